//! An origin for the origin-gate tests: the path picks the answer's
//! freshness, it can fail every call on demand (503 or a status the test
//! picks, `no-store`), `/slow/…`
//! paths wait until released, and it counts calls and the most in flight.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Response, StatusCode, Uri};
use axum::routing::get;
use axum::Router;
use tokio::sync::Semaphore;

/// See the module docs. Clones share everything.
#[derive(Clone)]
pub struct FaultyOrigin {
    calls: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    /// The status every call answers with while failing; 0 while healthy.
    failing: Arc<AtomicU16>,
    /// `/slow/…` calls take a permit each; the test adds them.
    slow: Arc<Semaphore>,
}

impl Default for FaultyOrigin {
    fn default() -> Self {
        Self::new()
    }
}

impl FaultyOrigin {
    pub fn new() -> Self {
        Self {
            calls: Arc::default(),
            in_flight: Arc::default(),
            peak: Arc::default(),
            failing: Arc::default(),
            slow: Arc::new(Semaphore::new(0)),
        }
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The most calls that were in flight at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// From now on every call answers 503 (`no-store`), or no longer.
    pub fn fail(&self, on: bool) {
        let status = if on { 503 } else { 0 };
        self.failing.store(status, Ordering::SeqCst);
    }

    /// From now on every call answers `status` (`no-store`).
    pub fn fail_with(&self, status: StatusCode) {
        self.failing.store(status.as_u16(), Ordering::SeqCst);
    }

    /// Let `n` waiting (or future) `/slow/…` calls answer.
    pub fn release(&self, n: usize) {
        self.slow.add_permits(n);
    }

    /// A router serving every path through `layer`.
    pub fn app<L>(&self, layer: L) -> Router
    where
        L: tower_layer::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
        L::Service:
            tower_service::Service<axum::http::Request<Body>> + Clone + Send + Sync + 'static,
        <L::Service as tower_service::Service<axum::http::Request<Body>>>::Response:
            axum::response::IntoResponse + 'static,
        <L::Service as tower_service::Service<axum::http::Request<Body>>>::Error:
            Into<Infallible> + 'static,
        <L::Service as tower_service::Service<axum::http::Request<Body>>>::Future: Send + 'static,
    {
        Router::new()
            .fallback(get(answer))
            .layer(layer)
            .with_state(self.clone())
    }
}

/// The freshness a path asks for: `/swr/…` stale-while-revalidate,
/// `/sie/…` stale-if-error, anything else `max-age=10`; `/short/…` and
/// `/sie/…` are fresh for 1 s only.
fn cache_control(path: &str) -> &'static str {
    if path.starts_with("/swr/") {
        "max-age=1, stale-while-revalidate=600"
    } else if path.starts_with("/sie/") {
        "max-age=1, stale-if-error=600"
    } else if path.starts_with("/short/") {
        "max-age=1"
    } else {
        "max-age=20"
    }
}

async fn answer(State(o): State<FaultyOrigin>, uri: Uri) -> Response<Body> {
    let n = o.calls.fetch_add(1, Ordering::SeqCst) + 1;
    let now = o.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    o.peak.fetch_max(now, Ordering::SeqCst);
    if uri.path().starts_with("/slow/") {
        if let Ok(permit) = o.slow.acquire().await {
            permit.forget();
        }
    }
    o.in_flight.fetch_sub(1, Ordering::SeqCst);
    let failing = o.failing.load(Ordering::SeqCst);
    if failing != 0 {
        let mut r = Response::new(Body::from(format!("down call={n}")));
        *r.status_mut() = StatusCode::from_u16(failing).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        r.headers_mut()
            .insert("cache-control", HeaderValue::from_static("no-store"));
        return r;
    }
    let mut r = Response::new(Body::from(format!("ok call={n} uri={uri}")));
    r.headers_mut().insert(
        "cache-control",
        HeaderValue::from_static(cache_control(uri.path())),
    );
    r
}
