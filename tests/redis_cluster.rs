//! Redis Cluster against real redis-server processes in cluster mode: one
//! origin call per key across instances with entries spread over every
//! master, sharded fill notifications (cluster and standalone), and a master
//! failover under load with fencing still in force.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use herdguard::{CacheLayer, RedisOptions};
use support::cluster::RedisCluster;
use support::origin::{cache_status, get_req, send, Origin};
use support::RedisServer;

const CACHEABLE: &[(&str, &str)] = &[("cache-control", "max-age=60")];

fn cluster_layer(
    cluster: &RedisCluster,
    opts: impl FnOnce(RedisOptions) -> RedisOptions,
) -> CacheLayer {
    CacheLayer::builder()
        .redis(opts(RedisOptions::cluster(cluster.urls()).namespace("t")))
        .build()
        .expect("valid layer")
}

/// The Redis key of `uri`'s entry, as the layers name it.
/// A's origin for the failover race: answers `old` once `gate` has a permit
/// (at most 30 s), whatever else took how long.
fn gated_app(layer: CacheLayer, gate: Arc<tokio::sync::Semaphore>) -> Router {
    Router::new()
        .fallback(axum::routing::get(move || {
            let gate = gate.clone();
            async move {
                let _permit = tokio::time::timeout(Duration::from_secs(30), gate.acquire()).await;
                ([("cache-control", "max-age=60")], "old answer")
            }
        }))
        .layer(layer)
}

fn entry_key(uri: &str) -> String {
    format!(
        "t:{{{}}}:v",
        CacheLayer::new().key_for(&get_req(uri)).to_hex()
    )
}

/// `per_key` concurrent GETs of every uri on every app; returns (uri, status, body).
async fn bursts(
    apps: &[Router],
    uris: &[String],
    per_key: usize,
) -> Vec<(String, axum::http::StatusCode, bytes::Bytes)> {
    let mut tasks = Vec::new();
    for app in apps {
        for uri in uris {
            for _ in 0..per_key {
                let (app, uri) = (app.clone(), uri.clone());
                tasks.push(tokio::spawn(async move {
                    let (code, _, body) = send(&app, get_req(&uri)).await;
                    (uri, code, body)
                }));
            }
        }
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request task"));
    }
    out
}

/// 3 instances on a 3-master cluster, concurrent bursts on 20 cold keys that land on every master: exactly one origin call per key, one body per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_bursts_on_twenty_keys_call_origin_once_per_key() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let uris: Vec<String> = (0..20).map(|i| format!("/spread/{i}")).collect();
    let masters = cluster.master_ports();
    let mut owners: Vec<u16> = uris
        .iter()
        .map(|u| cluster.master_of(&entry_key(u)))
        .collect();
    owners.sort_unstable();
    owners.dedup();
    assert_eq!(owners.len(), 3, "the 20 keys hash to all 3 masters");

    let origin = Origin::new(CACHEABLE).delay(Duration::from_millis(300));
    let apps: Vec<Router> = (0..3)
        .map(|_| origin.app(cluster_layer(&cluster, |o| o)))
        .collect();
    let results = bursts(&apps, &uris, 10).await;
    assert_eq!(results.len(), 600);
    let mut first: std::collections::HashMap<String, bytes::Bytes> = Default::default();
    for (uri, code, body) in results {
        assert_eq!(code, 200);
        let seen = first.entry(uri).or_insert_with(|| body.clone());
        assert_eq!(*seen, body, "every instance serves the one fill");
    }
    assert_eq!(origin.calls(), 20, "exactly one origin call per key");
    for port in masters {
        assert!(cluster.dbsize(port) > 0, "master {port} holds entries");
    }
}

/// Waiters on other instances are woken by the sharded fill notification, not by polling (both poll intervals 10 s), on a cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_waiters_wake_on_sharded_notification() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let slow_poll = |o: RedisOptions| {
        o.poll_interval(Duration::from_secs(10))
            .fallback_poll_interval(Duration::from_secs(10))
    };
    let layers: Vec<CacheLayer> = (0..3).map(|_| cluster_layer(&cluster, slow_poll)).collect();
    wakes_on_notification(layers).await;
}

/// The same on a standalone Redis 7: SSUBSCRIBE works there too, one code path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_waiters_wake_on_sharded_notification() {
    let server = RedisServer::start();
    let layers: Vec<CacheLayer> = (0..3)
        .map(|_| {
            CacheLayer::builder()
                .redis(
                    RedisOptions::new(server.url())
                        .namespace("t")
                        .poll_interval(Duration::from_secs(10))
                        .fallback_poll_interval(Duration::from_secs(10)),
                )
                .build()
                .expect("valid layer")
        })
        .collect();
    wakes_on_notification(layers).await;
}

/// One leader (origin 400 ms), two waiting instances: all done well before a poll would fire.
async fn wakes_on_notification(layers: Vec<CacheLayer>) {
    let origin = Origin::new(CACHEABLE).delay(Duration::from_millis(400));
    let apps: Vec<Router> = layers.into_iter().map(|l| origin.app(l)).collect();
    for round in 0..3 {
        let uri = format!("/notified/{round}");
        let started = tokio::time::Instant::now();
        let leader = {
            let (app, uri) = (apps[0].clone(), uri.clone());
            tokio::spawn(async move { send(&app, get_req(&uri)).await })
        };
        // The leader's origin call has started, so its lease is taken (a
        // fixed pause was not always enough on a loaded machine).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while origin.calls() < round + 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the leader never called"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let waiters: Vec<_> = apps[1..]
            .iter()
            .map(|app| {
                let (app, uri) = (app.clone(), uri.clone());
                tokio::spawn(async move { send(&app, get_req(&uri)).await })
            })
            .collect();
        let (_, _, lead_body) = leader.await.unwrap();
        for w in waiters {
            let (code, h, body) = w.await.unwrap();
            assert_eq!(code, 200);
            assert_eq!(body, lead_body);
            assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "waiters were woken by the fill, took {:?}",
            started.elapsed()
        );
    }
    assert_eq!(origin.calls(), 3);
}

/// A master fails over (CLUSTER FAILOVER on its replica) under load: zero 5xx; a leader whose lease lapsed across the failover has its late write fenced off on the new master; afterwards, cold keys cost exactly one origin call each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_failover_under_load_serves_and_keeps_fencing() {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(1))
            .await
            .unwrap(),
    );
    let fast_breaker =
        |o: RedisOptions| o.breaker_backoff(Duration::from_millis(50), Duration::from_millis(200));

    // Background load on 3 instances, 30 keys, until told to stop.
    let load_origin = Origin::new(&[("cache-control", "max-age=1")])
        .delay(Duration::from_millis(5))
        .tag("load");
    let load_apps: Vec<Router> = (0..3)
        .map(|_| load_origin.app(cluster_layer(&cluster, fast_breaker)))
        .collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (served, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut load = Vec::new();
    for (i, app) in load_apps.iter().enumerate() {
        for j in 0..4usize {
            let (app, stop, served, failed) =
                (app.clone(), stop.clone(), served.clone(), failed.clone());
            load.push(tokio::spawn(async move {
                let mut n = i * 7 + j;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let (code, _, _) = send(&app, get_req(&format!("/load/{}", n % 30))).await;
                    if code.is_success() {
                        served.fetch_add(1, Ordering::SeqCst);
                    } else {
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }));
        }
    }

    // A leader with no watchdog and a short lease, slower than the lease.
    let no_watchdog = |o: RedisOptions| {
        fast_breaker(o)
            .lease_ttl(Duration::from_millis(400))
            .watchdog(false)
    };
    // A's origin answers only when the test opens the gate, after B wrote:
    // the race does not depend on how long the failover takes.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let layer_a = cluster_layer(&cluster, no_watchdog);
    let a = gated_app(layer_a.clone(), gate.clone());
    let fenced_uri = "/fenced-across-failover";
    let first = tokio::spawn(async move { send(&a, get_req(fenced_uri)).await });
    tokio::time::sleep(Duration::from_millis(150)).await; // A holds the lease

    // Fail over the master that owns A's key, while the load runs.
    let owner = cluster.master_of(&entry_key(fenced_uri));
    let replica = cluster.replica_of(owner);
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.failover(replica))
        .await
        .unwrap();
    assert_eq!(cluster.master_of(&entry_key(fenced_uri)), replica);

    // A's lease has lapsed: B leads on the new master with a newer fence.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fast = Origin::new(CACHEABLE).tag("new");
    let b = fast.app(cluster_layer(&cluster, fast_breaker));
    let (code, _, from_b) = send(&b, get_req(fenced_uri)).await;
    assert_eq!(code, 200);
    assert!(from_b.starts_with(b"new"), "B computed it");
    gate.add_permits(1);
    let (code, _, from_a) = first.await.unwrap();
    assert_eq!(code, 200);
    assert!(
        from_a.starts_with(b"old"),
        "A still answers its own request"
    );
    assert_eq!(
        layer_a.stats().fenced_rejections,
        1,
        "A's late write is rejected by the new master"
    );
    let reader = Origin::new(CACHEABLE).tag("reader");
    let (_, h, stored) = send(
        &reader.app(cluster_layer(&cluster, |o| o)),
        get_req(fenced_uri),
    )
    .await;
    assert_eq!(stored, from_b, "the newer value stays");
    assert!(cache_status(&h).contains("hit"));
    assert_eq!(reader.calls(), 0);

    stop.store(true, Ordering::SeqCst);
    for t in load {
        t.await.unwrap();
    }
    assert_eq!(
        failed.load(Ordering::SeqCst),
        0,
        "no 5xx during the failover"
    );
    assert!(served.load(Ordering::SeqCst) > 100, "the load ran");

    // After the failover the cluster is fully usable: exact single flights.
    let after = Origin::new(CACHEABLE).delay(Duration::from_millis(200));
    let apps: Vec<Router> = (0..3)
        .map(|_| after.app(cluster_layer(&cluster, |o| o)))
        .collect();
    let uris: Vec<String> = (0..20).map(|i| format!("/after/{i}")).collect();
    for (_, code, _) in bursts(&apps, &uris, 5).await {
        assert_eq!(code, 200);
    }
    assert_eq!(
        after.calls(),
        20,
        "one origin call per key after the failover"
    );
}

/// A master is killed (SIGKILL) under load: zero 5xx while its replica takes over; the same layers then go back to the cluster by themselves and cold keys cost exactly one origin call each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_master_under_load_fails_open_and_recovers() {
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(1))
        .await
        .unwrap();
    // Patient replies: on a loaded machine a healthy node can miss the
    // 250 ms default, and each miss opens the breaker, so a key's leader
    // goes to the origin uncoalesced and the exact count below breaks. A
    // killed node refuses at once, so this does not slow the failover.
    let fast_breaker = |o: RedisOptions| {
        o.breaker_backoff(Duration::from_millis(50), Duration::from_millis(200))
            .response_timeout(Duration::from_secs(2))
            .pool_wait_timeout(Duration::from_secs(2))
    };
    let layers: Vec<CacheLayer> = (0..3)
        .map(|_| cluster_layer(&cluster, fast_breaker))
        .collect();
    let load_origin = Origin::new(&[("cache-control", "max-age=1")])
        .delay(Duration::from_millis(5))
        .tag("load");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (served, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut load = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        for j in 0..4usize {
            let app = load_origin.app(layer.clone());
            let (stop, served, failed) = (stop.clone(), served.clone(), failed.clone());
            load.push(tokio::spawn(async move {
                let mut n = i * 7 + j;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let (code, _, _) = send(&app, get_req(&format!("/load/{}", n % 30))).await;
                    if code.is_success() {
                        served.fetch_add(1, Ordering::SeqCst);
                    } else {
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let victim = cluster.master_ports()[0];
    cluster = tokio::task::spawn_blocking(move || {
        cluster.kill(victim);
        cluster
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    for t in load {
        t.await.unwrap();
    }
    assert_eq!(
        failed.load(Ordering::SeqCst),
        0,
        "no 5xx while a master died"
    );
    assert!(served.load(Ordering::SeqCst) > 100, "the load ran");

    // Each layer writes to every master again by itself (bounded wait), the
    // promoted replica included: its view of the slots is current, so no
    // cold key below meets a stale route.
    let probe = Origin::new(CACHEABLE);
    let masters = cluster.master_ports();
    for (i, layer) in layers.iter().enumerate() {
        let app = probe.app(layer.clone());
        let mut unwritten: std::collections::HashSet<u16> = masters.iter().copied().collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        for n in 0.. {
            let uri = format!("/probe/{i}/{n}");
            assert_eq!(send(&app, get_req(&uri)).await.0, 200);
            let key = entry_key(&uri);
            if cluster.exists(&key) {
                unwritten.remove(&cluster.master_of(&key));
                if unwritten.is_empty() {
                    break;
                }
                continue;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "layer {i} never went back to the masters {unwritten:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let after = Origin::new(CACHEABLE).delay(Duration::from_millis(200));
    let apps: Vec<Router> = layers.iter().map(|l| after.app(l.clone())).collect();
    let uris: Vec<String> = (0..20).map(|i| format!("/after-kill/{i}")).collect();
    for (_, code, _) in bursts(&apps, &uris, 5).await {
        assert_eq!(code, 200);
    }
    assert_eq!(
        after.calls(),
        20,
        "one origin call per key after the failover"
    );
}
