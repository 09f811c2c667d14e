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
//!   hit is a Redis round trip.
//!
//! ```text
//! cargo bench --bench hit_throughput
//! cargo bench --features cli --bench hit_throughput -- --load wrk --seconds 4 --rounds 2   # the proxy row needs the cli feature
//! cargo bench --bench hit_throughput -- --seconds 5 --connections 64 --rounds 5    # starts its own redis-server; --redis none to skip
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
use std::path::PathBuf;
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
[--load builtin|wrk] [--wrk-threads 2] [--proxy-bin PATH]";

const PATH: &str = "/k/hot";

/// One server under test.
struct Variant {
    name: &'static str,
    addr: Option<SocketAddr>,
    /// Whether its answers should be hits (checked after the warm-up).
    cached: bool,
    note: String,
    report: Report,
    wrk: Vec<WrkRun>,
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

/// The `herdguard` binary: `--proxy-bin`, else the one cargo built with
/// this bench (`--features cli`).
fn proxy_bin(args: &Args) -> Result<PathBuf, String> {
    match args.value("proxy-bin") {
        Some(p) => Ok(PathBuf::from(p)),
        None => option_env!("CARGO_BIN_EXE_herdguard")
            .map(PathBuf::from)
            .ok_or_else(|| "skipped: build with --features cli (or --proxy-bin)".to_owned()),
    }
}

/// Start every server, in the order of the table.
fn variants(args: &Args, servers: &Runtime, body: &Bytes, children: &mut Children) -> Vec<Variant> {
    let start = |r: Router| {
        servers
            .block_on(serve(r))
            // Dropping the handle detaches the server: it lives until exit.
            .map(|(addr, _task)| addr)
            .map_err(|e| format!("bind: {e}"))
    };
    let origin = servers
        .block_on(common::bare::origin(body.clone()))
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let layered = servers
        .block_on(common::bare::cached_origin(body.clone(), CacheLayer::new()))
        .map_err(|e| format!("bind: {e}"));
    // Long enough for any run; each child ends by itself after it.
    let lifetime = Duration::from_secs(60 + 12 * args.get("seconds", 5u64).max(1));
    let proxy = proxy_bin(args).and_then(|bin| {
        children.keep(servers.block_on(PeerProxy::start_herdguard(&bin, origin, lifetime)))
    });
    let nginx = children.keep(servers.block_on(PeerProxy::start_logging(
        Peer::Nginx,
        origin,
        lifetime,
        true,
    )));
    let varnish =
        children.keep(servers.block_on(PeerProxy::start(Peer::Varnish, origin, lifetime)));
    let redis = RedisTarget::from_args(args).unwrap_or_else(|e| {
        eprintln!("redis: {e}");
        std::process::exit(2);
    });
    let redis_hit = match &redis {
        None => Err("skipped: --redis none".to_owned()),
        Some(target) => with_redis(CacheLayer::builder(), &target.url, L1::Off, None)
            .and_then(|b| b.build().map_err(|e| e.to_string()))
            .and_then(|layer| start(router(body.clone()).layer(layer))),
    };
    // A spawned redis-server lives as long as the other children.
    children.1 = redis;
    vec![
        Variant::new("bare hyper origin", Ok(origin), false),
        Variant::new("layer in bare hyper, L1", layered, true),
        Variant::new("herdguard proxy, file log", proxy, true),
        Variant::new("nginx proxy_cache, buf log", nginx, true),
        Variant::new("varnish", varnish, true),
        Variant::new("bare axum handler", start(router(body.clone())), false),
        Variant::new(
            "axum + herdguard, L1 hit",
            start(router(body.clone()).layer(CacheLayer::new())),
            true,
        ),
        Variant::new("axum + herdguard, Redis", redis_hit, true),
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
                match wrk::run(addr, PATH, threads, connections, secs) {
                    Ok(r) => v.wrk.push(r),
                    Err(e) => v.note = e,
                }
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

fn print_table(variants: &[Variant]) {
    let base = variants[0].rps();
    let axum = variants
        .iter()
        .find(|v| v.name == "bare axum handler")
        .map_or(0.0, Variant::rps);
    println!(
        "{:<28} {:>10} {:>7} {:>7} {:>8} {:>8} {:>8} {:>7}  note",
        "variant", "req/s", "÷hyper", "÷axum", "p50 ms", "p99 ms", "hits", "errors"
    );
    for v in variants {
        if v.addr.is_none() {
            println!(
                "{:<28} {:>10} {:>7} {:>7} {:>8} {:>8} {:>8} {:>7}  {}",
                v.name, "-", "-", "-", "-", "-", "-", "-", v.note
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
        println!(
            "{:<28} {:>10.0} {:>7.2} {:>7.2} {:>8} {:>8} {:>8} {:>7}  {}",
            v.name,
            v.rps(),
            v.rps() / base.max(1e-9),
            v.rps() / axum.max(1e-9),
            ms(p50),
            ms(p99),
            hits,
            errors,
            v.note
        );
    }
}
