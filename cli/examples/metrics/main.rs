//! The quickstart with a Prometheus endpoint: herdguard's metrics (cache
//! outcomes, origin calls, waits, leases, fencing, Redis health) on
//! `/metrics`, served by the same axum router.
//!
//! ```text
//! cargo run --example metrics
//! curl -i http://127.0.0.1:3000/report/7
//! curl http://127.0.0.1:3000/metrics
//! ```
//! Environment, as in the quickstart: `HERDGUARD_ADDR` (default
//! 127.0.0.1:3000), `HERDGUARD_ORIGIN_DELAY_MS` (default 200), and
//! `HERDGUARD_REDIS_URL` to share one Redis between several processes (the
//! lease, fence and Redis metrics only appear with Redis).
//!
//! The table in docs/operations.md, "Reading the metrics", lists every
//! metric and its labels.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use herdguard::{CacheLayer, RedisOptions};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::json;

/// Install the Prometheus recorder for this process.
///
/// Call it before building the cache layer: metrics recorded earlier (such
/// as `herdguard_redis_available`, set when the layer is built) go nowhere.
/// Histograms get buckets, so several instances can be aggregated.
pub fn install_prometheus() -> Result<PrometheusHandle, BuildError> {
    const SECONDS: &[f64] = &[
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ];
    const BYTES: &[f64] = &[
        256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 8388608.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), SECONDS)?
        .set_buckets_for_metric(
            Matcher::Full(herdguard::metrics::names::ENTRY_BYTES.to_owned()),
            BYTES,
        )?
        .install_recorder()?;
    // Help lines for every herdguard metric.
    herdguard::metrics::describe_metrics();
    Ok(handle)
}

#[derive(Clone)]
struct App {
    origin_calls: Arc<AtomicU64>,
    delay: Duration,
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

/// `/report/{id}` behind the cache, `/metrics` beside it (not cached).
pub fn router(cache: CacheLayer, origin_delay: Duration, prometheus: PrometheusHandle) -> Router {
    let app = App {
        origin_calls: Arc::new(AtomicU64::new(0)),
        delay: origin_delay,
    };
    let cached = Router::new()
        .route("/report/{id}", get(report))
        .route_layer(cache)
        .with_state(app);
    let metrics = Router::new().route(
        "/metrics",
        get(move || {
            let body = prometheus.render();
            async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body) }
        }),
    );
    cached.merge(metrics)
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
    let redis_url = std::env::var("HERDGUARD_REDIS_URL")
        .ok()
        .filter(|u| !u.is_empty());

    let prometheus = install_prometheus()?;
    // Without an HTTP listener of its own, the exporter relies on us to
    // trim histogram buffers between scrapes.
    let upkeep = prometheus.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });

    let mut builder = CacheLayer::builder();
    if let Some(url) = &redis_url {
        builder = builder.redis(RedisOptions::new(url.as_str()).namespace("quickstart"));
    }
    let cache = builder.build()?;
    let app = router(cache, Duration::from_millis(delay_ms), prometheus);

    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    let store = if redis_url.is_some() {
        "redis + in-memory L1"
    } else {
        "in-memory"
    };
    println!(
        "herdguard metrics example ({store}) on http://{local} — try: curl -i http://{local}/report/7 ; then: curl http://{local}/metrics"
    );
    axum::serve(listener, app).await?;
    Ok(())
}

// The example's own tests (cargo test runs them: `test = true` in Cargo.toml).
#[cfg(test)]
mod tests;
