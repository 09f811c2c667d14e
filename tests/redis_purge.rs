//! Purges with Redis: by URL, by tag, and by unsafe method, reaching every
//! instance's L1 through pub/sub, and the Redis copies too.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::Duration;

use axum::http::Method;
use axum::Router;
use herdguard::purge::Purged;
use herdguard::{CacheLayer, RedisOptions, RoutePolicy};
use support::origin::{cache_status, get_req, req, send, Origin};
use support::RedisServer;

/// A long L1, so only the purge notice (not L1 expiry) can clear an instance.
fn layer(server: &RedisServer) -> CacheLayer {
    CacheLayer::builder()
        .redis(
            RedisOptions::new(server.url())
                .namespace("p")
                .l1_ttl(Duration::from_secs(30)),
        )
        .build()
        .unwrap()
}

/// Poll `app` for `uri` until it is no longer a hit, at most 2 s.
async fn until_not_hit(app: &Router, uri: &str) -> Duration {
    let start = tokio::time::Instant::now();
    loop {
        let (_, h, _) = send(app, get_req(uri)).await;
        if !cache_status(&h).contains("; hit") {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "the purge never reached this instance"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn is_hit(app: &Router, uri: &str) -> bool {
    let (_, h, _) = send(app, get_req(uri)).await;
    cache_status(&h).contains("; hit")
}

/// A URL purged on one instance is gone from another instance's L1 within a bounded delay, and from Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_by_url_reaches_every_instance() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let (la, lb) = (layer(&server), layer(&server));
    let (a, b) = (origin.app(la.clone()), origin.app(lb));
    server.wait_for_subscribers("p:purge", 2).await;
    send(&a, get_req("/item/1")).await;
    assert!(is_hit(&b, "/item/1").await, "B reads A's fill from Redis");
    assert!(is_hit(&b, "/item/1").await, "and keeps it in its L1");
    assert_eq!(origin.calls(), 1);

    drop(la.purge_url("http://example.test/item/1"));
    let delay = until_not_hit(&b, "/item/1").await;
    assert!(delay < Duration::from_secs(2));
    assert_eq!(origin.calls(), 2, "B went back to the origin");
    let fresh = origin.app(layer(&server));
    assert!(
        is_hit(&fresh, "/item/1").await,
        "B's refill is in Redis, the purged copy is not"
    );
}

/// A purge by a route's key on one instance removes what that key named from another instance's L1 and from Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_by_route_key_reaches_every_instance() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    // Every URL ending in /7 is the one resource "item:7".
    let item = |l: &CacheLayer| {
        l.with_policy(RoutePolicy::new().key(|p: &http::request::Parts| {
            format!("item:{}", p.uri.path().rsplit('/').next().unwrap_or(""))
        }))
    };
    let (la, lb) = (layer(&server), layer(&server));
    let (a, b) = (origin.app(item(&la)), origin.app(item(&lb)));
    server.wait_for_subscribers("p:purge", 2).await;
    send(&a, get_req("/a/7")).await;
    assert!(is_hit(&b, "/b/7").await, "B reads A's fill from Redis");
    assert!(is_hit(&b, "/b/7").await, "and keeps it in its L1");
    assert_eq!(origin.calls(), 1);

    let purged = la.purge_key(&la.route_key("item:7")).await;
    assert_eq!(purged.unwrap(), Purged::Redis);
    until_not_hit(&b, "/b/7").await;
    assert_eq!(origin.calls(), 2, "B went back to the origin");
    let fresh = origin.app(item(&layer(&server)));
    assert!(
        is_hit(&fresh, "/c/7").await,
        "B's refill is in Redis, the purged entry is not"
    );
    assert_eq!(origin.calls(), 2);
}

/// A tag purge removes every tagged entry on every instance and leaves untagged ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_by_tag_reaches_every_instance() {
    let server = RedisServer::start();
    let tagged = Origin::new(&[
        ("cache-control", "max-age=60"),
        ("surrogate-key", "product-7 list"),
    ]);
    let plain = Origin::new(&[("cache-control", "max-age=60")]);
    let (la, lb) = (layer(&server), layer(&server));
    let (ta, tb, pb) = (
        tagged.app(la.clone()),
        tagged.app(lb.clone()),
        plain.app(lb),
    );
    server.wait_for_subscribers("p:purge", 2).await;
    for uri in ["/a", "/b"] {
        send(&ta, get_req(uri)).await;
        assert!(is_hit(&tb, uri).await);
    }
    send(&pb, get_req("/c")).await;
    assert!(is_hit(&pb, "/c").await);

    drop(la.purge_tag("product-7"));
    until_not_hit(&tb, "/a").await;
    until_not_hit(&tb, "/b").await;
    assert!(is_hit(&pb, "/c").await, "untagged entries stay");
    assert_eq!(tagged.calls(), 4);
}

/// A successful POST on one instance invalidates the URL on the others; a failed PUT invalidates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_method_on_one_instance_invalidates_all() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let (a, b) = (origin.app(layer(&server)), origin.app(layer(&server)));
    server.wait_for_subscribers("p:purge", 2).await;
    send(&a, get_req("/cart")).await;
    assert!(is_hit(&b, "/cart").await);
    let (code, _, _) = send(&a, req(Method::PUT, "/cart", &[])).await;
    assert_eq!(code, 405, "no PUT route: not a success");
    assert!(
        is_hit(&b, "/cart").await,
        "a failed PUT invalidates nothing"
    );
    let (code, _, _) = send(&a, req(Method::POST, "/cart", &[])).await;
    assert_eq!(code, 200);
    until_not_hit(&b, "/cart").await;
}

/// A purge called from a thread with no tokio runtime clears this process and does not panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_outside_a_runtime_does_not_panic() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let l = layer(&server);
    let app = origin.app(l.clone());
    send(&app, get_req("/plain")).await;
    let joined = std::thread::spawn(move || {
        drop(l.purge_url("http://example.test/plain"));
        drop(l.purge_tag("anything"));
    })
    .join();
    assert!(joined.is_ok(), "purging outside a runtime panicked");
}
