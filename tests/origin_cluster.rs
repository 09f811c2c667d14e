//! The origin as a whole across instances on one real redis-server: the
//! cluster-wide budget, its permits expiring when an instance dies holding
//! them, and the breaker's probe elected once for the cluster.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::Router;
use deadpool_redis::redis;
use herdguard::{CacheLayer, OriginBreaker, RedisOptions};
use support::faulty::FaultyOrigin;
use support::origin::{cache_status, get_req, send};
use support::RedisServer;

/// Wait (at most 10 s) until the origin has had `n` calls.
async fn until_called(origin: &FaultyOrigin, n: usize) {
    let wait = async {
        while origin.calls() < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("the origin was not called in time");
}

fn budget_layer(server: &RedisServer, timeout: Duration) -> CacheLayer {
    CacheLayer::builder()
        .origin_timeout(timeout)
        .max_wait(timeout)
        .redis(RedisOptions::new(server.url()).cluster_origin_budget(1))
        .build()
        .unwrap()
}

/// With a cluster budget of one, a miss on a second instance waits while
/// the first instance's call holds the permit, then is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_budget_bounds_calls_across_instances() {
    let server = RedisServer::start();
    let origin = FaultyOrigin::new();
    let a = origin.app(budget_layer(&server, Duration::from_secs(10)));
    let b = origin.app(budget_layer(&server, Duration::from_secs(10)));
    let slow = tokio::spawn(async move { send(&a, get_req("/slow/a")).await.0 });
    until_called(&origin, 1).await;
    let miss = tokio::spawn(async move { send(&b, get_req("/b")).await.0 });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        origin.calls(),
        1,
        "the other instance's miss waits for the permit"
    );

    origin.release(1);
    assert_eq!(slow.await.unwrap(), StatusCode::OK);
    assert_eq!(miss.await.unwrap(), StatusCode::OK);
    assert_eq!(origin.calls(), 2);
    assert_eq!(origin.peak(), 1, "one call at a time in the cluster");
}

/// An instance that dies mid-call (its runtime dropped, so nothing gives its
/// permit back) holds the cluster's one permit only until it expires, a
/// second past the origin timeout: then another instance's miss is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_instances_cluster_permit_expires() {
    let server = RedisServer::start();
    let origin = FaultyOrigin::new();
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let a = origin.app(budget_layer(&server, Duration::from_secs(2)));
    doomed.spawn(async move { send(&a, get_req("/slow/a")).await });
    until_called(&origin, 1).await;
    let died = Instant::now();
    doomed.shutdown_background();

    let b = origin.app(budget_layer(&server, Duration::from_secs(10)));
    let (code, h, _) = send(&b, get_req("/b")).await;
    assert_eq!(code, StatusCode::OK, "{}", cache_status(&h));
    assert_eq!(origin.calls(), 2);
    assert!(
        died.elapsed() >= Duration::from_millis(1500),
        "served after {:?}: before the dead instance's permit expired",
        died.elapsed()
    );
}

/// Wait (at most 10 s) until no instance holds the origin down in Redis.
async fn until_marked_up(server: &RedisServer) {
    let mut conn = server.connection().await;
    let wait = async {
        loop {
            let down: i64 = redis::cmd("EXISTS")
                .arg("herdguard:{origin:herdguard}:down")
                .query_async(&mut conn)
                .await
                .unwrap();
            if down == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("the origin was never marked up");
}

fn breaker_layer(server: &RedisServer) -> CacheLayer {
    let second = Duration::from_secs(1);
    CacheLayer::builder()
        .origin_breaker(OriginBreaker::default().failures(1).backoff(second, second))
        .redis(RedisOptions::new(server.url()))
        .build()
        .unwrap()
}

/// One request on each of `apps` at once, on keys of its own: their statuses.
async fn one_each(apps: &[Router], round: usize) -> Vec<StatusCode> {
    let tasks: Vec<_> = apps
        .iter()
        .enumerate()
        .map(|(i, app)| {
            let app = app.clone();
            let path = format!("/r{round}/i{i}");
            tokio::spawn(async move { send(&app, get_req(&path)).await.0 })
        })
        .collect();
    let mut codes = Vec::new();
    for t in tasks {
        codes.push(t.await.unwrap());
    }
    codes
}

/// Three instances whose breakers are open send one probe per interval
/// for the whole cluster, not one each; once a probe is answered, the
/// others close without probing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_breaker_sends_one_probe_for_the_cluster() {
    let server = RedisServer::start();
    let origin = FaultyOrigin::new();
    let layers: Vec<CacheLayer> = (0..3).map(|_| breaker_layer(&server)).collect();
    let apps: Vec<Router> = layers.iter().map(|l| origin.app(l.clone())).collect();
    origin.fail(true);
    one_each(&apps, 0).await;
    assert_eq!(origin.calls(), 3, "each instance's first failure opens it");

    for round in 1..=2 {
        tokio::time::sleep(Duration::from_millis(1600)).await;
        one_each(&apps, round).await;
        assert_eq!(
            origin.calls(),
            3 + round,
            "round {round}: one probe for the cluster"
        );
    }

    origin.fail(false);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let (code, _, _) = send(&apps[0], get_req("/healed")).await;
    assert_eq!(code, StatusCode::OK, "the probe is answered");
    assert_eq!(origin.calls(), 6);
    until_marked_up(&server).await;
    let codes = one_each(&apps[1..], 4).await;
    assert_eq!(
        codes,
        vec![StatusCode::OK; 2],
        "the others close without a probe"
    );
    assert_eq!(origin.calls(), 8);
    let probes: u64 = layers.iter().map(|l| l.stats().probes).sum();
    assert_eq!(probes, 3, "two failed probes and the answered one");
}

/// The cluster probes as one instance would: a failed probe doubles the
/// interval for every instance, so a probe due on another instance before
/// that interval has run waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_probe_doubles_the_interval_for_the_cluster() {
    let server = RedisServer::start();
    let origin = FaultyOrigin::new();
    let (first, max) = (Duration::from_millis(1000), Duration::from_millis(4000));
    let layers: Vec<CacheLayer> = (0..2)
        .map(|_| {
            CacheLayer::builder()
                .origin_breaker(OriginBreaker::default().failures(1).backoff(first, max))
                .redis(RedisOptions::new(server.url()))
                .build()
                .unwrap()
        })
        .collect();
    let apps: Vec<Router> = layers.iter().map(|l| origin.app(l.clone())).collect();
    origin.fail(true);
    one_each(&apps, 0).await;
    assert_eq!(origin.calls(), 2);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    one_each(&apps, 1).await;
    assert_eq!(origin.calls(), 3, "the first probe, 1 s in");
    // 1.2 s later: past the first interval, within the doubled one (2 s).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    one_each(&apps, 2).await;
    assert_eq!(origin.calls(), 3, "no probe before the doubled interval");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    one_each(&apps, 3).await;
    assert_eq!(origin.calls(), 4, "the next probe, for the cluster");
}

fn plain_layer(server: &RedisServer) -> CacheLayer {
    CacheLayer::builder()
        .redis(RedisOptions::new(server.url()))
        .build()
        .unwrap()
}

/// While an instance's breaker is open, a copy only Redis holds (stored by
/// another instance) still stands in where stale-if-error allows it:
/// the instance looks in Redis instead of refusing at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_still_serves_a_copy_only_redis_holds() {
    let server = RedisServer::start();
    let origin = FaultyOrigin::new();
    let (a, b) = (
        origin.app(plain_layer(&server)),
        origin.app(plain_layer(&server)),
    );
    send(&a, get_req("/sie/k")).await;
    // Redis expiry runs on real time: let freshness (1 s) end.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    origin.fail(true);
    for path in ["/x0", "/x1", "/x2", "/x3", "/x4"] {
        send(&b, get_req(path)).await;
    }
    let calls = origin.calls();
    let (code, h, body) = send(&b, get_req("/sie/k")).await;
    assert_eq!(code, StatusCode::OK, "{}", cache_status(&h));
    assert!(
        cache_status(&h).contains("detail=origin-down"),
        "{}",
        cache_status(&h)
    );
    assert!(body.starts_with(b"ok call=1 "));
    assert_eq!(origin.calls(), calls, "no origin call while it is down");
}

/// A request waiting on another instance's call makes no room for a
/// background call here: instance B has one request waiting on A's lease
/// (one flight, no call of its own), so a refresh ahead of expiry on B is
/// skipped. Counted by origin calls alone, B would have had room, and four
/// instances made more calls at once than their clients could.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_on_another_instance_makes_no_room_for_a_refresh() {
    let server = RedisServer::start();
    let origin = FaultyOrigin::new();
    // Refresh ahead in the last 90 % of the freshness: a wide window.
    let layer = || {
        CacheLayer::builder()
            .refresh_ahead(0.9)
            .redis(RedisOptions::new(server.url()))
            .build()
            .unwrap()
    };
    let (a_layer, b_layer) = (layer(), layer());
    let (a, b) = (origin.app(a_layer), origin.app(b_layer.clone()));
    // Fresh for 1 s: from 0.1 s on, in the refresh-ahead window.
    send(&b, get_req("/short/h")).await;
    let stored = Instant::now();
    let lead = {
        let a = a.clone();
        tokio::spawn(async move { send(&a, get_req("/slow/x")).await.0 })
    };
    until_called(&origin, 2).await;
    let wait = {
        let b = b.clone();
        tokio::spawn(async move { send(&b, get_req("/slow/x")).await.0 })
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    while b_layer.flights(4).is_empty() {
        assert!(Instant::now() < deadline, "B never waited on A's call");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Into the window (0.1 s..1 s after the fill): hit twice.
    tokio::time::sleep(Duration::from_millis(150).saturating_sub(stored.elapsed())).await;
    for _ in 0..2 {
        let (_, h, _) = send(&b, get_req("/short/h")).await;
        assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    }
    assert!(
        stored.elapsed() < Duration::from_millis(950),
        "left the window"
    );
    assert_eq!(b_layer.stats().refreshes_skipped, 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(origin.calls(), 2, "no refresh of /short/h went out");

    origin.release(1);
    assert_eq!(lead.await.unwrap(), StatusCode::OK);
    assert_eq!(wait.await.unwrap(), StatusCode::OK);
    assert_eq!(origin.calls(), 2, "B's wait was answered by A's call");
}
