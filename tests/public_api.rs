//! The outside of the crate: Surrogate-Key handling, awaitable purges against
//! a real redis-server, cheap `Redlock` handles, and the service accessors.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::Duration;

use axum::http::Method;
use deadpool_redis::redis;
use herdguard::purge::Purged;
use herdguard::redlock::Redlock;
use herdguard::{CacheLayer, RedisOptions};
use support::origin::{cache_status, get_req, req, send, Origin};
use support::RedisServer;
use tower::Layer;

const TAGGED: &[(&str, &str)] = &[
    ("cache-control", "max-age=60"),
    ("surrogate-key", "product-7 list"),
];

// ---------------------------------------------------------------- Surrogate-Key

/// No client response carries Surrogate-Key by default: not the leader's miss, not a hit, not a bypass.
#[tokio::test]
async fn surrogate_key_is_stripped_on_every_path() {
    let app = Origin::new(TAGGED).app(CacheLayer::new());
    let (_, miss, _) = send(&app, get_req("/p")).await;
    let (_, hit, _) = send(&app, get_req("/p")).await;
    let (_, bypass, _) = send(&app, req(Method::POST, "/other", &[])).await;
    assert!(cache_status(&miss).contains("stored"), "{miss:?}");
    assert!(cache_status(&hit).contains("hit"), "{hit:?}");
    assert!(cache_status(&bypass).contains("fwd=method"), "{bypass:?}");
    for (path, headers) in [("miss", &miss), ("hit", &hit), ("bypass", &bypass)] {
        assert!(
            headers.get("surrogate-key").is_none(),
            "{path} leaked Surrogate-Key"
        );
    }
}

/// Stripped from clients, the tags are still indexed: purge_tag removes the entry.
#[tokio::test]
async fn stripped_tags_still_purge() {
    let origin = Origin::new(TAGGED);
    let cache = CacheLayer::new();
    let app = origin.app(cache.clone());
    send(&app, get_req("/p")).await;
    assert_eq!(cache.purge_tag("list").await.unwrap(), Purged::Local);
    let (_, h, _) = send(&app, get_req("/p")).await;
    assert!(!cache_status(&h).contains("hit"), "{h:?}");
    assert_eq!(origin.calls(), 2);
}

/// `forward_surrogate_key(true)` hands the header on, from the cache too.
#[tokio::test]
async fn surrogate_key_kept_when_asked() {
    let cache = CacheLayer::builder()
        .forward_surrogate_key(true)
        .build()
        .unwrap();
    let app = Origin::new(TAGGED).app(cache);
    send(&app, get_req("/p")).await;
    let (_, hit, _) = send(&app, get_req("/p")).await;
    assert!(cache_status(&hit).contains("hit"), "{hit:?}");
    assert_eq!(hit["surrogate-key"], "product-7 list");
}

// ---------------------------------------------------------------- purges

fn redis_layer(server: &RedisServer) -> CacheLayer {
    CacheLayer::builder()
        .redis(RedisOptions::new(server.url()).namespace("api"))
        .build()
        .unwrap()
}

async fn exists(server: &RedisServer, key: &str) -> bool {
    let mut c = server.connection().await;
    let n: i64 = redis::cmd("EXISTS")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap();
    n == 1
}

/// An awaited purge resolves to `Purged::Redis` only once the Redis copy is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awaited_purge_has_deleted_the_redis_copy() {
    let server = RedisServer::start();
    let cache = redis_layer(&server);
    let app = Origin::new(TAGGED).app(cache.clone());
    send(&app, get_req("/item")).await;
    let value = format!("api:{{{}}}:v", cache.key_for(&get_req("/item")).to_hex());
    let start = tokio::time::Instant::now();
    while !exists(&server, &value).await {
        assert!(start.elapsed() < Duration::from_secs(2), "never stored");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let outcome = cache.purge_url("http://example.test/item").await;
    assert_eq!(outcome.unwrap(), Purged::Redis);
    assert!(
        !exists(&server, &value).await,
        "deleted before the handle resolved"
    );
}

/// With Redis gone, an awaited purge is an error (memory is still purged), within the timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awaited_purge_reports_redis_down() {
    let mut server = RedisServer::start();
    let cache = redis_layer(&server);
    server.stop();
    let purge = cache.purge_tag("list");
    let outcome = tokio::time::timeout(Duration::from_secs(5), purge)
        .await
        .expect("bounded by the redis timeouts");
    let err = outcome.expect_err("redis is down");
    assert!(err.to_string().contains("redis"), "{err}");
}

/// A purge that could not reach Redis carries the failure, so a caller can branch on its kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_error_carries_the_redis_failure() {
    use herdguard::StoreFailureKind;
    use std::error::Error as _;
    let mut server = RedisServer::start();
    let cache = redis_layer(&server);
    server.stop();
    let err = tokio::time::timeout(Duration::from_secs(5), cache.purge_tag("list"))
        .await
        .expect("bounded by the redis timeouts")
        .expect_err("redis is down");
    let failure = err.store_failure().expect("a redis call failed");
    assert!(
        matches!(
            failure.kind(),
            StoreFailureKind::Connection
                | StoreFailureKind::Timeout
                | StoreFailureKind::Unavailable
        ),
        "{failure:?}"
    );
    assert!(err.source().is_some());
}

/// A fenced store whose Redis is gone fails with `LockError::Store`, whose failure says how.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_store_error_carries_the_redis_failure() {
    use herdguard::redlock::{FencedStore, LockError};
    use herdguard::StoreFailureKind;
    let mut server = RedisServer::start();
    let store = FencedStore::new(RedisOptions::new(server.url()).namespace("fs")).unwrap();
    server.stop();
    let err = tokio::time::timeout(Duration::from_secs(5), store.next_fence("job"))
        .await
        .expect("bounded by the redis timeouts")
        .expect_err("redis is down");
    let LockError::Store(failure) = &err else {
        panic!("not a store error: {err:?}");
    };
    assert!(
        matches!(
            failure.kind(),
            StoreFailureKind::Connection
                | StoreFailureKind::Timeout
                | StoreFailureKind::Unavailable
        ),
        "{failure:?}"
    );
}

// ---------------------------------------------------------------- handles

async fn normal_clients(server: &RedisServer) -> usize {
    let mut c = server.connection().await;
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut c)
        .await
        .unwrap();
    list.lines().count()
}

/// Redlock clones are one handle: both lease through one connection per node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_clones_share_connections() {
    fn shareable<T: Clone + Send + Sync + 'static>(_: &T) {}
    let server = RedisServer::start();
    let a = Redlock::builder([server.url()]).build().unwrap();
    let b = a.clone();
    shareable(&b);
    let task = tokio::spawn(async move {
        let lease = b.acquire("job-b").await.expect("free");
        b.release(lease).await;
        b
    });
    let lease = a.acquire("job-a").await.expect("free");
    a.release(lease).await;
    let _b = task.await.unwrap();
    // Our own inspecting connection, plus the one both live handles share.
    assert_eq!(normal_clients(&server).await, 2);
}

/// The service hands back the service it wraps: by reference, mutably, and by value.
#[test]
fn cache_service_exposes_the_inner_service() {
    #[derive(Clone)]
    struct Inner(u32);
    let mut svc = CacheLayer::new().layer(Inner(1));
    assert_eq!(svc.get_ref().0, 1);
    svc.get_mut().0 = 2;
    assert_eq!(svc.into_inner().0, 2);
}
