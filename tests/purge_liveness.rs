//! Connections and the purge listener after the network or a node goes
//! away without a word: a failover whose old
//! connections are blackholed behind a moved address, and a Redis Cluster
//! that loses its first seed node. Real redis-server processes; real time,
//! with bounds a loaded 2-core machine meets.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::{Duration, Instant};

use axum::http::Uri;
use axum::Router;
use deadpool_redis::redis;
use herdguard::purge::Purged;
use herdguard::{CacheLayer, RedisOptions};
use support::cluster::{cli, RedisCluster};
use support::origin::{call_of, get_req, req, send, Origin};
use support::{RedisServer, Vip};

const NS: &str = "live";
const CHANNEL: &str = "live:purge";

/// Long enough that only a purge notice (or the listener's own drop of
/// every copy after a reconnect) can remove a memory copy during a test.
const L1: Duration = Duration::from_secs(60);

/// A blackholed call costs the 250 ms reply timeout, the breaker's back-off
/// grows to 5 s at most, and the listener's PING comes every 5 s: each of
/// these is well within the bound, on a loaded machine too.
const HEAL: Duration = Duration::from_secs(20);

fn layer(url: String, cluster: Option<Vec<String>>) -> CacheLayer {
    let options = match cluster {
        Some(urls) => RedisOptions::cluster(urls),
        None => RedisOptions::new(url),
    };
    CacheLayer::builder()
        .redis(options.namespace(NS).l1_ttl(L1))
        .build()
        .unwrap()
}

/// The `call=N` of an origin answer.
fn url(path: &str) -> Uri {
    format!("http://example.test{path}").parse().unwrap()
}

fn entry_key(uri: &str) -> String {
    format!(
        "{NS}:{{{}}}:v",
        CacheLayer::new().key_for(&get_req(uri)).to_hex()
    )
}

/// Whether `uri`'s entry shows up on `server` within a second (the write
/// may land just after the answer).
async fn stored_on(server: &RedisServer, uri: &str) -> bool {
    let mut c = server.connection().await;
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let n: i64 = redis::cmd("EXISTS")
            .arg(entry_key(uri))
            .query_async(&mut c)
            .await
            .unwrap();
        if n == 1 {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn subscribers(server: &RedisServer) -> i64 {
    let mut c = server.connection().await;
    let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(CHANNEL)
        .query_async(&mut c)
        .await
        .unwrap();
    counts.first().map_or(0, |(_, n)| *n)
}

/// Poll `app` for `uri` until it answers from the origin (a call after
/// `seen`), at most `bound`; returns the answer's `call=N`.
async fn until_miss(app: &Router, uri: &str, seen: &str, bound: Duration) -> String {
    let start = Instant::now();
    loop {
        let (code, _, body) = send(app, get_req(uri)).await;
        assert_eq!(code, 200);
        let c = call_of(&body);
        if c != seen {
            return c;
        }
        assert!(
            start.elapsed() < bound,
            "{uri} still served its purged copy ({seen}) after {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// After a failover whose old connections are blackholed (the address moved to the promoted replica, the old paths silent but open), every instance's calls reach the new primary again, a purge through B after the switch reaches A's memory copy, and both purge listeners subscribe on the new primary, so later notices arrive too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_failover_heals_calls_and_purge_listeners() {
    let old = RedisServer::start();
    let new = RedisServer::start_replica_of(&old).await;
    let vip = Vip::start(old.port()).await;
    let origin = Origin::new(&[("cache-control", "max-age=600")]);
    let (la, lb) = (layer(vip.url(), None), layer(vip.url(), None));
    let (a, b) = (origin.app(la), origin.app(lb.clone()));
    old.wait_for_subscribers(CHANNEL, 2).await;
    assert_eq!(call_of(&send(&a, get_req("/p")).await.2), "call=1");
    let (_, _, body) = send(&b, get_req("/p")).await;
    assert_eq!(call_of(&body), "call=1", "B reads A's fill from Redis");
    old.wait_replicated(1).await;

    vip.blackhole();
    new.promote().await;
    vip.point_to(new.port());
    let switched = Instant::now();

    // (1) Each instance writes to the new primary again: its timed-out
    // connections were replaced by ones through the moved address.
    let mut calls = 1;
    for (name, app) in [("A", &a), ("B", &b)] {
        for i in 0.. {
            let uri = format!("/after/{name}/{i}");
            let (code, _, _) = send(app, get_req(&uri)).await;
            assert_eq!(code, 200);
            calls += 1;
            assert_eq!(origin.calls(), calls, "one origin call per new URL");
            if stored_on(&new, &uri).await {
                break;
            }
            assert!(
                switched.elapsed() < HEAL,
                "{name} wrote nothing to the new primary within {HEAL:?}"
            );
        }
    }
    println!(
        "both instances write again {:?} after the switch",
        switched.elapsed()
    );

    // (2) A purge through B after the switch: A's memory copy goes, heard
    // or not (a notice sent before A's listener is back is lost, and the
    // listener then drops every copy it holds from before).
    let listening = subscribers(&new).await;
    assert_eq!(lb.purge_url(&url("/p")).await.unwrap(), Purged::Redis);
    let purged = Instant::now();
    calls += 1;
    assert_eq!(
        until_miss(&a, "/p", "call=1", HEAL).await,
        format!("call={calls}")
    );
    println!(
        "A served a miss {:?} after the purge ({listening} listeners on the new primary at the purge)",
        purged.elapsed()
    );

    // (3) Both listeners are subscribed on the new primary: a purge is now
    // heard at once (L1 is 60 s, so nothing else removes the copy).
    new.wait_for_subscribers(CHANNEL, 2).await;
    let (_, _, body) = send(&a, get_req("/q")).await;
    calls += 1;
    assert_eq!(call_of(&body), format!("call={calls}"));
    let (_, _, body) = send(&a, get_req("/q")).await;
    assert_eq!(
        call_of(&body),
        format!("call={calls}"),
        "kept in A's memory"
    );
    assert_eq!(lb.purge_url(&url("/q")).await.unwrap(), Purged::Redis);
    let seen = format!("call={calls}");
    calls += 1;
    assert_eq!(
        until_miss(&a, "/q", &seen, Duration::from_secs(3)).await,
        format!("call={calls}")
    );

    // And a cold burst over both instances is one origin call again.
    let mut tasks = Vec::new();
    for app in [&a, &b] {
        for _ in 0..20 {
            let app = app.clone();
            tasks.push(tokio::spawn(
                async move { send(&app, get_req("/burst")).await },
            ));
        }
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().0, 200);
    }
    calls += 1;
    assert_eq!(origin.calls(), calls, "the burst cost one call");
}

/// Subscribers of the purge channel on every node of `cluster` that answers.
fn cluster_subscribers(cluster: &RedisCluster) -> i64 {
    cluster
        .nodes()
        .iter()
        .map(|n| {
            cli(n.port(), &["pubsub", "numsub", CHANNEL])
                .lines()
                .nth(1)
                .and_then(|l| l.trim().parse::<i64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

fn wait_cluster_subscribers(cluster: &RedisCluster, n: i64, bound: Duration) {
    let start = Instant::now();
    while cluster_subscribers(cluster) < n {
        assert!(
            start.elapsed() < bound,
            "{} purge listeners on the live nodes after {bound:?}, not {n}",
            cluster_subscribers(cluster)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// On Redis Cluster, with the first seed node killed, both purge listeners subscribe on a live node, and a purge through B removes A's memory copy of the purged variant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_purge_listener_survives_its_first_seed() {
    let mut cluster = RedisCluster::start_with_replicas(1);
    let first = cluster.nodes()[0].port();
    assert!(
        cluster.master_ports().contains(&first),
        "the first seed is a master"
    );
    let origin = Origin::new(&[
        ("cache-control", "max-age=600"),
        ("vary", "accept-language"),
    ]);
    let urls = cluster.urls();
    let (la, lb) = (
        layer(String::new(), Some(urls.clone())),
        layer(String::new(), Some(urls)),
    );
    let (a, _b) = (origin.app(la), origin.app(lb.clone()));
    wait_cluster_subscribers(&cluster, 2, Duration::from_secs(10));

    cluster.kill(first);
    wait_cluster_subscribers(&cluster, 2, HEAL);

    let de = || req(axum::http::Method::GET, "/v", &[("accept-language", "de")]);
    assert_eq!(call_of(&send(&a, de()).await.2), "call=1");
    assert_eq!(
        call_of(&send(&a, de()).await.2),
        "call=1",
        "kept in A's memory"
    );
    // The purge may meet B's connection still finding the promoted master.
    let start = Instant::now();
    while lb.purge_url(&url("/v")).await.ok() != Some(Purged::Redis) {
        assert!(start.elapsed() < HEAL, "B's purge never reached Redis");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let start = Instant::now();
    loop {
        let (code, _, body) = send(&a, de()).await;
        assert_eq!(code, 200);
        if call_of(&body) == "call=2" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "A still served its purged variant copy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(origin.calls(), 2);
}
