//! Per-route policy on one shared cache (`CacheLayer::with_policy`), and
//! targeted cache control (RFC 9213): exact origin-call counts against an
//! in-process origin that echoes whose request it answered.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use axum::routing::get;
use axum::Router;
use herdguard::{CacheLayer, RedisOptions, RoutePolicy};
use http::{request, response};
use http_body_util::BodyExt;
use tower::ServiceExt;

use support::RedisServer;

/// How the origin answers: from the query (`cc`, `vary`, `status`, `own`).
struct Answer {
    cc: Option<String>,
    vary: Option<String>,
    status: Option<u16>,
    own: Option<String>,
}

/// The origin: counts calls, sleeps a little so concurrent requests overlap,
/// and echoes the identity headers it saw in the body.
#[derive(Clone, Default)]
struct Origin {
    calls: Arc<AtomicUsize>,
}

impl Origin {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn route(&self, path: &str, layer: CacheLayer) -> Router {
        Router::new()
            .route(path, get(answer).layer(layer))
            .with_state(self.clone())
    }
}

async fn answer(
    State(o): State<Origin>,
    Query(q): Query<Vec<(String, String)>>,
    headers: HeaderMap,
) -> Response<Body> {
    let n = o.calls.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let get = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let a = Answer {
        cc: get("cc"),
        vary: get("vary"),
        status: get("status").and_then(|s| s.parse().ok()),
        own: get("own"),
    };
    let seen = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let body = format!(
        "call={n} auth={} cookie={} ae={}",
        seen("authorization"),
        seen("cookie"),
        seen("accept-encoding")
    );
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(a.status.unwrap_or(200)).unwrap();
    let mut set = |name: &'static str, v: Option<String>| {
        if let Some(v) = v {
            r.headers_mut()
                .insert(name, HeaderValue::from_str(&v).unwrap());
        }
    };
    set("cache-control", a.cc);
    set("vary", a.vary);
    set("herdguard-cache-control", a.own);
    r
}

async fn send(
    app: &Router,
    uri: &str,
    headers: &[(&'static str, &str)],
) -> (StatusCode, HeaderMap, String) {
    let mut req = Request::get(uri).header("host", "example.com");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let response = app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8(bytes.to_vec()).unwrap(),
    )
}

/// Both routes name an item by its last path segment.
fn item_key(parts: &request::Parts) -> String {
    let id = parts.uri.path().rsplit('/').next().unwrap_or("").to_owned();
    format!("item:{id}")
}

/// Two routes with different policies on one cache: one app with both.
fn two_routes(origin: &Origin, cache: &CacheLayer, query: &str) -> (Router, String, String) {
    let a = cache.with_policy(
        RoutePolicy::new()
            .key(item_key)
            .ignore_origin_cache_control()
            .default_ttl(Duration::from_secs(60)),
    );
    let b = cache.with_policy(
        RoutePolicy::new()
            .key(item_key)
            .default_ttl(Duration::from_secs(60))
            .max_ttl(Duration::from_secs(30)),
    );
    let app = origin.route("/a/{id}", a).merge(origin.route("/b/{id}", b));
    (app, format!("/a/7?{query}"), format!("/b/7?{query}"))
}

/// Concurrent requests over two routes whose key functions agree make one origin call.
#[tokio::test(start_paused = true)]
async fn routes_with_one_key_share_one_flight() {
    let origin = Origin::default();
    let cache = CacheLayer::new();
    let (app, a, b) = two_routes(&origin, &cache, "x=1");
    let sends = (0..10).map(|i| {
        let (app, uri) = (app.clone(), if i % 2 == 0 { a.clone() } else { b.clone() });
        async move { send(&app, &uri, &[]).await }
    });
    let answers = futures_util::future::join_all(sends).await;
    assert_eq!(origin.calls(), 1);
    assert!(answers
        .iter()
        .all(|(s, _, body)| *s == 200 && body.starts_with("call=1 ")));
    // And afterwards both routes hit the one stored entry.
    send(&app, &b, &[]).await;
    send(&app, &a, &[]).await;
    assert_eq!(origin.calls(), 1);
    assert_eq!(cache.stats().origin_calls, 1);
}

/// Without a shared key function, the same two routes are two entries.
#[tokio::test(start_paused = true)]
async fn routes_with_default_keys_stay_apart() {
    let origin = Origin::default();
    let cache = CacheLayer::new();
    let policy = || RoutePolicy::new().default_ttl(Duration::from_secs(60));
    let app = origin
        .route("/a/{id}", cache.with_policy(policy()))
        .merge(origin.route("/b/{id}", cache.with_policy(policy())));
    let (a, b) = (send(&app, "/a/7", &[]), send(&app, "/b/7", &[]));
    tokio::join!(a, b);
    assert_eq!(origin.calls(), 2);
}

/// A key function that ignores the path still keeps credentials apart: each user's own answer.
#[tokio::test(start_paused = true)]
async fn key_function_keeps_credentials_apart() {
    let origin = Origin::default();
    let cache = CacheLayer::new();
    // must-revalidate lets §3.5 store it, but only for the same credentials.
    let layer = cache.with_policy(RoutePolicy::new().key(|_: &request::Parts| "everything"));
    let app = origin.route("/{id}", layer);
    let uri = "/1?cc=max-age%3D60%2C%20must-revalidate";
    let (alice, bob, anon) = tokio::join!(
        send(&app, uri, &[("authorization", "Bearer alice")]),
        send(&app, uri, &[("authorization", "Bearer bob")]),
        send(&app, uri, &[]),
    );
    assert!(alice.2.contains("auth=Bearer alice"), "{}", alice.2);
    assert!(bob.2.contains("auth=Bearer bob"), "{}", bob.2);
    assert!(anon.2.contains("auth=-"), "{}", anon.2);
    let again = send(&app, uri, &[("authorization", "Bearer bob")]).await;
    assert!(again.2.contains("auth=Bearer bob"), "{}", again.2);
    let anon_path = send(&app, "/other?cc=max-age%3D60", &[]).await;
    assert!(anon_path.2.contains("auth=-"), "{}", anon_path.2);
}

/// A key function keeps Vary: each Cookie value gets its own variant, stored and reused.
#[tokio::test(start_paused = true)]
async fn key_function_keeps_vary_variants_apart() {
    let origin = Origin::default();
    let cache = CacheLayer::new();
    let layer = cache.with_policy(RoutePolicy::new().key(|_: &request::Parts| "one"));
    let app = origin.route("/{id}", layer);
    let uri = "/1?cc=max-age%3D60&vary=cookie";
    let (a, b) = tokio::join!(
        send(&app, uri, &[("cookie", "u=alice")]),
        send(&app, uri, &[("cookie", "u=bob")]),
    );
    assert!(a.2.contains("cookie=u=alice"), "{}", a.2);
    assert!(b.2.contains("cookie=u=bob"), "{}", b.2);
    let calls = origin.calls();
    let a2 = send(
        &app,
        "/2?cc=max-age%3D60&vary=cookie",
        &[("cookie", "u=alice")],
    )
    .await;
    let b2 = send(
        &app,
        "/3?cc=max-age%3D60&vary=cookie",
        &[("cookie", "u=bob")],
    )
    .await;
    assert_eq!(a2.2, a.2);
    assert_eq!(b2.2, b.2);
    assert_eq!(
        origin.calls(),
        calls,
        "both variants are reused under the one key"
    );
}

/// A purge by the route's key removes every entry it named: each Vary variant, filled from any URL, and no other key's.
#[tokio::test(start_paused = true)]
async fn purge_by_route_key_removes_every_variant() {
    let origin = Origin::default();
    let cache = CacheLayer::new();
    let (app, a, b) = two_routes(&origin, &cache, "cc=max-age%3D60&vary=cookie");
    let other = "/a/8?cc=max-age%3D60";
    send(&app, &a, &[("cookie", "u=alice")]).await;
    send(&app, &a, &[("cookie", "u=bob")]).await;
    send(&app, other, &[]).await;
    // Stored: route b hits both variants route a filled, and item 8 hits.
    send(&app, &b, &[("cookie", "u=alice")]).await;
    send(&app, &b, &[("cookie", "u=bob")]).await;
    send(&app, other, &[]).await;
    assert_eq!(origin.calls(), 3);

    let purged = cache.purge_key(&cache.route_key("item:7")).await;
    assert_eq!(purged.unwrap(), herdguard::purge::Purged::Local);
    send(&app, &b, &[("cookie", "u=alice")]).await;
    send(&app, &b, &[("cookie", "u=bob")]).await;
    assert_eq!(origin.calls(), 5, "both variants of item:7 were purged");
    send(&app, other, &[]).await;
    assert_eq!(origin.calls(), 5, "item:8 is another key: still stored");
}

/// A predicate's "no" stores nothing: the next request goes to the origin again.
#[tokio::test(start_paused = true)]
async fn predicate_refusal_is_not_stored() {
    let origin = Origin::default();
    let cache = CacheLayer::new();
    let only_ok = |_: &request::Parts, res: &response::Parts| res.status == StatusCode::OK;
    let app = origin.route(
        "/{id}",
        cache.with_policy(RoutePolicy::new().cache_when(only_ok)),
    );
    let missing = "/1?cc=max-age%3D60&status=404";
    send(&app, missing, &[]).await;
    send(&app, missing, &[]).await;
    assert_eq!(origin.calls(), 2);
    let ok = "/2?cc=max-age%3D60";
    send(&app, ok, &[]).await;
    send(&app, ok, &[]).await;
    assert_eq!(origin.calls(), 3);
}

/// Ignoring the origin's Cache-Control stores a `max-age=0` answer for the route's TTL.
#[tokio::test(start_paused = true)]
async fn ignore_mode_stores_for_the_route_ttl() {
    let origin = Origin::default();
    let cache = CacheLayer::new();
    let policy = RoutePolicy::new()
        .ignore_origin_cache_control()
        .default_ttl(Duration::from_secs(10));
    let app = origin.route("/{id}", cache.with_policy(policy));
    let uri = "/1?cc=max-age%3D0";
    send(&app, uri, &[]).await;
    send(&app, uri, &[]).await;
    assert_eq!(origin.calls(), 1);
    tokio::time::advance(Duration::from_secs(11)).await;
    send(&app, uri, &[]).await;
    assert_eq!(origin.calls(), 2);
}

/// Ignoring the origin's Cache-Control still obeys its `no-store` and `private`.
#[tokio::test(start_paused = true)]
async fn ignore_mode_still_obeys_no_store_and_private() {
    let origin = Origin::default();
    let cache = CacheLayer::new();
    let policy = RoutePolicy::new()
        .ignore_origin_cache_control()
        .default_ttl(Duration::from_secs(60));
    let app = origin.route("/{id}", cache.with_policy(policy));
    for uri in ["/1?cc=no-store", "/2?cc=private"] {
        send(&app, uri, &[]).await;
        send(&app, uri, &[]).await;
    }
    assert_eq!(origin.calls(), 4);
}

/// A route's max TTL cuts the origin's longer freshness short.
#[tokio::test(start_paused = true)]
async fn max_ttl_caps_origin_freshness() {
    let origin = Origin::default();
    let cache = CacheLayer::new();
    let policy = RoutePolicy::new().max_ttl(Duration::from_secs(5));
    let app = origin.route("/{id}", cache.with_policy(policy));
    let uri = "/1?cc=max-age%3D3600";
    send(&app, uri, &[]).await;
    tokio::time::advance(Duration::from_secs(4)).await;
    let (_, h, _) = send(&app, uri, &[]).await;
    assert_eq!(origin.calls(), 1);
    let status = h.get("cache-status").unwrap().to_str().unwrap();
    assert!(status.contains("hit; ttl=1"), "{status}");
    tokio::time::advance(Duration::from_secs(2)).await;
    send(&app, uri, &[]).await;
    assert_eq!(origin.calls(), 2);
}

/// A route's TTL gives headerless answers freshness; the layer without it stores none.
#[tokio::test(start_paused = true)]
async fn route_ttl_applies_only_to_its_route() {
    let origin = Origin::default();
    let cache = CacheLayer::new();
    let app = origin
        .route(
            "/a/{id}",
            cache.with_policy(RoutePolicy::new().default_ttl(Duration::from_secs(60))),
        )
        .merge(origin.route("/b/{id}", cache.clone()));
    for uri in ["/a/1", "/a/1", "/b/1", "/b/1"] {
        send(&app, uri, &[]).await;
    }
    assert_eq!(origin.calls(), 3);
}

/// The own targeted header wins over CDN-Cache-Control and Cache-Control, and is stripped.
#[tokio::test(start_paused = true)]
async fn own_cache_control_header_wins_and_is_stripped() {
    let origin = Origin::default();
    let own = HeaderName::from_static("herdguard-cache-control");
    let cache = CacheLayer::builder()
        .targeted_cache_control(own.clone())
        .build()
        .unwrap();
    let app = origin.route("/{id}", cache);
    let uri = "/1?cc=no-store&own=max-age%3D60";
    let (_, h1, _) = send(&app, uri, &[]).await;
    let (_, h2, _) = send(&app, uri, &[]).await;
    assert_eq!(origin.calls(), 1, "stored despite Cache-Control: no-store");
    assert!(!h1.contains_key(&own) && !h2.contains_key(&own));
    // Kept when asked to, and a no-store of our own beats everything else.
    let cache = CacheLayer::builder()
        .targeted_cache_control(own.clone())
        .forward_targeted_cache_control(true)
        .build()
        .unwrap();
    let app = origin.route("/{id}", cache);
    let uri = "/2?cc=max-age%3D60&own=no-store";
    let (_, h, _) = send(&app, uri, &[]).await;
    send(&app, uri, &[]).await;
    assert_eq!(origin.calls(), 3);
    assert_eq!(h.get(&own).unwrap(), "no-store");
}

/// Route layers on a Redis-backed cache open no Redis connections of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_layers_share_the_redis_client() {
    let redis = RedisServer::start();
    let clients = || {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &redis.port().to_string(), "CLIENT", "LIST"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    let origin = Origin::default();
    let cache = CacheLayer::builder()
        .redis(RedisOptions::new(redis.url()).namespace("routes"))
        .build()
        .unwrap();
    let (app, a, b) = two_routes(&origin, &cache, "x=2");
    send(&app, &a, &[]).await;
    let before = clients();
    let mut app = app;
    for i in 0..5u32 {
        let path = format!("/more{i}/{{id}}");
        let layer = cache.with_policy(
            RoutePolicy::new()
                .key(item_key)
                .default_ttl(Duration::from_secs(60)),
        );
        app = app.merge(origin.route(&path, layer));
    }
    for i in 0..5u32 {
        send(&app, &format!("/more{i}/7?x=2"), &[]).await;
    }
    send(&app, &b, &[]).await;
    assert_eq!(origin.calls(), 1, "every route reads the one entry");
    // redis-cli itself is one of the clients in both counts.
    assert_eq!(clients(), before);
}

/// Browsers' Accept-Encoding strings share one variant per bucket, and the origin is asked with the bucket.
#[tokio::test(start_paused = true)]
async fn accept_encoding_variants_are_bucketed() {
    let origin = Origin::default();
    let app = origin.route("/{id}", CacheLayer::new());
    let uri = "/1?cc=max-age%3D60&vary=accept-encoding";
    let chrome = send(&app, uri, &[("accept-encoding", "gzip, deflate, br, zstd")]).await;
    assert!(chrome.2.contains("ae=br"), "{}", chrome.2);
    let firefox = send(&app, uri, &[("accept-encoding", "gzip, deflate, br")]).await;
    let safari = send(&app, uri, &[("accept-encoding", "br, gzip, deflate")]).await;
    assert_eq!(
        (firefox.2.as_str(), safari.2.as_str()),
        (chrome.2.as_str(), chrome.2.as_str())
    );
    assert_eq!(origin.calls(), 1);
    let curl = send(&app, uri, &[("accept-encoding", "gzip")]).await;
    assert!(curl.2.contains("ae=gzip"), "{}", curl.2);
    let refuses_br = send(&app, uri, &[("accept-encoding", "br;q=0, gzip, deflate")]).await;
    assert_eq!(refuses_br.2, curl.2);
    let plain = send(&app, uri, &[]).await;
    assert!(plain.2.contains("ae=-"), "{}", plain.2);
    assert_eq!(origin.calls(), 3);
}
