//! Redis faults by class, against real redis-server processes: a server
//! turned into a replica (READONLY) and back, a failover behind one address,
//! a frozen server, a full server (OOM), and foreign values at entry keys.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use deadpool_redis::redis;
use herdguard::{CacheLayer, RedisOptions};
use support::origin::{cache_status, get_req, send, Origin};
use support::{info_field, RedisServer, Vip};
use tokio::time::Instant;

const CACHEABLE: &[(&str, &str)] = &[("cache-control", "max-age=60")];

/// Longest breaker back-off in these tests: after it, every instance probes.
const MAX_BACKOFF: Duration = Duration::from_millis(200);

fn layer(url: &str, opts: impl FnOnce(RedisOptions) -> RedisOptions) -> CacheLayer {
    CacheLayer::builder()
        .redis(opts(
            RedisOptions::new(url)
                .namespace("t")
                .breaker_backoff(Duration::from_millis(50), MAX_BACKOFF),
        ))
        .build()
        .expect("valid layer")
}

/// `per_app` requests on each app, one every `gap`, over `keys` distinct
/// paths under `prefix`; returns every status and the slowest answer.
async fn load(
    apps: &[Router],
    prefix: &str,
    per_app: usize,
    keys: usize,
    gap: Duration,
) -> (Vec<StatusCode>, Duration) {
    let mut tasks = Vec::new();
    for i in 0..per_app {
        for app in apps {
            let (app, uri) = (app.clone(), format!("{prefix}/{}", i % keys));
            tasks.push(tokio::spawn(async move {
                let started = Instant::now();
                let (code, _, _) = send(&app, get_req(&uri)).await;
                (code, started.elapsed())
            }));
        }
        tokio::time::sleep(gap).await;
    }
    let mut codes = Vec::new();
    let mut slowest = Duration::ZERO;
    for t in tasks {
        let (code, took) = t.await.unwrap();
        codes.push(code);
        slowest = slowest.max(took);
    }
    (codes, slowest)
}

/// After a fault, once the breaker's back-off has passed: each instance
/// makes one probe call, then a cold burst across all of them must cost
/// exactly one origin call again, every answer the same.
async fn assert_coalescing_is_back(apps: &[Router], origin: &Origin, uri: &'static str) {
    tokio::time::sleep(MAX_BACKOFF + Duration::from_millis(150)).await;
    for (i, app) in apps.iter().enumerate() {
        let (code, _, _) = send(app, get_req(&format!("/probe/{uri}/{i}"))).await;
        assert_eq!(code, 200);
    }
    let before = origin.calls();
    let mut tasks = Vec::new();
    for app in apps {
        for _ in 0..50 {
            let app = app.clone();
            tasks.push(tokio::spawn(async move { send(&app, get_req(uri)).await }));
        }
    }
    let mut bodies = Vec::new();
    for t in tasks {
        let (code, _, body) = t.await.unwrap();
        assert_eq!(code, 200);
        bodies.push(body);
    }
    assert_eq!(
        origin.calls() - before,
        1,
        "one origin call across instances"
    );
    assert!(bodies.iter().all(|b| b == &bodies[0]));
}

async fn replicaof(conn: &mut redis::aio::MultiplexedConnection, master: Option<u16>) {
    let mut cmd = redis::cmd("REPLICAOF");
    match master {
        Some(port) => cmd.arg("127.0.0.1").arg(port),
        None => cmd.arg("NO").arg("ONE"),
    };
    let _: () = cmd.query_async(conn).await.expect("REPLICAOF");
    if master.is_some() {
        let deadline = Instant::now() + Duration::from_secs(10);
        while info_field(conn, "replication", "master_link_status").await != "up" {
            assert!(Instant::now() < deadline, "replica never synced");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The server turned into a replica under load (READONLY), then back into a master: no 5xx, at most one origin call per instance per key meanwhile, and cross-instance coalescing comes back without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_and_back_heals_without_restart() {
    let other = RedisServer::start();
    let server = RedisServer::start();
    let origin = Origin::new(CACHEABLE).delay(Duration::from_millis(20));
    let apps: Vec<Router> = (0..2)
        .map(|_| origin.app(layer(&server.url(), |o| o)))
        .collect();
    let (codes, _) = load(&apps, "/warm", 4, 4, Duration::from_millis(5)).await;
    assert!(codes.iter().all(|c| *c == 200));

    let mut admin = server.connection().await;
    replicaof(&mut admin, Some(other.port())).await;
    let before = origin.calls();
    let (codes, _) = load(&apps, "/as-replica", 100, 20, Duration::from_millis(3)).await;
    assert!(codes.iter().all(|c| *c == 200), "no 5xx while read-only");
    let calls = origin.calls() - before;
    assert!(
        calls <= 2 * 20,
        "{calls} origin calls: more than one per instance per key"
    );

    replicaof(&mut admin, None).await;
    assert_coalescing_is_back(&apps, &origin, "/after-replica").await;
}

/// A failover behind one address (the old master demoted to a replica, the address moved to the new master): the kept connections that say READONLY are replaced, so writes reach the new master and coalescing comes back, with no restart and no 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_behind_one_address_heals_by_reconnecting() {
    let old = RedisServer::start();
    let new = RedisServer::start();
    let vip = Vip::start(old.port()).await;
    let origin = Origin::new(CACHEABLE).delay(Duration::from_millis(20));
    let apps: Vec<Router> = (0..2)
        .map(|_| origin.app(layer(&vip.url(), |o| o)))
        .collect();
    let (codes, _) = load(&apps, "/warm", 4, 4, Duration::from_millis(5)).await;
    assert!(codes.iter().all(|c| *c == 200));

    let mut on_old = old.connection().await;
    replicaof(&mut on_old, Some(new.port())).await;
    vip.point_to(new.port());
    let (codes, _) = load(&apps, "/failover", 100, 20, Duration::from_millis(3)).await;
    assert!(
        codes.iter().all(|c| *c == 200),
        "no 5xx across the failover"
    );

    assert_coalescing_is_back(&apps, &origin, "/after-failover").await;
    let key = CacheLayer::new()
        .key_for(&get_req("/after-failover"))
        .to_hex();
    let mut on_new = new.connection().await;
    let exists: i64 = redis::cmd("EXISTS")
        .arg(format!("t:{{{key}}}:v"))
        .query_async(&mut on_new)
        .await
        .unwrap();
    assert_eq!(exists, 1, "the entry was written to the new master");
}

/// A frozen Redis (SIGSTOP) under load: every request is answered within the reply timeout plus the origin time (plus scheduling slack), with no 5xx; after a thaw, coalescing comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_redis_answers_within_reply_timeout_plus_origin() {
    const REPLY: Duration = Duration::from_millis(200);
    const ORIGIN: Duration = Duration::from_millis(100);
    // Generous for a loaded 2-core machine; a hang (no reply bound) or a
    // wait on a connect (1 s connect timeout) is far beyond it.
    const SLACK: Duration = Duration::from_millis(400);
    let server = RedisServer::start();
    let origin = Origin::new(CACHEABLE).delay(ORIGIN);
    let apps: Vec<Router> = (0..2)
        .map(|_| origin.app(layer(&server.url(), |o| o.response_timeout(REPLY))))
        .collect();
    // Every kept connection is open before the freeze.
    let (codes, _) = load(&apps, "/warm", 8, 8, Duration::from_millis(5)).await;
    assert!(codes.iter().all(|c| *c == 200));

    server.freeze();
    let (codes, slowest) = load(&apps, "/frozen", 60, 15, Duration::from_millis(10)).await;
    server.thaw();
    println!(
        "frozen redis: slowest of {} answers {slowest:?}",
        codes.len()
    );
    assert!(codes.iter().all(|c| *c == 200), "no 5xx while frozen");
    assert!(
        slowest <= REPLY + ORIGIN + SLACK,
        "slowest answer {slowest:?}, bound {:?}",
        REPLY + ORIGIN + SLACK
    );
    assert_coalescing_is_back(&apps, &origin, "/after-thaw").await;
}

/// A full Redis (maxmemory reached, noeviction): the fenced write is refused with OOM, the answer is served and kept in memory, the lease is given back, reads of stored entries still hit, and the breaker never opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_skips_the_write_and_serves_from_memory() {
    let server = RedisServer::start();
    let origin = Origin::new(CACHEABLE).delay(Duration::from_millis(300));
    // A long back-off: had the breaker opened, the last burst would not
    // coalesce across instances.
    let slow_breaker =
        |o: RedisOptions| o.breaker_backoff(Duration::from_secs(30), Duration::from_secs(30));
    let (a, b) = (
        origin.app(layer(&server.url(), slow_breaker)),
        origin.app(layer(&server.url(), slow_breaker)),
    );
    send(&a, get_req("/stored")).await;
    let mut admin = server.connection().await;

    // The lease is taken before memory runs out; the write comes after.
    let leader = tokio::spawn({
        let a = a.clone();
        async move { send(&a, get_req("/full")).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let set_maxmemory = |n: u64| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(n)
            .clone()
    };
    let _: () = set_maxmemory(1).query_async(&mut admin).await.unwrap();
    let (code, _, body) = leader.await.unwrap();
    assert_eq!(code, 200);
    let key = CacheLayer::new().key_for(&get_req("/full")).to_hex();
    let (value, lock): (i64, i64) = redis::pipe()
        .cmd("EXISTS")
        .arg(format!("t:{{{key}}}:v"))
        .cmd("EXISTS")
        .arg(format!("t:{{{key}}}:lock"))
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!((value, lock), (0, 0), "nothing stored, lease given back");
    let (_, h, again) = send(&a, get_req("/full")).await;
    assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    assert_eq!(again, body, "served from memory");
    let (_, h, _) = send(&b, get_req("/stored")).await;
    assert!(
        cache_status(&h).contains("hit"),
        "a full server still reads"
    );
    assert_eq!(origin.calls(), 2);

    let _: () = set_maxmemory(0).query_async(&mut admin).await.unwrap();
    let mut tasks = Vec::new();
    for app in [&a, &b] {
        for _ in 0..20 {
            let app = app.clone();
            tasks.push(tokio::spawn(async move {
                send(&app, get_req("/after-oom")).await
            }));
        }
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().0, 200);
    }
    assert_eq!(
        origin.calls(),
        3,
        "Redis in use at once: the breaker never opened"
    );
}

/// A foreign string, list, hash, set or sorted set at an entry key is a miss: the next fill overwrites it, and another instance then reads the entry as a hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_at_entry_keys_are_overwritten() {
    let server = RedisServer::start();
    let origin = Origin::new(CACHEABLE);
    let mut conn = server.connection().await;
    for kind in ["string", "list", "hash", "set", "zset"] {
        let uri: &'static str = Box::leak(format!("/foreign/{kind}").into_boxed_str());
        let key = format!(
            "t:{{{}}}:v",
            CacheLayer::new().key_for(&get_req(uri)).to_hex()
        );
        let tamper = match kind {
            "string" => redis::cmd("SET").arg(&key).arg("not ours").clone(),
            "list" => redis::cmd("RPUSH").arg(&key).arg("a").clone(),
            "hash" => redis::cmd("HSET").arg(&key).arg("f").arg("v").clone(),
            "set" => redis::cmd("SADD").arg(&key).arg("m").clone(),
            _ => redis::cmd("ZADD").arg(&key).arg(1).arg("m").clone(),
        };
        let _: redis::Value = tamper.query_async(&mut conn).await.unwrap();
        let before = origin.calls();
        let (code, _, body) = send(&origin.app(layer(&server.url(), |o| o)), get_req(uri)).await;
        assert_eq!(code, 200, "{kind}");
        assert_eq!(origin.calls(), before + 1, "{kind}: recomputed");
        let kind_now: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(kind_now, "string", "{kind}: overwritten by the fill");
        let (_, h, again) = send(&origin.app(layer(&server.url(), |o| o)), get_req(uri)).await;
        assert!(
            cache_status(&h).contains("hit"),
            "{kind}: {}",
            cache_status(&h)
        );
        assert_eq!(again, body, "{kind}");
        assert_eq!(
            origin.calls(),
            before + 1,
            "{kind}: served from the stored entry"
        );
    }
}

/// A lookup whose reply is lost (the server stalls past the reply timeout, then runs it and takes the lease for the instance that gave up): that instance computes the answer and still stores it in Redis and gives the lease back, so another instance waiting on that lease is answered by it. One origin call, not a second fill after the lease's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_whose_reply_was_lost_still_fills_the_cluster_once() {
    const REPLY: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let origin = Origin::new(CACHEABLE).delay(Duration::from_secs(1));
    let lease = Duration::from_secs(20);
    let opts = |o: RedisOptions| o.response_timeout(REPLY).lease_ttl(lease);
    let (a, b) = (
        origin.app(layer(&server.url(), opts)),
        origin.app(layer(&server.url(), opts)),
    );
    // Both connected and their scripts loaded.
    send(&a, get_req("/warm-a")).await;
    send(&b, get_req("/warm-b")).await;
    let calls = origin.calls();

    server.freeze();
    let first = tokio::spawn({
        let a = a.clone();
        async move { send(&a, get_req("/lost")).await }
    });
    // A's lookup waits in the stalled server past its reply timeout, and
    // runs (taking the lease for A) once the server goes on.
    tokio::time::sleep(REPLY * 2).await;
    server.thaw();
    tokio::time::sleep(REPLY).await;
    let start = Instant::now();
    let (_, h, body_b) = send(&b, get_req("/lost")).await;
    let (code, _, body_a) = first.await.unwrap();
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        body_a,
        body_b,
        "B was answered by A's fill: {}",
        cache_status(&h)
    );
    assert_eq!(origin.calls(), calls + 1, "one origin call for both");
    assert!(
        start.elapsed() < lease / 2,
        "B did not wait out A's lease: {:?}",
        start.elapsed()
    );
}
