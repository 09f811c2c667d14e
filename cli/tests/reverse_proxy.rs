//! The reverse proxy example over real loopback HTTP: an axum origin on
//! 127.0.0.1:0, the proxy on 127.0.0.1:0, and a hyper client.

use herdguard_cli::app as proxy;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Request, Response, StatusCode};
use axum::routing::{any, get};
use axum::Router;
use bytes::Bytes;
use herdguard::CacheLayer;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[derive(Clone, Default)]
struct Counts {
    cached: Arc<AtomicUsize>,
    full: Arc<AtomicUsize>,
    not_modified: Arc<AtomicUsize>,
}

/// Echoes what arrived: method, body, and the headers a proxy is expected to set or drop.
async fn echo(req: Request<Body>) -> String {
    let (parts, body) = req.into_parts();
    let h = |n: &str| {
        parts
            .headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let body = body.collect().await.unwrap().to_bytes();
    format!(
        "method={} body={} xff={} xfp={} via={} x-secret={} x-end={}",
        parts.method,
        String::from_utf8_lossy(&body),
        h("x-forwarded-for"),
        h("x-forwarded-proto"),
        h("via"),
        h("x-secret"),
        h("x-end"),
    )
}

async fn cached(State(c): State<Counts>, headers: HeaderMap) -> Response<Body> {
    let n = c.cached.fetch_add(1, Ordering::SeqCst) + 1;
    let tag = headers
        .get("x-tag")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("t1")
        .to_owned();
    // `x-swr`: served stale for a minute past freshness while one refresh runs.
    let cache_control = if headers.contains_key("x-swr") {
        "max-age=60, stale-while-revalidate=60"
    } else {
        "max-age=60"
    };
    let mut r = Response::builder()
        .header("cache-control", cache_control)
        .header("surrogate-key", tag);
    // `x-via`: the origin answers with this `Via` of its own.
    if let Some(via) = headers.get("x-via") {
        r = r.header("via", via);
    }
    r.body(Body::from(format!("call={n}"))).unwrap()
}

/// Always stale on arrival, with an ETag: every use is a conditional request.
async fn etag(State(c): State<Counts>, headers: HeaderMap) -> Response<Body> {
    if headers.get("if-none-match").is_some_and(|v| v == "\"v1\"") {
        c.not_modified.fetch_add(1, Ordering::SeqCst);
        return Response::builder()
            .status(304)
            .header("etag", "\"v1\"")
            .body(Body::empty())
            .unwrap();
    }
    let n = c.full.fetch_add(1, Ordering::SeqCst) + 1;
    Response::builder()
        .header("cache-control", "max-age=0")
        .header("etag", "\"v1\"")
        .body(Body::from(format!("full={n}")))
        .unwrap()
}

async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

struct Setup {
    proxy: SocketAddr,
    counts: Counts,
    client: Client<HttpConnector, Body>,
}

async fn setup(purge_token: Option<&str>) -> Setup {
    let counts = Counts::default();
    let origin = Router::new()
        .route("/echo", any(echo))
        .route("/cached/{n}", get(cached))
        .route("/etag", get(etag))
        .with_state(counts.clone());
    let origin = serve(origin).await;
    let config = proxy::Config {
        upstream: format!("http://{origin}").parse().unwrap(),
        purge_token: purge_token.map(str::to_owned),
    };
    let proxy = serve(proxy::app(config, CacheLayer::new())).await;
    Setup {
        proxy,
        counts,
        client: Client::builder(TokioExecutor::new()).build_http(),
    }
}

impl Setup {
    async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let mut r = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).unwrap())
            .uri(format!("http://{}{path}", self.proxy))
            .header("host", "example.test");
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let resp = self
            .client
            .request(r.body(Body::from(body.to_owned())).unwrap())
            .await
            .unwrap();
        let (parts, body) = resp.into_parts();
        (
            parts.status,
            parts.headers,
            body.collect().await.unwrap().to_bytes(),
        )
    }
}

fn cache_status(h: &HeaderMap) -> &str {
    h.get("cache-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Any method and its body reach the upstream; Via and X-Forwarded-For are set; hop-by-hop headers are not forwarded.
#[tokio::test]
async fn forwards_method_body_and_end_to_end_headers_only() {
    let s = setup(None).await;
    let (code, h, body) = s
        .send(
            "PATCH",
            "/echo",
            &[
                ("connection", "x-secret"),
                ("x-secret", "1"),
                ("x-end", "2"),
            ],
            "payload",
        )
        .await;
    assert_eq!(code, StatusCode::OK);
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("method=PATCH body=payload"), "{body}");
    assert!(body.contains("xff=127.0.0.1 "), "{body}");
    assert!(body.contains("via=1.1 herdguard"), "{body}");
    assert!(body.contains("x-secret=- x-end=2"), "{body}");
    assert_eq!(h.get("via").unwrap(), "1.1 herdguard");
    assert!(cache_status(&h).contains("fwd=method"));
}

/// The example trusts no peer by default: a client's X-Forwarded-For and -Proto are replaced by what its connection shows.
#[tokio::test]
async fn no_peer_is_trusted_by_default() {
    let s = setup(None).await;
    let (_, _, body) = s
        .send(
            "GET",
            "/echo",
            &[
                ("x-forwarded-for", "10.0.0.1"),
                ("x-forwarded-proto", "javascript"),
            ],
            "",
        )
        .await;
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("xff=127.0.0.1 xfp=http "), "{body}");
}

/// GETs through the proxy are cached: two requests, one upstream call, and Surrogate-Key is not shown to clients.
#[tokio::test]
async fn caches_gets_through_the_proxy() {
    let s = setup(None).await;
    let (_, h1, b1) = s.send("GET", "/cached/1", &[], "").await;
    let (_, h2, b2) = s.send("GET", "/cached/1", &[], "").await;
    assert_eq!(
        (b1.as_ref(), b2.as_ref()),
        (b"call=1".as_ref(), b"call=1".as_ref())
    );
    assert!(cache_status(&h1).contains("fwd=uri-miss; fwd-status=200; stored"));
    assert!(cache_status(&h2).contains("hit"));
    assert!(h2.get("surrogate-key").is_none());
    assert_eq!(s.counts.cached.load(Ordering::SeqCst), 1);
}

/// A stale entry with an ETag is revalidated through the proxy: one full response, then only 304s from the upstream.
#[tokio::test]
async fn revalidation_round_trip_through_proxy() {
    let s = setup(None).await;
    for _ in 0..4 {
        let (code, _, body) = s.send("GET", "/etag", &[], "").await;
        assert_eq!((code, body.as_ref()), (StatusCode::OK, b"full=1".as_ref()));
    }
    assert_eq!(s.counts.full.load(Ordering::SeqCst), 1);
    assert_eq!(s.counts.not_modified.load(Ordering::SeqCst), 3);
}

/// Purge is off by default: PURGE is refused with 405 and the entry stays.
#[tokio::test]
async fn purge_is_off_by_default() {
    let s = setup(None).await;
    s.send("GET", "/cached/1", &[], "").await;
    let (code, _, _) = s
        .send("PURGE", "/cached/1", &[("x-purge-token", "t")], "")
        .await;
    assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
    let (_, h, _) = s.send("GET", "/cached/1", &[], "").await;
    assert!(cache_status(&h).contains("hit"));
    assert_eq!(s.counts.cached.load(Ordering::SeqCst), 1);
}

/// PURGE <url> needs the configured token; with it, the URL is fetched anew.
#[tokio::test]
async fn purge_url_requires_the_token() {
    let s = setup(Some("sesame")).await;
    s.send("GET", "/cached/1", &[], "").await;
    let (code, _, _) = s
        .send("PURGE", "/cached/1", &[("x-purge-token", "wrong")], "")
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    let (code, _, _) = s.send("PURGE", "/cached/1", &[], "").await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    let (_, h, _) = s.send("GET", "/cached/1", &[], "").await;
    assert!(cache_status(&h).contains("hit"));
    let (code, _, _) = s
        .send("PURGE", "/cached/1", &[("x-purge-token", "sesame")], "")
        .await;
    assert_eq!(code, StatusCode::OK);
    let (_, h, body) = s.send("GET", "/cached/1", &[], "").await;
    assert!(
        cache_status(&h).contains("fwd=uri-miss"),
        "{}",
        cache_status(&h)
    );
    assert_eq!(body, "call=2");
    assert_eq!(s.counts.cached.load(Ordering::SeqCst), 2);
}

/// The tag purge route removes every entry carrying the tag, and only those.
#[tokio::test]
async fn purge_tag_route_removes_tagged_entries() {
    let s = setup(Some("sesame")).await;
    s.send("GET", "/cached/1", &[("x-tag", "red shared")], "")
        .await;
    s.send("GET", "/cached/2", &[("x-tag", "blue shared")], "")
        .await;
    let (code, _, _) = s
        .send(
            "POST",
            "/.herdguard/purge/tag/red",
            &[("x-purge-token", "sesame")],
            "",
        )
        .await;
    assert_eq!(code, StatusCode::OK);
    let (_, h1, _) = s.send("GET", "/cached/1", &[], "").await;
    let (_, h2, _) = s.send("GET", "/cached/2", &[], "").await;
    assert!(cache_status(&h1).contains("fwd="));
    assert!(cache_status(&h2).contains("hit"));
    assert_eq!(s.counts.cached.load(Ordering::SeqCst), 3);
}

/// `Soft-Purge: 1` on PURGE and on the tag route marks the entry stale instead of removing it: the next answer is the old copy (`fwd=stale`), while one refresh replaces it.
#[tokio::test]
async fn soft_purge_header_marks_stale_on_both_routes() {
    let s = setup(Some("sesame")).await;
    let swr = [("x-swr", "1")];
    s.send("GET", "/cached/1", &swr, "").await;
    let soft = [("x-purge-token", "sesame"), ("soft-purge", "1")];
    let (code, _, body) = s.send("PURGE", "/cached/1", &soft, "").await;
    assert_eq!(code, StatusCode::OK);
    assert!(String::from_utf8_lossy(&body).starts_with("soft-purged"));
    let (_, h, body) = s.send("GET", "/cached/1", &swr, "").await;
    assert_eq!(body, "call=1");
    assert!(
        cache_status(&h).contains("fwd=stale") && cache_status(&h).contains("detail=soft-purge"),
        "{}",
        cache_status(&h)
    );
    let s = &s;
    let fresh = |want: &'static str| async move {
        for _ in 0..500 {
            let (_, h, body) = s.send("GET", "/cached/1", &swr, "").await;
            if body == want {
                return cache_status(&h).to_owned();
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("never answered {want}");
    };
    assert!(fresh("call=2").await.contains("hit"));
    assert_eq!(s.counts.cached.load(Ordering::SeqCst), 2);

    let (code, _, _) = s.send("POST", "/.herdguard/purge/tag/t1", &soft, "").await;
    assert_eq!(code, StatusCode::OK);
    let (_, h, body) = s.send("GET", "/cached/1", &swr, "").await;
    assert_eq!(body, "call=2");
    assert!(
        cache_status(&h).contains("detail=soft-purge"),
        "{}",
        cache_status(&h)
    );
    assert!(fresh("call=3").await.contains("hit"));
    assert_eq!(s.counts.cached.load(Ordering::SeqCst), 3);
}

/// An unreachable upstream is a 502 from the proxy, not a dropped connection.
#[tokio::test]
async fn unreachable_upstream_is_502() {
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    let config = proxy::Config {
        upstream: format!("http://{addr}").parse().unwrap(),
        purge_token: None,
    };
    let proxy = serve(proxy::app(config, CacheLayer::new())).await;
    let client: Client<HttpConnector, Body> = Client::builder(TokioExecutor::new()).build_http();
    let resp = client
        .request(
            Request::get(format!("http://{proxy}/x"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
}

/// A stored answer carries the proxy's Via once, after the upstream's own:
/// on the miss that filled it and on every hit after.
#[tokio::test]
async fn hits_carry_one_via() {
    let s = setup(None).await;
    for (path, theirs, want) in [
        ("/cached/via-none", None, "1.1 herdguard"),
        ("/cached/via-cdn", Some("1.0 cdn"), "1.0 cdn, 1.1 herdguard"),
    ] {
        let headers: Vec<(&str, &str)> = theirs.map(|v| ("x-via", v)).into_iter().collect();
        for round in 0..3 {
            let (code, h, _) = s.send("GET", path, &headers, "").await;
            assert_eq!(code, StatusCode::OK);
            assert_eq!(
                cache_status(&h).contains("hit"),
                round > 0,
                "{path} {round}"
            );
            let vias: Vec<_> = h.get_all("via").iter().collect();
            assert_eq!(vias, [want], "{path} round {round}");
        }
    }
}
