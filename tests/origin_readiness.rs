//! The inner service's readiness: `CacheService` is always ready, a hit
//! never waits for the origin's (a `ConcurrencyLimit` with no permit free),
//! and each call that reaches the origin makes its clone ready first.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, Request, Response};
use herdguard::{CacheLayer, RequestBody};
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
    let slow = tokio::spawn(cached.clone().oneshot(req(Method::GET, "/slow")));
    until_called(&calls, 1).await;
    let mut post = tokio::spawn(cached.clone().oneshot(req(Method::POST, "/a")));
    let early = tokio::time::timeout(Duration::from_secs(5), &mut post).await;
    assert!(early.is_err(), "the POST went past the origin's limit");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    release.notify_one();
    slow.await.unwrap().unwrap();
    let answer = post.await.unwrap().unwrap();
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
