//! Freshness across instances has one clock, Redis's `:fresh` key: an
//! entry Redis still calls fresh is served as fresh by every instance,
//! whatever its age by the writer's stamp (the write lands after the stamp).
#![cfg(feature = "redis")]

mod support;

use std::time::Duration;

use deadpool_redis::redis;
use herdguard::{CacheLayer, RedisOptions};
use support::origin::{cache_status, get_req, send, Origin};
use support::RedisServer;

fn layer(server: &RedisServer) -> CacheLayer {
    // Generous timeouts: a slow reply on a loaded machine must not open the
    // breaker (that fail-open path is tested in tests/redis_faults.rs).
    let opts = RedisOptions::new(server.url())
        .namespace("t")
        .response_timeout(Duration::from_secs(2))
        .pool_wait_timeout(Duration::from_secs(2));
    CacheLayer::builder()
        .redis(opts)
        .build()
        .expect("valid layer")
}

/// An entry Redis holds fresh past its stamped age (its write landed late) is a hit on another instance, not an origin call of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_redis_calls_fresh_is_not_refused_for_its_stamped_age() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=1")]);
    let writer = origin.app(layer(&server));
    let (code, _, first) = send(&writer, get_req("/late")).await;
    assert_eq!(code, 200);
    assert_eq!(origin.calls(), 1);

    // As if the fenced write had reached Redis long after the entry was
    // stamped: Redis keeps it fresh for longer than its age allows. (Real
    // time: Redis TTLs do not follow tokio's paused clock.)
    let key = CacheLayer::new().key_for(&get_req("/late")).to_hex();
    let mut conn = server.connection().await;
    for part in ["v", "fresh"] {
        let set: i64 = redis::cmd("PEXPIRE")
            .arg(format!("t:{{{key}}}:{part}"))
            .arg(5_000)
            .query_async(&mut conn)
            .await
            .expect("pexpire");
        assert_eq!(set, 1, "the entry's {part} key exists");
    }
    tokio::time::sleep(Duration::from_millis(1_300)).await; // past max-age by the stamp

    let reader = origin.app(layer(&server));
    let (code, h, body) = send(&reader, get_req("/late")).await;
    assert_eq!(code, 200);
    assert_eq!(origin.calls(), 1, "cache-status: {}", cache_status(&h));
    assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    assert_eq!(body, first);
}
