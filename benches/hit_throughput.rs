//! Hit throughput, side by side in one run: the same bytes served (a) by a
//! bare axum handler, (b) through herdguard from L1, (c) through herdguard
//! with L1 off so every hit is a Redis round trip.
//!
//! ```text
//! cargo bench --bench hit_throughput
//! cargo bench --bench hit_throughput -- --seconds 5 --connections 64 --rounds 5    # starts its own redis-server; --redis none to skip
//! ```
//! Each variant gets `--seconds` of load in all, cut into `--rounds` slices
//! run in turn (a, b, c, a, b, c, …) so machine noise lands on every variant
//! alike. The load generator (keep-alive HTTP/1.1, closed loop) runs on its
//! own runtime with `--client-threads` threads, as wrk would in its own
//! process; the servers get their own runtime.

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
use common::loadgen::{closed_loop, Conn, Load, Paths, Report};
use common::ms;
use common::origin::serve;
use common::redis::{with_redis, RedisTarget, L1};

const USAGE: &str = "cargo bench --bench hit_throughput -- [--seconds 5] [--connections 64] \
[--rounds 5] [--body-bytes 512] [--client-threads 1] [--server-threads 2] [--redis spawn|URL|none]";

/// One server under test.
struct Variant {
    name: &'static str,
    addr: Option<SocketAddr>,
    note: String,
    report: Report,
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
        ],
        USAGE,
    );
    let seconds = args.get("seconds", 5.0f64).clamp(0.2, 300.0);
    let connections = args.get("connections", 64usize).clamp(1, 1024);
    let rounds = args.get("rounds", 5u32).clamp(1, 100);
    let body = Bytes::from(vec![b'x'; args.get("body-bytes", 512usize)]);
    let servers = runtime(args.get("server-threads", 2usize));
    let clients = runtime(args.get("client-threads", 1usize));
    let redis = RedisTarget::from_args(&args).unwrap_or_else(|e| {
        eprintln!("redis: {e}");
        std::process::exit(2);
    });

    let start = |r: Router| {
        servers
            .block_on(serve(r))
            // Dropping the handle detaches the server: it lives until exit.
            .map(|(addr, _task)| addr)
            .unwrap_or_else(|e| panic!("bind: {e}"))
    };
    let bare = start(router(body.clone()));
    let l1 = start(router(body.clone()).layer(CacheLayer::new()));
    let (redis_addr, redis_note) = match &redis {
        None => (None, "skipped: --redis none".to_owned()),
        Some(target) => match with_redis(CacheLayer::builder(), &target.url, L1::Off, None)
            .and_then(|b| b.build().map_err(|e| e.to_string()))
        {
            Ok(layer) => (
                Some(start(router(body.clone()).layer(layer))),
                String::new(),
            ),
            Err(note) => (None, note),
        },
    };
    let mut variants = vec![
        Variant {
            name: "(a) bare axum handler",
            addr: Some(bare),
            note: String::new(),
            report: Report::new(),
        },
        Variant {
            name: "(b) herdguard, L1 hit",
            addr: Some(l1),
            note: String::new(),
            report: Report::new(),
        },
        Variant {
            name: "(c) herdguard, Redis hit",
            addr: redis_addr,
            note: redis_note,
            report: Report::new(),
        },
    ];

    let path = "/k/hot";
    // Fill the cached variants so every measured request is a hit.
    for v in &variants {
        if let Some(addr) = v.addr {
            let warmed = clients.block_on(async {
                let mut c = Conn::connect(addr).await?;
                c.get(path).await
            });
            if let Err(e) = warmed {
                eprintln!("{}: warm-up failed: {e}", v.name);
            }
        }
    }
    let redis_before = redis
        .as_ref()
        .and_then(|r| clients.block_on(r.commands()).ok());

    println!(
        "hit throughput: {connections} connections, {seconds} s per variant in {rounds} slices, \
         body {} bytes, loopback, {} cores",
        body.len(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let slice = Duration::from_secs_f64(seconds / f64::from(rounds));
    for _ in 0..rounds {
        for v in variants.iter_mut() {
            let Some(addr) = v.addr else { continue };
            let load = Load {
                addrs: vec![addr],
                connections,
                duration: slice,
                max_requests: 50_000_000,
                paths: Paths::Fixed(path.to_owned()),
                request_timeout: Duration::from_secs(5),
            };
            let r = clients.block_on(closed_loop(&load));
            v.report.merge(&r);
        }
    }
    if let (Some(before), Some(r)) = (redis_before, &redis) {
        if let (Ok(after), Some(c)) = (clients.block_on(r.commands()), variants.get(2)) {
            let per = (after - before) as f64 / c.report.ok.max(1) as f64;
            println!("redis commands per (c) request: {per:.2}");
        }
    }

    let base = variants[0].report.rps();
    println!(
        "{:<26} {:>10} {:>7} {:>8} {:>8} {:>8} {:>8} {:>7}  note",
        "variant", "req/s", "ratio", "p50 ms", "p99 ms", "max ms", "hits", "errors"
    );
    for v in &variants {
        let r = &v.report;
        if v.addr.is_none() {
            println!(
                "{:<26} {:>10} {:>7} {:>8} {:>8} {:>8} {:>8} {:>7}  {}",
                v.name, "-", "-", "-", "-", "-", "-", "-", v.note
            );
            continue;
        }
        let hits = if v.name.starts_with("(a)") {
            "-".to_owned()
        } else {
            format!("{:.1}%", 100.0 * r.hits as f64 / r.ok.max(1) as f64)
        };
        println!(
            "{:<26} {:>10.0} {:>7.2} {:>8} {:>8} {:>8} {:>8} {:>7}  {}",
            v.name,
            r.rps(),
            r.rps() / base.max(1e-9),
            ms(r.q(0.5)),
            ms(r.q(0.99)),
            ms(Duration::from_micros(r.latency_us.max())),
            hits,
            r.errors,
            v.note
        );
    }
}
