//! The origin of the origin-load bench: a slow handler on `/k/{key}` that
//! counts its calls and the calls in flight (with their peak), can fail on
//! command (an outage) and slow down past a knee (a database past its pool).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, Response, StatusCode};
use axum::routing::get;
use axum::Router;

/// What the bench reads and steers while the origin serves.
#[derive(Debug)]
pub(crate) struct MeteredOrigin {
    delay: Duration,
    cache_control: HeaderValue,
    body_bytes: usize,
    /// Past this many calls in flight each call takes proportionally longer
    /// (`delay × inflight / knee`); 0: never.
    knee: u64,
    failing: AtomicBool,
    /// Written into every body; raised when the origin heals, so a client
    /// can tell a fresh answer from one stored before the outage.
    generation: AtomicU64,
    calls: AtomicU64,
    inflight: AtomicU64,
    peak: AtomicU64,
}

impl MeteredOrigin {
    pub(crate) fn new(delay: Duration, cache_control: &str, body_bytes: usize) -> Self {
        Self {
            delay,
            cache_control: HeaderValue::from_str(cache_control)
                .unwrap_or_else(|_| panic!("{cache_control:?} is not a header value")),
            body_bytes,
            knee: 0,
            failing: AtomicBool::new(false),
            generation: AtomicU64::new(1),
            calls: AtomicU64::new(0),
            inflight: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    /// Slow down in proportion past `knee` calls in flight.
    pub(crate) fn with_knee(mut self, knee: u64) -> Self {
        self.knee = knee;
        self
    }

    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    pub(crate) fn inflight(&self) -> u64 {
        self.inflight.load(Ordering::SeqCst)
    }

    /// The most calls in flight at once since the last `take_peak`, and
    /// start the next span from the calls in flight now.
    pub(crate) fn take_peak(&self) -> u64 {
        self.peak
            .swap(self.inflight.load(Ordering::SeqCst), Ordering::SeqCst)
    }

    /// From now on every answer is `503`, `no-store`.
    pub(crate) fn fail(&self) {
        self.failing.store(true, Ordering::SeqCst);
    }

    /// Answer `200` again, with bodies of a new generation; returns it.
    pub(crate) fn heal(&self) -> u64 {
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        self.failing.store(false, Ordering::SeqCst);
        generation
    }

    fn delay_for(&self, inflight: u64) -> Duration {
        if self.knee == 0 || inflight <= self.knee {
            return self.delay;
        }
        self.delay.mul_f64(inflight as f64 / self.knee as f64)
    }
}

/// Lowers the in-flight count when the call ends, also when the caller
/// hangs up and the handler is dropped.
struct InFlight(Arc<MeteredOrigin>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn handle(State(o): State<Arc<MeteredOrigin>>, Path(key): Path<String>) -> Response<Body> {
    o.calls.fetch_add(1, Ordering::SeqCst);
    let now = o.inflight.fetch_add(1, Ordering::SeqCst) + 1;
    o.peak.fetch_max(now, Ordering::SeqCst);
    let _inflight = InFlight(Arc::clone(&o));
    tokio::time::sleep(o.delay_for(now)).await;
    // Whether the origin is down is decided when it answers: calls in
    // flight when it fails fail too.
    if o.failing.load(Ordering::SeqCst) {
        let mut r = Response::new(Body::from("origin down\n"));
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        return r;
    }
    let mut body = format!("gen={} key={key}\n", o.generation.load(Ordering::SeqCst));
    let pad = o.body_bytes.saturating_sub(body.len());
    body.extend(std::iter::repeat_n('x', pad));
    let mut r = Response::new(Body::from(body));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, o.cache_control.clone());
    r
}

/// Serve `origin` on a loopback port of the current runtime.
pub(crate) async fn serve(origin: &Arc<MeteredOrigin>) -> std::io::Result<SocketAddr> {
    let router = Router::new()
        .route("/k/{key}", get(handle))
        .with_state(Arc::clone(origin));
    // The task lives as long as the runtime: the bench's origin runtime.
    let (addr, _task) = super::origin::serve(router).await?;
    Ok(addr)
}

/// The generation a `gen=N key=…` body was made in.
pub(crate) fn body_generation(body: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(body.get(..body.len().min(32))?).ok()?;
    text.strip_prefix("gen=")?.split(' ').next()?.parse().ok()
}
