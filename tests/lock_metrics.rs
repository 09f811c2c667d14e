//! Lock and cache metrics, read back through a debugging recorder after real
//! flights against real redis-server processes. One test: the recorder is
//! global to this test binary.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::Duration;

use herdguard::redlock::Redlock;
use herdguard::{CacheLayer, RedisOptions};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::origin::{get_req, send, Origin};
use support::RedisServer;

/// Running totals: a debugging snapshot drains what it reads, so each
/// snapshot is added to what earlier ones saw. Counters add up, histograms
/// count their samples, gauges count the snapshots that saw them.
struct Totals {
    snap: Snapshotter,
    seen: Vec<Seen>,
}

/// Name, labels, and the total seen so far.
type Seen = (String, Vec<(String, String)>, u64);

impl Totals {
    fn drain(&mut self) {
        for (k, _, _, v) in self.snap.snapshot().into_vec() {
            let name = k.key().name().to_owned();
            let labels: Vec<(String, String)> = k
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let n = match v {
                DebugValue::Counter(c) => c,
                DebugValue::Histogram(h) => h.len() as u64,
                DebugValue::Gauge(_) => 1,
            };
            match self
                .seen
                .iter_mut()
                .find(|(a, b, _)| *a == name && *b == labels)
            {
                Some(entry) => entry.2 += n,
                None => self.seen.push((name, labels, n)),
            }
        }
    }
}

fn counter(totals: &mut Totals, name: &str, label: Option<(&str, &str)>) -> u64 {
    totals.drain();
    totals
        .seen
        .iter()
        .filter(|(n, _, _)| n == name)
        .filter(|(_, labels, _)| match label {
            Some((l, v)) => labels.iter().any(|(k, x)| k == l && x == v),
            None => true,
        })
        .map(|(_, _, n)| *n)
        .sum()
}

/// Acquired, contended and expired-mid-work leases, the held-time histogram, and the cache metrics, under their documented names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_cache_metrics_are_recorded() {
    let recorder = DebuggingRecorder::new();
    let mut snap = Totals {
        snap: recorder.snapshotter(),
        seen: Vec::new(),
    };
    recorder.install().expect("first recorder in this binary");

    let server = RedisServer::start();
    // Single lease: one leader (acquired), a second instance waits (contended).
    let origin = Origin::new(&[("cache-control", "max-age=60")]).delay(Duration::from_millis(200));
    let layer = |o: RedisOptions| {
        CacheLayer::builder()
            .redis(o.namespace("m"))
            .build()
            .unwrap()
    };
    let a = origin.app(layer(RedisOptions::new(server.url())));
    let b = origin.app(layer(RedisOptions::new(server.url())));
    let first = tokio::spawn({
        let a = a.clone();
        async move { send(&a, get_req("/m")).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    send(&b, get_req("/m")).await;
    first.await.unwrap();
    assert_eq!(
        counter(
            &mut snap,
            "redis_lock_acquire_total",
            Some(("result", "acquired"))
        ),
        1
    );
    assert!(
        counter(
            &mut snap,
            "redis_lock_acquire_total",
            Some(("result", "contended"))
        ) >= 1
    );
    assert_eq!(counter(&mut snap, "redis_lock_held_seconds", None), 1);
    assert_eq!(
        counter(
            &mut snap,
            "herdguard_lease_remaining_at_release_seconds",
            None
        ),
        1
    );

    // A lease that lapses under slow work, watchdog off: expired_mid_work.
    let slow = Origin::new(&[("cache-control", "max-age=60")]).delay(Duration::from_millis(400));
    let c = slow.app(layer(
        RedisOptions::new(server.url())
            .lease_ttl(Duration::from_millis(100))
            .watchdog(false),
    ));
    send(&c, get_req("/lapsed")).await;
    assert_eq!(
        counter(
            &mut snap,
            "redis_lock_acquire_total",
            Some(("result", "expired_mid_work"))
        ),
        1
    );

    // Redlock uses the same names.
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let lock = Redlock::builder(nodes.iter().map(RedisServer::url))
        .build()
        .unwrap();
    let lease = lock.acquire("job").await.unwrap();
    lock.release(lease).await;
    // Acquired: the first flight, the lapsed one, and this Redlock lease.
    assert_eq!(
        counter(
            &mut snap,
            "redis_lock_acquire_total",
            Some(("result", "acquired"))
        ),
        3
    );
    assert_eq!(counter(&mut snap, "redis_lock_held_seconds", None), 3);

    // Cache outcomes and the rest.
    assert!(
        counter(
            &mut snap,
            "herdguard_requests_total",
            Some(("outcome", "miss"))
        ) >= 2
    );
    assert!(
        counter(
            &mut snap,
            "herdguard_requests_total",
            Some(("outcome", "hit"))
        ) >= 1
    );
    assert_eq!(counter(&mut snap, "herdguard_origin_calls_total", None), 2);
    assert!(counter(&mut snap, "herdguard_entry_bytes", None) >= 2);
    assert!(counter(&mut snap, "herdguard_redis_available", None) >= 1);
}
