//! The lease watchdog against a real redis-server: it keeps a single-instance
//! lease alive past its TTL while the leader's origin call runs, and a lease
//! lost mid-work is counted as `expired_mid_work`. Real time throughout:
//! Redis TTLs do not follow tokio's paused clock.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use herdguard::{CacheLayer, RedisOptions};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::origin::{cache_status, get_req, send, Origin};
use support::RedisServer;

const CACHEABLE: &[(&str, &str)] = &[("cache-control", "max-age=60")];
/// Short enough that an origin call outlives it several times over, long
/// enough that a loaded 2-core machine still extends it in time (every
/// TTL/3; a lapse needs a stall of about two thirds of it).
const LEASE: Duration = Duration::from_millis(500);

fn layer(server: &RedisServer, name: &str) -> CacheLayer {
    // Generous Redis timeouts: a slow reply on a loaded machine must not
    // open the breaker (that fail-open path is tested in redis_faults.rs).
    let opts = RedisOptions::new(server.url())
        .namespace("w")
        .lease_ttl(LEASE)
        .response_timeout(Duration::from_secs(2))
        .pool_wait_timeout(Duration::from_secs(2));
    CacheLayer::builder()
        .cache_name(name)
        .redis(opts)
        .build()
        .expect("valid layer")
}

fn lock_key(uri: &str) -> String {
    let key = CacheLayer::new().key_for(&get_req(uri)).to_hex();
    format!("w:{{{key}}}:lock")
}

/// Wait (at most 10 s) until `origin` has been called `n` times.
async fn until_calls(origin: &Origin, n: usize) {
    let start = Instant::now();
    while origin.calls() < n {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the origin was never called {n} times"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The lease's holder and time left, in one round trip.
async fn lease_state(
    conn: &mut redis::aio::MultiplexedConnection,
    lock: &str,
) -> (Option<String>, i64) {
    redis::pipe()
        .get(lock)
        .pttl(lock)
        .query_async(conn)
        .await
        .expect("GET + PTTL")
}

/// An origin call 5× the lease TTL: the watchdog keeps the same lease alive throughout, so a second instance waits for the fill (1 origin call, the leader's body) instead of leading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_a_single_lease_alive_past_its_ttl() {
    const ORIGIN: Duration = Duration::from_millis(2_500);
    let server = RedisServer::start();
    let origin = Origin::new(CACHEABLE).delay(ORIGIN);
    let (a, b) = (
        origin.app(layer(&server, "a")),
        origin.app(layer(&server, "b")),
    );
    let lock = lock_key("/slow");
    let mut conn = server.connection().await;

    let first = tokio::spawn({
        let a = a.clone();
        async move { send(&a, get_req("/slow")).await }
    });
    until_calls(&origin, 1).await;
    let origin_started = Instant::now();
    let (holder, _) = lease_state(&mut conn, &lock).await;
    let holder = holder.expect("A's lease is in Redis while its origin call runs");
    let second = tokio::spawn({
        let b = b.clone();
        async move { send(&b, get_req("/slow")).await }
    });

    // Until well before the origin can answer (its sleep cannot end early),
    // i.e. strictly inside A's call, over about four lease TTLs.
    let mut samples = 0;
    while origin_started.elapsed() < ORIGIN - Duration::from_millis(500) {
        let (now, pttl) = lease_state(&mut conn, &lock).await;
        assert_eq!(
            now.as_deref(),
            Some(holder.as_str()),
            "A's lease changed hands after {:?} (pttl {pttl})",
            origin_started.elapsed()
        );
        assert!(pttl > 0, "A's lease has no time left: pttl {pttl}");
        samples += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(samples >= 3, "only {samples} samples of the lease");

    let (code_a, _, body_a) = first.await.unwrap();
    let (code_b, h_b, body_b) = second.await.unwrap();
    assert_eq!(code_a, 200);
    assert_eq!(code_b, 200);
    assert_eq!(origin.calls(), 1, "B: {}", cache_status(&h_b));
    assert_eq!(body_b, body_a, "B answers with A's fill");
}

/// The drained-on-read debugging recorder of this binary: only one test
/// reads it, so nothing another test records is lost to it.
fn recorder() -> &'static Snapshotter {
    static SNAP: OnceLock<Snapshotter> = OnceLock::new();
    SNAP.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder in this binary");
        snap
    })
}

/// `redis_lock_acquire_total{result="expired_mid_work"}` of cache `name`.
fn expired_mid_work(snap: &Snapshotter, name: &str) -> u64 {
    snap.snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == "redis_lock_acquire_total")
        .filter(|(k, ..)| {
            let labels: Vec<(&str, &str)> =
                k.key().labels().map(|l| (l.key(), l.value())).collect();
            labels.contains(&("cache", name)) && labels.contains(&("result", "expired_mid_work"))
        })
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(c) => c,
            other => panic!("a counter, not {other:?}"),
        })
        .sum()
}

/// A lease taken over mid-work (the watchdog's extension finds another token) is counted once as `expired_mid_work` under the layer's cache label; the leader still answers and leaves the other holder's lease alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_mid_work_is_counted_once_as_expired_mid_work() {
    let snap = recorder();
    let server = RedisServer::start();
    let origin = Origin::new(CACHEABLE).delay(Duration::from_millis(1_500));
    let a = origin.app(layer(&server, "lost"));
    let lock = lock_key("/lost");
    let mut conn = server.connection().await;

    let first = tokio::spawn({
        let a = a.clone();
        async move { send(&a, get_req("/lost")).await }
    });
    until_calls(&origin, 1).await;
    // As after a failover that lost the lease and someone else took it: a
    // lease is only ever taken with a token, so the fence's `next` moves on.
    let fence = lock.replace(":lock", ":fence");
    let script = "local n, h = string.match(redis.call('GET', KEYS[2]), '^(%d+):(%d*)$') \
        redis.call('SET', KEYS[2], string.format('%.0f', tonumber(n) + 1000) .. ':' .. h, 'KEEPTTL') \
        return redis.call('SET', KEYS[1], 'intruder', 'PX', 30000)";
    let _: () = redis::cmd("EVAL")
        .arg(script)
        .arg(2)
        .arg(&lock)
        .arg(&fence)
        .query_async(&mut conn)
        .await
        .expect("the lease taken over");

    let (code, _, body) = first.await.unwrap();
    assert_eq!(code, 200);
    assert!(body.starts_with(b"origin call=1"), "{body:?}");
    assert_eq!(origin.calls(), 1);
    assert_eq!(expired_mid_work(snap, "lost"), 1);
    let (holder, pttl) = lease_state(&mut conn, &lock).await;
    assert_eq!(holder.as_deref(), Some("intruder"), "pttl {pttl}");
    assert!(pttl > 20_000, "not extended by A either: pttl {pttl}");
}
