//! Redlock and lock safety under faults, against real redis-server processes:
//! lost nodes, a frozen node, a paused holder, failover losing the lock, a
//! randomized stress run, and Redlock as the cache layer's lease backend.

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use deadpool_redis::redis;
use herdguard::{CacheLayer, FencedStore, LockError, RedisOptions, Redlock};
use support::origin::{get_req, send, Origin};
use support::RedisServer;
use tokio::time::Instant;

fn nodes(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

fn redlock(servers: &[RedisServer], ttl: Duration) -> Redlock {
    Redlock::builder(servers.iter().map(RedisServer::url))
        .namespace("rl")
        .ttl(ttl)
        .retries(2, Duration::from_millis(20))
        .build()
        .expect("valid redlock")
}

async fn lock_keys(server: &RedisServer) -> Vec<String> {
    let mut c = server.connection().await;
    redis::cmd("KEYS")
        .arg("rl:*:lock")
        .query_async(&mut c)
        .await
        .unwrap()
}

/// 5 nodes with 2 killed: a quorum of 3 remains and acquisition succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_two_killed_still_acquires() {
    let mut servers = nodes(5);
    servers[0].stop();
    servers[1].stop();
    let lock = redlock(&servers, Duration::from_secs(10));
    let lease = lock.acquire("job").await.expect("a quorum of 3 is up");
    assert!(lease.remaining() > Duration::from_secs(9));
    for s in &servers[2..] {
        assert_eq!(lock_keys(s).await.len(), 1, "held on every live node");
    }
    lock.release(lease).await;
    for s in &servers[2..] {
        assert!(
            lock_keys(s).await.is_empty(),
            "released everywhere reachable"
        );
    }
}

/// 5 nodes with 3 killed: acquisition fails within its bound and leaves no partial lock on the survivors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_three_killed_fails_cleanly() {
    let mut servers = nodes(5);
    for s in &mut servers[..3] {
        s.stop();
    }
    let lock = redlock(&servers, Duration::from_secs(10));
    let start = Instant::now();
    let result = lock.acquire("job").await;
    assert!(matches!(result, Err(LockError::NotAcquired)));
    // 3 attempts × (50 ms node timeout + up to 20 ms jitter), plus slack.
    assert!(
        start.elapsed() < Duration::from_millis(800),
        "took {:?}",
        start.elapsed()
    );
    for s in &servers[3..] {
        assert!(lock_keys(s).await.is_empty(), "no partial lock left behind");
    }
}

/// One node frozen with SIGSTOP: acquisition completes within the per-node timeout plus a small margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_node_never_stalls_acquisition() {
    let servers = nodes(5);
    let lock = redlock(&servers, Duration::from_secs(10)); // node timeout 50 ms
                                                           // Open every connection first, so the measurement is of acquisition alone.
    let warm = lock.acquire("warm").await.unwrap();
    lock.release(warm).await;
    servers[2].freeze();
    let start = Instant::now();
    let lease = lock.acquire("job").await.expect("4 of 5 answer");
    let took = start.elapsed();
    servers[2].thaw();
    assert!(took < Duration::from_millis(50 + 150), "took {took:?}");
    lock.release(lease).await;
}

/// A holder paused past its validity: a second worker acquires; the first one's fenced write is rejected and the second's stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_is_fenced_off() {
    let servers = nodes(3);
    let data = RedisServer::start();
    let store = FencedStore::new(RedisOptions::new(data.url()).namespace("res")).unwrap();
    let lock = redlock(&servers, Duration::from_millis(300));

    let first = lock.acquire("ledger").await.unwrap();
    let first_fence = store.next_fence("ledger").await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await; // "GC pause" past validity
    assert_eq!(first.remaining(), Duration::ZERO);

    let second = lock
        .acquire("ledger")
        .await
        .expect("the first lease has lapsed");
    let second_fence = store.next_fence("ledger").await.unwrap();
    assert!(second_fence > first_fence);
    assert!(store
        .write("ledger", second_fence, b"second")
        .await
        .unwrap());
    assert!(
        !store.write("ledger", first_fence, b"first").await.unwrap(),
        "older fence rejected"
    );
    assert_eq!(store.read("ledger").await.unwrap().unwrap(), "second");
    lock.release(second).await;
    lock.release(first).await;
}

/// The async-replication hole: a lock taken on a master whose replica never saw it is lost on failover, a second holder appears, and the fence still keeps the newer value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_loses_the_lock_but_not_the_data() {
    let mut master = RedisServer::start();
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let mut rc = replica.connection().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut rc)
            .await
            .unwrap();
        if info.contains("master_link_status:up") {
            break;
        }
        assert!(Instant::now() < deadline, "replica never synced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let data = RedisServer::start();
    let store = FencedStore::new(RedisOptions::new(data.url()).namespace("res")).unwrap();

    // 1-2. Freeze the replica, then take the lock on the master. The master
    // also drops the replication link, so the write cannot sit in the frozen
    // replica's socket buffer: a frozen replica that cannot reconnect is a
    // replica that lags, which is what asynchronous replication allows.
    replica.freeze();
    let mut mc = master.connection().await;
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut mc)
        .await
        .unwrap();
    let on_master = redlock(std::slice::from_ref(&master), Duration::from_secs(10));
    let holder_a = on_master.acquire("account:7").await.unwrap();
    let fence_a = store.next_fence("account:7").await.unwrap();

    // 3. Kill the master, resume the replica, promote it.
    master.stop();
    replica.thaw();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut rc)
        .await
        .unwrap();

    // 4. A second worker acquires the "same" lock: two holders at once.
    let on_promoted = redlock(std::slice::from_ref(&replica), Duration::from_secs(10));
    let holder_b = on_promoted
        .acquire("account:7")
        .await
        .expect("the promoted replica never saw the lock");
    assert!(
        holder_a.remaining() > Duration::ZERO,
        "A still believes it holds the lock"
    );
    let fence_b = store.next_fence("account:7").await.unwrap();

    // 5. Fencing: whatever the order, an older token never overwrites a newer value.
    assert!(store.write("account:7", fence_b, b"from B").await.unwrap());
    assert!(!store.write("account:7", fence_a, b"from A").await.unwrap());
    assert_eq!(store.read("account:7").await.unwrap().unwrap(), "from B");
    on_promoted.release(holder_b).await;
    on_master.release(holder_a).await;
}

/// K workers × M rounds with random pauses around the TTL: every accepted write in the ledger carries a strictly increasing fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_safety_stress() {
    const WORKERS: usize = 4;
    const ROUNDS: usize = 8;
    let servers = nodes(3);
    let data = RedisServer::start();
    let store = Arc::new(FencedStore::new(RedisOptions::new(data.url()).namespace("res")).unwrap());
    let lock = Arc::new(redlock(&servers, Duration::from_millis(120)));
    // The ledger lock is held across the write so ledger order is store order.
    let ledger = Arc::new(tokio::sync::Mutex::new(Vec::<u64>::new()));
    let started = Instant::now();
    let tasks: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (lock, store, ledger) = (lock.clone(), store.clone(), ledger.clone());
            tokio::spawn(async move {
                let (mut writes, mut rejected, mut after_expiry) = (0, 0, 0);
                for _ in 0..ROUNDS {
                    // Keep trying for this round (bounded): every worker gets
                    // its turns, so every round ends in a write attempt.
                    let give_up = Instant::now() + Duration::from_secs(5);
                    let lease = loop {
                        match lock.acquire("stress").await {
                            Ok(lease) => break Some(lease),
                            Err(_) if Instant::now() < give_up => continue,
                            Err(_) => break None,
                        }
                    };
                    let Some(lease) = lease else { continue };
                    let fence = store.next_fence("stress").await.unwrap();
                    let pause = rand::random_range(0..240u64); // 0 to 2× TTL
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    if lease.remaining().is_zero() {
                        after_expiry += 1; // a window where another holder may exist
                    }
                    let mut l = ledger.lock().await;
                    writes += 1;
                    if store
                        .write("stress", fence, &fence.to_le_bytes())
                        .await
                        .unwrap()
                    {
                        l.push(fence);
                    } else {
                        rejected += 1;
                    }
                    drop(l);
                    lock.release(lease).await;
                }
                (writes, rejected, after_expiry)
            })
        })
        .collect();
    let (mut writes, mut rejected, mut windows) = (0, 0, 0);
    for t in tasks {
        let (w, r, a) = t.await.unwrap();
        writes += w;
        rejected += r;
        windows += a;
    }
    let ledger = ledger.lock().await;
    println!(
        "lock stress: {writes} writes, {} accepted, {rejected} rejected by the fence, {windows} writes after lease expiry, {:?}",
        ledger.len(),
        started.elapsed()
    );
    assert_eq!(writes, WORKERS * ROUNDS, "every round wrote");
    assert_eq!(ledger.len() + rejected, writes);
    assert!(
        ledger.windows(2).all(|w| w[0] < w[1]),
        "accepted fences strictly increase: {ledger:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// Guarded work that runs past its deadline is abandoned and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_work_past_deadline_is_abandoned() {
    let servers = nodes(3);
    let data = RedisServer::start();
    let store = FencedStore::new(RedisOptions::new(data.url()).namespace("res")).unwrap();
    // Node timeout 5 ms and TTL 150 ms; a slow node is simulated by freezing
    // two of three nodes after acquisition, so no extension reaches a quorum.
    let lock = redlock(&servers, Duration::from_millis(150));
    let ok = lock
        .run(&store, "job", |work| async move {
            Ok::<_, std::io::Error>(bytes::Bytes::from(work.fence().to_string()))
        })
        .await
        .unwrap();
    assert!(ok.accepted);
    let result = lock
        .run(&store, "job", |_work| async {
            servers[0].freeze();
            servers[1].freeze();
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"too late"))
        })
        .await;
    servers[0].thaw();
    servers[1].thaw();
    assert!(matches!(result, Err(LockError::Expired)), "{result:?}");
    assert_eq!(
        store.read("job").await.unwrap().unwrap(),
        ok.fence.to_string()
    );
}

/// The cache layer with Redlock as its lease backend: 3 instances, one cold key, exactly 1 origin call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_on_redlock_calls_origin_once() {
    let lock_nodes = nodes(3);
    let main = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60")]).delay(Duration::from_millis(200));
    let apps: Vec<Router> = (0..3)
        .map(|_| {
            let layer = CacheLayer::builder()
                .redis(RedisOptions::new(main.url()).namespace("t"))
                .redlock(redlock(&lock_nodes, Duration::from_secs(5)))
                .build()
                .unwrap();
            origin.app(layer)
        })
        .collect();
    let mut tasks = Vec::new();
    for app in &apps {
        for _ in 0..100 {
            let app = app.clone();
            tasks.push(tokio::spawn(async move {
                send(&app, get_req("/redlocked")).await
            }));
        }
    }
    let mut bodies = Vec::new();
    for t in tasks {
        let (code, _, body) = t.await.unwrap();
        assert_eq!(code, 200);
        bodies.push(body);
    }
    assert_eq!(origin.calls(), 1);
    assert!(bodies.iter().all(|b| b == &bodies[0]));
}
