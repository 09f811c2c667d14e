//! Requests whose meaning the key cannot hold, through
//! the layer alone, as a library user runs it with no proxy in front: odd
//! Host forms and method / URL override headers bypass the cache, a host
//! with capitals reaches the service as the key has it, and Accept-Encoding
//! buckets offer the origin every coding their requests share. In memory,
//! and on two instances sharing a real redis-server where a poisoned entry
//! would cross instances.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, Response, StatusCode, Uri, Version};
use axum::Router;
use herdguard::{CacheLayer, RedisOptions};
use http_body_util::BodyExt;
use tower::ServiceExt;

use support::RedisServer;

/// Headers an application may act on that the key does not contain.
const OVERRIDES: [(&str, &str); 5] = [
    ("x-http-method-override", "DELETE"),
    ("x-http-method", "DELETE"),
    ("x-method-override", "DELETE"),
    ("x-original-url", "/admin"),
    ("x-rewrite-url", "/admin"),
];

#[derive(Clone, Default)]
struct Calls(Arc<AtomicUsize>);

impl Calls {
    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Answers `max-age=60` with what it was asked: the Host header, the
/// target's authority and any override header, after a wait on `/slow`.
/// On `/enc` it is a gzip-only origin: gzip when the request accepts it,
/// identity otherwise, with `Vary: Accept-Encoding`.
async fn origin(State(calls): State<Calls>, uri: Uri, headers: HeaderMap) -> Response<Body> {
    let n = calls.0.fetch_add(1, Ordering::SeqCst) + 1;
    if uri.path() == "/slow" {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let h = |name: &str| {
        headers.get(name).map_or("-".to_owned(), |v| {
            String::from_utf8_lossy(v.as_bytes()).into_owned()
        })
    };
    let mut r = Response::builder().header("cache-control", "max-age=60");
    if uri.path() == "/enc" {
        let gzip = h("accept-encoding")
            .split(',')
            .map(str::trim)
            .any(|c| c == "gzip" || (c.starts_with("gzip;") && !c.contains("q=0")));
        r = r.header("vary", "accept-encoding");
        if gzip {
            r = r.header("content-encoding", "gzip");
        }
        let body = format!("call={n} gzip={gzip} ae={}", h("accept-encoding"));
        return r.body(Body::from(body)).unwrap();
    }
    let overrides: Vec<String> = OVERRIDES
        .iter()
        .filter_map(|(k, _)| {
            headers
                .get(*k)
                .map(|v| format!("{k}:{}", v.to_str().unwrap()))
        })
        .collect();
    let body = format!(
        "call={n} host={} authority={} override={}",
        h("host"),
        uri.authority().map_or("-", |a| a.as_str()),
        overrides.join(",")
    );
    r.body(Body::from(body)).unwrap()
}

fn app(calls: &Calls, layer: CacheLayer) -> Router {
    Router::new()
        .fallback(origin)
        .layer(layer)
        .with_state(calls.clone())
}

fn redis_layer(redis: &RedisServer) -> CacheLayer {
    CacheLayer::builder()
        .redis(RedisOptions::new(redis.url()).namespace("unkeyed"))
        .build()
        .expect("valid layer")
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn cache_status(&self) -> &str {
        self.headers
            .get("cache-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// A GET of `target` (origin form or absolute) on `version`, with these headers.
async fn send(app: &Router, version: Version, target: &str, headers: &[(&str, &str)]) -> Answer {
    let mut r = Request::get(target).version(version);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let response = app
        .clone()
        .oneshot(r.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body.collect().await.unwrap().to_bytes()).into_owned(),
    }
}

async fn get(app: &Router, path: &str, headers: &[(&str, &str)]) -> Answer {
    send(app, Version::HTTP_11, path, headers).await
}

const PLAIN: &[(&str, &str)] = &[("host", "app.test")];

/// A name, the version and target sent, and the request's headers.
type Case = (
    &'static str,
    Version,
    &'static str,
    &'static [(&'static str, &'static str)],
);

/// A Host with userinfo is neither stored for the plain host nor served the plain host's entry.
#[tokio::test]
async fn userinfo_host_and_plain_host_never_share_an_answer() {
    let calls = Calls::default();
    let app = app(&calls, CacheLayer::new());
    let evil = &[("host", "evil.example@app.test")];
    // Cold: the evil request first.
    let a = get(&app, "/cold", evil).await;
    assert!(a.body.contains("host=evil.example@app.test"), "{}", a.body);
    let b = get(&app, "/cold", PLAIN).await;
    assert!(b.body.starts_with("call=2 host=app.test "), "{}", b.body);
    assert!(
        a.cache_status().contains("fwd=request; detail=bad-host"),
        "{}",
        a.cache_status()
    );
    // Warm: the plain host's entry is not served to the evil request.
    let c = get(&app, "/cold", evil).await;
    assert!(
        c.body.starts_with("call=3 host=evil.example@app.test"),
        "{}",
        c.body
    );
    let d = get(&app, "/cold", PLAIN).await;
    assert!(d.body.starts_with("call=2 host=app.test "), "{}", d.body);
    assert!(d.cache_status().contains("hit"), "{}", d.cache_status());
    assert_eq!(calls.get(), 3);
}

/// An h2 :authority with userinfo (the target's authority) bypasses as a Host with userinfo does.
#[tokio::test]
async fn h2_authority_with_userinfo_bypasses() {
    let calls = Calls::default();
    let app = app(&calls, CacheLayer::new());
    let a = send(
        &app,
        Version::HTTP_2,
        "http://evil.example@app.test/h2",
        &[],
    )
    .await;
    assert!(
        a.body.contains("authority=evil.example@app.test"),
        "{}",
        a.body
    );
    let b = send(&app, Version::HTTP_2, "http://app.test/h2", &[]).await;
    assert!(
        b.body.starts_with("call=2 host=- authority=app.test "),
        "{}",
        b.body
    );
    assert!(
        a.cache_status().contains("detail=bad-host"),
        "{}",
        a.cache_status()
    );
    let c = send(&app, Version::HTTP_2, "http://app.test/h2", &[]).await;
    assert!(c.cache_status().contains("hit"), "{}", c.cache_status());
    assert_eq!(calls.get(), 2);
}

/// Hosts outside the grammar, none on HTTP/1.1, two Host lines, or a Host unlike the target are never stored: each request calls the origin.
#[tokio::test]
async fn invalid_hosts_are_never_stored() {
    let calls = Calls::default();
    let app = app(&calls, CacheLayer::new());
    let cases: [Case; 8] = [
        ("space", Version::HTTP_11, "/i", &[("host", "app test")]),
        ("path", Version::HTTP_11, "/i", &[("host", "app.test/evil")]),
        ("port", Version::HTTP_11, "/i", &[("host", "app.test:abc")]),
        ("empty", Version::HTTP_11, "/i", &[("host", "")]),
        ("missing", Version::HTTP_11, "/i", &[]),
        ("missing h2", Version::HTTP_2, "/i", &[]),
        (
            "two",
            Version::HTTP_11,
            "/i",
            &[("host", "app.test"), ("host", "evil.test")],
        ),
        (
            "disagrees",
            Version::HTTP_11,
            "http://app.test/i",
            &[("host", "evil.test")],
        ),
    ];
    let mut expected = 0;
    for (name, version, target, headers) in cases {
        for _ in 0..2 {
            let a = send(&app, version, target, headers).await;
            expected += 1;
            assert_eq!(a.status, StatusCode::OK, "{name}");
            assert_eq!(calls.get(), expected, "{name}: {}", a.body);
            assert!(
                a.cache_status().contains("detail=bad-host"),
                "{name}: {}",
                a.cache_status()
            );
        }
    }
    // HTTP/1.0 may name no host: cached.
    send(&app, Version::HTTP_10, "/i", &[]).await;
    let a = send(&app, Version::HTTP_10, "/i", &[]).await;
    assert!(a.cache_status().contains("hit"), "{}", a.cache_status());
    assert_eq!(calls.get(), expected + 1);
}

/// Plain requests arriving while a userinfo-Host request is at the origin never get its answer: they are not coalesced with it.
#[tokio::test(start_paused = true)]
async fn userinfo_host_is_never_coalesced_with_the_plain_host() {
    let calls = Calls::default();
    let app = app(&calls, CacheLayer::new());
    let evil = {
        let app = app.clone();
        tokio::spawn(async move { get(&app, "/slow", &[("host", "evil.example@app.test")]).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(calls.get(), 1, "the evil request is at the origin");
    let plain: Vec<_> = (0..3)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { get(&app, "/slow", PLAIN).await })
        })
        .collect();
    let evil = evil.await.unwrap();
    assert!(
        evil.body.contains("host=evil.example@app.test"),
        "{}",
        evil.body
    );
    for p in plain {
        let p = p.await.unwrap();
        assert!(p.body.starts_with("call=2 host=app.test "), "{}", p.body);
    }
    assert_eq!(
        calls.get(),
        2,
        "the evil call, and one for the three plain requests"
    );
}

/// A host with capitals reaches the service lowercased, as the key has it, so its answer is right for the plain host.
#[tokio::test]
async fn host_capitals_reach_the_service_as_keyed() {
    let calls = Calls::default();
    let app = app(&calls, CacheLayer::new());
    let a = get(&app, "/case", &[("host", "App.TEST")]).await;
    assert!(a.body.starts_with("call=1 host=app.test "), "{}", a.body);
    let b = get(&app, "/case", PLAIN).await;
    assert!(b.cache_status().contains("hit"), "{}", b.cache_status());
    let c = send(&app, Version::HTTP_2, "http://APP.test/case2", &[]).await;
    assert!(c.body.contains("authority=app.test "), "{}", c.body);
    assert_eq!(calls.get(), 2);
}

/// A GET with a method or URL override header is not served the stored entry, is not stored, and leaves the entry to plain GETs.
#[tokio::test]
async fn override_headers_bypass_the_cache() {
    let calls = Calls::default();
    let app = app(&calls, CacheLayer::new());
    for (i, (name, value)) in OVERRIDES.iter().enumerate() {
        let path = format!("/o{i}");
        let before = calls.get();
        // Cold: the override first, then a plain GET gets its own answer.
        let a = get(&app, &path, &[("host", "app.test"), (name, value)]).await;
        assert!(
            a.body.contains(&format!("override={name}:")),
            "{name}: {}",
            a.body
        );
        let b = get(&app, &path, PLAIN).await;
        assert!(b.body.ends_with("override="), "{name}: {}", b.body);
        let detail = if name.contains("url") {
            "url-override"
        } else {
            "method-override"
        };
        assert!(
            a.cache_status()
                .contains(&format!("fwd=request; detail={detail}")),
            "{name}: {}",
            a.cache_status()
        );
        // Warm: the override still reaches the origin, the entry stays.
        let c = get(&app, &path, &[("host", "app.test"), (name, value)]).await;
        assert!(
            c.body.contains(&format!("override={name}:")),
            "{name}: {}",
            c.body
        );
        let d = get(&app, &path, PLAIN).await;
        assert_eq!(d.body, b.body, "{name}");
        assert!(
            d.cache_status().contains("hit"),
            "{name}: {}",
            d.cache_status()
        );
        assert_eq!(calls.get(), before + 3, "{name}");
    }
}

/// A browser's Accept-Encoding lets a gzip-only origin compress, and nobody is sent a coding they refused or did not list.
#[tokio::test]
async fn encoding_buckets_offer_every_shared_coding() {
    let calls = Calls::default();
    let app = app(&calls, CacheLayer::new());
    let with = |ae: &'static str| [("host", "app.test"), ("accept-encoding", ae)];
    let chrome = get(&app, "/enc", &with("gzip, deflate, br, zstd")).await;
    assert_eq!(
        chrome.headers.get("content-encoding").map(|v| v.as_bytes()),
        Some(&b"gzip"[..]),
        "{}",
        chrome.body
    );
    let safari = get(&app, "/enc", &with("gzip, deflate, br")).await;
    assert!(
        safari.cache_status().contains("hit"),
        "{}",
        safari.cache_status()
    );
    for refuses in ["br", "br, gzip;q=0", "identity", "deflate, zstd"] {
        let a = get(&app, "/enc", &with(refuses)).await;
        assert!(
            a.headers.get("content-encoding").is_none(),
            "{refuses}: {}",
            a.body
        );
    }
    assert_eq!(calls.get(), 3, "one call per bucket: br+gzip, br, identity");
}

/// On Redis, a userinfo-Host request on one instance never reaches a plain request on another.
#[tokio::test]
async fn userinfo_host_never_crosses_instances() {
    let redis = RedisServer::start();
    let calls = Calls::default();
    let a = app(&calls, redis_layer(&redis));
    let b = app(&calls, redis_layer(&redis));
    let evil = get(&a, "/x", &[("host", "evil.example@app.test")]).await;
    assert!(
        evil.body.contains("host=evil.example@app.test"),
        "{}",
        evil.body
    );
    let plain = get(&b, "/x", PLAIN).await;
    assert!(
        plain.body.starts_with("call=2 host=app.test "),
        "{}",
        plain.body
    );
    let again = get(&a, "/x", PLAIN).await;
    assert_eq!(again.body, plain.body);
    assert_eq!(calls.get(), 2);
}

/// On Redis, an override request on one instance neither stores nor is served what a plain request on another gets.
#[tokio::test]
async fn override_headers_never_cross_instances() {
    let redis = RedisServer::start();
    let calls = Calls::default();
    let a = app(&calls, redis_layer(&redis));
    let b = app(&calls, redis_layer(&redis));
    let o = get(
        &a,
        "/o",
        &[("host", "app.test"), ("x-original-url", "/admin")],
    )
    .await;
    assert!(
        o.body.contains("override=x-original-url:/admin"),
        "{}",
        o.body
    );
    let plain = get(&b, "/o", PLAIN).await;
    assert!(plain.body.ends_with("override="), "{}", plain.body);
    let o2 = get(
        &b,
        "/o",
        &[("host", "app.test"), ("x-http-method-override", "DELETE")],
    )
    .await;
    assert!(
        o2.body.contains("override=x-http-method-override:DELETE"),
        "{}",
        o2.body
    );
    let again = get(&a, "/o", PLAIN).await;
    assert_eq!(again.body, plain.body);
    assert_eq!(calls.get(), 3);
}

/// On Redis, a browser's gzip variant stored by one instance is never served to a br-only request on another.
#[tokio::test]
async fn encoding_buckets_hold_across_instances() {
    let redis = RedisServer::start();
    let calls = Calls::default();
    let a = app(&calls, redis_layer(&redis));
    let b = app(&calls, redis_layer(&redis));
    let with = |ae: &'static str| [("host", "app.test"), ("accept-encoding", ae)];
    let chrome = get(&a, "/enc", &with("gzip, deflate, br, zstd")).await;
    assert_eq!(
        chrome.headers.get("content-encoding").map(|v| v.as_bytes()),
        Some(&b"gzip"[..]),
        "{}",
        chrome.body
    );
    let br_only = get(&b, "/enc", &with("br")).await;
    assert!(
        br_only.headers.get("content-encoding").is_none(),
        "{}",
        br_only.body
    );
    let firefox = get(&b, "/enc", &with("gzip, deflate, br")).await;
    assert_eq!(firefox.body, chrome.body, "{}", firefox.cache_status());
    assert_eq!(calls.get(), 2);
}
