//! Hot keys through a real layer: exact counts for a burst on paused tokio
//! time, names redacted unless full URLs are opted in, axum routes as
//! names, stale answers and passes counted per key, and hostile names.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use herdguard::status::HotKey;
use herdguard::CacheLayer;
use support::origin::{get_req, send, Origin};

/// `n` concurrent GETs of `uri` through `app`, all answered.
async fn burst(app: &Router, uri: &str, n: usize) {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let app = app.clone();
            let r = get_req(uri);
            tokio::spawn(async move { send(&app, r).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.expect("request task").0, 200);
    }
}

fn top(rows: &[HotKey]) -> &HotKey {
    rows.first().expect("a hot key listed")
}

/// A burst of 1000 on one cold key: requests 1000, one origin call, 999 waiters, each having waited the origin's 100 ms.
#[tokio::test(start_paused = true)]
async fn cold_burst_lists_one_call_and_999_waiters() {
    let origin = Origin::new(&[("cache-control", "max-age=60")]).delay(Duration::from_millis(100));
    let cache = CacheLayer::new();
    let app = origin.app(cache.clone());
    burst(&app, "/cold", 1000).await;
    assert_eq!(origin.calls(), 1);

    let hot = cache.hot_keys();
    assert_eq!((hot.k, hot.window), (64, Duration::from_secs(60)));
    let requests = top(&hot.requests);
    assert_eq!((requests.name.as_str(), requests.count), ("/cold", 1000));
    assert_eq!(requests.key.len(), 32);
    assert_eq!(hot.requests.len(), 1);
    let calls = top(&hot.origin_calls);
    assert_eq!(
        (calls.name.as_str(), calls.count, calls.overcount),
        ("/cold", 1, 0)
    );
    assert_eq!(calls.key, requests.key);
    assert_eq!(top(&hot.waiters).count, 999);
    assert_eq!(top(&hot.waited_ms).count, 999 * 100);
    assert!(hot.stale.is_empty() && hot.passes.is_empty());

    // A hit adds a request and nothing else.
    send(&app, get_req("/cold")).await;
    let hot = cache.hot_keys();
    assert_eq!(top(&hot.requests).count, 1001);
    assert_eq!(top(&hot.origin_calls).count, 1);
}

/// The window forgets: a whole window after the burst, nothing is listed.
#[tokio::test(start_paused = true)]
async fn counts_leave_the_window() {
    let origin = Origin::new(&[("cache-control", "max-age=600")]);
    let cache = CacheLayer::builder()
        .hot_key_window(Duration::from_secs(10))
        .build()
        .unwrap();
    let app = origin.app(cache.clone());
    burst(&app, "/a", 3).await;
    assert_eq!(top(&cache.hot_keys().requests).count, 3);
    tokio::time::advance(Duration::from_secs(11)).await;
    assert!(cache.hot_keys().requests.is_empty());
}

/// A query's value (a token) never appears in a name by default; with full URLs opted in, it does.
#[tokio::test]
async fn query_is_redacted_unless_opted_in() {
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let cache = CacheLayer::new();
    let app = origin.app(cache.clone());
    send(&app, get_req("/report?token=secret&x=1")).await;
    let hot = cache.hot_keys();
    let names: Vec<&str> = [&hot.requests, &hot.origin_calls]
        .iter()
        .flat_map(|rows| rows.iter().map(|r| r.name.as_str()))
        .collect();
    assert_eq!(names, ["/report?…", "/report?…"]);

    let full = CacheLayer::builder()
        .hot_key_full_urls(true)
        .build()
        .unwrap();
    let app = origin.app(full.clone());
    send(&app, get_req("/report?token=secret&x=1")).await;
    assert_eq!(
        top(&full.hot_keys().requests).name,
        "/report?token=secret&x=1"
    );
}

/// Under an axum route the name is the route, not the URL.
#[tokio::test]
async fn axum_route_names_the_key() {
    let cache = CacheLayer::new();
    let app = Router::new()
        .route(
            "/items/{id}",
            get(|| async { ([("cache-control", "max-age=60")], "item") }),
        )
        .layer(cache.clone());
    send(&app, get_req("/items/7?token=secret")).await;
    send(&app, get_req("/items/8")).await;
    let hot = cache.hot_keys();
    assert_eq!(hot.requests.len(), 2, "two keys");
    assert!(hot.requests.iter().all(|r| r.name == "/items/{id}"));
}

/// Stale answers and requests under a hit-for-pass marker are counted for their key.
#[tokio::test(start_paused = true)]
async fn stale_and_passes_are_counted() {
    let swr = Origin::new(&[("cache-control", "max-age=1, stale-while-revalidate=60")]);
    let cache = CacheLayer::new();
    let app = swr.app(cache.clone());
    send(&app, get_req("/s")).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    send(&app, get_req("/s")).await;
    let hot = cache.hot_keys();
    assert_eq!(
        (top(&hot.stale).name.as_str(), top(&hot.stale).count),
        ("/s", 1)
    );

    let private = Origin::new(&[("cache-control", "private")]);
    let cache = CacheLayer::new();
    let app = private.app(cache.clone());
    for _ in 0..3 {
        send(&app, get_req("/me")).await;
    }
    let hot = cache.hot_keys();
    assert_eq!(private.calls(), 3);
    let passes = top(&hot.passes);
    assert_eq!(passes.name, "/me");
    assert!(passes.count >= 2, "{passes:?}");
}

/// A long name of multi-byte characters is cut at a character boundary within the bound; nothing panics.
#[tokio::test]
async fn hostile_names_are_bounded() {
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let cache = CacheLayer::new();
    let app = origin.app(cache.clone());
    let path = format!("/{}", "%E2%82%AC€".repeat(50));
    let (code, ..) = send(&app, get_req(&path)).await;
    assert_eq!(code, 200);
    let hot = cache.hot_keys();
    let name = &top(&hot.requests).name;
    assert!(name.len() <= 96 && name.starts_with("/%E2%82%AC"), "{name}");
}

/// `hot_keys(0)` keeps nothing and reports empty lists.
#[tokio::test]
async fn zero_turns_hot_keys_off() {
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let cache = CacheLayer::builder().hot_keys(0).build().unwrap();
    let app = origin.app(cache.clone());
    send(&app, get_req("/a")).await;
    let hot = cache.hot_keys();
    assert_eq!(hot.k, 0);
    assert!(hot.requests.is_empty() && hot.origin_calls.is_empty());
}
