//! The inner service's readiness: `CacheService` is always ready, a hit
//! never waits for the origin's (a `ConcurrencyLimit` with no permit free),
//! and each call that reaches the origin makes its clone ready first.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use herdguard::service::RequestBody;
use herdguard::CacheLayer;
use http_body_util::BodyExt;
use tower::{Layer, Service, ServiceExt};

fn req(method: Method, uri: &str) -> Request<Body> {
    let r = Request::builder().method(method).uri(uri);
    r.header("host", "example.test")
        .body(Body::empty())
        .unwrap()
}

fn status(h: &HeaderMap) -> &str {
    h.get("cache-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// An origin behind a limit of one call at a time whose `/slow` path holds
/// that one permit until `release` is notified; other paths answer at once
/// (cacheable). It counts its calls.
fn limited_origin(
    calls: Arc<AtomicUsize>,
    release: Arc<tokio::sync::Notify>,
) -> tower::limit::ConcurrencyLimit<
    impl Service<
            Request<RequestBody<Body>>,
            Response = Response<Body>,
            Error = Infallible,
            Future = impl Send,
        > + Clone
        + Send,
> {
    let origin = tower::service_fn(move |req: Request<RequestBody<Body>>| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        let release = Arc::clone(&release);
        async move {
            if req.uri().path() == "/slow" {
                release.notified().await;
            }
            let mut r = Response::new(Body::from(format!("call={n}")));
            r.headers_mut()
                .insert("cache-control", HeaderValue::from_static("max-age=60"));
            Ok::<_, Infallible>(r)
        }
    });
    tower::limit::ConcurrencyLimit::new(origin, 1)
}

/// Wait (at most 5 s of the test's clock) until the origin has been called
/// `n` times. It sleeps between looks, so a paused clock moves on too.
async fn until_called(calls: &AtomicUsize, n: usize) {
    let wait = async {
        while calls.load(Ordering::SeqCst) < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .expect("the origin was not called in time");
}

/// `second`, sent while a slow `/slow` call holds the origin's one permit:
/// it does not reach the origin for 5 s of the test's clock, and once the
/// slow call is let go, it does. Its answer.
async fn behind_the_slow_call<S, B>(
    cached: &S,
    calls: &AtomicUsize,
    release: &tokio::sync::Notify,
    second: Request<Body>,
) -> Response<B>
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    let slow = tokio::spawn(cached.clone().oneshot(req(Method::GET, "/slow")));
    until_called(calls, 1).await;
    let mut queued = tokio::spawn(cached.clone().oneshot(second));
    let early = tokio::time::timeout(Duration::from_secs(5), &mut queued).await;
    assert!(early.is_err(), "it went past the origin's limit");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    release.notify_one();
    slow.await.unwrap().unwrap();
    queued.await.unwrap().unwrap()
}

/// A hit does not wait for the origin's readiness: with the origin's one
/// permit held by a slow call, a stored answer is still served at once.
#[tokio::test(start_paused = true)]
async fn a_hit_is_served_while_the_origin_has_no_permit_free() {
    let calls = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    let cached = CacheLayer::new().layer(limited_origin(calls.clone(), release.clone()));
    let filled = cached
        .clone()
        .oneshot(req(Method::GET, "/a"))
        .await
        .unwrap();
    assert!(status(filled.headers()).contains("fwd=uri-miss"));
    let slow = tokio::spawn(cached.clone().oneshot(req(Method::GET, "/slow")));
    until_called(&calls, 2).await;
    let hit = tokio::time::timeout(
        Duration::from_secs(5),
        cached.clone().oneshot(req(Method::GET, "/a")),
    )
    .await
    .expect("the hit waited for the origin's permit")
    .unwrap();
    assert!(status(hit.headers()).contains("hit"));
    assert_eq!(
        hit.into_body().collect().await.unwrap().to_bytes(),
        "call=1"
    );
    release.notify_one();
    slow.await.unwrap().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A request past the cache makes the origin ready before calling it: a
/// POST waits for the slow call's permit (no panic from calling a service
/// that was never readied), then is answered by the origin.
#[tokio::test(start_paused = true)]
async fn a_bypass_waits_for_the_origin_to_be_ready() {
    let calls = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    let cached = CacheLayer::new().layer(limited_origin(calls.clone(), release.clone()));
    let answer = behind_the_slow_call(&cached, &calls, &release, req(Method::POST, "/a")).await;
    assert!(status(answer.headers()).contains("fwd=method"));
    assert_eq!(
        answer.into_body().collect().await.unwrap().to_bytes(),
        "call=2"
    );
}

/// The time a miss queued for the origin's readiness is not counted into
/// its answer's age: behind a slow call holding the one permit for 3 s
/// (real time: the age is computed from the wall clock), the answer stored
/// once the permit is free is served with `Age: 0` or 1, not 3.
#[tokio::test]
async fn the_wait_for_the_origins_readiness_does_not_age_the_answer() {
    let calls = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    let cached = CacheLayer::new().layer(limited_origin(calls.clone(), release.clone()));
    let slow = tokio::spawn(cached.clone().oneshot(req(Method::GET, "/slow")));
    until_called(&calls, 1).await;
    let queued = tokio::spawn(cached.clone().oneshot(req(Method::GET, "/b")));
    tokio::time::sleep(Duration::from_secs(3)).await;
    release.notify_one();
    slow.await.unwrap().unwrap();
    let filled = queued.await.unwrap().unwrap();
    assert!(status(filled.headers()).contains("fwd=uri-miss"));
    let hit = cached
        .clone()
        .oneshot(req(Method::GET, "/b"))
        .await
        .unwrap();
    assert!(status(hit.headers()).contains("hit"));
    let age: u64 = hit.headers()["age"].to_str().unwrap().parse().unwrap();
    assert!(age <= 1, "the queueing counted as age: Age {age}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A call outside any flight readies the origin too: with the one leader
/// permit held by a slow flight, a miss on another key goes to the origin
/// uncached (`detail=overloaded`), waits for the origin's permit, then is
/// answered by it (no panic from calling a service that was never readied).
#[tokio::test(start_paused = true)]
async fn a_call_past_the_leader_cap_waits_for_the_origin_to_be_ready() {
    let calls = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    let layer = CacheLayer::builder().leader_limit(1).build().unwrap();
    let cached = layer.layer(limited_origin(calls.clone(), release.clone()));
    let answer = behind_the_slow_call(&cached, &calls, &release, req(Method::GET, "/a")).await;
    assert_eq!(answer.status(), StatusCode::OK);
    assert!(status(answer.headers()).contains("detail=overloaded"));
    assert_eq!(
        answer.into_body().collect().await.unwrap().to_bytes(),
        "call=2"
    );
}

/// Two clones of a layered service whose inner one holds a reservation from
/// `poll_ready` (a permit, a slot): after a miss and then a hit on the first,
/// which then sits idle as a keep-alive connection would, the second
/// becomes ready. A hit must not keep a reservation (the layer never
/// readies its inner service for a hit at all).
async fn a_hit_gives_back_the_reservation<S, B>(mut first: S)
where
    S: Service<Request<Body>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    let mut second = first.clone();
    for _ in 0..2 {
        let r = first.ready().await.unwrap().call(req(Method::GET, "/r"));
        r.await.unwrap();
    }
    // The second clone's miss must reach the origin: a reservation kept
    // by the first clone would hold it back.
    let miss = second.ready().await.unwrap().call(req(Method::GET, "/r2"));
    let answered = tokio::time::timeout(Duration::from_secs(1), miss).await;
    let response = answered.expect("the first clone's hit kept the reservation");
    let response = response.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(status(response.headers()).contains("fwd=uri-miss"));
}

async fn reserved_origin(_: Request<RequestBody<Body>>) -> Result<Response<Body>, Infallible> {
    let mut r = Response::new(Body::from("x"));
    r.headers_mut()
        .insert("cache-control", HeaderValue::from_static("max-age=60"));
    Ok(r)
}

#[tokio::test(start_paused = true)]
async fn a_hit_releases_a_concurrency_limit_permit() {
    let inner = tower::limit::ConcurrencyLimit::new(tower::service_fn(reserved_origin), 1);
    a_hit_gives_back_the_reservation(CacheLayer::new().layer(inner)).await;
}

#[tokio::test(start_paused = true)]
async fn a_hit_releases_a_buffer_slot() {
    let inner = tower::buffer::Buffer::new(tower::service_fn(reserved_origin), 1);
    a_hit_gives_back_the_reservation(CacheLayer::new().layer(inner)).await;
}
