//! The HTTP-agnostic engine: coalescing, shared errors, panics, cancellation,
//! bounded waits and stale-while-revalidate.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use herdguard::metrics::Source;
use herdguard::{Cache, CacheKey, Error, Freshness};

fn fresh(secs: u64, stale: u64) -> Freshness {
    Freshness::new(Duration::from_secs(secs)).with_stale(Duration::from_secs(stale))
}

/// Spawn `n` concurrent lookups of `key` whose computation sleeps `delay` and counts calls.
async fn burst(
    cache: &Cache<String>,
    key: CacheKey,
    n: usize,
    calls: &Arc<AtomicUsize>,
    delay: Duration,
) -> Vec<Result<herdguard::Lookup<String>, Error>> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (cache, calls) = (cache.clone(), calls.clone());
            tokio::spawn(async move {
                cache
                    .get_or_compute(&key, fresh(5, 30), move || async move {
                        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                        tokio::time::sleep(delay).await;
                        Ok::<_, std::io::Error>(format!("value-{n}"))
                    })
                    .await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

/// 1000 concurrent callers of a cold key run the computation exactly once and all get its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_burst_computes_once() {
    let cache: Cache<String> = Cache::builder().build().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let results = burst(
        &cache,
        CacheKey::new("cold"),
        1000,
        &calls,
        Duration::from_millis(50),
    )
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(results
        .iter()
        .all(|r| r.as_ref().unwrap().value == "value-1"));
    let misses = results
        .iter()
        .filter(|r| r.as_ref().unwrap().source == Source::Miss)
        .count();
    assert_eq!(misses, 1, "exactly one caller led");
}

/// Within the stale grace, a burst is answered at once with the stale value and exactly one refresh runs.
#[tokio::test(start_paused = true)]
async fn stale_burst_refreshes_once_without_waiting() {
    let cache: Cache<String> = Cache::builder().build().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let key = CacheKey::new("swr");
    burst(&cache, key, 1, &calls, Duration::from_millis(200)).await;
    tokio::time::advance(Duration::from_secs(6)).await; // past max-age 5, inside grace 30

    let start = tokio::time::Instant::now();
    let results = burst(&cache, key, 500, &calls, Duration::from_millis(200)).await;
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "no caller waited for the origin"
    );
    assert!(results.iter().all(|r| {
        let l = r.as_ref().unwrap();
        l.source == Source::Stale && l.value == "value-1"
    }));
    tokio::time::sleep(Duration::from_millis(250)).await; // let the refresh land
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "one initial fill + exactly one refresh"
    );
    let after = burst(&cache, key, 1, &calls, Duration::ZERO).await;
    let l = after[0].as_ref().unwrap();
    assert_eq!((l.source, l.value.as_str()), (Source::Hit, "value-2"));
}

/// When the leader's computation fails, every waiter gets that same error and nobody retries.
#[tokio::test(start_paused = true)]
async fn leader_error_is_shared() {
    let cache: Cache<String> = Cache::builder().build().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let key = CacheKey::new("err");
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let (cache, calls) = (cache.clone(), calls.clone());
            tokio::spawn(async move {
                cache
                    .get_or_compute(&key, fresh(5, 0), move || async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Err::<String, _>(std::io::Error::other("db down"))
                    })
                    .await
            })
        })
        .collect();
    for t in tasks {
        match t.await.unwrap() {
            Err(Error::Compute(e)) => assert_eq!(e.to_string(), "db down"),
            other => panic!("expected the shared error, got {other:?}"),
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A panicking computation gives every waiter `Panicked`, and the next call elects a new leader.
#[tokio::test(start_paused = true)]
async fn panic_fails_waiters_and_next_call_recovers() {
    let cache: Cache<String> = Cache::builder().build().unwrap();
    let key = CacheKey::new("panic");
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move {
                cache
                    .get_or_compute(&key, fresh(5, 0), || async {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        if true {
                            panic!("origin bug");
                        }
                        Ok::<String, std::io::Error>(String::new())
                    })
                    .await
            })
        })
        .collect();
    for t in tasks {
        assert!(matches!(t.await.unwrap(), Err(Error::Panicked)));
    }
    assert_eq!(cache.flights_running(), 0, "the panicked flight is gone");
    let ok = cache
        .get_or_compute(&key, fresh(5, 0), || async {
            Ok::<_, std::io::Error>("fine".to_string())
        })
        .await
        .unwrap();
    assert_eq!((ok.source, ok.value.as_str()), (Source::Miss, "fine"));
}

/// Dropping the leader's request mid-flight does not cancel the computation for its waiters.
#[tokio::test(start_paused = true)]
async fn dropped_leader_still_completes_for_waiters() {
    let cache: Cache<String> = Cache::builder().build().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let key = CacheKey::new("dropped");
    let leader = {
        let (cache, calls) = (cache.clone(), calls.clone());
        tokio::spawn(async move {
            cache
                .get_or_compute(&key, fresh(5, 0), move || async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, std::io::Error>("from-leader".to_string())
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let waiters = burst(&cache, key, 20, &calls, Duration::from_millis(100));
    leader.abort();
    let results = waiters.await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(results
        .iter()
        .all(|r| r.as_ref().unwrap().value == "from-leader"
            && r.as_ref().unwrap().source == Source::Coalesced));
}

/// A waiter gives up after `max_wait` and computes on its own, uncached.
#[tokio::test(start_paused = true)]
async fn wait_is_bounded() {
    let cache: Cache<String> = Cache::builder()
        .max_wait(Duration::from_millis(500))
        .build()
        .unwrap();
    let key = CacheKey::new("slow");
    let slow = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_compute(&key, fresh(5, 0), || async {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    Ok::<_, std::io::Error>("slow".to_string())
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    let start = tokio::time::Instant::now();
    let own = cache
        .get_or_compute(&key, fresh(5, 0), || async {
            Ok::<_, std::io::Error>("own".to_string())
        })
        .await
        .unwrap();
    assert_eq!((own.source, own.value.as_str()), (Source::Bypass, "own"));
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    assert_eq!(slow.await.unwrap().unwrap().value, "slow");
}

/// A computation longer than the origin timeout fails every waiter with `OriginTimeout`.
#[tokio::test(start_paused = true)]
async fn origin_timeout_bounds_the_leader() {
    let cache: Cache<String> = Cache::builder()
        .origin_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let r = cache
        .get_or_compute(&CacheKey::new("hang"), fresh(5, 0), || async {
            std::future::pending::<Result<String, std::io::Error>>().await
        })
        .await;
    assert!(matches!(r, Err(Error::OriginTimeout)));
    assert_eq!(cache.flights_running(), 0);
}
