//! Instructions per L1 hit, next to the bare inner service: a count, not a
//! time, so it holds on a loaded machine and two runs agree.
//!
//! ```text
//! bash benches/hit_cost.sh            # builds, runs each path under callgrind, prints the table
//! ```
//! The binary alone runs one path N times (`hit_cost <path> <N>`); the script
//! runs each path twice (N and 2N requests) under
//! `valgrind --tool=callgrind --toggle-collect=*hit_cost*measure*` and divides
//! the difference by N, so set-up and the warm-up fill cancel out. Paths:
//! `bare` (the inner `service_fn`), `hit` (an L1 hit through `CacheService`),
//! `bare-axum` and `hit-axum` (the same as an axum `Router`). Every request
//! reads its whole body, as `hot_path`'s `tower` group does.
//!
//! With Redis (`HERDGUARD_BENCH_REDIS=redis://127.0.0.1:PORT/`; the script
//! starts a redis-server when one is installed): `redis-axum`, a Redis hit
//! with L1 off, and `bare-axum-rt`, its base. Both run in batches of
//! [`BATCH`] concurrent requests on a current-thread runtime: every request
//! of a batch is polled before any Redis reply is read, so each batch is
//! exactly one flight and one Redis lookup, its hits coalesced on it, and
//! the count is the same in every run.
#![allow(missing_docs, reason = "a bench binary")]

mod common;

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use axum::body::Body;
use axum::http::{header, Request, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use herdguard::service::RequestBody;
use herdguard::CacheLayer;
use tower::{Layer, Service, ServiceExt};

use common::hit::{body_len, origin_response, request};

const BODY_BYTES: usize = 512;
const USAGE: &str =
    "hit_cost <bare|hit|bare-axum|hit-axum|bare-axum-rt|redis-axum> <requests, a multiple of 40>";

/// Concurrent requests per batch in the runtime paths (`wrk -c64` on the
/// throughput bench coalesces about 30 hits per Redis lookup).
const BATCH: u64 = 40;

/// Poll once; a hit must be ready at once, so a `Pending` is a finding.
fn ready<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("a hit answered Pending: it waited on something"),
    }
}

/// The measured loop: callgrind collects only inside this function.
#[inline(never)]
fn measure<S, Req>(service: &S, make: impl Fn() -> Req, n: u64) -> usize
where
    S: Service<Req, Error = Infallible> + Clone,
    S::Response: IntoBody,
{
    let mut total = 0;
    for _ in 0..n {
        let r = ready(service.clone().oneshot(make())).unwrap_or_else(|e| match e {});
        total += ready(r.body_len());
    }
    black_box(total)
}

/// The measured loop of the runtime paths: `n / BATCH` batches of
/// [`BATCH`] concurrent requests, each run to its end.
#[inline(never)]
fn measure_batched<S, Req>(
    rt: &tokio::runtime::Runtime,
    service: &S,
    make: impl Fn() -> Req,
    n: u64,
) -> usize
where
    S: Service<Req, Error = Infallible> + Clone,
    S::Response: IntoBody,
{
    let mut total = 0;
    for _ in 0..n / BATCH {
        let batch = (0..BATCH).map(|_| async {
            let r = service.clone().oneshot(make()).await;
            r.unwrap_or_else(|e| match e {}).body_len().await
        });
        total += rt
            .block_on(futures_util::future::join_all(batch))
            .iter()
            .sum::<usize>();
    }
    black_box(total)
}

/// An axum Router behind a layer that keeps nothing in memory: every hit
/// is read from Redis at `url` (warmed by one fill, checked to be a hit).
fn redis_router(rt: &tokio::runtime::Runtime, router: Router, url: &str) -> Router {
    let opts = herdguard::RedisOptions::new(url)
        .namespace("hit-cost")
        .l1_ttl(std::time::Duration::ZERO);
    let layer = CacheLayer::builder()
        .redis(opts)
        .build()
        .unwrap_or_else(|e| panic!("layer: {e}"));
    let router = router.layer(layer);
    let _guard = rt.enter();
    for _ in 0..2 {
        let _ = rt.block_on(router.clone().oneshot(request()));
    }
    let r = rt.block_on(router.clone().oneshot(request()));
    let status = r.unwrap_or_else(|e| match e {});
    let status = status.headers().get("cache-status").cloned();
    assert!(
        status
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("hit")),
        "a Redis hit after the warm-up: {status:?}"
    );
    router
}

trait IntoBody {
    fn body_len(self) -> impl Future<Output = usize>;
}

impl<B: http_body::Body> IntoBody for Response<B>
where
    B::Error: std::fmt::Debug,
{
    fn body_len(self) -> impl Future<Output = usize> {
        body_len(self)
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(n)) = (args.next(), args.next().and_then(|n| n.parse::<u64>().ok()))
    else {
        eprintln!("usage: {USAGE}");
        std::process::exit(2);
    };
    // The runtime is for the warm-up fill only; measured hits never await.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"));
    let body = Bytes::from(vec![b'x'; BODY_BYTES]);
    let inner = tower::service_fn(move |_req: Request<RequestBody<Body>>| {
        let body = body.clone();
        async move { Ok::<_, Infallible>(origin_response(body)) }
    });
    let bytes = Bytes::from(vec![b'x'; BODY_BYTES]);
    let handler = move || {
        let bytes = bytes.clone();
        async move { ([(header::CACHE_CONTROL, "max-age=3600")], bytes) }
    };
    let total = match path.as_str() {
        "bare" => measure(&inner, || request().map(RequestBody::new), n),
        "hit" => {
            let cached = CacheLayer::new().layer(inner);
            let _guard = rt.enter();
            let warm = rt.block_on(cached.clone().oneshot(request()));
            let warm = warm.unwrap_or_else(|e| match e {});
            assert!(
                warm.headers().contains_key("cache-status"),
                "the layer answered"
            );
            measure(&cached, request, n)
        }
        "bare-axum" => {
            let router: Router = Router::new().route("/k/{key}", get(handler));
            measure(&router, request, n)
        }
        "hit-axum" => {
            let router: Router = Router::new()
                .route("/k/{key}", get(handler))
                .layer(CacheLayer::new());
            let _guard = rt.enter();
            let _ = rt.block_on(router.clone().oneshot(request()));
            measure(&router, request, n)
        }
        "bare-axum-rt" => {
            let router: Router = Router::new().route("/k/{key}", get(handler));
            measure_batched(&rt, &router, request, n)
        }
        "redis-axum" => {
            let Ok(url) = std::env::var("HERDGUARD_BENCH_REDIS") else {
                eprintln!("redis-axum: set HERDGUARD_BENCH_REDIS=redis://127.0.0.1:PORT/");
                std::process::exit(2);
            };
            let router = Router::new().route("/k/{key}", get(handler));
            let router = redis_router(&rt, router, &url);
            measure_batched(&rt, &router, request, n)
        }
        other => {
            eprintln!("unknown path {other:?}; usage: {USAGE}");
            std::process::exit(2);
        }
    };
    assert_eq!(
        total as u64,
        n * BODY_BYTES as u64,
        "every request read its whole body"
    );
}
