//! `Cache<V>` without HTTP: freshness from the computed value, `get`,
//! `insert` and `invalidate`, and serde values through a real redis-server.

#[cfg(all(feature = "redis", feature = "serde"))]
use herdguard_testkit as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use herdguard::metrics::Source;
use herdguard::{Cache, CacheKey, Freshness};

fn secs(n: u64) -> Freshness {
    Freshness::new(Duration::from_secs(n))
}

/// The computation's own freshness holds: a hit until it runs out, then exactly one new computation.
#[tokio::test(start_paused = true)]
async fn freshness_comes_from_the_computed_value() {
    let cache: Cache<String> = Cache::builder().refresh_ahead(0.0).build().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let key = CacheKey::new("token");
    let lookup = || {
        let calls = Arc::clone(&calls);
        cache.get_or_compute_with(&key, move || async move {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            // A token endpoint that says how long its token lives.
            Ok::<_, std::io::Error>((format!("token-{n}"), secs(10)))
        })
    };
    assert_eq!(lookup().await.unwrap().source, Source::Miss);
    tokio::time::advance(Duration::from_secs(9)).await;
    let hit = lookup().await.unwrap();
    assert_eq!((hit.source, hit.value.as_str()), (Source::Hit, "token-1"));
    tokio::time::advance(Duration::from_secs(2)).await;
    let renewed = lookup().await.unwrap();
    assert_eq!(
        (renewed.source, renewed.value.as_str()),
        (Source::Miss, "token-2")
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// `insert` is read back by `get` and by `get_or_compute` without a computation; `invalidate` removes it.
#[tokio::test]
async fn insert_get_invalidate() {
    let cache: Cache<String> = Cache::builder().build().unwrap();
    let key = CacheKey::new("k");
    assert_eq!(cache.get(&key), None);
    cache.insert(&key, "inserted".into(), secs(60)).await;
    assert_eq!(cache.get(&key).as_deref(), Some("inserted"));
    let found = cache
        .get_or_compute(&key, secs(60), || async {
            Ok::<_, std::io::Error>("computed".to_string())
        })
        .await
        .unwrap();
    assert_eq!(
        (found.source, found.value.as_str()),
        (Source::Hit, "inserted")
    );
    cache.invalidate(&key);
    assert_eq!(cache.get(&key), None);
}

/// An `insert` with no freshness stores nothing and drops the older value: the next read computes instead of finding the old one.
#[tokio::test]
async fn an_insert_without_freshness_drops_the_older_value() {
    let cache: Cache<String> = Cache::builder().build().unwrap();
    let key = CacheKey::new("k");
    cache.insert(&key, "old".into(), secs(60)).await;
    cache
        .insert(&key, "new".into(), Freshness::new(Duration::ZERO))
        .await;
    assert_eq!(cache.get(&key), None, "the older value stayed");
    let found = cache
        .get_or_compute(&key, secs(60), || async {
            Ok::<_, std::io::Error>("computed".to_string())
        })
        .await
        .unwrap();
    assert_eq!(found.value, "computed");
}

/// A value inserted while an older computation runs is not replaced by it: the computation's callers get their value, later readers the inserted one.
#[tokio::test(start_paused = true)]
async fn insert_beats_a_computation_already_running() {
    let cache: Cache<String> = Cache::builder().build().unwrap();
    let key = CacheKey::new("race");
    let slow = tokio::spawn({
        let cache = cache.clone();
        async move {
            cache
                .get_or_compute(&key, secs(60), || async {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Ok::<_, std::io::Error>("older".to_string())
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(cache.flights_running(), 1);
    cache.insert(&key, "newer".into(), secs(60)).await;
    assert_eq!(slow.await.unwrap().unwrap().value, "older");
    assert_eq!(cache.get(&key).as_deref(), Some("newer"));
}

/// A caller that waits on a running computation but wakes only after it ended and an `invalidate` came never gets the invalidated value: it computes again (2 computations).
#[tokio::test(start_paused = true)]
async fn a_waiter_woken_after_an_invalidate_computes_again() {
    let cache: Cache<String> = Cache::builder().build().unwrap();
    let key = CacheKey::new("race");
    let calls = Arc::new(AtomicUsize::new(0));
    let lookup = || {
        let (cache, calls) = (cache.clone(), Arc::clone(&calls));
        async move {
            let computed = cache.get_or_compute(&key, secs(60), move || async move {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok::<_, std::io::Error>(format!("v{n}"))
            });
            computed.await.unwrap().value
        }
    };
    let first = tokio::spawn(lookup());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut late = Box::pin(lookup());
    // Polled once while the computation runs: it waits on it.
    assert!(tokio::time::timeout(Duration::ZERO, &mut late)
        .await
        .is_err());
    assert_eq!(first.await.unwrap(), "v1");
    cache.invalidate(&key);
    assert_eq!(late.await, "v2");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[cfg(all(feature = "redis", feature = "serde"))]
mod shared {
    use super::support::RedisServer;
    use super::*;
    use herdguard::{Json, RedisOptions};

    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Profile {
        name: String,
        visits: u32,
    }

    fn cache(server: &RedisServer) -> Cache<Json<Profile>> {
        Cache::builder()
            .redis(RedisOptions::new(server.url()).namespace("cache-api"))
            .build()
            .unwrap()
    }

    /// A serde value stored by one instance is read from Redis by another, which never computes: no hand-written encoding.
    #[tokio::test]
    async fn serde_values_cross_instances() {
        let server = RedisServer::start();
        let (a, b) = (cache(&server), cache(&server));
        let key = CacheKey::new("profile:7");
        let ada = Profile {
            name: "Ada".into(),
            visits: 3,
        };
        let stored = ada.clone();
        a.get_or_compute(&key, secs(60), move || async move {
            Ok::<_, std::io::Error>(Json(stored))
        })
        .await
        .unwrap();
        let read = b
            .get_or_compute(&key, secs(60), || async {
                Err::<Json<Profile>, _>(std::io::Error::other("must not compute"))
            })
            .await
            .unwrap();
        assert_eq!((read.source, read.value.0), (Source::Hit, ada));
    }

    /// A value inserted on one instance reaches Redis: another instance reads it without computing.
    #[tokio::test]
    async fn insert_reaches_other_instances() {
        let server = RedisServer::start();
        let (a, b) = (cache(&server), cache(&server));
        let key = CacheKey::new("profile:8");
        let bob = Profile {
            name: "Bob".into(),
            visits: 1,
        };
        a.insert(&key, Json(bob.clone()), secs(60)).await;
        // The Redis write runs in the background: bounded wait for it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let read = b
                .get_or_compute(&key, secs(60), || async {
                    Err::<Json<Profile>, _>(std::io::Error::other("not there yet"))
                })
                .await;
            match read {
                Ok(read) => {
                    assert_eq!((read.source, read.value.0), (Source::Hit, bob));
                    break;
                }
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("the insert never reached Redis: {e}"),
            }
        }
    }
}
