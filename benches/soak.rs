//! Soak: a long closed loop over many keys with a short max-age, checking
//! that nothing fails, no key is computed twice in one freshness window, and
//! memory stays flat.
//!
//! ```text
//! cargo bench --bench soak                       # 60 s, against a redis-server it starts
//! cargo bench --bench soak -- --seconds 10       # shorter
//! cargo bench --bench soak -- --redis none       # in-memory only
//! cargo bench --bench soak -- --large            # memory bound: distinct 200 KB entries
//! ```
//! `--large`: one in-memory instance with `--capacity-mib` (32) fed distinct
//! 200 KB entries (max-age=60, so nothing expires) for `--seconds` (10),
//! far more bytes than the capacity; exits 1 when RSS at the end exceeds
//! 1.25 × capacity + 64 MiB, the bound the crate documents.
//! Defaults: 64 connections over P=4 instances, 10,000 keys, max-age=1,
//! origin 5 ms. A "window" is 0.75 × max-age (less 20 ms of scheduling
//! slack): refresh-ahead refills a hot key once per max-age, that far in,
//! so a call sooner than that after the last one is a second fill.
//! Per-key windows are counted per instance in memory (each
//! instance has its own cache, so each may fill a key once per window) and
//! across the cluster with Redis.
//!
//! Exits 1 when a target is missed: errors > 0, more than one origin call
//! for a key within one window, or RSS at the end more than 10% (+8 MiB)
//! above the middle.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use herdguard::CacheLayer;

use common::args::Args;
use common::loadgen::{closed_loop, Load, Paths};
use common::origin::{spawn_instance, Origin, Scope};
use common::redis::{with_redis, RedisTarget, L1};
use common::{ms, rss_bytes};

const USAGE: &str = "cargo bench --bench soak -- [--seconds 60] [--connections 64] \
[--keys 10000] [--instances 4] [--origin-delay-ms 5] [--redis spawn|URL|none] \
[--large [--capacity-mib 32] [--body-bytes 200000]]";

const MAX_AGE: Duration = Duration::from_secs(1);
/// Scheduling slack: a refill a hair under one max-age after the last one
/// is a clock artefact, not a second fill of a fresh entry.
const WINDOW_SLACK: Duration = Duration::from_millis(20);
/// Refresh-ahead (on by default) refills a hot key once its last quarter of
/// freshness begins (the crate's fraction 0.25; the 5 ms origin is far
/// below the "twice the origin time" alternative), for the next window. So
/// a correct cache calls the origin for a key at most once per
/// 0.75 × max-age; a call sooner than that is a second fill.
const REFILL_GAP: Duration = Duration::from_millis(MAX_AGE.as_millis() as u64 * 3 / 4);

fn mib(b: Option<u64>) -> String {
    b.map_or_else(|| "?".to_owned(), common::mib)
}

#[tokio::main]
async fn main() {
    let args = Args::parse(
        &[
            "seconds",
            "connections",
            "keys",
            "instances",
            "origin-delay-ms",
            "redis",
            "large",
            "capacity-mib",
            "body-bytes",
        ],
        USAGE,
    );
    if args.switch("large") {
        large(&args).await;
        return;
    }
    let seconds = args.get("seconds", 60.0f64).clamp(1.0, 3600.0);
    let connections = args.get("connections", 64usize).clamp(1, 1024);
    let keys = args.get("keys", 10_000u32).clamp(1, 1_000_000);
    let instances = args.get("instances", 4usize).clamp(1, 64);
    let delay = Duration::from_millis(args.get("origin-delay-ms", 5u64));
    let redis = RedisTarget::from_args(&args).unwrap_or_else(|e| {
        eprintln!("redis: {e}");
        std::process::exit(2);
    });
    let scope = if redis.is_some() {
        Scope::Cluster
    } else {
        Scope::Instance
    };

    let origin = Arc::new(Origin::tracking_keys(
        delay,
        "max-age=1",
        512,
        instances,
        keys,
        REFILL_GAP - WINDOW_SLACK,
        scope,
    ));
    let mut servers = Vec::with_capacity(instances);
    for i in 0..instances {
        let layer = match &redis {
            None => CacheLayer::new(),
            Some(target) => {
                match with_redis(CacheLayer::builder(), &target.url, L1::Default, None)
                    .and_then(|b| b.build().map_err(|e| e.to_string()))
                {
                    Ok(l) => l,
                    Err(note) => {
                        println!("soak against Redis: {note}");
                        return;
                    }
                }
            }
        };
        match spawn_instance(&origin, i, Some(layer)).await {
            Ok(s) => servers.push(s),
            Err(e) => {
                eprintln!("bind: {e}");
                std::process::exit(2);
            }
        }
    }
    let mode = match &redis {
        Some(r) => format!("Redis at {}", r.url),
        None => "in-memory, per instance".to_owned(),
    };
    println!(
        "soak: {seconds} s, {connections} connections over {instances} instances, {keys} keys, \
         max-age=1, origin {} ms, {mode}",
        delay.as_millis()
    );

    let load = Load {
        addrs: servers.iter().map(|s| s.addr).collect(),
        connections,
        duration: Duration::from_secs_f64(seconds),
        max_requests: 500_000_000,
        paths: Paths::Keys {
            prefix: "/k/".to_owned(),
            keys,
        },
        request_timeout: Duration::from_secs(10),
    };
    let rss_start = rss_bytes();
    let started = Instant::now();
    let run = tokio::spawn(async move { closed_loop(&load).await });

    // Progress every tenth of the run; the middle sample is the reference
    // the end is compared with (the start is before any entry exists).
    let tick = Duration::from_secs_f64(seconds / 10.0);
    let mut rss_mid = None;
    println!(
        "{:>7} {:>12} {:>12} {:>12}",
        "t (s)", "rss", "origin calls", "entries"
    );
    println!("{:>7.1} {:>12} {:>12} {:>12}", 0.0, mib(rss_start), 0, 0);
    for step in 1..10 {
        tokio::time::sleep_until((started + tick * step).into()).await;
        let rss = rss_bytes();
        if step == 5 {
            rss_mid = rss;
        }
        let entries: u64 = servers
            .iter()
            .filter_map(|s| s.layer.as_ref())
            .map(CacheLayer::entry_count)
            .sum();
        println!(
            "{:>7.1} {:>12} {:>12} {:>12}",
            started.elapsed().as_secs_f64(),
            mib(rss),
            origin.calls(),
            entries
        );
    }
    let report = match run.await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("load task failed: {e}");
            std::process::exit(1);
        }
    };
    let rss_end = rss_bytes();

    let Some(windows) = origin.windows() else {
        unreachable!("the soak origin tracks keys")
    };
    let errors = report.errors;
    let max_in_window = windows.max_in_window();
    let rss_flat = match (rss_mid, rss_end) {
        (Some(mid), Some(end)) => end <= mid + mid / 10 + 8 * 1048576,
        _ => true,
    };
    println!(
        "\nrequests        {} ({:.0}/s)",
        report.ok + errors,
        report.rps()
    );
    println!(
        "latency         p50 {} ms, p99 {} ms, max {} ms",
        ms(report.q(0.5)),
        ms(report.q(0.99)),
        ms(Duration::from_micros(report.latency_us.max()))
    );
    println!(
        "hits/fwd        {} hit, {} stale, {} forwarded",
        report.hits, report.stale, report.forwarded
    );
    println!("origin calls    {}", origin.calls());
    // Requests the layers answered with an origin call of their own, outside
    // any flight (a flight's answer they could not take): each one is also
    // an origin call, so a second fill in a window shows up here first.
    let bypassed: u64 = servers
        .iter()
        .filter_map(|s| s.layer.as_ref())
        .map(|l| l.stats().bypasses)
        .sum();
    println!("outside flights {bypassed} (own origin calls, not shared)");
    println!(
        "errors          {errors}  {}",
        if errors == 0 { "ok" } else { "FAIL (want 0)" }
    );
    println!(
        "calls/key/window max {max_in_window} ({} calls within {} ms of the previous one; \
         shortest gap {} ms)  {}",
        windows.violations(),
        ms(REFILL_GAP - WINDOW_SLACK),
        windows.min_gap().map_or_else(|| "-".to_owned(), ms),
        if max_in_window <= 1 {
            "ok"
        } else {
            "FAIL (want <= 1)"
        }
    );
    println!(
        "rss             start {}, middle {}, end {}  {}",
        mib(rss_start),
        mib(rss_mid),
        mib(rss_end),
        if rss_flat {
            "ok"
        } else {
            "FAIL (still growing)"
        }
    );
    if errors > 0 || max_in_window > 1 || !rss_flat {
        std::process::exit(1);
    }
}

/// Distinct large entries through one in-memory instance with a small
/// capacity: RSS against the documented bound.
async fn large(args: &Args) {
    let seconds = args.get("seconds", 10.0f64).clamp(1.0, 600.0);
    let capacity = args.get("capacity-mib", 32u64).clamp(1, 4096) * 1048576;
    let body = args.get("body-bytes", 200_000usize).clamp(1, 8 << 20);
    let connections = args.get("connections", 16usize).clamp(1, 1024);
    // Uniform over 100,000 keys: nearly every request is a new entry.
    let keys = 100_000u32;
    let origin = Arc::new(
        Origin::tracking_keys(
            Duration::ZERO,
            "max-age=60",
            body,
            1,
            keys,
            Duration::from_secs(60),
            Scope::Instance,
        )
        .copying_bodies(),
    );
    let layer = match CacheLayer::builder()
        .capacity_bytes(usize::try_from(capacity).unwrap_or(usize::MAX))
        .build()
    {
        Ok(l) => l,
        Err(e) => {
            eprintln!("layer: {e}");
            std::process::exit(2);
        }
    };
    let server = match spawn_instance(&origin, 0, Some(layer.clone())).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bind: {e}");
            std::process::exit(2);
        }
    };
    let bound = common::memory_bound(capacity);
    println!(
        "soak --large: {seconds} s, {connections} connections, one in-memory instance, \
         capacity {}, distinct {} KB entries, bound 1.25 x capacity + 64 MiB = {}",
        mib(Some(capacity)),
        body / 1000,
        mib(Some(bound))
    );
    let load = Load {
        addrs: vec![server.addr],
        connections,
        duration: Duration::from_secs_f64(seconds),
        max_requests: 5_000_000,
        paths: Paths::Keys {
            prefix: "/k/".to_owned(),
            keys,
        },
        request_timeout: Duration::from_secs(10),
    };
    let rss_start = rss_bytes();
    let run = tokio::spawn(async move { closed_loop(&load).await });
    let started = Instant::now();
    let mut rss_max = rss_start.unwrap_or(0);
    println!(
        "{:>7} {:>12} {:>12} {:>14}",
        "t (s)", "rss", "origin calls", "layer bytes"
    );
    while !run.is_finished() {
        tokio::time::sleep(Duration::from_secs_f64(seconds / 10.0)).await;
        let rss = rss_bytes();
        rss_max = rss_max.max(rss.unwrap_or(0));
        println!(
            "{:>7.1} {:>12} {:>12} {:>14}",
            started.elapsed().as_secs_f64(),
            mib(rss),
            origin.calls(),
            mib(Some(layer.memory_bytes() as u64))
        );
    }
    let report = match run.await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("load task failed: {e}");
            std::process::exit(1);
        }
    };
    let rss_end = rss_bytes().unwrap_or(0);
    rss_max = rss_max.max(rss_end);
    let fed = origin.calls() * body as u64;
    let ok = rss_max <= bound && report.errors == 0;
    println!(
        "\nrequests        {} ({:.0}/s), errors {}",
        report.ok + report.errors,
        report.rps(),
        report.errors
    );
    println!(
        "fed             {} through a capacity of {}; layer holds {} ({} entries)",
        mib(Some(fed)),
        mib(Some(capacity)),
        mib(Some(layer.memory_bytes() as u64)),
        layer.entry_count()
    );
    println!(
        "rss             start {}, max {}, end {}; bound {}  {}",
        mib(rss_start),
        mib(Some(rss_max)),
        mib(Some(rss_end)),
        mib(Some(bound)),
        if ok { "ok" } else { "FAIL" }
    );
    if !ok {
        std::process::exit(1);
    }
}
