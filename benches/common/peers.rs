//! What readers would otherwise use: nginx (`proxy_cache` with
//! `proxy_cache_lock on`) and Varnish (its waiting list), started by the
//! bench in front of the same origin when they are installed.
//!
//! Each runs on a free loopback port with its config written to a temp dir,
//! under `timeout` so it ends by itself even if the bench is killed, and is
//! stopped (SIGTERM, then SIGKILL) when its [`PeerProxy`] is dropped.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A cache server readers would put in front of an origin instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    Nginx,
    Varnish,
}

impl Peer {
    pub(crate) fn program(self) -> &'static str {
        match self {
            Peer::Nginx => "nginx",
            Peer::Varnish => "varnishd",
        }
    }

    /// The version line the program prints, or `None` when not installed.
    pub(crate) fn version(self) -> Option<String> {
        let flag = match self {
            Peer::Nginx => "-v",
            Peer::Varnish => "-V",
        };
        let out = Command::new(self.program()).arg(flag).output().ok()?;
        // Both print their version on stderr.
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find(|l| !l.trim().is_empty())?
            .trim()
            .to_owned();
        Some(line)
    }
}

/// One line per peer for the bench's header.
pub(crate) fn report() -> Vec<String> {
    [Peer::Nginx, Peer::Varnish]
        .into_iter()
        .map(|p| match p.version() {
            Some(v) => format!("{}: {v} (rows in the cold and expired bursts)", p.program()),
            None => format!("{}: not installed; its rows are skipped", p.program()),
        })
        .collect()
}

/// A running nginx or varnishd in front of `origin`; stopped on drop.
#[derive(Debug)]
pub(crate) struct PeerProxy {
    pub(crate) addr: SocketAddr,
    child: Child,
    dir: PathBuf,
}

pub(crate) fn free_port() -> Result<u16, String> {
    StdListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

impl PeerProxy {
    /// Start `peer` in front of `origin` and wait (at most 20 s) until it
    /// accepts connections. It ends by itself after `lifetime` at the latest.
    pub(crate) async fn start(
        peer: Peer,
        origin: SocketAddr,
        lifetime: Duration,
    ) -> Result<Self, String> {
        Self::start_logging(peer, origin, lifetime, false).await
    }

    /// [`PeerProxy::start`], with nginx writing its access log to a file
    /// as its docs advise for load (`buffer=256k flush=1s`) when
    /// `access_log` is set. (Varnish logs to shared memory, read only by
    /// `varnishncsa`; nothing changes for it.)
    pub(crate) async fn start_logging(
        peer: Peer,
        origin: SocketAddr,
        lifetime: Duration,
        access_log: bool,
    ) -> Result<Self, String> {
        if !origin.ip().is_loopback() {
            return Err(format!("{origin} is not loopback"));
        }
        if peer.version().is_none() {
            return Err(format!("skipped: {} not installed", peer.program()));
        }
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "herdguard-bench-{}-{}-{seq}",
            peer.program(),
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let port = free_port()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let args = match peer {
            Peer::Nginx => nginx_args(&dir, addr, origin, access_log)?,
            Peer::Varnish => varnish_args(&dir, addr, origin)?,
        };
        Self::launch(peer.program().as_ref(), &args, dir, addr, lifetime).await
    }

    /// Start `herdguard proxy` (the binary at `bin`) in front of `origin`,
    /// memory only, its access log written to a file in its temp dir.
    pub(crate) async fn start_herdguard(
        bin: &Path,
        origin: SocketAddr,
        lifetime: Duration,
    ) -> Result<Self, String> {
        Self::start_herdguard_with(bin, origin, lifetime, &[]).await
    }

    /// [`PeerProxy::start_herdguard`] with `extra` flags after the others.
    pub(crate) async fn start_herdguard_with(
        bin: &Path,
        origin: SocketAddr,
        lifetime: Duration,
        extra: &[&str],
    ) -> Result<Self, String> {
        // A dir of its own: several instances run side by side, and each
        // removes its dir when dropped.
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "herdguard-bench-proxy-{}-{seq}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let mut args = vec![
            "proxy".to_owned(),
            "--listen".into(),
            addr.to_string(),
            "--upstream".into(),
            format!("http://{origin}"),
            "--access-log".into(),
            dir.join("access.log").display().to_string(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        Self::launch(bin.as_os_str(), &args, dir, addr, lifetime).await
    }

    /// Resident memory of the server (the child of `timeout`), from
    /// `/proc`; None where that cannot be read.
    pub(crate) fn server_rss_bytes(&self) -> Option<u64> {
        let pid = self.child.id();
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
        let server = children.split_whitespace().next()?;
        super::rss_of(server)
    }

    async fn launch(
        program: &std::ffi::OsStr,
        args: &[String],
        dir: PathBuf,
        addr: SocketAddr,
        lifetime: Duration,
    ) -> Result<Self, String> {
        let name = Path::new(program).display().to_string();
        let log = std::fs::File::create(dir.join("stderr.log")).map_err(|e| e.to_string())?;
        // `timeout` bounds its life even if this process dies without dropping it.
        let child = Command::new("timeout")
            .args(["-s", "TERM", "-k", "5"])
            .arg(format!("{}s", lifetime.as_secs().max(1)))
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{name}: {e}"))?;
        let mut proxy = Self { addr, child, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let connect = tokio::net::TcpStream::connect(addr);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(200), connect).await {
                return Ok(proxy);
            }
            if let Ok(Some(status)) = proxy.child.try_wait() {
                return Err(format!("{name} exited ({status}): {}", proxy.log_tail()));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{name} did not listen within 20 s: {}",
                    proxy.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        for f in ["stderr.log", "error.log"] {
            if let Ok(t) = std::fs::read_to_string(self.dir.join(f)) {
                text.push_str(&t);
            }
        }
        // clap's `error: …` line comes before its usage lines: keep it.
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let mut tail: Vec<&str> = lines.iter().rev().take(3).rev().copied().collect();
        if let Some(e) = lines.iter().find(|l| l.starts_with("error:")) {
            if !tail.contains(e) {
                tail.insert(0, e);
            }
        }
        tail.join(" | ")
    }
}

impl Drop for PeerProxy {
    fn drop(&mut self) {
        // SIGTERM to `timeout` is passed on to the server, which stops its
        // workers (nginx) or its child (varnishd) before exiting.
        let pid = self.child.id().to_string();
        let _ = Command::new("kill")
            .args(["-TERM", &pid])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                let _ = std::fs::remove_dir_all(&self.dir);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // `timeout -k 5` has SIGKILLed the server by now; end `timeout` too.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf, String> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// nginx as a caching reverse proxy: `proxy_cache_lock on` (one request per
/// key fills, the others wait for it), stale served while one request
/// updates in the background (`proxy_cache_use_stale updating` +
/// `proxy_cache_background_update`, what `stale-while-revalidate` asks for).
/// Lock timeouts are nginx's defaults (5 s). With `access_log`, the
/// combined format to a file, buffered as nginx's docs advise for load.
fn nginx_args(
    dir: &Path,
    addr: SocketAddr,
    origin: SocketAddr,
    access_log: bool,
) -> Result<Vec<String>, String> {
    let d = dir.display();
    let access_log = if access_log {
        format!("{d}/access.log combined buffer=256k flush=1s")
    } else {
        "off".to_owned()
    };
    let conf = format!(
        r#"daemon off;
master_process on;
worker_processes 2;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
worker_rlimit_nofile 8192;
events {{ worker_connections 4096; }}
http {{
    access_log {access_log};
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy_temp;
    fastcgi_temp_path {d}/fastcgi_temp;
    uwsgi_temp_path {d}/uwsgi_temp;
    scgi_temp_path {d}/scgi_temp;
    proxy_cache_path {d}/cache levels=1:2 keys_zone=bench:8m max_size=256m inactive=10m use_temp_path=off;
    # The bench's load generator reads Cache-Status (RFC 9211) the way
    # herdguard writes it.
    map $upstream_cache_status $bench_cache_status {{
        HIT "nginx; hit";
        REVALIDATED "nginx; hit";
        STALE "nginx; hit; detail=stale";
        UPDATING "nginx; hit; detail=stale";
        default "nginx; fwd=miss";
    }}
    upstream origin {{ server {origin}; keepalive 64; }}
    server {{
        listen {addr} backlog=4096;
        keepalive_requests 100000;
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_cache bench;
            proxy_cache_lock on;
            proxy_cache_use_stale updating error timeout;
            proxy_cache_background_update on;
            proxy_hide_header x-bench-ready-us;
            add_header Cache-Status $bench_cache_status always;
        }}
    }}
}}
"#
    );
    let conf = write(dir, "nginx.conf", &conf)?;
    Ok(vec![
        "-p".into(),
        dir.display().to_string(),
        "-e".into(),
        dir.join("error.log").display().to_string(),
        "-c".into(),
        conf.display().to_string(),
    ])
}

/// varnishd with its built-in VCL (the waiting list coalesces misses; grace
/// comes from `stale-while-revalidate`), malloc storage, no jail, and a
/// Cache-Status header for the load generator.
fn varnish_args(dir: &Path, addr: SocketAddr, origin: SocketAddr) -> Result<Vec<String>, String> {
    let vcl = format!(
        r#"vcl 4.1;
backend origin {{ .host = "{ip}"; .port = "{port}"; }}
sub vcl_hit {{
    if (obj.ttl <= 0s) {{ set req.http.x-bench-stale = "1"; }}
}}
sub vcl_backend_response {{
    unset beresp.http.x-bench-ready-us;
}}
sub vcl_deliver {{
    if (req.http.x-bench-stale) {{
        set resp.http.Cache-Status = "varnish; hit; detail=stale";
    }} elsif (obj.hits > 0) {{
        set resp.http.Cache-Status = "varnish; hit";
    }} else {{
        set resp.http.Cache-Status = "varnish; fwd=miss";
    }}
}}
"#,
        ip = origin.ip(),
        port = origin.port()
    );
    let vcl = write(dir, "bench.vcl", &vcl)?;
    let admin = free_port()?;
    Ok(vec![
        "-F".into(),
        "-j".into(),
        "none".into(),
        "-a".into(),
        addr.to_string(),
        "-T".into(),
        format!("127.0.0.1:{admin}"),
        "-n".into(),
        dir.join("work").display().to_string(),
        "-P".into(),
        dir.join("varnishd.pid").display().to_string(),
        "-f".into(),
        vcl.display().to_string(),
        "-s".into(),
        "malloc,256m".into(),
    ])
}

/// The `herdguard` binary: `--proxy-bin`, else the one
/// `cargo build --release -p herdguard-cli` put beside the running bench's
/// own profile folder (target/release/herdguard).
pub(crate) fn herdguard_bin(given: Option<&str>) -> Result<PathBuf, String> {
    if let Some(p) = given {
        return Ok(PathBuf::from(p));
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("herdguard")))
        .filter(|p| p.is_file());
    beside.ok_or_else(|| {
        "skipped: run `cargo build --release -p herdguard-cli` first (or pass --proxy-bin)"
            .to_owned()
    })
}
