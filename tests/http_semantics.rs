//! RFC 9111 shared-cache behaviour, one rule per test, against a scripted
//! origin service. Time-dependent tests pause tokio time: the layer measures
//! residence on the tokio clock.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use bytes::Bytes;
use herdguard::service::{CacheBody, RequestBody};
use herdguard::CacheLayer;
use http_body_util::BodyExt;
use tower::{Layer, Service, ServiceExt};

type Script = dyn Fn(usize, &Request<Body>) -> Response<Body> + Send + Sync;

/// An origin whose answer to call `n` (1-based) each test scripts; it counts
/// its calls and the 304s it sent, and records every request's headers.
#[derive(Clone)]
struct Origin {
    calls: Arc<AtomicUsize>,
    not_modified: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<HeaderMap>>>,
    script: Arc<Script>,
}

impl Origin {
    fn new(
        script: impl Fn(usize, &Request<Body>) -> Response<Body> + Send + Sync + 'static,
    ) -> Self {
        Self {
            calls: Arc::default(),
            not_modified: Arc::default(),
            seen: Arc::default(),
            script: Arc::new(script),
        }
    }

    /// Always the same headers; the body says which call produced it.
    fn fixed(headers: &'static [(&'static str, &'static str)]) -> Self {
        Self::new(move |n, _| resp(200, headers, &format!("call={n}")))
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn not_modified(&self) -> usize {
        self.not_modified.load(Ordering::SeqCst)
    }

    fn seen(&self, i: usize) -> HeaderMap {
        self.seen.lock().unwrap()[i].clone()
    }

    fn service(
        &self,
        layer: &CacheLayer,
    ) -> impl Service<
        Request<Body>,
        Response = Response<CacheBody<Body>>,
        Error = Infallible,
        Future = impl Send,
    > + Clone
           + Send
           + 'static {
        let o = self.clone();
        layer.layer(tower::service_fn(move |req: Request<RequestBody<Body>>| {
            let req = req.map(Body::new);
            let n = o.calls.fetch_add(1, Ordering::SeqCst) + 1;
            o.seen.lock().unwrap().push(req.headers().clone());
            let r = (o.script)(n, &req);
            if r.status() == StatusCode::NOT_MODIFIED {
                o.not_modified.fetch_add(1, Ordering::SeqCst);
            }
            async move { Ok::<_, Infallible>(r) }
        }))
    }
}

fn resp(status: u16, headers: &[(&str, &str)], body: &str) -> Response<Body> {
    let mut r = Response::new(Body::from(body.to_owned()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    for (k, v) in headers {
        r.headers_mut().append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    r
}

fn req(method: Method, uri: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut r = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "example.test");
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.body(Body::empty()).unwrap()
}

fn get(headers: &[(&str, &str)]) -> Request<Body> {
    req(Method::GET, "/r", headers)
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn cache_status(&self) -> &str {
        self.headers
            .get("cache-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

async fn send<S>(svc: &S, r: Request<Body>) -> Answer
where
    S: Service<Request<Body>, Response = Response<CacheBody<Body>>, Error = Infallible> + Clone,
{
    let resp = svc.clone().oneshot(r).await.unwrap();
    let (parts, body) = resp.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

async fn advance(secs: u64) {
    tokio::time::advance(Duration::from_secs(secs)).await;
}

// ---------------------------------------------------------------- request directives

/// Request no-cache goes to the origin and stores the fresh result for the next request.
#[tokio::test(start_paused = true)]
async fn request_no_cache_forwards_and_stores() {
    let origin = Origin::fixed(&[("cache-control", "max-age=60")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    let a = send(&svc, get(&[("cache-control", "no-cache")])).await;
    assert_eq!(a.body, "call=2");
    assert!(
        a.cache_status()
            .contains("fwd=request; fwd-status=200; stored"),
        "{}",
        a.cache_status()
    );
    let a = send(&svc, get(&[])).await;
    assert_eq!((a.body.as_ref(), origin.calls()), (b"call=2".as_ref(), 2));
    assert!(a.cache_status().contains("hit"));
}

/// `Pragma: no-cache` without Cache-Control acts as request no-cache.
#[tokio::test(start_paused = true)]
async fn request_pragma_no_cache_forwards() {
    let origin = Origin::fixed(&[("cache-control", "max-age=60")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    let a = send(&svc, get(&[("pragma", "no-cache")])).await;
    assert!(a.cache_status().contains("fwd=request"));
    assert_eq!(origin.calls(), 2);
}

/// If-Match, If-Unmodified-Since and Upgrade go to the origin untouched,
/// a warm entry notwithstanding (docs/http_choices.md): the cache cannot
/// judge the precondition or the protocol switch.
#[tokio::test(start_paused = true)]
async fn preconditions_and_upgrades_go_to_the_origin() {
    let origin = Origin::fixed(&[("cache-control", "max-age=60")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    let sent = [
        ("if-match", "\"v1\""),
        ("if-unmodified-since", "Sun, 06 Dec 2026 00:00:00 GMT"),
        ("upgrade", "websocket"),
    ];
    for (i, header) in sent.into_iter().enumerate() {
        let a = send(&svc, get(&[header])).await;
        assert!(
            a.cache_status().contains("fwd=request"),
            "{header:?}: {}",
            a.cache_status()
        );
        assert_eq!(origin.calls(), i + 2, "{header:?}");
    }
}

/// Request no-store goes to the origin and nothing of the exchange is stored.
#[tokio::test(start_paused = true)]
async fn request_no_store_stores_nothing() {
    let origin = Origin::fixed(&[("cache-control", "max-age=60")]);
    let svc = origin.service(&CacheLayer::new());
    let a = send(&svc, get(&[("cache-control", "no-store")])).await;
    assert!(a.cache_status().contains("fwd=request"));
    let a = send(&svc, get(&[])).await;
    assert!(a.cache_status().contains("fwd=uri-miss"));
    assert_eq!(origin.calls(), 2);
}

/// Request max-age refuses a stored response older than it, and accepts a younger one.
#[tokio::test(start_paused = true)]
async fn request_max_age_limits_age() {
    let origin = Origin::fixed(&[("cache-control", "max-age=60")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    advance(10).await;
    let a = send(&svc, get(&[("cache-control", "max-age=30")])).await;
    assert!(a.cache_status().contains("hit"), "{}", a.cache_status());
    let a = send(&svc, get(&[("cache-control", "max-age=5")])).await;
    assert!(
        a.cache_status().contains("fwd=request"),
        "{}",
        a.cache_status()
    );
    assert_eq!(a.body, "call=2");
    assert_eq!(origin.calls(), 2);
}

/// Request max-stale accepts a stale response within its bound, not beyond it.
#[tokio::test(start_paused = true)]
async fn request_max_stale_accepts_bounded_staleness() {
    let origin = Origin::fixed(&[("cache-control", "max-age=5")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    advance(8).await;
    let a = send(&svc, get(&[("cache-control", "max-stale=10")])).await;
    assert_eq!(a.body, "call=1");
    assert!(
        a.cache_status().contains("detail=max-stale"),
        "{}",
        a.cache_status()
    );
    let a = send(&svc, get(&[("cache-control", "max-stale=1")])).await;
    assert_eq!(a.body, "call=2");
    assert_eq!(origin.calls(), 2);
}

/// Request min-fresh refuses a response that will not stay fresh long enough.
#[tokio::test(start_paused = true)]
async fn request_min_fresh_requires_remaining_freshness() {
    let origin = Origin::fixed(&[("cache-control", "max-age=60")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    advance(50).await;
    let a = send(&svc, get(&[("cache-control", "min-fresh=5")])).await;
    assert!(a.cache_status().contains("hit"));
    let a = send(&svc, get(&[("cache-control", "min-fresh=20")])).await;
    assert_eq!(a.body, "call=2");
    assert_eq!(origin.calls(), 2);
}

/// only-if-cached with nothing stored is a 504 and never reaches the origin.
#[tokio::test(start_paused = true)]
async fn only_if_cached_without_entry_is_504() {
    let origin = Origin::fixed(&[("cache-control", "max-age=60")]);
    let svc = origin.service(&CacheLayer::new());
    let a = send(&svc, get(&[("cache-control", "only-if-cached")])).await;
    assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(origin.calls(), 0);
}

/// only-if-cached is answered from a fresh entry, and is a 504 once that entry is stale.
#[tokio::test(start_paused = true)]
async fn only_if_cached_uses_fresh_entry_only() {
    let origin = Origin::fixed(&[("cache-control", "max-age=5")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    let a = send(&svc, get(&[("cache-control", "only-if-cached")])).await;
    assert_eq!(
        (a.status, a.body.as_ref()),
        (StatusCode::OK, b"call=1".as_ref())
    );
    advance(6).await;
    let a = send(&svc, get(&[("cache-control", "only-if-cached")])).await;
    assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(origin.calls(), 1);
}

// ---------------------------------------------------------------- response directives

/// max-age: fresh until it runs out, then the origin is asked again.
#[tokio::test(start_paused = true)]
async fn max_age_expires() {
    let origin = Origin::fixed(&[("cache-control", "max-age=5")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    advance(4).await;
    assert!(send(&svc, get(&[])).await.cache_status().contains("hit"));
    advance(2).await;
    let a = send(&svc, get(&[])).await;
    assert_eq!(a.body, "call=2");
    assert_eq!(origin.calls(), 2);
}

/// s-maxage wins over max-age in a shared cache.
#[tokio::test(start_paused = true)]
async fn s_maxage_wins_over_max_age() {
    let origin = Origin::fixed(&[("cache-control", "max-age=1, s-maxage=60")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    advance(30).await;
    let a = send(&svc, get(&[])).await;
    assert_eq!(a.cache_status(), "herdguard; hit; ttl=30");
    assert_eq!(origin.calls(), 1);
}

/// Response no-cache is stored but revalidated before every use; a 304 serves the stored body.
#[tokio::test(start_paused = true)]
async fn response_no_cache_revalidates_every_use() {
    let origin = Origin::new(|n, r| {
        if r.headers()
            .get("if-none-match")
            .is_some_and(|v| v == "\"v1\"")
        {
            resp(304, &[("etag", "\"v1\"")], "")
        } else {
            resp(
                200,
                &[("cache-control", "no-cache"), ("etag", "\"v1\"")],
                &format!("call={n}"),
            )
        }
    });
    let svc = origin.service(&CacheLayer::new());
    for _ in 0..3 {
        let a = send(&svc, get(&[])).await;
        assert_eq!(
            (a.status, a.body.as_ref()),
            (StatusCode::OK, b"call=1".as_ref())
        );
    }
    assert_eq!((origin.calls(), origin.not_modified()), (3, 2));
}

/// must-revalidate: never served stale, neither by stale-while-revalidate nor by client max-stale.
#[tokio::test(start_paused = true)]
async fn must_revalidate_is_never_stale() {
    let origin = Origin::fixed(&[(
        "cache-control",
        "max-age=1, stale-while-revalidate=60, must-revalidate",
    )]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    advance(2).await;
    let a = send(&svc, get(&[("cache-control", "max-stale=100")])).await;
    assert_eq!(a.body, "call=2");
    advance(2).await;
    let a = send(&svc, get(&[])).await;
    assert_eq!(a.body, "call=3");
    assert_eq!(origin.calls(), 3);
}

/// proxy-revalidate: a shared cache never serves it stale either.
#[tokio::test(start_paused = true)]
async fn proxy_revalidate_is_never_stale() {
    let origin = Origin::fixed(&[("cache-control", "max-age=1, proxy-revalidate")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    advance(2).await;
    let a = send(&svc, get(&[("cache-control", "max-stale")])).await;
    assert_eq!(a.body, "call=2");
    assert_eq!(origin.calls(), 2);
}

/// stale-while-revalidate: served stale at once inside the window, one background refresh.
#[tokio::test(start_paused = true)]
async fn stale_while_revalidate_serves_stale_and_refreshes_once() {
    let origin = Origin::fixed(&[("cache-control", "max-age=1, stale-while-revalidate=30")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    advance(3).await;
    for _ in 0..5 {
        let a = send(&svc, get(&[])).await;
        assert_eq!(a.body, "call=1");
        assert!(a.cache_status().contains("detail=stale"));
    }
    tokio::task::yield_now().await;
    advance(0).await;
    assert_eq!(origin.calls(), 2);
    assert_eq!(send(&svc, get(&[])).await.body, "call=2");
}

/// stale-if-error: an origin 5xx is replaced by the stale copy within the window, not after it.
#[tokio::test(start_paused = true)]
async fn stale_if_error_serves_stale_on_5xx() {
    let origin = Origin::new(|n, _| {
        if n == 1 {
            resp(
                200,
                &[("cache-control", "max-age=1, stale-if-error=60")],
                "good",
            )
        } else {
            resp(503, &[], "down")
        }
    });
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    advance(10).await;
    let a = send(&svc, get(&[])).await;
    assert_eq!(
        (a.status, a.body.as_ref()),
        (StatusCode::OK, b"good".as_ref())
    );
    assert!(
        a.cache_status()
            .contains("fwd-status=503; ttl=-9; detail=stale-if-error"),
        "{}",
        a.cache_status()
    );
    advance(60).await;
    let a = send(&svc, get(&[])).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(origin.calls(), 3);
}

/// public lets a response to an authorized request be stored (§3.5).
#[tokio::test(start_paused = true)]
async fn public_allows_storing_authorized_response() {
    let origin = Origin::fixed(&[("cache-control", "public, max-age=60")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[("authorization", "Bearer a")])).await;
    let a = send(&svc, get(&[("authorization", "Bearer a")])).await;
    assert!(a.cache_status().contains("hit"));
    assert_eq!(origin.calls(), 1);
}

// ---------------------------------------------------------------- freshness arithmetic

/// The origin's Age counts toward the entry's age: Age and ttl on the hit reflect it.
#[tokio::test(start_paused = true)]
async fn age_header_is_part_of_current_age() {
    let origin = Origin::fixed(&[("cache-control", "max-age=60"), ("age", "50")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    advance(5).await;
    let a = send(&svc, get(&[])).await;
    assert_eq!(a.header("age"), "55");
    assert_eq!(a.cache_status(), "herdguard; hit; ttl=5");
    advance(6).await;
    assert_eq!(send(&svc, get(&[])).await.body, "call=2");
}

/// Heuristic freshness is off by default: Last-Modified alone is not stored.
#[tokio::test(start_paused = true)]
async fn heuristic_freshness_is_off_by_default() {
    let lm = httpdate::fmt_http_date(std::time::SystemTime::now() - Duration::from_secs(1000));
    let lm: &'static str = Box::leak(lm.into_boxed_str());
    let origin = Origin::new(move |n, _| resp(200, &[("last-modified", lm)], &format!("call={n}")));
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    send(&svc, get(&[])).await;
    assert_eq!(origin.calls(), 2);
}

/// Heuristic freshness when switched on: 10 % of the Last-Modified age, capped.
#[tokio::test(start_paused = true)]
async fn heuristic_freshness_when_enabled() {
    let lm = httpdate::fmt_http_date(std::time::SystemTime::now() - Duration::from_secs(1000));
    let lm: &'static str = Box::leak(lm.into_boxed_str());
    let origin = Origin::new(move |n, _| resp(200, &[("last-modified", lm)], &format!("call={n}")));
    let layer = CacheLayer::builder()
        .heuristic_freshness(Duration::from_secs(3600))
        .build()
        .unwrap();
    let svc = origin.service(&layer);
    send(&svc, get(&[])).await;
    advance(99).await;
    let a = send(&svc, get(&[])).await;
    assert!(
        a.cache_status().starts_with("herdguard; hit; ttl="),
        "{}",
        a.cache_status()
    );
    advance(2).await;
    send(&svc, get(&[])).await;
    assert_eq!(origin.calls(), 2);
}

// ---------------------------------------------------------------- Vary

/// Several variants of one URL coexist: each is stored once and then hit.
#[tokio::test(start_paused = true)]
async fn vary_variants_coexist() {
    let origin = Origin::new(|n, r| {
        let lang = r
            .headers()
            .get("accept-language")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-");
        resp(
            200,
            &[("cache-control", "max-age=60"), ("vary", "Accept-Language")],
            &format!("call={n} lang={lang}"),
        )
    });
    let svc = origin.service(&CacheLayer::new());
    for round in 0..3 {
        for lang in ["en", "fr", "de"] {
            let a = send(&svc, get(&[("accept-language", lang)])).await;
            assert!(
                a.body.ends_with(format!("lang={lang}").as_bytes()),
                "{:?}",
                a.body
            );
            assert_eq!(
                a.cache_status().contains("hit"),
                round > 0,
                "{}",
                a.cache_status()
            );
        }
    }
    assert_eq!(origin.calls(), 3);
}

/// No Vary mismatch is ever served: every answer echoes the request's own header values.
#[tokio::test(start_paused = true)]
async fn vary_mismatch_is_never_served() {
    let origin = Origin::new(|n, r| {
        let v = |h: &str| {
            r.headers()
                .get(h)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_owned()
        };
        resp(
            200,
            &[
                ("cache-control", "max-age=60"),
                ("vary", "accept-language, x-tenant"),
            ],
            &format!("{}|{}|{n}", v("accept-language"), v("x-tenant")),
        )
    });
    let svc = origin.service(&CacheLayer::new());
    let langs = [None, Some("en"), Some("fr")];
    let tenants = [None, Some("a"), Some("b")];
    for _ in 0..2 {
        for l in langs {
            for t in tenants {
                let mut h = Vec::new();
                if let Some(l) = l {
                    h.push(("accept-language", l));
                }
                if let Some(t) = t {
                    h.push(("x-tenant", t));
                }
                let a = send(&svc, get(&h)).await;
                let want = format!("{}|{}|", l.unwrap_or("-"), t.unwrap_or("-"));
                assert!(
                    a.body.starts_with(want.as_bytes()),
                    "{want} got {:?}",
                    a.body
                );
            }
        }
    }
    assert_eq!(origin.calls(), 9);
}

/// `Vary: *` never matches: nothing is stored.
#[tokio::test(start_paused = true)]
async fn vary_star_never_matches() {
    let origin = Origin::fixed(&[("cache-control", "max-age=60"), ("vary", "*")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    send(&svc, get(&[])).await;
    assert_eq!(origin.calls(), 2);
}

// ---------------------------------------------------------------- conditional requests

/// A client's matching If-None-Match is answered 304 from the cache, without the origin.
#[tokio::test(start_paused = true)]
async fn client_if_none_match_gets_304_from_cache() {
    let origin = Origin::fixed(&[("cache-control", "max-age=60"), ("etag", "\"abc\"")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    let a = send(&svc, get(&[("if-none-match", "W/\"abc\"")])).await;
    assert_eq!(a.status, StatusCode::NOT_MODIFIED);
    assert!(a.body.is_empty());
    assert_eq!(a.header("etag"), "\"abc\"");
    let a = send(&svc, get(&[("if-none-match", "\"other\"")])).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(origin.calls(), 1);
}

/// A client's If-Modified-Since not older than Last-Modified is answered 304 from the cache.
#[tokio::test(start_paused = true)]
async fn client_if_modified_since_gets_304_from_cache() {
    let origin = Origin::fixed(&[
        ("cache-control", "max-age=60"),
        ("last-modified", "Tue, 01 Jan 2030 00:00:00 GMT"),
    ]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    let a = send(
        &svc,
        get(&[("if-modified-since", "Tue, 01 Jan 2030 00:00:00 GMT")]),
    )
    .await;
    assert_eq!(a.status, StatusCode::NOT_MODIFIED);
    let a = send(
        &svc,
        get(&[("if-modified-since", "Mon, 31 Dec 2029 00:00:00 GMT")]),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(origin.calls(), 1);
}

/// Headers a 304 freshens reach the hits after it: the served head a hit
/// built on the stored entry is not carried over to the freshened copy the
/// background refresh (stale-while-revalidate) makes from it.
#[tokio::test(start_paused = true)]
async fn hits_after_a_304_carry_the_freshened_headers() {
    let origin = Origin::new(|n, r| {
        let version = format!("{n}");
        let headers = [
            ("etag", "\"v1\""),
            ("cache-control", "max-age=5, stale-while-revalidate=30"),
            ("x-version", version.as_str()),
        ];
        if r.headers().contains_key("if-none-match") {
            resp(304, &headers, "")
        } else {
            resp(200, &headers, "full")
        }
    });
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    let hit = send(&svc, get(&[])).await;
    assert_eq!(
        (hit.cache_status(), hit.header("x-version")),
        ("herdguard; hit; ttl=5", "1")
    );
    advance(6).await;
    let stale = send(&svc, get(&[])).await;
    assert_eq!(stale.header("x-version"), "1", "{}", stale.cache_status());
    for _ in 0..50 {
        if origin.not_modified() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(origin.not_modified(), 1, "the background refresh ran");
    tokio::time::sleep(Duration::from_millis(10)).await;
    let hit = send(&svc, get(&[])).await;
    assert_eq!(hit.header("x-version"), "2", "{}", hit.cache_status());
}

/// Revalidation round trip: each expiry costs one conditional request, answered 304, and the stored body is served.
#[tokio::test(start_paused = true)]
async fn revalidation_round_trip_counts_304s() {
    let origin = Origin::new(|n, r| {
        if r.headers()
            .get("if-none-match")
            .is_some_and(|v| v == "\"v1\"")
        {
            resp(
                304,
                &[("etag", "\"v1\""), ("cache-control", "max-age=5")],
                "",
            )
        } else {
            resp(
                200,
                &[("etag", "\"v1\""), ("cache-control", "max-age=5")],
                &format!("full={n}"),
            )
        }
    });
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    for round in 1..=3 {
        advance(6).await;
        let a = send(&svc, get(&[])).await;
        assert_eq!(
            (a.status, a.body.as_ref()),
            (StatusCode::OK, b"full=1".as_ref())
        );
        assert!(
            a.cache_status()
                .contains("fwd=stale; fwd-status=304; stored; ttl=5"),
            "{}",
            a.cache_status()
        );
        let b = send(&svc, get(&[])).await;
        assert!(
            b.cache_status().contains("hit"),
            "round {round}: {}",
            b.cache_status()
        );
    }
    assert_eq!((origin.calls(), origin.not_modified()), (4, 3));
    assert!(origin.seen(0).get("if-none-match").is_none());
    assert_eq!(origin.seen(1).get("if-none-match").unwrap(), "\"v1\"");
}

/// A 304 replaces the stored headers it carries (and the freshness), but never Content-Length.
#[tokio::test(start_paused = true)]
async fn not_modified_updates_stored_headers() {
    let origin = Origin::new(|_, r| {
        if r.headers().contains_key("if-modified-since") {
            resp(
                304,
                &[
                    ("cache-control", "max-age=100"),
                    ("x-version", "2"),
                    ("content-length", "999"),
                ],
                "",
            )
        } else {
            resp(
                200,
                &[
                    ("cache-control", "max-age=5"),
                    ("x-version", "1"),
                    ("last-modified", "Tue, 01 Jan 2030 00:00:00 GMT"),
                ],
                "body",
            )
        }
    });
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    advance(6).await;
    let a = send(&svc, get(&[])).await;
    assert_eq!(a.header("x-version"), "2");
    assert_eq!(a.body, "body");
    advance(50).await;
    let a = send(&svc, get(&[])).await;
    assert!(a.cache_status().contains("hit"), "{}", a.cache_status());
    assert_eq!(a.header("x-version"), "2");
    assert_ne!(a.header("content-length"), "999");
    assert_eq!((origin.calls(), origin.not_modified()), (2, 1));
}

// ---------------------------------------------------------------- unsafe methods, HEAD, Range, pass

/// A successful POST invalidates its target URI and a same-origin Location, but not a foreign one.
#[tokio::test(start_paused = true)]
async fn unsafe_method_invalidates_target_and_same_origin_location() {
    let origin = Origin::new(|n, r| {
        if r.method() == Method::POST {
            resp(
                201,
                &[
                    ("location", "/created"),
                    ("content-location", "http://other.test/foreign"),
                ],
                "",
            )
        } else {
            resp(
                200,
                &[("cache-control", "max-age=60")],
                &format!("call={n}"),
            )
        }
    });
    let svc = origin.service(&CacheLayer::new());
    for uri in ["/r", "/created", "/foreign"] {
        send(&svc, req(Method::GET, uri, &[])).await;
    }
    let a = send(&svc, req(Method::POST, "/r", &[])).await;
    assert!(a.cache_status().contains("fwd=method"));
    let misses: Vec<bool> = {
        let mut v = Vec::new();
        for uri in ["/r", "/created", "/foreign"] {
            v.push(
                send(&svc, req(Method::GET, uri, &[]))
                    .await
                    .cache_status()
                    .contains("fwd="),
            );
        }
        v
    };
    // /foreign was stored under example.test, and other.test is another origin.
    assert_eq!(misses, [true, true, false]);
    assert_eq!(origin.calls(), 6);
}

/// A failed unsafe request (5xx) invalidates nothing.
#[tokio::test(start_paused = true)]
async fn failed_unsafe_method_does_not_invalidate() {
    let origin = Origin::new(|n, r| {
        if r.method() == Method::DELETE {
            resp(500, &[], "")
        } else {
            resp(
                200,
                &[("cache-control", "max-age=60")],
                &format!("call={n}"),
            )
        }
    });
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    send(&svc, req(Method::DELETE, "/r", &[])).await;
    assert!(send(&svc, get(&[])).await.cache_status().contains("hit"));
    assert_eq!(origin.calls(), 2);
}

/// HEAD is answered from the stored GET, with headers and no body.
#[tokio::test(start_paused = true)]
async fn head_is_served_from_stored_get() {
    let origin = Origin::fixed(&[("cache-control", "max-age=60"), ("x-a", "1")]);
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[])).await;
    let a = send(&svc, req(Method::HEAD, "/r", &[])).await;
    assert_eq!(
        (a.status, a.header("x-a"), a.body.len()),
        (StatusCode::OK, "1", 0)
    );
    assert_eq!(origin.calls(), 1);
}

/// A 206 from the origin (even to the cache's whole-object fill) is passed on as it is and never stored.
#[tokio::test(start_paused = true)]
async fn origin_206_is_passed_on_never_stored() {
    let origin = Origin::new(|_, _| {
        resp(
            206,
            &[
                ("cache-control", "max-age=60"),
                ("content-range", "bytes 0-1/4"),
            ],
            "ab",
        )
    });
    let svc = origin.service(&CacheLayer::new());
    let a = send(&svc, get(&[("range", "bytes=0-1")])).await;
    assert_eq!(a.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(a.header("content-range"), "bytes 0-1/4");
    assert_eq!(a.body, "ab");
    assert!(!a.cache_status().contains("stored"), "{}", a.cache_status());
    send(&svc, get(&[])).await;
    send(&svc, get(&[])).await;
    assert_eq!(origin.calls(), 3);
}

/// Hit-for-pass: after an uncacheable answer, the next request goes straight to the origin.
#[tokio::test(start_paused = true)]
async fn hit_for_pass_marks_uncacheable() {
    let origin = Origin::fixed(&[("cache-control", "private, max-age=60")]);
    let svc = origin.service(&CacheLayer::new());
    let a = send(&svc, get(&[])).await;
    assert!(
        a.cache_status().contains("detail=uncacheable"),
        "{}",
        a.cache_status()
    );
    let a = send(&svc, get(&[])).await;
    assert!(
        a.cache_status().contains("detail=hit-for-pass"),
        "{}",
        a.cache_status()
    );
    assert_eq!(origin.calls(), 2);
}

/// Concurrent requests for one cold key are reported as one stored fill and collapsed waiters.
#[tokio::test(start_paused = true)]
async fn cache_status_reports_collapsed() {
    let origin = Origin::fixed(&[("cache-control", "max-age=60")]);
    let svc = origin.service(&CacheLayer::new());
    let (a, b) = tokio::join!(send(&svc, get(&[])), send(&svc, get(&[])));
    let mut statuses = [a.cache_status().to_owned(), b.cache_status().to_owned()];
    statuses.sort();
    assert_eq!(
        statuses,
        [
            "herdguard; fwd=uri-miss; fwd-status=200; collapsed".to_owned(),
            "herdguard; fwd=uri-miss; fwd-status=200; stored; ttl=60".to_owned()
        ]
    );
    assert_eq!(origin.calls(), 1);
}

// ---------------------------------------------------------------- cross-user safety

/// Authorization without public or s-maxage: never stored, every request reaches the origin.
#[tokio::test(start_paused = true)]
async fn authorization_without_permission_is_never_stored() {
    let origin = Origin::fixed(&[("cache-control", "max-age=60")]);
    let svc = origin.service(&CacheLayer::new());
    for token in ["Bearer a", "Bearer a", "Bearer b"] {
        send(&svc, get(&[("authorization", token)])).await;
    }
    assert_eq!(origin.calls(), 3);
}

/// A response to an authorized request is never served to a request without Authorization, even when public.
#[tokio::test(start_paused = true)]
async fn authorized_response_never_reaches_anonymous() {
    let origin = Origin::new(|n, r| {
        let who = if r.headers().contains_key("authorization") {
            "user"
        } else {
            "anon"
        };
        resp(
            200,
            &[("cache-control", "public, s-maxage=60")],
            &format!("{who}:{n}"),
        )
    });
    let svc = origin.service(&CacheLayer::new());
    send(&svc, get(&[("authorization", "Bearer a")])).await;
    let a = send(&svc, get(&[])).await;
    assert_eq!(a.body, "anon:2");
    let a = send(&svc, get(&[("authorization", "Bearer a")])).await;
    assert_eq!(a.body, "user:1");
    let a = send(&svc, get(&[])).await;
    assert_eq!(a.body, "anon:2");
    assert_eq!(origin.calls(), 2);
}

// ---------------------------------------------------------------- invalidation

fn tagged(n: usize, r: &Request<Body>) -> Response<Body> {
    let tags = match r.uri().path() {
        "/a" => "product-1 list",
        "/b" => "product-2 list",
        _ => "other",
    };
    resp(
        200,
        &[
            ("cache-control", "max-age=600"),
            ("surrogate-key", tags),
            ("vary", "accept-language"),
        ],
        &format!("call={n}"),
    )
}

async fn hit(
    svc: &(impl Service<Request<Body>, Response = Response<CacheBody<Body>>, Error = Infallible>
          + Clone),
    uri: &str,
    h: &[(&str, &str)],
) -> bool {
    send(svc, req(Method::GET, uri, h))
        .await
        .cache_status()
        .contains("hit")
}

/// purge_url removes every variant of the URL (Vary and Authorization) and nothing else.
#[tokio::test(start_paused = true)]
async fn purge_url_removes_all_variants() {
    let origin = Origin::new(tagged);
    let layer = CacheLayer::new();
    let svc = origin.service(&layer);
    let variants: [&[(&str, &str)]; 3] = [
        &[("accept-language", "en")],
        &[("accept-language", "fr")],
        &[],
    ];
    for v in variants {
        send(&svc, req(Method::GET, "/a", v)).await;
    }
    send(&svc, req(Method::GET, "/b", &[])).await;
    drop(layer.purge_url("http://example.test/a"));
    for v in variants {
        assert!(!hit(&svc, "/a", v).await);
    }
    assert!(hit(&svc, "/b", &[]).await);
    assert_eq!(origin.calls(), 7);
}

/// purge_key with a URL key has the same effect as purge_url.
#[tokio::test(start_paused = true)]
async fn purge_key_removes_the_url() {
    let origin = Origin::new(tagged);
    let layer = CacheLayer::new();
    let svc = origin.service(&layer);
    send(&svc, req(Method::GET, "/a", &[])).await;
    drop(layer.purge_key(&layer.url_key(&"http://example.test/a".parse().unwrap())));
    assert!(!hit(&svc, "/a", &[]).await);
    assert_eq!(origin.calls(), 2);
}

/// purge_tag removes exactly the entries whose Surrogate-Key carries the tag.
#[tokio::test(start_paused = true)]
async fn purge_tag_removes_tagged_entries_only() {
    let origin = Origin::new(tagged);
    let layer = CacheLayer::new();
    let svc = origin.service(&layer);
    for uri in ["/a", "/b", "/c"] {
        send(&svc, req(Method::GET, uri, &[])).await;
    }
    drop(layer.purge_tag("product-1"));
    assert_eq!(
        [
            hit(&svc, "/a", &[]).await,
            hit(&svc, "/b", &[]).await,
            hit(&svc, "/c", &[]).await
        ],
        [false, true, true]
    );
    drop(layer.purge_tag("list"));
    assert_eq!(
        [
            hit(&svc, "/a", &[]).await,
            hit(&svc, "/b", &[]).await,
            hit(&svc, "/c", &[]).await
        ],
        [false, false, true]
    );
    assert_eq!(origin.calls(), 6);
}

/// A purged response with validators is not revalidated afterwards: the next request fetches it whole.
#[tokio::test(start_paused = true)]
async fn purge_also_drops_retained_copies() {
    let origin = Origin::new(|n, _| {
        resp(
            200,
            &[
                ("cache-control", "max-age=1"),
                ("etag", "\"x\""),
                ("surrogate-key", "t"),
            ],
            &format!("call={n}"),
        )
    });
    let layer = CacheLayer::new();
    let svc = origin.service(&layer);
    send(&svc, get(&[])).await;
    advance(2).await;
    drop(layer.purge_tag("t"));
    let a = send(&svc, get(&[])).await;
    assert!(
        a.cache_status().contains("fwd=uri-miss"),
        "{}",
        a.cache_status()
    );
    assert_eq!(origin.seen(1).get("if-none-match"), None);
    assert_eq!(origin.not_modified(), 0);
}

/// Hostile headers (huge, non-UTF-8, malformed directives and validators) never panic and fail safe.
#[tokio::test(start_paused = true)]
async fn hostile_headers_fail_safe() {
    let origin = Origin::new(|n, _| {
        let mut r = resp(
            200,
            &[
                (
                    "cache-control",
                    "max-age=99999999999999999999, s-maxage=\"x\"",
                ),
                ("etag", "\"unterminated"),
            ],
            &format!("call={n}"),
        );
        r.headers_mut()
            .insert("vary", HeaderValue::from_bytes(b"accept, \xff").unwrap());
        r
    });
    let svc = origin.service(&CacheLayer::new());
    let big = "x".repeat(64 * 1024);
    let mut r = get(&[
        ("cache-control", "max-stale=abc, min-fresh=-1, max-age=1e9"),
        ("if-none-match", "W/\""),
    ]);
    r.headers_mut().insert(
        "if-modified-since",
        HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
    );
    r.headers_mut()
        .insert("x-big", HeaderValue::from_str(&big).unwrap());
    let a = send(&svc, r).await;
    assert_eq!(a.status, StatusCode::OK);
    send(&svc, get(&[])).await;
    assert_eq!(origin.calls(), 2, "unreadable Vary is never stored");
}
