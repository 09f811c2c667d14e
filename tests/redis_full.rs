//! A full Redis (`noeviction` at `maxmemory`): writes
//! are refused, so no lease can be taken, but what Redis holds can still be
//! read. A stale entry is served stale while this instance refreshes it
//! once, instead of every request waiting on the origin. The server is made
//! full at once with `CONFIG SET maxmemory 1` after the entry was stored.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::Duration;

use deadpool_redis::redis;
use futures_util::future::join_all;
use herdguard::{CacheLayer, RedisOptions};
use support::origin::{cache_status, call_of, get_req, send, Origin};
use support::RedisServer;

fn layer(server: &RedisServer) -> CacheLayer {
    CacheLayer::builder()
        .redis(
            RedisOptions::new(server.url())
                .namespace("full")
                .l1_ttl(Duration::from_secs(30)),
        )
        .build()
        .unwrap()
}

async fn fill_up(server: &RedisServer) {
    let mut c = server.connection().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query_async(&mut c)
        .await
        .unwrap();
    let refused: redis::RedisResult<()> = redis::cmd("SET")
        .arg("probe")
        .arg("x")
        .query_async(&mut c)
        .await;
    assert!(
        format!("{refused:?}").contains("OOM"),
        "the server refuses writes now: {refused:?}"
    );
}

/// On a full server, 5 concurrent requests for a stale entry (on an instance with nothing in memory) are all answered with the stale copy, and the origin is called exactly once more, to refresh it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_still_serves_its_stale_entry() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let origin = Origin::new(&[("cache-control", "max-age=1, stale-while-revalidate=60")])
        .delay(Duration::from_millis(500));
    let a = origin.app(layer(&server));
    let (_, _, body) = send(&a, get_req("/s")).await;
    assert_eq!(call_of(&body), "call=1");
    fill_up(&server).await;
    tokio::time::sleep(Duration::from_millis(1300)).await;

    let b = origin.app(layer(&server));
    let answers = join_all((0..5).map(|_| send(&b, get_req("/s")))).await;
    for (status, headers, body) in &answers {
        assert_eq!(status.as_u16(), 200);
        assert_eq!(
            call_of(body),
            "call=1",
            "served stale, not after the origin: {}",
            cache_status(headers)
        );
    }
    let start = tokio::time::Instant::now();
    while origin.calls() < 2 {
        assert!(start.elapsed() < Duration::from_secs(10), "never refreshed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The refresh lands in this instance's memory (Redis refuses it).
    let start = tokio::time::Instant::now();
    loop {
        let (_, headers, body) = send(&b, get_req("/s")).await;
        if call_of(&body) == "call=2" {
            assert!(cache_status(&headers).contains("hit"), "{headers:?}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "refresh never served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(origin.calls(), 2);
}

/// On a full server a cold key is still coalesced on each instance: 5 concurrent requests cost one origin call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_still_coalesces_each_instance() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    fill_up(&server).await;
    let origin = Origin::new(&[("cache-control", "max-age=60")]).delay(Duration::from_millis(300));
    let a = origin.app(layer(&server));
    let answers = join_all((0..5).map(|_| send(&a, get_req("/cold")))).await;
    for (status, _, body) in &answers {
        assert_eq!(status.as_u16(), 200);
        assert_eq!(call_of(body), "call=1");
    }
    assert_eq!(origin.calls(), 1);
}
