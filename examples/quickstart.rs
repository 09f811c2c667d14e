//! The quickstart: an expensive handler behind herdguard, no Redis needed.
//!
//! ```text
//! cargo run --release --example quickstart
//! curl -i http://127.0.0.1:3000/report/7
//! curl http://127.0.0.1:3000/stats
//! ```
//! Environment: `HERDGUARD_ADDR` (default 127.0.0.1:3000),
//! `HERDGUARD_ORIGIN_DELAY_MS` (default 200), and `HERDGUARD_REDIS_URL`
//! (e.g. `redis://127.0.0.1:6379`) to share one Redis between several
//! quickstart processes, so a cold key costs one origin call in all of them.
//! `HERDGUARD_REDIS_CLUSTER` does the same on a Redis Cluster: comma-separated
//! seed URLs, e.g. `redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002`.
//! `rediss://` URLs need `--features tls`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use herdguard::{CacheLayer, RedisOptions};
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
    (
        [(
            header::CACHE_CONTROL,
            "max-age=5, stale-while-revalidate=30",
        )],
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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("HERDGUARD_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let delay_ms: u64 = match std::env::var("HERDGUARD_ORIGIN_DELAY_MS") {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("HERDGUARD_ORIGIN_DELAY_MS must be a number, got {v:?}"))?,
        Err(_) => 200,
    };
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
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
    let cache = builder.build()?;
    let app = App {
        origin_calls: Arc::new(AtomicU64::new(0)),
        delay: Duration::from_millis(delay_ms),
        cache: cache.clone(),
    };
    let router = Router::new()
        .route("/report/{id}", get(report))
        .route_layer(cache)
        .route("/stats", get(stats))
        .with_state(app);

    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!(
        "herdguard quickstart ({store}) on http://{local} — try: curl -i http://{local}/report/7 ; then: curl http://{local}/stats"
    );
    axum::serve(listener, router).await?;
    Ok(())
}
