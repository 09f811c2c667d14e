//! The slow origin the benches put herdguard in front of, and app instances
//! (axum servers on 127.0.0.1:0) that each own their layer.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, Response};
use axum::routing::get;
use axum::serve::ListenerExt;
use axum::Router;
use bytes::Bytes;
use herdguard::CacheLayer;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The instant every bench timestamp that crosses the wire is relative to.
pub(crate) fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Outermost middleware: stamp when the server-side stack (herdguard
/// included) produced the response, before hyper writes it. Waiter release
/// measured to here excludes the loopback and client costs that dominate
/// the client-side number on a small machine.
async fn stamp_ready(mut r: axum::response::Response) -> axum::response::Response {
    let us = epoch().elapsed().as_micros() as u64;
    r.headers_mut()
        .insert("x-bench-ready-us", HeaderValue::from(us));
    r
}

/// Where "one origin call per key per window" is counted: per instance when
/// each instance caches alone, across the cluster when they share Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    Instance,
    Cluster,
}

/// A handler that sleeps, counts its calls and notes when each call returned.
#[derive(Debug)]
pub(crate) struct Origin {
    calls: AtomicU64,
    delay: Duration,
    cache_control: HeaderValue,
    body: Bytes,
    /// Every response gets its own copy of the body, as from a real upstream
    /// (a shared `Bytes` would make every stored entry one allocation).
    copy_body: bool,
    /// `(instance, when the handler returned)`: the fill instant waiters are
    /// measured against. `None` for long runs, where it would grow without bound.
    fills: Option<Mutex<Vec<(usize, Instant)>>>,
    windows: Option<KeyWindows>,
}

impl Origin {
    /// An origin for short scenarios: records every fill instant.
    pub(crate) fn new(delay: Duration, cache_control: &'static str, body_bytes: usize) -> Self {
        Self {
            calls: AtomicU64::new(0),
            delay,
            cache_control: HeaderValue::from_static(cache_control),
            body: Bytes::from(vec![b'x'; body_bytes]),
            copy_body: false,
            fills: Some(Mutex::new(Vec::with_capacity(1024))),
            windows: None,
        }
    }

    /// An origin for long runs over `/k/{0..keys}`: no fill log, but a
    /// fixed-size per-key record of calls within each freshness window.
    pub(crate) fn tracking_keys(
        delay: Duration,
        cache_control: &'static str,
        body_bytes: usize,
        instances: usize,
        keys: u32,
        window: Duration,
        scope: Scope,
    ) -> Self {
        Self {
            fills: None,
            windows: Some(KeyWindows::new(instances, keys, window, scope)),
            ..Self::new(delay, cache_control, body_bytes)
        }
    }

    /// Serve each response from a body of its own (memory measurements).
    pub(crate) fn copying_bodies(mut self) -> Self {
        self.copy_body = true;
        self
    }

    /// Origin calls so far.
    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Fill instants recorded so far.
    pub(crate) fn fills(&self) -> Vec<(usize, Instant)> {
        self.fills.as_ref().map_or_else(Vec::new, |f| {
            f.lock().unwrap_or_else(PoisonError::into_inner).clone()
        })
    }

    /// Per-key window statistics (long runs only).
    pub(crate) fn windows(&self) -> Option<&KeyWindows> {
        self.windows.as_ref()
    }

    /// The response body every call serves.
    pub(crate) fn body(&self) -> Bytes {
        self.body.clone()
    }
}

/// Most origin calls seen for one key inside one freshness window, kept in
/// a table allocated up front so it does not move the soak's RSS.
#[derive(Debug)]
pub(crate) struct KeyWindows {
    window: Duration,
    keys: u32,
    scope: Scope,
    /// The last few call instants per (scope, key); a correct cache needs one.
    recent: Vec<Mutex<[Option<Instant>; 4]>>,
    max_in_window: AtomicU64,
    /// Keys (per scope) that ever saw more than one call in a window.
    violations: AtomicU64,
    min_gap_us: AtomicU64,
}

impl KeyWindows {
    fn new(instances: usize, keys: u32, window: Duration, scope: Scope) -> Self {
        let slots = match scope {
            Scope::Instance => instances.max(1) * keys as usize,
            Scope::Cluster => keys as usize,
        };
        Self {
            window,
            keys,
            scope,
            recent: (0..slots).map(|_| Mutex::new([None; 4])).collect(),
            max_in_window: AtomicU64::new(0),
            violations: AtomicU64::new(0),
            min_gap_us: AtomicU64::new(u64::MAX),
        }
    }

    fn record(&self, instance: usize, key: u32, at: Instant) {
        if key >= self.keys {
            return;
        }
        let slot = match self.scope {
            Scope::Instance => instance * self.keys as usize + key as usize,
            Scope::Cluster => key as usize,
        };
        let Some(cell) = self.recent.get(slot) else {
            return;
        };
        let mut recent = cell.lock().unwrap_or_else(PoisonError::into_inner);
        let mut in_window = 1;
        let mut newest: Option<Instant> = None;
        for t in recent.iter().flatten() {
            if at.saturating_duration_since(*t) < self.window {
                in_window += 1;
            }
            newest = Some(newest.map_or(*t, |n| n.max(*t)));
        }
        if let Some(n) = newest {
            let gap = at.saturating_duration_since(n).as_micros() as u64;
            self.min_gap_us.fetch_min(gap, Ordering::Relaxed);
        }
        // Replace the oldest (or an empty) record.
        let oldest = (0..recent.len())
            .min_by_key(|&i| recent[i])
            .unwrap_or_else(|| unreachable!("the array is not empty"));
        recent[oldest] = Some(at);
        drop(recent);
        self.max_in_window.fetch_max(in_window, Ordering::Relaxed);
        if in_window > 1 {
            self.violations.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The most calls for one key inside one window (a correct cache: 1).
    pub(crate) fn max_in_window(&self) -> u64 {
        self.max_in_window.load(Ordering::Relaxed)
    }

    /// Calls that came less than a window after the previous call for their key.
    pub(crate) fn violations(&self) -> u64 {
        self.violations.load(Ordering::Relaxed)
    }

    /// The shortest gap between two calls for one key, if any key had two.
    pub(crate) fn min_gap(&self) -> Option<Duration> {
        match self.min_gap_us.load(Ordering::Relaxed) {
            u64::MAX => None,
            us => Some(Duration::from_micros(us)),
        }
    }
}

#[derive(Debug, Clone)]
struct Handler {
    origin: Arc<Origin>,
    instance: usize,
}

async fn handle(State(h): State<Handler>, Path(key): Path<String>) -> Response<Body> {
    let o = &h.origin;
    let started = Instant::now();
    o.calls.fetch_add(1, Ordering::SeqCst);
    if let (Some(w), Ok(k)) = (&o.windows, key.parse::<u32>()) {
        w.record(h.instance, k, started);
    }
    if !o.delay.is_zero() {
        tokio::time::sleep(o.delay).await;
    }
    let body = if o.copy_body {
        Bytes::copy_from_slice(&o.body)
    } else {
        o.body.clone()
    };
    let mut r = Response::new(Body::from(body));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, o.cache_control.clone());
    if let Some(fills) = &o.fills {
        fills
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((h.instance, Instant::now()));
    }
    r
}

/// The origin's routes (`/k/{key}`) as instance `instance` serves them.
pub(crate) fn origin_router(origin: &Arc<Origin>, instance: usize) -> Router {
    Router::new()
        .route("/k/{key}", get(handle))
        .with_state(Handler {
            origin: Arc::clone(origin),
            instance,
        })
}

/// A running axum server on a loopback port; dropping it stops accepting.
#[derive(Debug)]
pub(crate) struct Instance {
    pub(crate) addr: SocketAddr,
    pub(crate) layer: Option<CacheLayer>,
    task: JoinHandle<()>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        // Open connections end when the bench's clients close them.
        self.task.abort();
    }
}

/// Serve `router` on 127.0.0.1:0 with TCP_NODELAY.
pub(crate) async fn serve(router: Router) -> io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            eprintln!("server on {addr} stopped: {e}");
        }
    });
    Ok((addr, task))
}

/// One app instance in front of `origin`, with its own layer (or none).
pub(crate) async fn spawn_instance(
    origin: &Arc<Origin>,
    instance: usize,
    layer: Option<CacheLayer>,
) -> io::Result<Instance> {
    let router = origin_router(origin, instance);
    let router = match &layer {
        Some(l) => router.layer(l.clone()),
        None => router,
    };
    let router = router.layer(axum::middleware::map_response(stamp_ready));
    let (addr, task) = serve(router).await?;
    Ok(Instance { addr, layer, task })
}
