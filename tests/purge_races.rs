//! A purge beats a fill that was already running when it came: the fill's
//! answer still goes to the requests waiting on it, but it is not stored, so
//! the purge is not silently undone. In memory (paused time) and across two
//! instances on a real redis-server.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use herdguard::purge::Purged;
use herdguard::redlock::FencedStore;
use herdguard::{Cache, CacheKey, CacheLayer, RedisOptions};
use support::origin::{cache_status, get_req, send, Origin};
use support::RedisServer;
use tower::{Service, ServiceExt};

fn url() -> http::Uri {
    "http://example.test/r".parse().unwrap()
}

fn body_call(body: &Bytes) -> String {
    let s = String::from_utf8_lossy(body);
    s.split_whitespace()
        .find(|w| w.starts_with("call="))
        .unwrap_or_default()
        .to_owned()
}

/// Memory only: GET with a 1 s origin, PURGE 300 ms later; the waiting requests get that fill, and the next request goes to the origin.
#[tokio::test(start_paused = true)]
async fn purge_beats_an_in_flight_fill_in_memory() {
    let origin = Origin::new(&[("cache-control", "max-age=60")]).delay(Duration::from_secs(1));
    let cache = CacheLayer::new();
    let app = origin.app(cache.clone());
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, get_req("/r")).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let joined = tokio::spawn({
        let app = app.clone();
        async move { send(&app, get_req("/r")).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(cache.purge_url(&url()));

    let (status, _, body) = first.await.unwrap();
    assert_eq!(
        (status.as_u16(), body_call(&body).as_str()),
        (200, "call=1")
    );
    let (_, headers, body) = joined.await.unwrap();
    assert_eq!(body_call(&body), "call=1", "a waiter gets the older fill");
    assert!(cache_status(&headers).contains("collapsed"));
    assert_eq!(origin.calls(), 1);

    let (_, headers, body) = send(&app, get_req("/r")).await;
    assert_eq!(origin.calls(), 2, "the next request went to the origin");
    assert_eq!(body_call(&body), "call=2");
    assert!(!cache_status(&headers).contains("hit"));
    let (_, headers, _) = send(&app, get_req("/r")).await;
    assert!(
        cache_status(&headers).contains("hit"),
        "and its fill is stored"
    );
}

/// A purge of a key through the engine API also beats its running fill (memory only).
#[tokio::test(start_paused = true)]
async fn invalidate_beats_an_in_flight_computation() {
    let cache: Cache<String> = Cache::builder().build().unwrap();
    let key = CacheKey::new("k");
    let fresh = herdguard::Freshness::new(Duration::from_secs(60));
    let slow = tokio::spawn({
        let cache = cache.clone();
        async move {
            cache
                .get_or_compute(&key, fresh, || async {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Ok::<_, std::io::Error>("old".to_owned())
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    cache.invalidate(&key);
    assert_eq!(slow.await.unwrap().unwrap().value, "old");
    let next = cache
        .get_or_compute(&key, fresh, || async {
            Ok::<_, std::io::Error>("new".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(next.value, "new", "the older fill was not stored");
}

fn layer(server: &RedisServer) -> CacheLayer {
    CacheLayer::builder()
        .redis(RedisOptions::new(server.url()).namespace("race"))
        .build()
        .unwrap()
}

/// Two instances on Redis: GET on A with a 1 s origin, PURGE on B 300 ms later; A's waiters get that fill, it is not stored anywhere, and the next request goes to the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_beats_an_in_flight_fill_across_instances() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60")]).delay(Duration::from_secs(1));
    let (la, lb) = (layer(&server), layer(&server));
    let (a, b) = (origin.app(la), origin.app(lb.clone()));
    server.wait_for_subscribers("race:purge", 2).await;
    let first = tokio::spawn({
        let a = a.clone();
        async move { send(&a, get_req("/r")).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let purged = lb.purge_key(&lb.url_key(&url())).await.unwrap();
    assert_ne!(purged, Purged::Local, "the purge reached redis");

    let (status, _, body) = first.await.unwrap();
    assert_eq!(
        (status.as_u16(), body_call(&body).as_str()),
        (200, "call=1")
    );
    assert_eq!(origin.calls(), 1);

    let (_, headers, body) = send(&b, get_req("/r")).await;
    assert_eq!(origin.calls(), 2, "the next request went to the origin");
    assert_eq!(body_call(&body), "call=2");
    assert!(!cache_status(&headers).contains("hit"));
    let (_, headers, body) = send(&a, get_req("/r")).await;
    assert_eq!(body_call(&body), "call=2", "A never stored its older fill");
    assert!(cache_status(&headers).contains("hit"));
    assert_eq!(origin.calls(), 2);
}

/// On Redis alone, with no instance told of the purge: a token issued before a purge is refused, one issued after it is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_raises_the_fence_in_redis() {
    let server = RedisServer::start();
    let opts = RedisOptions::new(server.url()).namespace("race");
    let fenced = FencedStore::new(opts.clone()).unwrap();
    let before = fenced.next_fence("r").await.unwrap();
    let key = CacheKey::new("r");
    let purger = CacheLayer::builder().redis(opts).build().unwrap();
    let purged = purger.purge_key(&key).await.unwrap();
    assert_ne!(purged, Purged::Local);
    assert!(
        !fenced.write("r", before, b"older").await.unwrap(),
        "a write that leased before the purge is refused"
    );
    let after = fenced.next_fence("r").await.unwrap();
    assert!(fenced.write("r", after, b"newer").await.unwrap());
    assert_eq!(fenced.read("r").await.unwrap().unwrap(), &b"newer"[..]);
}

/// A layer over an origin that answers `call=N` (N counts its calls) after
/// a second, storable for a minute.
type Svc = tower::util::BoxCloneService<
    http::Request<axum::body::Body>,
    http::Response<herdguard::service::CacheBody<axum::body::Body>>,
    std::convert::Infallible,
>;

fn slow_counted_origin() -> (Arc<AtomicUsize>, CacheLayer, Svc) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let inner = tower::service_fn(
        move |_req: http::Request<herdguard::service::RequestBody<axum::body::Body>>| {
            let n = c.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let mut r = http::Response::new(axum::body::Body::from(format!("call={n}")));
                r.headers_mut().insert(
                    "cache-control",
                    http::HeaderValue::from_static("max-age=60"),
                );
                Ok::<_, std::convert::Infallible>(r)
            }
        },
    );
    let cache = CacheLayer::new();
    let svc = tower::ServiceBuilder::new()
        .layer(cache.clone())
        .service(inner);
    (calls, cache, Svc::new(svc))
}

async fn body_of(r: http::Response<herdguard::service::CacheBody<axum::body::Body>>) -> Bytes {
    use http_body_util::BodyExt;
    r.into_body().collect().await.unwrap().to_bytes()
}

/// A request called while a fill runs but first polled after that fill ended and a purge came never gets the purged answer: it asks the origin itself (2 calls).
#[tokio::test(start_paused = true)]
async fn a_request_first_polled_after_its_flight_ended_and_a_purge_asks_again() {
    let (calls, cache, svc) = slow_counted_origin();
    let first = tokio::spawn(svc.clone().oneshot(get_req("/r")));
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Called while the fill runs; not polled yet.
    let mut late_svc = svc.clone();
    let late = late_svc.ready().await.unwrap().call(get_req("/r"));
    let first = first.await.unwrap().unwrap();
    assert_eq!(body_call(&body_of(first).await), "call=1");
    drop(cache.purge_url(&url()));
    let late = late.await.unwrap();
    assert_eq!(body_call(&body_of(late).await), "call=2");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A request that waits on a running fill (polled once while it runs) but
/// wakes only after that fill ended and a purge completed never gets the
/// purged answer: it asks the origin itself (2 calls).
#[tokio::test(start_paused = true)]
async fn a_waiter_woken_after_its_flight_ended_and_a_purge_asks_again() {
    let (calls, cache, svc) = slow_counted_origin();
    let first = tokio::spawn(svc.clone().oneshot(get_req("/r")));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut late_svc = svc.clone();
    let mut late = Box::pin(late_svc.ready().await.unwrap().call(get_req("/r")));
    // Polled once while the fill runs: it waits on the flight.
    assert!(tokio::time::timeout(Duration::ZERO, &mut late)
        .await
        .is_err());
    let first = first.await.unwrap().unwrap();
    assert_eq!(body_call(&body_of(first).await), "call=1");
    // The purge completes before the waiter's task runs again.
    drop(cache.purge_url(&url()));
    let late = late.await.unwrap();
    let status = cache_status(late.headers()).to_owned();
    assert_eq!(body_call(&body_of(late).await), "call=2", "{status}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
