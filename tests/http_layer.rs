//! The Tower layer in front of axum handlers: coalescing over HTTP and one
//! test per HTTP storage rule.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use herdguard::service::{CacheBody, RequestBody};
use herdguard::CacheLayer;
use http_body_util::BodyExt;
use tower::{Service, ServiceExt};

/// An origin whose response headers and delay each test chooses; it counts its calls.
#[derive(Clone)]
struct Origin {
    calls: Arc<AtomicUsize>,
    headers: Arc<Vec<(&'static str, &'static str)>>,
    delay: Duration,
}

impl Origin {
    fn new(headers: &[(&'static str, &'static str)]) -> Self {
        Self {
            calls: Arc::new(AtomicUsize::new(0)),
            headers: Arc::new(headers.to_vec()),
            delay: Duration::ZERO,
        }
    }

    fn delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// Echoes the call number and the request's Accept-Language, so tests can tell responses apart.
async fn handler(State(o): State<Origin>, req_headers: HeaderMap) -> Response<Body> {
    let n = o.calls.fetch_add(1, Ordering::SeqCst) + 1;
    if !o.delay.is_zero() {
        tokio::time::sleep(o.delay).await;
    }
    let lang = req_headers
        .get("accept-language")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    let mut r = Response::new(Body::from(format!("call={n} lang={lang}")));
    for (k, v) in o.headers.iter() {
        r.headers_mut()
            .append(HeaderName::from_static(k), HeaderValue::from_static(v));
    }
    r
}

fn app(origin: &Origin, layer: CacheLayer) -> Router {
    Router::new()
        .route("/r", get(handler).post(handler))
        .layer(layer)
        .with_state(origin.clone())
}

fn req(method: Method, uri: &str, headers: &[(&'static str, &'static str)]) -> Request<Body> {
    let mut r = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "example.test");
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.body(Body::empty()).unwrap()
}

async fn send(app: &Router, r: Request<Body>) -> (StatusCode, HeaderMap, Bytes) {
    let resp = app.clone().oneshot(r).await.unwrap();
    let (parts, body) = resp.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

async fn get_twice(
    origin: &Origin,
    layer: CacheLayer,
    headers: &[(&'static str, &'static str)],
) -> (HeaderMap, HeaderMap) {
    let app = app(origin, layer);
    let (_, h1, _) = send(&app, req(Method::GET, "/r", headers)).await;
    let (_, h2, _) = send(&app, req(Method::GET, "/r", headers)).await;
    (h1, h2)
}

fn status(h: &HeaderMap) -> &str {
    h.get("cache-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

const CACHEABLE: &[(&str, &str)] = &[("cache-control", "max-age=60")];

/// 1000 concurrent GETs of a cold URL make exactly one origin call, and every body is identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_burst_of_1000_calls_origin_once() {
    let origin = Origin::new(CACHEABLE).delay(Duration::from_millis(100));
    let app = app(&origin, CacheLayer::new());
    let tasks: Vec<_> = (0..1000)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, req(Method::GET, "/r", &[])).await })
        })
        .collect();
    let mut bodies = Vec::new();
    for t in tasks {
        let (code, _, body) = t.await.unwrap();
        assert_eq!(code, StatusCode::OK);
        bodies.push(body);
    }
    assert_eq!(origin.calls(), 1);
    assert!(bodies.iter().all(|b| b == &bodies[0]));
}

/// After max-age, inside stale-while-revalidate, a burst is all served stale at once and one refresh runs.
#[tokio::test(start_paused = true)]
async fn stale_burst_is_served_at_once_with_one_refresh() {
    let origin = Origin::new(&[("cache-control", "max-age=5, stale-while-revalidate=30")])
        .delay(Duration::from_millis(200));
    let app = app(&origin, CacheLayer::new());
    send(&app, req(Method::GET, "/r", &[])).await;
    tokio::time::advance(Duration::from_secs(6)).await;

    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..300)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, req(Method::GET, "/r", &[])).await })
        })
        .collect();
    for t in tasks {
        let (_, h, body) = t.await.unwrap();
        assert!(status(&h).contains("detail=stale"), "{}", status(&h));
        assert_eq!(body, "call=1 lang=-");
    }
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "nobody waited for the origin"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(origin.calls(), 2, "exactly one refresh");
    let (_, h, body) = send(&app, req(Method::GET, "/r", &[])).await;
    assert!(status(&h).contains("hit"));
    assert_eq!(body, "call=2 lang=-");
}

/// An inner service error reaches the leading request as-is; the waiters get a 502, and the origin ran once.
#[tokio::test(start_paused = true)]
async fn inner_error_is_shared_not_retried() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let inner = tower::service_fn(move |_req: Request<RequestBody<Body>>| {
        let c = c.clone();
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            Err::<Response<Body>, _>(std::io::Error::other("upstream reset"))
        }
    });
    let svc = tower::ServiceBuilder::new()
        .layer(CacheLayer::new())
        .service(inner);
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(req(Method::GET, "/e", &[])).await })
        })
        .collect();
    let (mut errors, mut bad_gateway) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Err(e) => {
                assert_eq!(e.to_string(), "upstream reset");
                errors += 1;
            }
            Ok(r) => {
                assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
                assert!(status(r.headers()).contains("detail=origin-error"));
                bad_gateway += 1;
            }
        }
    }
    assert_eq!((errors, bad_gateway), (1, 19));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A panicking origin answers every waiter with 502, and the next request elects a new leader.
#[tokio::test(start_paused = true)]
async fn origin_panic_is_contained() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let inner = tower::service_fn(move |_req: Request<RequestBody<Body>>| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if n == 0 {
                panic!("handler bug");
            }
            let mut r = Response::new(Body::from("ok"));
            r.headers_mut()
                .insert("cache-control", HeaderValue::from_static("max-age=60"));
            Ok::<_, Infallible>(r)
        }
    });
    let svc = tower::ServiceBuilder::new()
        .layer(CacheLayer::new())
        .service(inner);
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(req(Method::GET, "/p", &[])).await.unwrap() })
        })
        .collect();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        assert!(status(r.headers()).contains("origin-panic"));
    }
    let r = svc.oneshot(req(Method::GET, "/p", &[])).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A leading request dropped mid-flight (client gone) still fills the entry for its waiters.
#[tokio::test(start_paused = true)]
async fn dropped_leader_request_still_fills() {
    let origin = Origin::new(CACHEABLE).delay(Duration::from_millis(100));
    let app = app(&origin, CacheLayer::new());
    let leader = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, req(Method::GET, "/r", &[])).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, req(Method::GET, "/r", &[])).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    leader.abort();
    for w in waiters {
        let (code, h, body) = w.await.unwrap();
        assert_eq!(code, StatusCode::OK);
        assert_eq!(body, "call=1 lang=-");
        assert!(status(&h).contains("collapsed"));
    }
    assert_eq!(origin.calls(), 1);
}

/// POST is never cached, is marked fwd=method, and a successful one invalidates the GET entry.
#[tokio::test]
async fn unsafe_method_bypasses_and_invalidates() {
    let origin = Origin::new(CACHEABLE);
    let app = app(&origin, CacheLayer::new());
    send(&app, req(Method::GET, "/r", &[])).await;
    let (_, h, _) = send(&app, req(Method::POST, "/r", &[])).await;
    assert!(status(&h).contains("fwd=method"));
    let (_, h, body) = send(&app, req(Method::GET, "/r", &[])).await;
    assert!(status(&h).contains("fwd=uri-miss"), "{}", status(&h));
    assert_eq!(body, "call=3 lang=-");
}

/// A response with no freshness information is not stored.
#[tokio::test]
async fn no_freshness_is_not_stored() {
    let origin = Origin::new(&[]);
    let (_, h2) = get_twice(&origin, CacheLayer::new(), &[]).await;
    assert_eq!(origin.calls(), 2);
    assert!(!status(&h2).contains("stored"));
}

/// A configured default TTL stores a response that has no freshness of its own.
#[tokio::test]
async fn default_ttl_stores() {
    let origin = Origin::new(&[]);
    let layer = CacheLayer::builder()
        .default_ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    let (_, h2) = get_twice(&origin, layer, &[]).await;
    assert_eq!(origin.calls(), 1);
    assert!(status(&h2).contains("hit"));
}

/// An Expires date in the future is explicit freshness.
#[tokio::test]
async fn expires_stores() {
    let expires: &'static str = Box::leak(
        httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(120))
            .into_boxed_str(),
    );
    let origin = Origin::new(&[("expires", expires)]);
    get_twice(&origin, CacheLayer::new(), &[]).await;
    assert_eq!(origin.calls(), 1);
}

/// no-store responses are never stored.
#[tokio::test]
async fn no_store_is_not_stored() {
    let origin = Origin::new(&[("cache-control", "max-age=60, no-store")]);
    get_twice(&origin, CacheLayer::new(), &[]).await;
    assert_eq!(origin.calls(), 2);
}

/// private responses are never stored by this shared cache.
#[tokio::test]
async fn private_is_not_stored() {
    let origin = Origin::new(&[("cache-control", "max-age=60, private")]);
    get_twice(&origin, CacheLayer::new(), &[]).await;
    assert_eq!(origin.calls(), 2);
}

/// Responses that set a cookie are never stored.
#[tokio::test]
async fn set_cookie_is_not_stored() {
    let origin = Origin::new(&[
        ("cache-control", "max-age=60"),
        ("set-cookie", "session=abc"),
    ]);
    get_twice(&origin, CacheLayer::new(), &[]).await;
    assert_eq!(origin.calls(), 2);
}

/// `Vary: *` responses are never stored.
#[tokio::test]
async fn vary_star_is_not_stored() {
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("vary", "*")]);
    get_twice(&origin, CacheLayer::new(), &[]).await;
    assert_eq!(origin.calls(), 2);
}

/// With Authorization and only max-age, the response is not stored (RFC 9111 §3.5).
#[tokio::test]
async fn authorization_without_permission_is_not_stored() {
    let origin = Origin::new(CACHEABLE);
    get_twice(&origin, CacheLayer::new(), &[("authorization", "Bearer a")]).await;
    assert_eq!(origin.calls(), 2);
}

/// With Authorization and `public`, the response is stored, but never served to a request without Authorization.
#[tokio::test]
async fn authorized_public_response_is_not_served_to_anonymous() {
    let origin = Origin::new(&[("cache-control", "public, max-age=60")]);
    let app = app(&origin, CacheLayer::new());
    send(
        &app,
        req(Method::GET, "/r", &[("authorization", "Bearer a")]),
    )
    .await;
    let (_, h, _) = send(
        &app,
        req(Method::GET, "/r", &[("authorization", "Bearer b")]),
    )
    .await;
    assert!(
        status(&h).contains("hit"),
        "explicitly public: shared among authorized requests"
    );
    let (_, h, body) = send(&app, req(Method::GET, "/r", &[])).await;
    assert!(!status(&h).contains("hit"));
    assert_eq!(body, "call=2 lang=-");
}

/// A stored variant is never served to a request whose varied header differs.
#[tokio::test]
async fn vary_mismatch_is_never_served() {
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("vary", "Accept-Language")]);
    let app = app(&origin, CacheLayer::new());
    send(&app, req(Method::GET, "/r", &[("accept-language", "en")])).await;
    let (_, h, body) = send(&app, req(Method::GET, "/r", &[("accept-language", "fr")])).await;
    assert_eq!(body, "call=2 lang=fr");
    assert!(status(&h).contains("fwd=vary-miss"));
    let (_, h, body) = send(&app, req(Method::GET, "/r", &[("accept-language", "en")])).await;
    assert!(status(&h).contains("hit"));
    assert_eq!(body, "call=1 lang=en");
}

/// Concurrent waiters with a different varied header value never receive the leader's variant.
#[tokio::test(start_paused = true)]
async fn vary_mismatch_is_never_shared_with_waiters() {
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("vary", "Accept-Language")])
        .delay(Duration::from_millis(50));
    let app = app(&origin, CacheLayer::new());
    let en = {
        let app = app.clone();
        tokio::spawn(async move {
            send(&app, req(Method::GET, "/r", &[("accept-language", "en")])).await
        })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    let (_, _, fr) = send(&app, req(Method::GET, "/r", &[("accept-language", "fr")])).await;
    assert!(fr.ends_with(b"lang=fr"), "{fr:?}");
    assert!(en.await.unwrap().2.ends_with(b"lang=en"));
}

/// A hit carries Age and a Cache-Status of hit with a ttl; the fill says stored.
#[tokio::test(start_paused = true)]
async fn hit_has_age_and_cache_status() {
    let origin = Origin::new(CACHEABLE);
    let app = app(&origin, CacheLayer::new());
    let (_, h1, _) = send(&app, req(Method::GET, "/r", &[])).await;
    assert!(
        status(&h1).starts_with("herdguard; fwd=uri-miss; fwd-status=200; stored"),
        "{}",
        status(&h1)
    );
    tokio::time::advance(Duration::from_secs(3)).await;
    let (_, h2, _) = send(&app, req(Method::GET, "/r", &[])).await;
    assert_eq!(status(&h2), "herdguard; hit; ttl=57");
    assert_eq!(h2.get("age").unwrap(), "3");
}

/// Two layers with different names hit on one thread at the same moment:
/// each answer carries its own layer's name (hit wordings are reused per
/// thread, never across names), and Age and ttl follow the clock.
#[tokio::test(start_paused = true)]
async fn hit_wording_is_per_layer_name() {
    let origin = Origin::new(CACHEABLE);
    let names = ["edge", "edge2", "e"];
    let apps: Vec<Router> = names
        .iter()
        .map(|n| {
            app(
                &origin,
                CacheLayer::builder().cache_name(*n).build().unwrap(),
            )
        })
        .collect();
    for app in &apps {
        send(app, req(Method::GET, "/r", &[])).await;
    }
    for secs in [0u64, 1, 1, 33] {
        tokio::time::advance(Duration::from_secs(secs)).await;
        for (app, name) in apps.iter().zip(names) {
            let (_, h, _) = send(app, req(Method::GET, "/r", &[])).await;
            let age: u64 = h.get("age").unwrap().to_str().unwrap().parse().unwrap();
            assert_eq!(status(&h), format!("{name}; hit; ttl={}", 60 - age));
        }
    }
    let (_, h, _) = send(&apps[0], req(Method::GET, "/r", &[])).await;
    assert_eq!(h.get("age").unwrap(), "35");
    assert_eq!(origin.calls(), 3);
}

/// HEAD is answered from the GET entry, without a body.
#[tokio::test]
async fn head_is_served_from_get() {
    let origin = Origin::new(CACHEABLE);
    let app = app(&origin, CacheLayer::new());
    send(&app, req(Method::GET, "/r", &[])).await;
    let (code, h, body) = send(&app, req(Method::HEAD, "/r", &[])).await;
    assert_eq!(code, StatusCode::OK);
    assert!(status(&h).contains("hit"));
    assert!(body.is_empty());
    assert_eq!(origin.calls(), 1);
}

/// Range requests share the URL's entry: the first fills it whole, the second is a hit cut to its range.
#[tokio::test]
async fn range_requests_are_cut_from_the_stored_entry() {
    let origin = Origin::new(CACHEABLE);
    let app = app(&origin, CacheLayer::new());
    let range = [("range", "bytes=0-3")];
    let (code, h1, body) = send(&app, req(Method::GET, "/r", &range)).await;
    assert_eq!(
        (code, &body[..]),
        (StatusCode::PARTIAL_CONTENT, &b"call"[..])
    );
    assert!(status(&h1).contains("fwd=uri-miss"), "{}", status(&h1));
    let (code, h2, body) = send(&app, req(Method::GET, "/r", &range)).await;
    assert_eq!(
        (code, &body[..]),
        (StatusCode::PARTIAL_CONTENT, &b"call"[..])
    );
    assert!(status(&h2).contains("hit"), "{}", status(&h2));
    assert_eq!(origin.calls(), 1);
}

/// A request with `Cache-Control: no-cache` goes to the origin.
#[tokio::test]
async fn request_no_cache_bypasses() {
    let origin = Origin::new(CACHEABLE);
    let app = app(&origin, CacheLayer::new());
    send(&app, req(Method::GET, "/r", &[])).await;
    let (_, h, _) = send(
        &app,
        req(Method::GET, "/r", &[("cache-control", "no-cache")]),
    )
    .await;
    assert!(status(&h).contains("fwd=request"));
    assert_eq!(origin.calls(), 2);
}

/// A body over the limit with a Content-Length streams through whole and is not stored.
#[tokio::test]
async fn declared_large_body_passes_through() {
    let big = Bytes::from(vec![b'x'; 4096]);
    let b2 = big.clone();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let inner = tower::service_fn(move |_r: Request<RequestBody<Body>>| {
        c.fetch_add(1, Ordering::SeqCst);
        let b = b2.clone();
        async move {
            let mut r = Response::new(Body::from(b));
            r.headers_mut()
                .insert("cache-control", HeaderValue::from_static("max-age=60"));
            r.headers_mut()
                .insert("content-length", HeaderValue::from_static("4096"));
            Ok::<_, Infallible>(r)
        }
    });
    let mut svc = CacheLayer::builder()
        .max_body_bytes(1024)
        .build()
        .unwrap()
        .layer_service(inner);
    for _ in 0..2 {
        let r = svc
            .ready()
            .await
            .unwrap()
            .call(req(Method::GET, "/big", &[]))
            .await
            .unwrap();
        assert!(
            status(r.headers()).contains("too-large")
                || status(r.headers()).contains("hit-for-pass")
        );
        assert_eq!(r.into_body().collect().await.unwrap().to_bytes(), big);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A streamed body (no Content-Length) that outgrows the limit is delivered intact and not stored.
#[tokio::test]
async fn streamed_large_body_passes_through_intact() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let inner = tower::service_fn(move |_r: Request<RequestBody<Body>>| {
        c.fetch_add(1, Ordering::SeqCst);
        async move {
            let chunks = (0..10u8).map(|i| Ok::<_, Infallible>(Bytes::from(vec![b'a' + i; 300])));
            let mut r = Response::new(Body::from_stream(futures_util::stream::iter(chunks)));
            r.headers_mut()
                .insert("cache-control", HeaderValue::from_static("max-age=60"));
            Ok::<_, Infallible>(r)
        }
    });
    let mut svc = CacheLayer::builder()
        .max_body_bytes(1000)
        .build()
        .unwrap()
        .layer_service(inner);
    let expected: Vec<u8> = (0..10u8).flat_map(|i| vec![b'a' + i; 300]).collect();
    for _ in 0..2 {
        let r = svc
            .ready()
            .await
            .unwrap()
            .call(req(Method::GET, "/stream", &[]))
            .await
            .unwrap();
        assert_eq!(r.into_body().collect().await.unwrap().to_bytes(), expected);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// One layer on several routes shares one store: counters and entries span all routes.
#[tokio::test]
async fn routes_share_one_layer() {
    let origin = Origin::new(CACHEABLE);
    let layer = CacheLayer::new();
    let app = Router::new()
        .route("/a", get(handler))
        .route("/b", get(handler))
        .layer(layer.clone())
        .with_state(origin.clone());
    for uri in ["/a", "/b", "/a", "/b"] {
        send(&app, req(Method::GET, uri, &[])).await;
    }
    assert_eq!(origin.calls(), 2);
    let s = layer.stats();
    assert_eq!((s.misses, s.hits), (2, 2));
    assert_eq!(layer.entry_count(), 2);
}

/// `route_layer` works, and nested routers with the same inner path never share an entry.
// Nested routers strip their prefix; the full path comes from axum's
// OriginalUri, which only the `axum` feature reads.
#[cfg(feature = "axum")]
#[tokio::test]
async fn route_layer_and_nested_routers_keep_keys_apart() {
    let origin = Origin::new(CACHEABLE);
    let layer = CacheLayer::new();
    let inner = || {
        Router::new()
            .route("/x", get(handler))
            .route_layer(layer.clone())
    };
    let app = Router::new()
        .nest("/v1", inner())
        .nest("/v2", inner())
        .with_state(origin.clone());
    let (_, _, b1) = send(&app, req(Method::GET, "/v1/x", &[])).await;
    let (_, _, b2) = send(&app, req(Method::GET, "/v2/x", &[])).await;
    assert_ne!(b1, b2);
    let (_, h, b1_again) = send(&app, req(Method::GET, "/v1/x", &[])).await;
    assert!(status(&h).contains("hit"));
    assert_eq!(b1, b1_again);
    assert_eq!(origin.calls(), 2);
}

/// Trait helper: wrap a service in a layer without ServiceBuilder noise.
trait LayerService {
    fn layer_service<S>(&self, inner: S) -> herdguard::service::CacheService<S>;
}

impl LayerService for CacheLayer {
    fn layer_service<S>(&self, inner: S) -> herdguard::service::CacheService<S> {
        tower::Layer::layer(self, inner)
    }
}

#[allow(dead_code)]
fn _body_type_is_public(_: CacheBody<Body>) {}
