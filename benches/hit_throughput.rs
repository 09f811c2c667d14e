//! Hit throughput, side by side in one run, every server answering the same
//! small body from one warm key:
//!
//! - the bare hyper origin (answers at once; the base of the ratios) and
//!   the same origin behind `CacheLayer` in that bare hyper server;
//! - `herdguard proxy` (the release binary, a child process) in front of
//!   the bare origin, its access log written to a file;
//! - nginx `proxy_cache` (2 workers, access log to a file with
//!   `buffer=256k flush=1s`) and Varnish in front of it, when installed;
//! - a bare axum handler, herdguard in it from L1, and with L1 off so every
//!   hit is a Redis round trip;
//! - the bare axum handler reading its body from Redis on every request:
//!   one plain `GET` over one multiplexed connection that all requests
//!   share (no key derivation, no checks, no coalescing). What a round trip
//!   per request costs here, beside the herdguard row, whose concurrent
//!   requests for one key share one lookup.
//!
//! ```text
//! cargo bench --bench hit_throughput
//! cargo build --release -p herdguard-cli && cargo bench --bench hit_throughput -- --load wrk --seconds 4 --rounds 2   # the proxy row runs the herdguard binary
//! cargo bench --bench hit_throughput -- --seconds 5 --connections 64 --rounds 5    # starts its own redis-server; --redis none to skip
//! cargo bench --bench hit_throughput -- --load wrk --only axum,redis    # only the rows whose names contain one of these
//! ```
//! Each variant gets `--seconds` of load in all, cut into `--rounds` slices
//! run in turn (a, b, c, a, b, c, …) so machine noise lands on every variant
//! alike. `--load builtin` (the default): the in-process load generator
//! (keep-alive HTTP/1.1, closed loop) on its own runtime with
//! `--client-threads` threads; the in-process servers get their own
//! runtime. `--load wrk`: `wrk -t{--wrk-threads} -c{--connections}` per
//! slice (whole seconds), the same C client for the servers in this process
//! and the child processes alike.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::header;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use herdguard::CacheLayer;
use tokio::runtime::Runtime;

use common::args::Args;
use common::loadgen::{closed_loop, Class, Conn, Load, Paths, Report};
use common::ms;
use common::origin::serve;
use common::peers::{Peer, PeerProxy};
use common::redis::{with_redis, RedisTarget, L1};
use common::wrk::{self, WrkRun};

const USAGE: &str = "cargo bench --bench hit_throughput -- [--seconds 5] [--connections 64] \
[--rounds 5] [--body-bytes 512] [--client-threads 1] [--server-threads 2] [--redis spawn|URL|none] \
[--load builtin|wrk] [--wrk-threads 2] [--proxy-bin PATH] [--only NAME,NAME]";

const PATH: &str = "/k/hot";

// The rows, in the order of the table; `--only` matches parts of these.
const HYPER: &str = "bare hyper origin";
const LAYERED: &str = "layer in bare hyper, L1";
const PROXY: &str = "herdguard proxy, file log";
const NGINX: &str = "nginx proxy_cache, buf log";
const VARNISH: &str = "varnish";
const AXUM: &str = "bare axum handler";
const AXUM_L1: &str = "axum + herdguard, L1 hit";
const REDIS: &str = "axum + herdguard, Redis";
const REDIS_GET: &str = "axum + Redis GET per request";

/// One server under test.
struct Variant {
    name: &'static str,
    addr: Option<SocketAddr>,
    /// Whether its answers should be hits (checked after the warm-up).
    cached: bool,
    note: String,
    report: Report,
    wrk: Vec<WrkRun>,
    /// This process's CPU time during the row's wrk slices: with `--load
    /// wrk` only the servers run here (wrk and redis-server are children).
    cpu: Duration,
}

impl Variant {
    fn new(name: &'static str, started: Result<SocketAddr, String>, cached: bool) -> Self {
        let (addr, note) = match started {
            Ok(a) => (Some(a), String::new()),
            Err(note) => (None, note),
        };
        Self {
            name,
            addr,
            cached,
            note,
            report: Report::new(),
            wrk: Vec::new(),
            cpu: Duration::ZERO,
        }
    }

    fn rps(&self) -> f64 {
        if self.wrk.is_empty() {
            return self.report.rps();
        }
        let (n, s) = self
            .wrk
            .iter()
            .fold((0, 0.0), |(n, s), r| (n + r.requests, s + r.secs));
        n as f64 / f64::max(s, 1e-9)
    }
}

fn router(body: Bytes) -> Router {
    let handler = move || {
        let body = body.clone();
        async move { ([(header::CACHE_CONTROL, "max-age=3600")], body) }
    };
    Router::new().route("/k/{key}", get(handler))
}

/// The bare handler, its body read from Redis with one `GET` per request
/// over one multiplexed connection shared by every request (commands of
/// concurrent requests share writes, as the crate's own connections do).
async fn redis_get(url: &str, body: Bytes) -> Result<Router, String> {
    use deadpool_redis::redis::{self, AsyncCommands};
    const KEY: &str = "bench:floor";
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let () = conn
        .set(KEY, body.as_ref())
        .await
        .map_err(|e| e.to_string())?;
    let handler = move || {
        let mut conn = conn.clone();
        async move {
            match conn.get::<_, Vec<u8>>(KEY).await {
                Ok(v) => Ok(([(header::CACHE_CONTROL, "max-age=3600")], Bytes::from(v))),
                Err(_) => Err(axum::http::StatusCode::BAD_GATEWAY),
            }
        }
    };
    Ok(Router::new().route("/k/{key}", get(handler)))
}

fn runtime(threads: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"))
}

/// The servers outside this process, kept alive until the end of `main`.
struct Children(Vec<PeerProxy>, Option<RedisTarget>);

impl Children {
    fn keep(&mut self, p: Result<PeerProxy, String>) -> Result<SocketAddr, String> {
        let p = p?;
        let addr = p.addr;
        self.0.push(p);
        Ok(addr)
    }
}

/// Whether the row `name` runs: `--only` lists parts of row names
/// (case-insensitive), any of which selects a row; without it, every row.
fn selected(args: &Args, name: &str) -> bool {
    let Some(only) = args.value("only") else {
        return true;
    };
    let name = name.to_ascii_lowercase();
    only.split(',')
        .map(|part| part.trim().to_ascii_lowercase())
        .any(|part| !part.is_empty() && name.contains(&part))
}

/// Start every server `--only` selects, in the order of the table.
fn variants(args: &Args, servers: &Runtime, body: &Bytes, children: &mut Children) -> Vec<Variant> {
    let start = |r: Router| {
        servers
            .block_on(serve(r))
            // Dropping the handle detaches the server: it lives until exit.
            .map(|(addr, _task)| addr)
            .map_err(|e| format!("bind: {e}"))
    };
    // A row `--only` leaves out is not started: `Err` is its note.
    let run = |name: &str| {
        if selected(args, name) {
            Ok(())
        } else {
            Err("skipped: --only".to_owned())
        }
    };
    // The origin of the proxy rows, started whatever rows run.
    let origin = servers
        .block_on(common::bare::origin(body.clone()))
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let layered = run(LAYERED).and_then(|()| {
        servers
            .block_on(common::bare::cached_origin(body.clone(), CacheLayer::new()))
            .map_err(|e| format!("bind: {e}"))
    });
    // Long enough for any run; each child ends by itself after it.
    let lifetime = Duration::from_secs(60 + 12 * args.get("seconds", 5u64).max(1));
    let proxy = run(PROXY)
        .and_then(|()| common::peers::herdguard_bin(args.value("proxy-bin")))
        .and_then(|bin| {
            children.keep(servers.block_on(PeerProxy::start_herdguard(&bin, origin, lifetime)))
        });
    let nginx = run(NGINX).and_then(|()| {
        children.keep(servers.block_on(PeerProxy::start_logging(
            Peer::Nginx,
            origin,
            lifetime,
            true,
        )))
    });
    let varnish = run(VARNISH).and_then(|()| {
        children.keep(servers.block_on(PeerProxy::start(Peer::Varnish, origin, lifetime)))
    });
    let redis = match run(REDIS).or_else(|_| run(REDIS_GET)) {
        Ok(()) => RedisTarget::from_args(args).unwrap_or_else(|e| {
            eprintln!("redis: {e}");
            std::process::exit(2);
        }),
        Err(_) => None,
    };
    let redis_hit = run(REDIS).and_then(|()| match &redis {
        None => Err("skipped: --redis none".to_owned()),
        Some(target) => with_redis(CacheLayer::builder(), &target.url, L1::Off, None)
            .and_then(|b| b.build().map_err(|e| e.to_string()))
            .and_then(|layer| start(router(body.clone()).layer(layer))),
    });
    let redis_get = run(REDIS_GET).and_then(|()| match &redis {
        None => Err("skipped: --redis none".to_owned()),
        Some(target) => servers
            .block_on(redis_get(&target.url, body.clone()))
            .and_then(start),
    });
    // A spawned redis-server lives as long as the other children.
    children.1 = redis;
    let axum = run(AXUM).and_then(|()| start(router(body.clone())));
    let axum_l1 = run(AXUM_L1).and_then(|()| start(router(body.clone()).layer(CacheLayer::new())));
    vec![
        Variant::new(HYPER, run(HYPER).map(|()| origin), false),
        Variant::new(LAYERED, layered, true),
        Variant::new(PROXY, proxy, true),
        Variant::new(NGINX, nginx, true),
        Variant::new(VARNISH, varnish, true),
        Variant::new(AXUM, axum, false),
        Variant::new(AXUM_L1, axum_l1, true),
        Variant::new(REDIS, redis_hit, true),
        Variant::new(REDIS_GET, redis_get, false),
    ]
}

/// Fill every cache (one request), then check a second request is a hit.
fn warm(clients: &Runtime, variants: &mut [Variant]) {
    for v in variants.iter_mut() {
        let Some(addr) = v.addr else { continue };
        let second = clients.block_on(async {
            let mut c = Conn::connect(addr).await?;
            c.get(PATH).await?;
            c.get(PATH).await
        });
        match second {
            Err(e) => v.note = format!("warm-up failed: {e}"),
            Ok(r) if v.cached && r.class != Class::Hit => {
                v.note = format!("not a hit after warm-up: {:?}", r.class)
            }
            Ok(r) if r.status != 200 => v.note = format!("status {}", r.status),
            Ok(_) => {}
        }
    }
}

fn main() {
    let args = Args::parse(
        &[
            "seconds",
            "connections",
            "rounds",
            "body-bytes",
            "client-threads",
            "server-threads",
            "redis",
            "load",
            "wrk-threads",
            "proxy-bin",
            "only",
        ],
        USAGE,
    );
    let seconds = args.get("seconds", 5.0f64).clamp(0.2, 300.0);
    let connections = args.get("connections", 64usize).clamp(1, 1024);
    let rounds = args.get("rounds", 5u32).clamp(1, 100);
    let use_wrk = match args.value("load").unwrap_or("builtin") {
        "builtin" => false,
        "wrk" if wrk::version().is_some() => true,
        "wrk" => {
            eprintln!("--load wrk: wrk is not installed");
            std::process::exit(2);
        }
        other => {
            eprintln!("--load {other}: builtin or wrk\nusage: {USAGE}");
            std::process::exit(2);
        }
    };
    let body = Bytes::from(vec![b'x'; args.get("body-bytes", 512usize)]);
    let servers = runtime(args.get("server-threads", 2usize));
    let clients = runtime(args.get("client-threads", 1usize));
    let mut children = Children(Vec::new(), None);
    let mut variants = variants(&args, &servers, &body, &mut children);
    warm(&clients, &mut variants);

    let slice = Duration::from_secs_f64(seconds / f64::from(rounds));
    let load = if use_wrk {
        let secs = slice.as_secs_f64().round().max(1.0) as u64;
        let threads = args.get("wrk-threads", 2usize).clamp(1, 64);
        format!("wrk -t{threads} -c{connections} -d{secs}s per slice")
    } else {
        format!("builtin load generator, {connections} connections")
    };
    println!(
        "hit throughput: {load}, {seconds} s per variant in {rounds} slices, body {} bytes, \
         loopback, {} cores",
        body.len(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    for _ in 0..rounds {
        for v in variants.iter_mut() {
            let Some(addr) = v.addr else { continue };
            if use_wrk {
                let secs = slice.as_secs_f64().round().max(1.0) as u64;
                let threads = args.get("wrk-threads", 2usize).clamp(1, 64);
                let before = process_cpu();
                match wrk::run(addr, PATH, threads, connections, secs) {
                    Ok(r) => v.wrk.push(r),
                    Err(e) => v.note = e,
                }
                v.cpu += process_cpu().saturating_sub(before);
                continue;
            }
            let load = Load {
                addrs: vec![addr],
                connections,
                duration: slice,
                max_requests: 50_000_000,
                paths: Paths::Fixed(PATH.to_owned()),
                request_timeout: Duration::from_secs(5),
            };
            let r = clients.block_on(closed_loop(&load));
            v.report.merge(&r);
        }
    }
    print_table(&variants);
    drop(children);
}

/// User and system CPU time of this process so far (`/proc/self/stat`,
/// in ticks of 10 ms); zero where that cannot be read.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name's closing parenthesis start at
    // field 3 (state); utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

fn print_table(variants: &[Variant]) {
    let base = variants[0].rps();
    let axum = variants
        .iter()
        .find(|v| v.name == AXUM)
        .map_or(0.0, Variant::rps);
    println!(
        "{:<28} {:>10} {:>7} {:>7} {:>8} {:>8} {:>8} {:>7} {:>8}  note",
        "variant", "req/s", "÷hyper", "÷axum", "p50 ms", "p99 ms", "hits", "errors", "cpu µs"
    );
    for v in variants {
        if v.addr.is_none() {
            println!(
                "{:<28} {:>10} {:>7} {:>7} {:>8} {:>8} {:>8} {:>7} {:>8}  {}",
                v.name, "-", "-", "-", "-", "-", "-", "-", "-", v.note
            );
            continue;
        }
        let r = &v.report;
        let (p50, p99, errors, hits) = if v.wrk.is_empty() {
            let hits = format!("{:.1}%", 100.0 * r.hits as f64 / r.ok.max(1) as f64);
            (r.q(0.5), r.q(0.99), r.errors, hits)
        } else {
            // The worst slice; wrk does not read Cache-Status, so the hit
            // column says what the warm-up check found.
            let p50 = v.wrk.iter().map(|w| w.p50).max().unwrap_or_default();
            let p99 = v.wrk.iter().map(|w| w.p99).max().unwrap_or_default();
            let errors = v.wrk.iter().map(|w| w.errors).sum();
            (p50, p99, errors, "warm".to_owned())
        };
        let hits = if v.cached { hits } else { "-".to_owned() };
        // A base row left out (`--only`) measured nothing: no ratio to it.
        let ratio = |base: f64| {
            if base > 0.0 {
                format!("{:.2}", v.rps() / base)
            } else {
                "-".to_owned()
            }
        };
        // Server CPU per request in this process (wrk rows only; not the
        // child processes' own: nginx, Varnish, the proxy, redis-server).
        let requests: u64 = v.wrk.iter().map(|w| w.requests).sum();
        let cpu = if requests == 0 {
            "-".to_owned()
        } else {
            format!("{:.2}", v.cpu.as_secs_f64() * 1e6 / requests as f64)
        };
        println!(
            "{:<28} {:>10.0} {:>7} {:>7} {:>8} {:>8} {:>8} {:>7} {:>8}  {}",
            v.name,
            v.rps(),
            ratio(base),
            ratio(axum),
            ms(p50),
            ms(p99),
            hits,
            errors,
            cpu,
            v.note
        );
    }
}
