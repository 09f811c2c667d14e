//! The fence as one string (`<next>:<hw>`): `hw` taken from the stored entry
//! when the fence was lost, a life that a token issued off the request path
//! never shortens, and an older release's hash replaced, not an error.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use herdguard::redlock::FencedStore;
use herdguard::{Cache, CacheKey, Freshness, RedisOptions};
use support::RedisServer;
use tokio::sync::Notify;

const NS: &str = "fz";

/// A missed reply means fail-open (computing locally), not what these
/// tests look at: a loaded 2-core machine must not turn one into a failure.
fn options(server: &RedisServer) -> RedisOptions {
    RedisOptions::new(server.url())
        .namespace(NS)
        .response_timeout(Duration::from_secs(2))
}

fn fence_key(key: &CacheKey) -> String {
    format!("{NS}:{{{}}}:fence", key.to_hex())
}

/// A new token never shortens the fence's life: after a write kept it for the value's lifetime, the next token leaves it that long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_token_never_shortens_the_fence_hash() {
    let server = RedisServer::start();
    let store = FencedStore::new(options(&server))
        .unwrap()
        .keep(Duration::from_secs(600));
    let t1 = store.next_fence("r").await.unwrap();
    assert!(store.write("r", t1, b"v1").await.unwrap());
    let mut c = server.connection().await;
    let fence = fence_key(&CacheKey::new("r"));
    let kept: i64 = redis::cmd("PTTL")
        .arg(&fence)
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(kept > 600_000, "the write keeps it past the value: {kept}");
    let t2 = store.next_fence("r").await.unwrap();
    assert!(t2 > t1);
    let left: i64 = redis::cmd("PTTL")
        .arg(&fence)
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(
        left > kept - 5_000,
        "the token cut the hash's life from {kept} to {left} ms"
    );
}

/// After the fence is lost, a lease on a stale entry gets a token above the entry's own, even one ahead of the server clock (as after a failover to a server whose clock is behind): the refresh's write lands instead of being refused until the clock catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_fence_hash_restarts_above_the_entrys_token() {
    let server = RedisServer::start();
    let key = CacheKey::new("k");
    let fence = fence_key(&key);
    let value = format!("{NS}:{{{}}}:v", key.to_hex());
    let mut c = server.connection().await;
    // The fill's token: 30 s ahead of this server's clock.
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
    let ahead = secs * 1_000_000 + micros + 30_000_000;
    let _: () = redis::cmd("SET")
        .arg(&fence)
        .arg(format!("{ahead}:"))
        .arg("PX")
        .arg(60_000)
        .query_async(&mut c)
        .await
        .unwrap();
    let fresh = Freshness::new(Duration::from_millis(500)).with_stale(Duration::from_secs(60));
    let cache = || -> Cache<String> { Cache::builder().redis(options(&server)).build().unwrap() };
    let a = cache();
    let first = a
        .get_or_compute(&key, fresh, || async {
            Ok::<_, std::io::Error>("one".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(first.value, "one");
    let gone: i64 = redis::cmd("DEL")
        .arg(&fence)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(gone, 1, "the fence is lost");
    tokio::time::sleep(Duration::from_millis(700)).await;

    // Another instance finds the entry stale, serves it, and refreshes it.
    // The refresh answers only once the stale copy is seen: one that had
    // already landed would rightly be served instead.
    let b = cache();
    let seen = Arc::new(Notify::new());
    let refreshed = Arc::clone(&seen);
    let refresh = b.get_or_compute(&key, fresh, || async move {
        refreshed.notified().await;
        Ok::<_, std::io::Error>("two".to_owned())
    });
    let stale = tokio::time::timeout(Duration::from_secs(5), refresh)
        .await
        .expect("served stale, not held until the refresh answers")
        .unwrap();
    assert_eq!(stale.value, "one", "served stale while it refreshes");
    seen.notify_one();
    let start = Instant::now();
    loop {
        let stored: Vec<u8> = redis::cmd("GET")
            .arg(&value)
            .query_async(&mut c)
            .await
            .unwrap();
        if stored.ends_with(b"two") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the refresh's write was refused: its token is below the entry's"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A fence an older release left as a hash is no error: the lookup that
/// leases reads it as no fence (the entry's own token is the floor), the
/// fill is stored, and the fence is a string from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_releases_fence_hash_is_replaced() {
    let server = RedisServer::start();
    let key = CacheKey::new("old");
    let fence = fence_key(&key);
    let mut c = server.connection().await;
    let _: () = redis::cmd("HSET")
        .arg(&fence)
        .arg("next")
        .arg(5)
        .arg("hw")
        .arg(5)
        .query_async(&mut c)
        .await
        .unwrap();
    let fresh = Freshness::new(Duration::from_secs(60));
    let cache = || -> Cache<String> { Cache::builder().redis(options(&server)).build().unwrap() };
    let got = cache()
        .get_or_compute(&key, fresh, || async {
            Ok::<_, std::io::Error>("filled".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(got.value, "filled");
    let kind: String = redis::cmd("TYPE")
        .arg(&fence)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(kind, "string", "the hash was replaced");
    // Another instance is answered from Redis: the fill was stored.
    let other = cache()
        .get_or_compute(&key, fresh, || async {
            Ok::<_, std::io::Error>("computed again".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(other.value, "filled");
}
