//! One request never turns the cache against its users: an error page or an "uncacheable" answer made for one request never
//! evicts, replaces or marks what others are served; a waiter never gets an
//! error page made for another request; and a `stale-if-error` entry holds
//! on every instance of a Redis cluster. In memory (paused time) and on two
//! layers sharing a real redis-server (real time: Redis expiry).
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, Response, StatusCode, Uri};
use axum::Router;
use bytes::Bytes;
use herdguard::{CacheLayer, RedisOptions};
use http_body_util::BodyExt;
use tokio::sync::Notify;
use tower::ServiceExt;

use support::RedisServer;

/// An origin that answers `max-age=60` unless a request makes it answer
/// otherwise, as CPDoS needs: an `X-Pad` over 1 KB is a 431, a method
/// override a 405, `X-Private` or any `Cookie` a `private` 200, `X-No-Store`
/// a `no-store` 200 (all without freshness).
/// `/err` is a 500 with no Cache-Control after 400 ms, echoing the cookie;
/// `/sie` a 200 `max-age=1, stale-if-error=60` until `failing`, then a 500
/// `max-age=30` (`/everywhere` sends its 431 with `max-age=60`); `/swr` a 200 `max-age=1, stale-while-revalidate=1,
/// stale-if-error=60` after 300 ms; `/err-stored` a 500 `max-age=30` after
/// 400 ms; `/sie-slow` like `/sie` but failing with a 500 without freshness
/// after 400 ms; `/short` a 200 `max-age=1`; `/no-store` always a `no-store`
/// 200 after 100 ms; `/held` a `private` 200 once `go` is notified (it
/// notifies `started` first).
#[derive(Clone, Default)]
struct Origin {
    calls: Arc<AtomicUsize>,
    running: Arc<AtomicUsize>,
    most_at_once: Arc<AtomicUsize>,
    failing: Arc<AtomicBool>,
    started: Arc<Notify>,
    go: Arc<Notify>,
}

impl Origin {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn app(&self, layer: CacheLayer) -> Router {
        Router::new()
            .fallback(handler)
            .layer(layer)
            .with_state(self.clone())
    }
}

async fn handler(State(o): State<Origin>, uri: Uri, headers: HeaderMap) -> Response<Body> {
    let n = o.calls.fetch_add(1, Ordering::SeqCst) + 1;
    let now = o.running.fetch_add(1, Ordering::SeqCst) + 1;
    o.most_at_once.fetch_max(now, Ordering::SeqCst);
    let r = answer(&o, uri.path(), &headers, n).await;
    o.running.fetch_sub(1, Ordering::SeqCst);
    r
}

async fn answer(o: &Origin, path: &str, headers: &HeaderMap, n: usize) -> Response<Body> {
    let reply = |status: u16, cc: Option<&str>, body: String| {
        let mut r = Response::builder().status(status);
        if let Some(cc) = cc {
            r = r.header("cache-control", cc);
        }
        r.body(Body::from(body)).expect("valid response")
    };
    match path {
        "/err" => {
            tokio::time::sleep(Duration::from_millis(400)).await;
            let cookie = headers
                .get("cookie")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-");
            reply(500, None, format!("error for {cookie}"))
        }
        "/err-stored" => {
            tokio::time::sleep(Duration::from_millis(400)).await;
            reply(500, Some("max-age=30"), format!("stored error call={n}"))
        }
        "/sie-slow" if o.failing.load(Ordering::SeqCst) => {
            tokio::time::sleep(Duration::from_millis(400)).await;
            reply(500, None, format!("failed call={n}"))
        }
        "/sie-slow" => reply(
            200,
            Some("max-age=1, stale-if-error=60"),
            format!("ok call={n}"),
        ),
        "/sie" if o.failing.load(Ordering::SeqCst) => {
            reply(500, Some("max-age=30"), format!("failed call={n}"))
        }
        "/swr" => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            reply(
                200,
                Some("max-age=1, stale-while-revalidate=1, stale-if-error=60"),
                format!("ok call={n}"),
            )
        }
        "/sie" => reply(
            200,
            Some("max-age=1, stale-if-error=60"),
            format!("ok call={n}"),
        ),
        // An origin that sends its Cache-Control on every answer, errors too.
        "/everywhere" if headers.get("x-pad").is_some_and(|v| v.len() > 1024) => reply(
            431,
            Some("max-age=60"),
            format!("header too large call={n}"),
        ),
        _ if headers.get("x-pad").is_some_and(|v| v.len() > 1024) => {
            reply(431, None, format!("header too large call={n}"))
        }
        _ if headers.contains_key("x-http-method-override") => {
            reply(405, None, format!("method not allowed call={n}"))
        }
        "/no-store" => {
            tokio::time::sleep(Duration::from_millis(100)).await;
            reply(200, Some("no-store"), format!("no-store call={n}"))
        }
        "/held" => {
            o.started.notify_one();
            o.go.notified().await;
            reply(200, Some("private"), format!("private call={n}"))
        }
        _ if headers.contains_key("x-private") || headers.contains_key("cookie") => {
            reply(200, Some("private"), format!("private call={n}"))
        }
        _ if headers.contains_key("x-no-store") => {
            reply(200, Some("no-store"), format!("no-store call={n}"))
        }
        "/short" => reply(200, Some("max-age=1"), format!("ok call={n}")),
        _ => reply(200, Some("max-age=60"), format!("ok call={n}")),
    }
}

struct Answer {
    status: StatusCode,
    cache_status: String,
    body: Bytes,
}

async fn send(app: &Router, uri: &str, headers: &[(&str, &str)]) -> Answer {
    let mut r = Request::get(uri).header("host", "example.test");
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let resp = app
        .clone()
        .oneshot(r.body(Body::empty()).expect("valid request"))
        .await
        .expect("router is infallible");
    let (parts, body) = resp.into_parts();
    Answer {
        status: parts.status,
        cache_status: parts
            .headers
            .get("cache-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned(),
        body: body.collect().await.expect("body").to_bytes(),
    }
}

/// The CPDoS requests (header oversize, meta characters): a `no-cache` reload with a 10 KB
/// header (origin 431), the same leading with a method override (405).
fn attacks() -> [Vec<(&'static str, String)>; 2] {
    [
        vec![
            ("cache-control", "no-cache".to_owned()),
            ("x-pad", "a".repeat(10 * 1024)),
        ],
        vec![
            ("cache-control", "no-cache".to_owned()),
            ("x-http-method-override", "DELETE".to_owned()),
        ],
    ]
}

async fn attack(app: &Router, uri: &str, headers: &[(&'static str, String)]) -> Answer {
    let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    send(app, uri, &h).await
}

/// Ten plain GETs spread over `apps`; each must be a 200.
async fn ten_plain_gets(apps: &[&Router], uri: &str) -> Vec<String> {
    let mut statuses = Vec::new();
    for i in 0..10 {
        let a = send(apps[i % apps.len()], uri, &[]).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.cache_status);
        statuses.push(a.cache_status);
    }
    statuses
}

fn redis_layer(redis: &RedisServer) -> CacheLayer {
    CacheLayer::builder()
        .redis(RedisOptions::new(redis.url()).namespace("ep"))
        .build()
        .expect("valid layer")
}

/// What the entry key `ep:{hex}:v` holds: None when empty, else whether it
/// is the pass marker and, for an entry, its stored HTTP status.
async fn stored(redis: &RedisServer, hex: &str) -> Option<(bool, Option<u16>)> {
    let mut c = redis.connection().await;
    let v: Option<Vec<u8>> = deadpool_redis::redis::cmd("GET")
        .arg(format!("ep:{{{hex}}}:v"))
        .query_async(&mut c)
        .await
        .expect("GET");
    let v = v?;
    if herdguard::inspect::is_pass_marker(&v) {
        return Some((true, None));
    }
    let status = herdguard::inspect::decode_envelope(&v)
        .ok()
        .and_then(|e| e.http_status);
    Some((false, status))
}

fn key_hex(layer: &CacheLayer, path: &str) -> String {
    let r = Request::get(path)
        .header("host", "example.test")
        .body(())
        .expect("request");
    layer.key_for(&r).to_hex()
}

// ---------------------------------------------------------------------------
// §1: one request disables caching for everyone
// ---------------------------------------------------------------------------

/// Hot key, memory: after an oversized or method-override reload answered 431/405, the next 10 plain GETs cost 0 origin calls.
#[tokio::test(start_paused = true)]
async fn an_error_answer_to_one_reload_keeps_the_hot_entry() {
    for headers in attacks() {
        let origin = Origin::default();
        let app = origin.app(CacheLayer::new());
        send(&app, "/x", &[]).await;
        assert!(send(&app, "/x", &[]).await.cache_status.contains("hit"));
        let hostile = attack(&app, "/x", &headers).await;
        assert!(hostile.status.is_client_error(), "{}", hostile.status);
        assert_eq!(origin.calls(), 2);
        for s in ten_plain_gets(&[&app], "/x").await {
            assert!(s.starts_with("herdguard; hit"), "{s}");
        }
        assert_eq!(origin.calls(), 2, "no origin call after the attack");
    }
}

/// Cold key, memory: an oversized or method-override request that leads the miss (431/405) leaves the next 10 plain GETs exactly one origin call.
#[tokio::test(start_paused = true)]
async fn an_error_answer_leading_a_cold_miss_marks_nothing() {
    for headers in attacks() {
        let origin = Origin::default();
        let app = origin.app(CacheLayer::new());
        let hostile = attack(&app, "/x", &headers).await;
        assert!(hostile.status.is_client_error(), "{}", hostile.status);
        ten_plain_gets(&[&app], "/x").await;
        assert_eq!(origin.calls(), 2, "the attack, then one fill");
    }
}

/// Hot key, memory: an answer uncacheable for everyone (`private`) to one reload never replaces the fresh entry with a pass marker.
#[tokio::test(start_paused = true)]
async fn an_uncacheable_answer_to_one_reload_keeps_the_fresh_entry() {
    let origin = Origin::default();
    let app = origin.app(CacheLayer::new());
    send(&app, "/x", &[]).await;
    let private = send(
        &app,
        "/x",
        &[("cache-control", "no-cache"), ("x-private", "1")],
    )
    .await;
    assert_eq!(&private.body[..], b"private call=2");
    for s in ten_plain_gets(&[&app], "/x").await {
        assert!(s.starts_with("herdguard; hit"), "{s}");
    }
    assert_eq!(origin.calls(), 2);
}

/// Hot key, memory: a 431 that carries `max-age=60` (storable) answering one oversized reload never replaces the fresh entry.
#[tokio::test(start_paused = true)]
async fn a_storable_error_answer_to_one_reload_keeps_the_hot_entry() {
    let origin = Origin::default();
    let app = origin.app(CacheLayer::new());
    send(&app, "/everywhere", &[]).await;
    let hostile = attack(&app, "/everywhere", &attacks()[0]).await;
    assert_eq!(hostile.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    for s in ten_plain_gets(&[&app], "/everywhere").await {
        assert!(s.starts_with("herdguard; hit"), "{s}");
    }
    assert_eq!(origin.calls(), 2);
}

/// Hot key, two layers on one Redis: the storable 431 answering a reload on the instance without a copy of its own never replaces the fresh Redis entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_storable_error_answer_to_one_reload_keeps_the_hot_entry() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let (a, b) = (
        origin.app(redis_layer(&redis)),
        origin.app(redis_layer(&redis)),
    );
    send(&a, "/everywhere", &[]).await;
    let hostile = attack(&b, "/everywhere", &attacks()[0]).await;
    assert_eq!(hostile.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    for s in ten_plain_gets(&[&a, &b], "/everywhere").await {
        assert!(s.starts_with("herdguard; hit"), "{s}");
    }
    assert_eq!(origin.calls(), 2);
}

/// Hot key, two layers on one Redis: the 431/405 reload on one instance leaves 10 GETs over both at 0 origin calls, and no pass marker in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_an_error_answer_to_one_reload_keeps_the_hot_entry() {
    for (i, headers) in attacks().into_iter().enumerate() {
        let redis = RedisServer::start();
        let origin = Origin::default();
        let (la, lb) = (redis_layer(&redis), redis_layer(&redis));
        let (a, b) = (origin.app(la.clone()), origin.app(lb));
        send(&a, "/x", &[]).await;
        assert!(send(&b, "/x", &[]).await.cache_status.contains("hit"));
        let hostile = attack(&a, "/x", &headers).await;
        assert!(
            hostile.status.is_client_error(),
            "attack {i}: {}",
            hostile.status
        );
        assert_eq!(origin.calls(), 2);
        for s in ten_plain_gets(&[&a, &b], "/x").await {
            assert!(s.starts_with("herdguard; hit"), "attack {i}: {s}");
        }
        assert_eq!(origin.calls(), 2, "attack {i}: no origin call after it");
        let key = key_hex(&la, "/x");
        // The entry, not a pass marker.
        assert_eq!(stored(&redis, &key).await, Some((false, Some(200))));
    }
}

/// Cold key, two layers on one Redis: the 431/405 request leading the miss leaves 10 GETs over both instances exactly one origin call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_an_error_answer_leading_a_cold_miss_marks_nothing() {
    for (i, headers) in attacks().into_iter().enumerate() {
        let redis = RedisServer::start();
        let origin = Origin::default();
        let (a, b) = (
            origin.app(redis_layer(&redis)),
            origin.app(redis_layer(&redis)),
        );
        let hostile = attack(&a, "/x", &headers).await;
        assert!(
            hostile.status.is_client_error(),
            "attack {i}: {}",
            hostile.status
        );
        ten_plain_gets(&[&a, &b], "/x").await;
        assert_eq!(origin.calls(), 2, "attack {i}: the attack, then one fill");
    }
}

/// Hot key, two layers on one Redis: a `private` answer to a reload on an instance with no copy of its own sets no pass marker over the fresh Redis entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_an_uncacheable_answer_never_marks_a_fresh_entry() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let (la, lb) = (redis_layer(&redis), redis_layer(&redis));
    let (a, b) = (origin.app(la.clone()), origin.app(lb));
    send(&a, "/x", &[]).await;
    // B has never seen the key: its reload refuses the Redis entry.
    let private = send(
        &b,
        "/x",
        &[("cache-control", "no-cache"), ("x-private", "1")],
    )
    .await;
    assert_eq!(&private.body[..], b"private call=2");
    let key = key_hex(&la, "/x");
    assert_eq!(
        stored(&redis, &key).await,
        Some((false, Some(200))),
        "no pass marker over the fresh entry"
    );
    for s in ten_plain_gets(&[&a, &b], "/x").await {
        assert!(s.starts_with("herdguard; hit"), "{s}");
    }
    assert_eq!(origin.calls(), 2);
}

/// Requests that make the origin answer a
/// 200 uncacheable because of the request: a cookie (`private`), and a
/// header it answers `no-store` to.
fn uncacheable_for_one() -> [[(&'static str, &'static str); 1]; 2] {
    [[("cookie", "user=mallory")], [("x-no-store", "1")]]
}

/// Ten plain GETs after a pass marker set by one request: the first asks
/// the origin again (hit-for-miss) and stores, the nine after are hits.
fn assert_one_refill(statuses: &[String]) {
    assert!(
        statuses[0].contains("stored") && statuses[0].contains("detail=hit-for-miss"),
        "{}",
        statuses[0]
    );
    for s in &statuses[1..] {
        assert!(s.starts_with("herdguard; hit"), "{s}");
    }
}

/// Redis holds the entry (a 200), not the pass marker, within 5 s: the
/// hit-for-miss write runs in the background.
async fn until_entry_in_redis(redis: &RedisServer, hex: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while stored(redis, hex).await != Some((false, Some(200))) {
        assert!(
            std::time::Instant::now() < deadline,
            "redis still holds {:?}",
            stored(redis, hex).await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Cold key, memory: a 200 `private` / `no-store` made so by one request leading the miss leaves the next 10 plain GETs exactly one origin call (hit-for-miss), the 9 after it hits.
#[tokio::test(start_paused = true)]
async fn an_uncacheable_answer_for_one_request_costs_one_more_call() {
    for headers in uncacheable_for_one() {
        let origin = Origin::default();
        let app = origin.app(CacheLayer::new());
        let hostile = send(&app, "/x", &headers).await;
        assert_eq!(hostile.status, StatusCode::OK);
        assert!(
            hostile.cache_status.contains("detail=uncacheable"),
            "{}",
            hostile.cache_status
        );
        assert_one_refill(&ten_plain_gets(&[&app], "/x").await);
        assert_eq!(origin.calls(), 2, "{headers:?}: the request, then one fill");
    }
}

/// Expired key, memory: the same request leading the refresh of an entry past its freshness (no grace) leaves the next 10 plain GETs exactly one origin call.
#[tokio::test(start_paused = true)]
async fn an_uncacheable_answer_refreshing_an_expired_entry_costs_one_more_call() {
    for headers in uncacheable_for_one() {
        let origin = Origin::default();
        let app = origin.app(CacheLayer::new());
        send(&app, "/short", &[]).await;
        assert!(send(&app, "/short", &[]).await.cache_status.contains("hit"));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let hostile = send(&app, "/short", &headers).await;
        assert_eq!(hostile.status, StatusCode::OK);
        assert_eq!(origin.calls(), 2);
        assert_one_refill(&ten_plain_gets(&[&app], "/short").await);
        assert_eq!(
            origin.calls(),
            3,
            "{headers:?}: one refill after the request"
        );
    }
}

/// A pass marker from an answer uncacheable for everyone (`no-store`) stays: five concurrent GETs under it (fallback limit 2) each make their own call at once (none coalesced, queued or stored), as before hit-for-miss.
#[tokio::test(start_paused = true)]
async fn passes_under_a_marker_are_neither_coalesced_nor_stored() {
    let origin = Origin::default();
    let layer = CacheLayer::builder()
        .fallback_limit(2)
        .build()
        .expect("valid layer");
    let app = origin.app(layer);
    send(&app, "/no-store", &[]).await;
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, "/no-store", &[]).await })
        })
        .collect();
    let mut bodies = Vec::new();
    for t in tasks {
        let a = t.await.expect("answered");
        assert!(
            a.cache_status.contains("hit-for-pass"),
            "{}",
            a.cache_status
        );
        assert!(!a.cache_status.contains("collapsed"), "{}", a.cache_status);
        bodies.push(String::from_utf8_lossy(&a.body).into_owned());
    }
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), 5, "each its own answer: {bodies:?}");
    assert_eq!(origin.calls(), 6);
    // Past the two permits the others passed at once, never queued.
    assert_eq!(origin.most_at_once.load(Ordering::SeqCst), 5);
    let after = send(&app, "/no-store", &[]).await;
    assert!(
        after.cache_status.contains("hit-for-pass"),
        "{}",
        after.cache_status
    );
    assert_eq!(origin.calls(), 7);
}

/// Cold key, two layers on one Redis: a `private` / `no-store` 200 for one request on A (pass marker on A and in Redis) leaves 10 plain GETs on B exactly one origin call, and Redis then holds the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_an_uncacheable_answer_for_one_request_costs_one_more_call() {
    for headers in uncacheable_for_one() {
        let redis = RedisServer::start();
        let origin = Origin::default();
        let (la, lb) = (redis_layer(&redis), redis_layer(&redis));
        let (a, b) = (origin.app(la.clone()), origin.app(lb));
        let key = key_hex(&la, "/x");
        let hostile = send(&a, "/x", &headers).await;
        assert_eq!(hostile.status, StatusCode::OK);
        assert_eq!(
            stored(&redis, &key).await,
            Some((true, None)),
            "pass marker"
        );
        assert_one_refill(&ten_plain_gets(&[&b], "/x").await);
        assert_eq!(origin.calls(), 2, "{headers:?}: the request, then one fill");
        until_entry_in_redis(&redis, &key).await;
    }
}

/// Cold key, two layers on one Redis: after the same request on A, 10 plain GETs on A cost one origin call; once its write is in Redis, B's GETs are hits too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_the_instance_that_set_the_marker_refills_once() {
    for headers in uncacheable_for_one() {
        let redis = RedisServer::start();
        let origin = Origin::default();
        let (la, lb) = (redis_layer(&redis), redis_layer(&redis));
        let (a, b) = (origin.app(la.clone()), origin.app(lb));
        let key = key_hex(&la, "/x");
        send(&a, "/x", &headers).await;
        assert_one_refill(&ten_plain_gets(&[&a], "/x").await);
        until_entry_in_redis(&redis, &key).await;
        for s in ten_plain_gets(&[&b], "/x").await {
            assert!(s.starts_with("herdguard; hit"), "{s}");
        }
        assert_eq!(origin.calls(), 2, "{headers:?}: the request, then one fill");
    }
}

/// Cold key, two layers on one Redis: after the cookie request on A (marker on A and in Redis), 10 plain GETs alternating B, A, B, A… cost one origin call in all: B's hit-for-miss stores the entry and A, still holding the marker in memory, reads it from Redis; the 9 after B's are hits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_marker_in_memory_reads_the_entry_another_instance_stored() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let (la, lb) = (redis_layer(&redis), redis_layer(&redis));
    let (a, b) = (origin.app(la.clone()), origin.app(lb));
    let key = key_hex(&la, "/x");
    let hostile = send(&a, "/x", &[("cookie", "user=mallory")]).await;
    assert!(
        hostile.cache_status.contains("detail=uncacheable"),
        "{}",
        hostile.cache_status
    );
    assert_eq!(stored(&redis, &key).await, Some((true, None)), "marker");
    let first = send(&b, "/x", &[]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_one_refill(std::slice::from_ref(&first.cache_status));
    // B's write runs in the background; A's next GET comes after it.
    until_entry_in_redis(&redis, &key).await;
    let rest = ten_plain_gets(&[&a, &b], "/x").await;
    assert_eq!(
        origin.calls(),
        2,
        "the request, then B's one fill: {rest:?}"
    );
    for s in &rest {
        assert!(s.starts_with("herdguard; hit"), "{s}");
    }
}

/// Two layers on one Redis, the URL uncacheable for everyone (`no-store`, marker on A and in Redis): five concurrent GETs on A (fallback limit 2) each make their own call at once: none coalesced on another's call, queued or stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_passes_under_a_marker_are_neither_coalesced_nor_stored() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let layer = |r: &RedisServer| {
        CacheLayer::builder()
            .redis(RedisOptions::new(r.url()).namespace("ep"))
            .fallback_limit(2)
            .build()
            .expect("valid layer")
    };
    let (la, lb) = (layer(&redis), layer(&redis));
    let (a, b) = (origin.app(la.clone()), origin.app(lb));
    let key = key_hex(&la, "/no-store");
    send(&a, "/no-store", &[]).await;
    assert_eq!(stored(&redis, &key).await, Some((true, None)), "marker");
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move { send(&a, "/no-store", &[]).await })
        })
        .collect();
    let mut bodies = Vec::new();
    for t in tasks {
        let r = t.await.expect("answered");
        assert!(
            r.cache_status.contains("hit-for-pass"),
            "{}",
            r.cache_status
        );
        assert!(!r.cache_status.contains("collapsed"), "{}", r.cache_status);
        bodies.push(String::from_utf8_lossy(&r.body).into_owned());
    }
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), 5, "each its own answer: {bodies:?}");
    assert_eq!(origin.calls(), 6);
    // The origin takes 100 ms: past the two permits the others passed at
    // once, never queued behind them.
    assert_eq!(origin.most_at_once.load(Ordering::SeqCst), 5);
    let on_b = send(&b, "/no-store", &[]).await;
    assert!(
        on_b.cache_status.contains("hit-for-pass"),
        "{}",
        on_b.cache_status
    );
    assert_eq!(origin.calls(), 7);
    assert_eq!(
        stored(&redis, &key).await,
        Some((true, None)),
        "still the marker"
    );
}

/// The write script itself refuses a pass marker over a fresh entry (`fresh_entry_held`): here the entry lands in Redis while B's fill runs, under an older token (as a Vary copy filed under the fill's own token does), so nothing on B's side knows of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_the_write_script_never_marks_a_fresh_entry() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let (la, lb) = (redis_layer(&redis), redis_layer(&redis));
    let (a, b) = (origin.app(la.clone()), origin.app(lb));
    // A fresh entry's bytes, written by A (under A's token, before B's).
    send(&a, "/x", &[]).await;
    let mut c = redis.connection().await;
    let entry: Vec<u8> = deadpool_redis::redis::cmd("GET")
        .arg(format!("ep:{{{}}}:v", key_hex(&la, "/x")))
        .query_async(&mut c)
        .await
        .expect("GET");
    // B leads the cold key `/held` (its lease and token are newer); the
    // entry lands there while B's origin call runs.
    let held = key_hex(&la, "/held");
    let fill = tokio::spawn({
        let b = b.clone();
        async move { send(&b, "/held", &[]).await }
    });
    tokio::time::timeout(Duration::from_secs(10), origin.started.notified())
        .await
        .expect("B's origin call started");
    let () = deadpool_redis::redis::cmd("SET")
        .arg(format!("ep:{{{held}}}:v"))
        .arg(&entry)
        .arg("PX")
        .arg(60_000)
        .query_async(&mut c)
        .await
        .expect("SET");
    origin.go.notify_one();
    let private = fill.await.expect("answered");
    assert_eq!(&private.body[..], b"private call=2");
    assert_eq!(
        stored(&redis, &held).await,
        Some((false, Some(200))),
        "the fresh entry stays; no pass marker over it"
    );
}

// ---------------------------------------------------------------------------
// §4: one user's error page handed to other users
// ---------------------------------------------------------------------------

/// Alice's unstored 500 (made with her cookie) never reaches bob and carol, who waited on her flight: each gets the error made for it.
#[tokio::test(start_paused = true)]
async fn waiters_never_get_an_error_page_made_for_another_request() {
    let origin = Origin::default();
    let app = origin.app(CacheLayer::new());
    let alice = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "/err", &[("cookie", "user=alice")]).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let others = ["user=bob", "user=carol"].map(|cookie| {
        let app = app.clone();
        tokio::spawn(async move { send(&app, "/err", &[("cookie", cookie)]).await })
    });
    let alice = alice.await.expect("alice answered");
    assert_eq!(&alice.body[..], b"error for user=alice");
    for (task, who) in others.into_iter().zip(["bob", "carol"]) {
        let a = task.await.expect("answered");
        assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            String::from_utf8_lossy(&a.body),
            format!("error for user={who}"),
            "{}",
            a.cache_status
        );
        assert!(!a.cache_status.contains("collapsed"), "{}", a.cache_status);
    }
    assert_eq!(origin.calls(), 3);
}

/// Eight waiters of an unshareable 500 call the failing origin themselves, never more than `fallback_limit` (2) at once.
#[tokio::test(start_paused = true)]
async fn waiters_of_an_unshared_error_stay_under_the_fallback_limit() {
    let origin = Origin::default();
    let layer = CacheLayer::builder()
        .fallback_limit(2)
        .build()
        .expect("valid layer");
    let app = origin.app(layer);
    let leader = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "/err", &[("cookie", "n=0")]).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waiters: Vec<_> = (1..=8)
        .map(|i| {
            let app = app.clone();
            let cookie = format!("n={i}");
            tokio::spawn(async move { send(&app, "/err", &[("cookie", &cookie)]).await })
        })
        .collect();
    leader.await.expect("leader answered");
    for (i, w) in waiters.into_iter().enumerate() {
        let a = w.await.expect("answered");
        assert_eq!(
            String::from_utf8_lossy(&a.body),
            format!("error for n={}", i + 1)
        );
    }
    assert_eq!(origin.calls(), 9);
    assert_eq!(origin.most_at_once.load(Ordering::SeqCst), 2);
}

/// Three requests on one leader whose 500 carries freshness (stored for everyone) share it: one origin call.
#[tokio::test(start_paused = true)]
async fn a_stored_error_is_shared_with_its_waiters() {
    let origin = Origin::default();
    let app = origin.app(CacheLayer::new());
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, "/err-stored", &[]).await })
        })
        .collect();
    for t in tasks {
        let a = t.await.expect("answered");
        assert_eq!(&a.body[..], b"stored error call=1", "{}", a.cache_status);
    }
    assert_eq!(origin.calls(), 1);
}

/// Waiters of an unshared 500 whose stored copy allows stale-if-error get that copy, not an origin call each.
#[tokio::test(start_paused = true)]
async fn waiters_of_an_unshared_error_get_stale_if_error() {
    let origin = Origin::default();
    let app = origin.app(CacheLayer::new());
    send(&app, "/sie-slow", &[]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    origin.failing.store(true, Ordering::SeqCst);
    let leader = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "/sie-slow", &[]).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, "/sie-slow", &[]).await })
        })
        .collect();
    for t in std::iter::once(leader).chain(waiters) {
        let a = t.await.expect("answered");
        assert_eq!(&a.body[..], b"ok call=1", "{}", a.cache_status);
        assert!(
            a.cache_status.contains("stale-if-error"),
            "{}",
            a.cache_status
        );
    }
    assert_eq!(origin.calls(), 2, "the fill, then one failed call");
}

// ---------------------------------------------------------------------------
// §5: stale-if-error across instances
// ---------------------------------------------------------------------------

/// A 200 `max-age=1, stale-if-error=60` stored by A: once the origin fails (500 `max-age=30`), B, with no copy of its own, answers it stale-if-error, never stores the 500, and neither instance ever serves the 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_holds_on_an_instance_without_a_copy() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let (la, lb) = (redis_layer(&redis), redis_layer(&redis));
    let (a, b) = (origin.app(la.clone()), origin.app(lb));
    let first = send(&a, "/sie", &[]).await;
    assert_eq!(&first.body[..], b"ok call=1");
    let key = key_hex(&la, "/sie");
    let mut c = redis.connection().await;
    let pttl: i64 = deadpool_redis::redis::cmd("PTTL")
        .arg(format!("ep:{{{key}}}:v"))
        .query_async(&mut c)
        .await
        .expect("PTTL");
    assert!(
        pttl > 55_000,
        "the shared entry outlives stale-if-error: {pttl} ms"
    );
    // Redis expiry runs on real time: let freshness (1 s) end.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    origin.failing.store(true, Ordering::SeqCst);
    for (i, app) in [&b, &a, &b, &a].into_iter().enumerate() {
        let r = send(app, "/sie", &[]).await;
        assert_eq!(
            (r.status, &r.body[..]),
            (StatusCode::OK, &b"ok call=1"[..]),
            "request {i}: {}",
            r.cache_status
        );
        // Each instance's first request tries the origin; after that
        // failure its copy answers alone for the key's backoff.
        let detail = if i < 2 {
            "stale-if-error"
        } else {
            "origin-backoff"
        };
        assert!(r.cache_status.contains(detail), "{}", r.cache_status);
    }
    // One call per instance to the failing origin, none stored.
    assert_eq!(origin.calls(), 3);
    assert_eq!(
        stored(&redis, &key).await,
        Some((false, Some(200))),
        "the 500 was never stored"
    );
}

/// An entry kept in Redis only for stale-if-error (past its stale-while-revalidate) is not served stale: five requests on an instance without a copy share one refill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_kept_for_errors_only_is_refilled_once() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let (a, b) = (
        origin.app(redis_layer(&redis)),
        origin.app(redis_layer(&redis)),
    );
    send(&a, "/swr", &[]).await;
    // Past freshness (1 s) and stale-while-revalidate (1 s more), within
    // stale-if-error.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let b = b.clone();
            tokio::spawn(async move { send(&b, "/swr", &[]).await })
        })
        .collect();
    for t in tasks {
        let r = t.await.expect("answered");
        assert_eq!(&r.body[..], b"ok call=2", "{}", r.cache_status);
    }
    assert_eq!(origin.calls(), 2);
}
