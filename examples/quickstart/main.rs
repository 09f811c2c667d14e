//! The quickstart: an expensive handler behind herdguard, no Redis needed.
//! On start it fires a burst of concurrent requests at itself over loopback
//! and prints how many origin calls the burst cost, then keeps serving.
//!
//! ```text
//! cargo run --release --example quickstart
//! # burst: 1000 requests → 1 origin call (1000 at once over loopback, 1 distinct body, ...)
//! curl -i http://127.0.0.1:3000/report/7
//! curl http://127.0.0.1:3000/stats
//! ```
//! Options: `--exit` (or `HERDGUARD_EXIT=1`) exits after the burst;
//! `--burst-at HOST:PORT,HOST:PORT,...` starts no server and spreads the
//! burst over quickstarts already running (with Redis: several processes,
//! one origin call in total).
//!
//! Environment: `HERDGUARD_ADDR` (default 127.0.0.1:3000),
//! `HERDGUARD_ORIGIN_DELAY_MS` (default 200), `HERDGUARD_BURST` (requests in
//! the burst, default 1000; 0 skips it), and `HERDGUARD_REDIS_URL`
//! (e.g. `redis://127.0.0.1:6379`) to share one Redis between several
//! quickstart processes, so a cold key costs one origin call in all of them.
//! `HERDGUARD_REDIS_CLUSTER` does the same on a Redis Cluster: comma-separated
//! seed URLs, e.g. `redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002`.
//! `rediss://` URLs need `--features tls`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use herdguard::{CacheLayer, RedisOptions};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

#[derive(Clone)]
struct App {
    origin_calls: Arc<AtomicU64>,
    delay: Duration,
    cache: CacheLayer,
}

/// The deliberately expensive handler: a slow "database query".
async fn report(State(app): State<App>, Path(id): Path<String>) -> impl IntoResponse {
    let call = app.origin_calls.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(app.delay).await;
    let generated_at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    // A burst key stays fresh well past any burst, so the burst's count is
    // its own: not a refresh-ahead near the end of a 5 s freshness.
    let cache_control = if id.starts_with("burst-") {
        "max-age=60"
    } else {
        "max-age=5, stale-while-revalidate=30"
    };
    (
        [(header::CACHE_CONTROL, cache_control)],
        Json(json!({ "id": id, "origin_call": call, "generated_at_ms": generated_at_ms })),
    )
}

async fn stats(State(app): State<App>) -> impl IntoResponse {
    let s = app.cache.stats();
    Json(json!({
        "origin_calls": app.origin_calls.load(Ordering::SeqCst),
        "hit": s.hits,
        "stale": s.stale,
        "miss": s.misses,
        "coalesced": s.coalesced,
        "bypass": s.bypasses,
        "errors": s.errors,
    }))
}

/// The quickstart's app: `/report/{id}` behind `cache`, `/stats` beside it.
pub fn router(cache: CacheLayer, origin_delay: Duration) -> Router {
    let app = App {
        origin_calls: Arc::new(AtomicU64::new(0)),
        delay: origin_delay,
        cache: cache.clone(),
    };
    Router::new()
        .route("/report/{id}", get(report))
        .route_layer(cache)
        .route("/stats", get(stats))
        .with_state(app)
}

/// What one burst cost and how it went.
#[derive(Debug)]
pub struct Burst {
    /// Requests sent.
    pub requests: usize,
    /// Instances the burst was spread over.
    pub instances: usize,
    /// Requests in flight at once (bounded by the open-file limit).
    pub at_once: usize,
    /// Handler calls during the burst, summed over every instance's `/stats`.
    pub origin_calls: u64,
    /// Distinct response bodies: 1 when every request got the same answer.
    pub distinct_bodies: usize,
    /// Requests that failed or answered other than 200.
    pub errors: usize,
    /// Median latency.
    pub p50: Duration,
    /// Slowest latency.
    pub max: Duration,
}

impl Burst {
    /// The line the quickstart prints, e.g. `1000 requests → 1 origin call (...)`.
    pub fn line(&self) -> String {
        let over = match self.instances {
            1 => String::new(),
            n => format!(" over {n} instances"),
        };
        let s = if self.origin_calls == 1 { "" } else { "s" };
        format!(
            "{} requests{over} → {} origin call{s} ({} at once over loopback, {} distinct body, p50 {} ms, max {} ms, {} errors)",
            self.requests,
            self.origin_calls,
            self.at_once,
            self.distinct_bodies,
            self.p50.as_millis(),
            self.max.as_millis(),
            self.errors,
        )
    }
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// GET `http://{target}{path}` with a fixed `Host`, so every instance keys
/// the request alike whatever port it listens on. At most 10 s.
async fn fetch(client: &HttpClient, target: &str, path: &str) -> Result<(u16, Bytes), String> {
    let request = http::Request::get(format!("http://{target}{path}"))
        .header(header::HOST, "quickstart.local")
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let go = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok((status, body.to_bytes()))
    };
    tokio::time::timeout(Duration::from_secs(10), go)
        .await
        .map_err(|_| format!("no answer from {target} within 10 s"))?
}

async fn origin_calls(client: &HttpClient, targets: &[String]) -> Result<u64, String> {
    let mut sum = 0;
    for t in targets {
        let (_, body) = fetch(client, t, "/stats").await?;
        let stats: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| format!("/stats of {t}: {e}"))?;
        sum += stats["origin_calls"]
            .as_u64()
            .ok_or_else(|| format!("/stats of {t} has no origin_calls"))?;
    }
    Ok(sum)
}

/// Soft open-file limit (Linux; elsewhere assume the common 256).
fn open_file_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).map(str::to_owned))
        })
        .and_then(|soft| soft.parse().ok())
        .unwrap_or(256)
}

/// How many requests may be in flight at once: one socket each, two when
/// client and server share this process, with room to spare.
pub fn burst_width(requests: usize, same_process: bool) -> usize {
    let sockets = open_file_limit().saturating_sub(100);
    let per_request = if same_process { 2 } else { 1 };
    requests.min(sockets / per_request).max(1)
}

/// Fire `requests` concurrent GETs of one cold key, spread round-robin over
/// `targets`, at most `at_once` in flight, and count the origin calls.
pub async fn burst(targets: &[String], requests: usize, at_once: usize) -> Result<Burst, String> {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let nonce = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let path = format!("/report/burst-{nonce}");
    let before = origin_calls(&client, targets).await?;
    let permits = Arc::new(tokio::sync::Semaphore::new(at_once));
    let tasks: Vec<_> = (0..requests)
        .map(|i| {
            let (client, permits, path) = (client.clone(), permits.clone(), path.clone());
            let target = targets[i % targets.len()].clone();
            tokio::spawn(async move {
                let _permit = permits.acquire_owned().await;
                let started = Instant::now();
                let answer = fetch(&client, &target, &path).await;
                (answer, started.elapsed())
            })
        })
        .collect();
    let (mut bodies, mut latencies, mut errors) = (HashSet::new(), Vec::new(), 0);
    let mut first_error = None;
    for task in tasks {
        match task.await {
            Ok((Ok((200, body)), took)) => {
                bodies.insert(body);
                latencies.push(took);
            }
            Ok((Ok((status, _)), _)) => {
                errors += 1;
                first_error.get_or_insert(format!("status {status}"));
            }
            Ok((Err(e), _)) => {
                errors += 1;
                first_error.get_or_insert(e);
            }
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    if let Some(e) = first_error {
        eprintln!("burst: {errors} requests failed, first: {e} (too many open files? raise `ulimit -n` or lower HERDGUARD_BURST)");
    }
    let after = origin_calls(&client, targets).await?;
    latencies.sort();
    Ok(Burst {
        requests,
        instances: targets.len(),
        at_once,
        origin_calls: after.saturating_sub(before),
        distinct_bodies: bodies.len(),
        errors,
        p50: latencies
            .get(latencies.len() / 2)
            .copied()
            .unwrap_or_default(),
        max: latencies.last().copied().unwrap_or_default(),
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let args: Vec<String> = std::env::args().skip(1).collect();
    let exit =
        args.iter().any(|a| a == "--exit") || env("HERDGUARD_EXIT").is_some_and(|v| v != "0");
    let burst_at = args
        .iter()
        .position(|a| a == "--burst-at")
        .map(|i| {
            args.get(i + 1)
                .cloned()
                .ok_or("--burst-at needs HOST:PORT,...")
        })
        .transpose()?;
    let requests: usize = match env("HERDGUARD_BURST") {
        Some(v) => v
            .parse()
            .map_err(|_| format!("HERDGUARD_BURST must be a number, got {v:?}"))?,
        None => 1000,
    };

    if let Some(list) = burst_at {
        let targets: Vec<String> = list.split(',').map(|t| t.trim().to_owned()).collect();
        let at_once = burst_width(requests.max(1), false);
        println!(
            "{}",
            burst(&targets, requests.max(1), at_once).await?.line()
        );
        return Ok(());
    }

    let addr = env("HERDGUARD_ADDR").unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let delay_ms: u64 = match env("HERDGUARD_ORIGIN_DELAY_MS") {
        Some(v) => v
            .parse()
            .map_err(|_| format!("HERDGUARD_ORIGIN_DELAY_MS must be a number, got {v:?}"))?,
        None => 200,
    };
    let redis = match (env("HERDGUARD_REDIS_CLUSTER"), env("HERDGUARD_REDIS_URL")) {
        (Some(_), Some(_)) => {
            return Err("set HERDGUARD_REDIS_CLUSTER or HERDGUARD_REDIS_URL, not both".into())
        }
        (Some(list), None) => Some(RedisOptions::cluster(
            list.split(',').map(str::trim).filter(|u| !u.is_empty()),
        )),
        (None, Some(url)) => Some(RedisOptions::new(url)),
        (None, None) => None,
    };
    let store = match &redis {
        Some(o) if o.is_cluster() => "redis cluster + in-memory L1",
        Some(_) => "redis + in-memory L1",
        None => "in-memory",
    };
    let mut builder = CacheLayer::builder();
    if let Some(options) = redis {
        builder = builder.redis(options.namespace("quickstart"));
    }
    let router = router(builder.build()?, Duration::from_millis(delay_ms));

    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("herdguard quickstart ({store}) on http://{local}");
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    if requests > 0 {
        let at_once = burst_width(requests, true);
        println!(
            "{}",
            burst(&[local.to_string()], requests, at_once).await?.line()
        );
    }
    if exit {
        return Ok(());
    }
    println!("serving; try: curl -i http://{local}/report/7 ; then: curl http://{local}/stats");
    server.await??;
    Ok(())
}

// The example's own tests (cargo test runs them: `test = true` in Cargo.toml).
#[cfg(test)]
mod tests;
