//! An origin 206 answering the cache's whole-object fill: it is
//! passed to the request that led, and it never switches caching off for
//! the URL (no pass marker), so the next plain GET fills and stores a 200.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use herdguard::service::RequestBody;
use herdguard::CacheLayer;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Layer, ServiceExt};

fn get() -> Request<()> {
    Request::get("http://r.test/object").body(()).unwrap()
}

/// The first call answers `bytes 0-4/10` with 5 bytes, every later one the
/// whole 200; both say max-age=3600.
fn origin(
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<RequestBody<()>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |_req: Request<RequestBody<()>>| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            let r = Response::builder().header("cache-control", "max-age=3600");
            let r = if n == 0 {
                r.status(206)
                    .header("content-range", "bytes 0-4/10")
                    .body(Full::new(Bytes::from_static(b"01234")))
            } else {
                r.body(Full::new(Bytes::from_static(b"0123456789")))
            };
            Ok::<_, Infallible>(r.unwrap())
        }
    })
}

#[tokio::test(start_paused = true)]
async fn origin_206_to_a_plain_get_sets_no_pass_marker() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = CacheLayer::builder()
        .build()
        .unwrap()
        .layer(origin(Arc::clone(&calls)));
    let first = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(first.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(first.headers()["content-range"], "bytes 0-4/10");
    for round in 0..3 {
        let r = svc.clone().oneshot(get()).await.unwrap();
        let status = r.headers()["cache-status"].to_str().unwrap().to_owned();
        // No marker: a plain miss, not hit-for-miss or hit-for-pass.
        assert!(!status.contains("hit-for"), "round {round}: {status}");
        assert_eq!(r.status(), StatusCode::OK, "{status}");
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"0123456789");
        if round > 0 {
            assert!(status.contains("hit"), "round {round}: {status}");
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2, "the 206, then one fill");
}
