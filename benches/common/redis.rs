//! The Redis side of the benches: where the Redis URL comes from, a
//! throwaway redis-server on a free loopback port, the `INFO stats`
//! delta, and THE two functions to fill in once the crate's Redis builder
//! lands ([`with_redis`]).

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use herdguard::CacheLayerBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::args::Args;

/// How much of the in-process tier a Redis-backed layer keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum L1 {
    /// The crate's default short L1 TTL in front of Redis.
    Default,
    /// No L1: every hit is a Redis round trip (the "Redis-only hit" row).
    Off,
}

/// A layer builder that stores in Redis at `url`.
///
/// `lease`: the lease TTL a scenario needs (the slow-origin scenario asks
/// for 1 s so the watchdog must extend it); `None` keeps the crate default.
///
/// Every "herdguard + Redis" row of every bench goes through here.
pub(crate) fn with_redis(
    builder: CacheLayerBuilder,
    url: &str,
    l1: L1,
    lease: Option<Duration>,
) -> Result<CacheLayerBuilder, String> {
    let mut opts = herdguard::RedisOptions::new(url).namespace("bench");
    if let Some(lease) = lease {
        opts = opts.lease_ttl(lease);
    }
    if l1 == L1::Off {
        opts = opts.l1_ttl(Duration::ZERO);
    }
    Ok(builder.redis(opts))
}

/// A Redis to run the Redis rows against: `--redis URL`, else the
/// `HERDGUARD_BENCH_REDIS` environment variable. The value `spawn` starts a
/// private redis-server on a free loopback port for the run.
#[derive(Debug)]
pub(crate) struct RedisTarget {
    pub(crate) url: String,
    pub(crate) addr: SocketAddr,
    _server: Option<RedisServer>,
}

impl RedisTarget {
    /// The Redis rows run by default against a private redis-server the
    /// bench starts (`spawn`); `--redis none` leaves them out, `--redis URL`
    /// uses a running one. `Err` when the one asked for cannot be used.
    pub(crate) fn from_args(args: &Args) -> Result<Option<Self>, String> {
        let value = args
            .value("redis")
            .map(str::to_owned)
            .or_else(|| std::env::var("HERDGUARD_BENCH_REDIS").ok())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "spawn".to_owned());
        if value == "none" {
            return Ok(None);
        }
        if value == "spawn" {
            let server = RedisServer::start().map_err(|e| format!("redis-server: {e}"))?;
            return Ok(Some(Self {
                url: format!("redis://{}/", server.addr),
                addr: server.addr,
                _server: Some(server),
            }));
        }
        let addr = loopback_addr(&value)?;
        Ok(Some(Self {
            url: value,
            addr,
            _server: None,
        }))
    }

    /// Total commands Redis has executed, not counting our own INFO calls.
    pub(crate) async fn commands(&self) -> io::Result<u64> {
        command_calls(self.addr).await
    }
}

/// `redis://127.0.0.1:6379[/db]` → its address; anything but loopback is refused.
fn loopback_addr(url: &str) -> Result<SocketAddr, String> {
    let rest = url
        .strip_prefix("redis://")
        .ok_or_else(|| format!("{url:?}: only redis:// URLs are supported"))?;
    let host_port = rest.split('/').next().unwrap_or_default();
    let host_port = host_port.rsplit('@').next().unwrap_or_default();
    let host_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:6379")
    };
    let host_port = host_port.replace("localhost", "127.0.0.1");
    let addr: SocketAddr = host_port
        .parse()
        .map_err(|_| format!("{url:?}: expected redis://127.0.0.1:PORT"))?;
    if !addr.ip().is_loopback() {
        return Err(format!("{url:?}: benches only talk to loopback"));
    }
    Ok(addr)
}

/// A private redis-server with no persistence, killed on drop.
#[derive(Debug)]
pub(crate) struct RedisServer {
    pub(crate) addr: SocketAddr,
    child: Child,
}

impl RedisServer {
    /// Start one on a free loopback port and wait (at most 5 s) until it answers.
    pub(crate) fn start() -> io::Result<Self> {
        let port = StdListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "yes",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let server = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(server.addr).is_err() {
            if Instant::now() > deadline {
                return Err(io::Error::other("redis-server did not start within 5 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `total_commands_processed` from `INFO stats`, leaving out our own INFO calls, via
/// raw RESP so the benches need no Redis client of their own.
pub(crate) async fn command_calls(addr: SocketAddr) -> io::Result<u64> {
    let mut s = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::other("connect to redis timed out"))??;
    // `total_commands_processed` counts what clients send; commands run
    // inside a Lua script are not round trips and are not counted there
    // (they are in `commandstats`). Our own INFO calls are subtracted.
    let ours = INFO_CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
    s.write_all(b"*2\r\n$4\r\nINFO\r\n$5\r\nstats\r\n").await?;
    let mut buf = Vec::with_capacity(8192);
    let read = async {
        loop {
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                return Err(io::Error::other("redis closed the connection"));
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(body) = complete_bulk(&buf) {
                return Ok(body.to_vec());
            }
        }
    };
    let body = tokio::time::timeout(Duration::from_secs(2), read)
        .await
        .map_err(|_| io::Error::other("INFO stats timed out"))??;
    let total = String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .ok_or_else(|| io::Error::other("no total_commands_processed in INFO stats"))?;
    Ok(total.saturating_sub(ours))
}

static INFO_CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The payload of a complete RESP bulk string (`$len\r\n…\r\n`).
fn complete_bulk(buf: &[u8]) -> Option<&[u8]> {
    let line_end = buf.windows(2).position(|w| w == b"\r\n")?;
    let len: usize = std::str::from_utf8(buf.get(1..line_end)?)
        .ok()?
        .parse()
        .ok()?;
    buf.get(line_end + 2..line_end + 2 + len)
}
