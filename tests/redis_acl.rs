//! The ACL command list in docs/operations.md is complete: a Redis user made
//! from exactly that line (parsed from the doc here, so it cannot drift)
//! runs the Redis paths: lease, fill, wait, purge and soft purge by URL and
//! by tag, and the purge index.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::Duration;

use deadpool_redis::redis;
use herdguard::purge::Purged;
use herdguard::{CacheLayer, RedisOptions};
use support::origin::{cache_status, get_req, send, Origin};
use support::RedisServer;

const NS: &str = "acl";

/// The `ACL SETUSER herdguard ...` line of docs/operations.md, for `NS`.
fn documented_acl(password: &str) -> Vec<String> {
    let doc = include_str!("../docs/operations.md");
    let line = doc
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("ACL SETUSER herdguard "))
        .expect("docs/operations.md has the ACL SETUSER herdguard line");
    line.split_whitespace()
        .map(|w| w.replace("NAMESPACE", NS).replace("PASSWORD", password))
        .collect()
}

fn layer(url: String) -> CacheLayer {
    CacheLayer::builder()
        .redis(
            RedisOptions::new(url)
                .namespace(NS)
                .l1_ttl(Duration::from_secs(30)),
        )
        .build()
        .unwrap()
}

/// Two instances on a user with exactly the documented commands: a cold burst costs one origin call across both, the other reads the fill from Redis, and purges by URL and by tag reach Redis and every instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_runs_every_redis_path() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let words = documented_acl("pw");
    let mut cmd = redis::cmd(&words[0]);
    for w in &words[1..] {
        cmd.arg(w);
    }
    let _: () = cmd
        .query_async(&mut admin)
        .await
        .expect("the documented ACL line runs");
    let url = format!("redis://herdguard:pw@127.0.0.1:{}", server.port());

    let origin = Origin::new(&[("cache-control", "max-age=60"), ("surrogate-key", "t1")])
        .delay(Duration::from_millis(300));
    let (la, lb) = (layer(url.clone()), layer(url));
    let (a, b) = (origin.app(la.clone()), origin.app(lb.clone()));
    server.wait_for_subscribers(&format!("{NS}:purge"), 2).await;

    // Lease, fill and wait: A leads, B waits on A's fill.
    let first = tokio::spawn({
        let a = a.clone();
        async move { send(&a, get_req("/p")).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (_, hb, _) = send(&b, get_req("/p")).await;
    first.await.unwrap();
    assert_eq!(origin.calls(), 1, "one call across both instances");
    assert!(
        !cache_status(&hb).contains("fwd=uri-miss"),
        "{}",
        cache_status(&hb)
    );

    // Purge by URL (index and stamp) from B; A misses next.
    let u: http::Uri = "http://example.test/p".parse().unwrap();
    assert_eq!(lb.purge_url(&u).await.unwrap(), Purged::Redis);
    // A drops its memory copy when the purge notice arrives (pub/sub, so
    // moments after B's purge answered): until then a hit, then one miss.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, ha, _) = send(&a, get_req("/p")).await;
        if !cache_status(&ha).contains("hit") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the purge notice never reached A: {}",
            cache_status(&ha)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(origin.calls(), 2);

    // Purge by tag: the refilled entry is indexed under its tag.
    assert_eq!(la.purge_tag("t1").await.unwrap(), Purged::Redis);
    let (_, hb, _) = send(&b, get_req("/p")).await;
    assert!(!cache_status(&hb).contains("hit"), "{}", cache_status(&hb));
    assert_eq!(origin.calls(), 3);

    // Soft purges by tag and by URL (the index walked with ZSCAN, the entry
    // kept with a shorter PTTL): Redis takes both through this user.
    assert_eq!(la.soft_purge_tag("t1").await.unwrap(), Purged::Redis);
    assert_eq!(la.soft_purge_url(&u).await.unwrap(), Purged::Redis);

    let denied: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(denied.is_empty(), "commands were refused: {denied:?}");
}
