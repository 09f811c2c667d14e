//! Redlock and lock safety under faults, against real redis-server processes:
//! lost nodes, a frozen node, a paused holder, failover losing the lock, a
//! randomized stress run, and Redlock as the cache layer's lease backend.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use deadpool_redis::redis;
use herdguard::redlock::{FencedStore, LockError, Redlock};
use herdguard::{CacheLayer, RedisOptions};
use support::origin::{get_req, send, Origin};
use support::RedisServer;
use tokio::time::Instant;

fn nodes(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

/// The per-node budget these tests use: a quarter of the TTL, 20 to 50 ms.
/// (The default, TTL/100 with a 5 ms floor, is what production wants for
/// second-long leases; with the short test TTLs it would be 5 ms, which a
/// loaded 2-core machine misses for healthy nodes.)
fn node_budget(ttl: Duration) -> Duration {
    (ttl / 4).clamp(Duration::from_millis(20), Duration::from_millis(50))
}

fn redlock(servers: &[RedisServer], ttl: Duration) -> Redlock {
    Redlock::builder(servers.iter().map(RedisServer::url))
        .namespace("rl")
        .ttl(ttl)
        .node_timeout(node_budget(ttl))
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
    // The node timeout plus scheduling slack for a loaded machine; a stall
    // on the frozen node would last until the 1 s connect timeout or longer.
    assert!(took < Duration::from_millis(50 + 450), "took {took:?}");
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

/// One acquisition in the stress run, as its worker saw it.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// From the moment `acquire` returned...
    from: Instant,
    /// ...to the end of validity or the release, whichever came first.
    until: Instant,
    fence: u64,
    /// Written after the lease's validity ended: another holder may exist.
    late: bool,
    accepted: bool,
}

/// K workers × M rounds, a quarter of the holds pausing three TTLs: no two leases are ever valid at once (fails if Redlock granted every acquire), each pause past the TTL is an overlap where a newer holder writes first and the fence rejects the late write, and accepted fences strictly increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_safety_stress() {
    const WORKERS: usize = 4;
    const ROUNDS: usize = 6;
    const TTL: Duration = Duration::from_millis(200);
    let servers = nodes(3);
    let data = RedisServer::start();
    let store = Arc::new(FencedStore::new(RedisOptions::new(data.url()).namespace("res")).unwrap());
    let lock = Arc::new(redlock(&servers, TTL));
    // The ledger lock is held across the write so ledger order is store order.
    let ledger = Arc::new(tokio::sync::Mutex::new(Vec::<Held>::new()));
    let started = Instant::now();
    let tasks: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (lock, store, ledger) = (lock.clone(), store.clone(), ledger.clone());
            tokio::spawn(async move {
                for round in 0..ROUNDS {
                    // Keep trying for this round (bounded): every worker gets
                    // its turns, so every round ends in a write attempt.
                    let give_up = Instant::now() + Duration::from_secs(10);
                    let lease = loop {
                        match lock.acquire("stress").await {
                            Ok(lease) => break lease,
                            Err(_) => assert!(Instant::now() < give_up, "worker {w} starved"),
                        }
                    };
                    let from = Instant::now();
                    let fence = store.next_fence("stress").await.unwrap();
                    let pause = if (w + round) % WORKERS == 0 {
                        TTL * 3 // a "GC pause": others take the lease meanwhile
                    } else {
                        Duration::from_millis(10)
                    };
                    tokio::time::sleep(pause).await;
                    let mut l = ledger.lock().await;
                    let late = Instant::now() >= lease.deadline();
                    let accepted = store
                        .write("stress", fence, &fence.to_le_bytes())
                        .await
                        .unwrap();
                    let until = Instant::now().min(lease.deadline());
                    l.push(Held {
                        from,
                        until,
                        fence,
                        late,
                        accepted,
                    });
                    drop(l);
                    lock.release(lease).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let ledger = ledger.lock().await;
    let late_rejected = ledger.iter().filter(|h| h.late && !h.accepted).count();
    let late = ledger.iter().filter(|h| h.late).count();
    println!(
        "lock stress: {} writes, {} accepted, {late} late, {late_rejected} late and rejected by the fence, {:?}",
        ledger.len(),
        ledger.iter().filter(|h| h.accepted).count(),
        started.elapsed()
    );
    assert_eq!(ledger.len(), WORKERS * ROUNDS, "every round wrote");
    let mut by_start: Vec<&Held> = ledger.iter().collect();
    by_start.sort_by_key(|h| h.from);
    for pair in by_start.windows(2) {
        assert!(
            pair[1].from >= pair[0].until,
            "two leases valid at once: {:?} and {:?}",
            pair[0],
            pair[1]
        );
    }
    // Ledger order is store order: a write lands iff its fence is newer
    // than every one accepted before it.
    let mut newest = 0;
    for h in ledger.iter() {
        assert_eq!(h.accepted, h.fence > newest, "{h:?}");
        if h.accepted {
            newest = h.fence;
        }
    }
    assert!(
        late_rejected >= 1,
        "no pause produced an overlap the fence had to settle: {ledger:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// Guarded work that runs past its deadline is abandoned and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_work_past_deadline_is_abandoned() {
    let servers = nodes(3);
    let data = RedisServer::start();
    let store = FencedStore::new(RedisOptions::new(data.url()).namespace("res")).unwrap();
    // Node timeout 37 ms and TTL 150 ms; a slow node is simulated by freezing
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

/// The cache layer with Redlock as its lease backend: 3 instances, one cold key, exactly 1 origin call; while the origin runs the lease lives on a quorum of the lock nodes (and not on the main store), and it is released after the fill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_on_redlock_calls_origin_once() {
    let lock_nodes = nodes(3);
    let main = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60")]).delay(Duration::from_millis(500));
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
    // The leader is in the origin now: it holds the lease.
    let deadline = Instant::now() + Duration::from_secs(5);
    while origin.calls() == 0 {
        assert!(Instant::now() < deadline, "the origin was never called");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let hex = CacheLayer::new().key_for(&get_req("/redlocked")).to_hex();
    let lease_key = format!("rl:{{{hex}}}:lock");
    let mut holding = 0;
    for node in &lock_nodes {
        if lock_keys(node).await.contains(&lease_key) {
            holding += 1;
        }
    }
    assert!(holding >= 2, "the lease is on {holding} of 3 lock nodes");
    let mut c = main.connection().await;
    let on_main: i64 = redis::cmd("EXISTS")
        .arg(format!("t:{{{hex}}}:lock"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(on_main, 0, "no lease on the main store");

    let mut bodies = Vec::new();
    for t in tasks {
        let (code, _, body) = t.await.unwrap();
        assert_eq!(code, 200);
        bodies.push(body);
    }
    assert_eq!(origin.calls(), 1);
    assert!(bodies.iter().all(|b| b == &bodies[0]));
    for node in &lock_nodes {
        assert!(lock_keys(node).await.is_empty(), "released after the fill");
    }
}

/// Validity pays for real acquisition time: with one node frozen the acquisition takes at least the node timeout, and the validity left once acquired is at most TTL − elapsed − (TTL × drift + 2 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validity_pays_for_a_slow_node() {
    const TTL: Duration = Duration::from_secs(2);
    const NODE_TIMEOUT: Duration = Duration::from_millis(150);
    let servers = nodes(3);
    let lock = Redlock::builder(servers.iter().map(RedisServer::url))
        .namespace("rl")
        .ttl(TTL)
        .node_timeout(NODE_TIMEOUT)
        .retries(0, Duration::from_millis(1))
        .build()
        .unwrap();
    let warm = lock.acquire("warm").await.unwrap();
    lock.release(warm).await;
    servers[2].freeze();
    let before = Instant::now();
    let lease = lock.acquire("job").await.expect("2 of 3 answer");
    let acquired = Instant::now();
    servers[2].thaw();
    let elapsed = acquired - before;
    assert!(
        elapsed >= NODE_TIMEOUT,
        "the frozen node was waited for: {elapsed:?}"
    );
    let drift = TTL.mul_f64(0.01) + Duration::from_millis(2);
    let validity = lease.deadline().saturating_duration_since(acquired);
    assert!(
        validity <= TTL - elapsed - drift,
        "validity {validity:?} with {elapsed:?} elapsed"
    );
    assert!(validity > Duration::ZERO);
    lock.release(lease).await;
}
