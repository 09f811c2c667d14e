//! What a cold burst costs Redis: P instances (each its own `CacheLayer`,
//! as separate processes would be) on one redis-server the bench starts,
//! `--requests` (100) concurrent GETs per instance of one cold key, an
//! origin that answers after `--origin-delay-ms` (200).
//!
//! ```text
//! cargo bench --bench redis_cost
//! cargo bench --bench redis_cost -- --instances 1,4,16 --requests 100 --origin-delay-ms 200 --runs 3
//! ```
//!
//! Redis commands are the sum of `calls` over `INFO commandstats` (commands
//! run inside Lua scripts included), reset before each burst; the bench's
//! own INFO/CONFIG and the subscriber's liveness PING are left out. Each
//! instance is warmed first (connections, scripts, fill subscriber), so the
//! counts are per key, not per process start. Columns: origin calls; Redis
//! commands in all, per instance, for the leader's whole fill (the P=1 row)
//! and per waiting instance; waiter latency after the fill: completion of
//! each request on a non-leading instance minus the moment the origin
//! call returned (p50/p99).
//!
//! Then the leader's cost as entries grow: one cold fill with T
//! `Surrogate-Key` tags, and N `Vary: Accept-Language` variants of one URL.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, Request, Response};
use axum::routing::get;
use axum::Router;
use deadpool_redis::redis;
use herdguard::{CacheLayer, RedisOptions};
use http_body_util::BodyExt;
use tower::ServiceExt;

use common::args::Args;
use common::redis::RedisServer;

const USAGE: &str = "cargo bench --bench redis_cost -- [--instances 1,4,16] [--requests 100] \
[--origin-delay-ms 200] [--runs 3]";

/// Commands the bench sends itself, and the idle subscriber's PING.
const OURS: &[&str] = &[
    "info",
    "config|resetstat",
    "ping",
    "pubsub|shardnumsub",
    "pubsub|shardchannels",
];

/// The origin: counts calls, stamps when each call returned.
#[derive(Clone)]
struct Origin {
    calls: Arc<AtomicUsize>,
    returned: Arc<Mutex<Option<Instant>>>,
    delay: Duration,
    headers: Arc<Vec<(String, String)>>,
}

impl Origin {
    fn app(&self, layer: CacheLayer) -> Router {
        let me = self.clone();
        Router::new()
            .fallback(get(move |h: HeaderMap| {
                let me = me.clone();
                async move {
                    me.calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(me.delay).await;
                    let lang = h
                        .get("accept-language")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_owned();
                    let mut r = Response::builder().header("cache-control", "max-age=60");
                    for (k, v) in me.headers.iter() {
                        r = r.header(k, v);
                    }
                    *me.returned.lock().unwrap() = Some(Instant::now());
                    r.body(Body::from(format!("{lang} {}", "x".repeat(512))))
                        .unwrap()
                }
            }))
            .layer(layer)
    }
}

async fn send(app: &Router, uri: &str, lang: Option<&str>) -> Instant {
    let mut r = Request::get(uri).header("host", "bench.test");
    if let Some(l) = lang {
        r = r.header("accept-language", l);
    }
    let resp = app
        .clone()
        .oneshot(r.body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert!(resp.status().is_success());
    let _ = resp.into_body().collect().await.unwrap();
    Instant::now()
}

async fn commandstats(c: &mut redis::aio::MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (!OURS.contains(&name)).then(|| (name.to_owned(), calls))
        })
        .collect()
}

async fn reset(c: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(c)
        .await
        .unwrap();
}

fn layer(url: &str) -> CacheLayer {
    CacheLayer::builder()
        .redis(RedisOptions::new(url).namespace("cost"))
        .build()
        .unwrap()
}

struct BurstResult {
    origin_calls: usize,
    commands: u64,
    waiter_after_fill: Vec<Duration>,
}

/// `per` concurrent requests on each app for `uri`; the instance whose
/// origin is called leads.
async fn burst(
    c: &mut redis::aio::MultiplexedConnection,
    origins: &[Origin],
    apps: &[Router],
    uri: &str,
    per: usize,
) -> BurstResult {
    // One counter, shared by every instance's origin.
    let before = origins[0].calls.load(Ordering::SeqCst);
    for o in origins {
        *o.returned.lock().unwrap() = None;
    }
    reset(c).await;
    let mut tasks = Vec::new();
    for (i, app) in apps.iter().enumerate() {
        for _ in 0..per {
            let (app, uri) = (app.clone(), uri.to_owned());
            tasks.push((i, tokio::spawn(async move { send(&app, &uri, None).await })));
        }
    }
    let mut done = Vec::new();
    for (i, t) in tasks {
        done.push((i, t.await.unwrap()));
    }
    // The leader's purge index is written in the background.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let commands = commandstats(c).await.values().sum();
    let leaders: Vec<usize> = (0..origins.len())
        .filter(|&i| origins[i].returned.lock().unwrap().is_some())
        .collect();
    let returned = leaders
        .iter()
        .filter_map(|&i| *origins[i].returned.lock().unwrap())
        .min();
    let waiter_after_fill = match returned {
        Some(at) => done
            .iter()
            .filter(|(i, _)| !leaders.contains(i))
            .map(|(_, t)| t.saturating_duration_since(at))
            .collect(),
        None => Vec::new(),
    };
    let after = origins[0].calls.load(Ordering::SeqCst);
    BurstResult {
        origin_calls: after - before,
        commands,
        waiter_after_fill,
    }
}

fn origins(n: usize, delay: Duration, headers: Vec<(String, String)>) -> Vec<Origin> {
    let calls = Arc::new(AtomicUsize::new(0));
    let headers = Arc::new(headers);
    (0..n)
        .map(|_| Origin {
            calls: calls.clone(),
            returned: Arc::default(),
            delay,
            headers: headers.clone(),
        })
        .collect()
}

fn quantile(v: &mut [Duration], q: f64) -> String {
    common::quantile(v, q).map_or_else(|| "-".to_owned(), common::ms)
}

/// A fresh redis-server, `p` warmed instances; one cold burst per run.
async fn row(p: usize, per: usize, delay: Duration, runs: usize, leader_alone: Option<u64>) -> u64 {
    let server = RedisServer::start().expect("redis-server");
    let url = format!("redis://{}/", server.addr);
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let origins = origins(p, delay, Vec::new());
    let apps: Vec<Router> = origins.iter().map(|o| o.app(layer(&url))).collect();
    // Warm-up: every connection, the scripts, every fill subscriber.
    burst(&mut c, &origins, &apps, "/warm", 5).await;
    let mut counts = Vec::new();
    let mut calls = Vec::new();
    let mut lat = Vec::new();
    for run in 0..runs {
        let r = burst(&mut c, &origins, &apps, &format!("/cold/{run}"), per).await;
        counts.push(r.commands);
        calls.push(r.origin_calls);
        lat.extend(r.waiter_after_fill);
    }
    counts.sort_unstable();
    let median = counts[counts.len() / 2];
    let per_waiter = match (p, leader_alone) {
        (1, _) | (_, None) => "-".to_owned(),
        (p, Some(l)) => format!("{:.1}", (median as f64 - l as f64) / (p - 1) as f64),
    };
    println!(
        "| {p} | {} | {median} [{}–{}] | {:.1} | {} | {} | {} |",
        calls
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        counts[0],
        counts[counts.len() - 1],
        median as f64 / p as f64,
        per_waiter,
        quantile(&mut lat, 0.5),
        quantile(&mut lat, 0.99),
    );
    median
}

/// One cold fill on one instance, `headers` on the answer, `langs` variants.
async fn leader_cost(headers: Vec<(String, String)>, langs: &[&str]) -> u64 {
    let server = RedisServer::start().expect("redis-server");
    let url = format!("redis://{}/", server.addr);
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let origins = origins(1, Duration::from_millis(1), headers);
    let app = origins[0].app(layer(&url));
    // Warm-up on another URL with the same shape.
    for l in langs {
        send(&app, "/warm", Some(l)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    reset(&mut c).await;
    for l in langs {
        send(&app, "/item", Some(l)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    commandstats(&mut c).await.values().sum()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse(&["instances", "requests", "origin-delay-ms", "runs"], USAGE);
    let instances: Vec<usize> = args
        .value("instances")
        .unwrap_or("1,4,16")
        .split(',')
        .map(|s| s.trim().parse().expect("--instances 1,4,16"))
        .collect();
    let per: usize = args.get("requests", 100);
    let delay = Duration::from_millis(args.get("origin-delay-ms", 200));
    let runs: usize = args.get("runs", 3).max(1);
    println!(
        "redis_cost: {per} requests per instance, origin {} ms, {runs} runs per row (median [min–max])",
        delay.as_millis()
    );
    println!("| instances | origin calls | Redis commands | per instance | per waiting instance | waiter after fill p50 ms | p99 ms |");
    println!("|---|---|---|---|---|---|---|");
    let mut leader = None;
    for p in instances {
        let total = row(p, per, delay, runs, leader).await;
        if p == 1 {
            leader = Some(total);
        }
    }
    println!();
    println!("leader's whole fill (one instance, one cold key), by tags and Vary variants:");
    println!("| entry | Redis commands | per variant |");
    println!("|---|---|---|");
    for tags in [0usize, 1, 4, 16] {
        let headers = if tags == 0 {
            Vec::new()
        } else {
            let list: Vec<String> = (0..tags).map(|t| format!("tag{t}")).collect();
            vec![("surrogate-key".to_owned(), list.join(" "))]
        };
        let n = leader_cost(headers, &["en"]).await;
        println!("| {tags} tags | {n} | - |");
    }
    let langs = ["en", "de", "fr", "it", "es", "nl", "pt", "sv"];
    for variants in [1usize, 2, 8] {
        let headers = vec![("vary".to_owned(), "accept-language".to_owned())];
        let n = leader_cost(headers, &langs[..variants]).await;
        println!(
            "| Vary, {variants} variants | {n} | {:.1} |",
            n as f64 / variants as f64
        );
    }
}
