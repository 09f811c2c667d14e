//! `herdguard locks --sentinel`, the binary, against a real Sentinel
//! topology: the nodes come from the sentinels, and a lease held with two
//! tokens (as a failover that lost a lease leaves it) is reported split:
//! one made by hand, and one a real failover leaves.

use herdguard_testkit as support;

use std::time::Duration;

use deadpool_redis::redis;
use herdguard::CacheKey;
use support::sentinel::SentinelSet;

/// Two tokens for one lock across a primary and its replicas: the one every
/// node replicated, and another written on one replica by hand (it accepts
/// writes for this test). `locks --sentinel` finds all three nodes and
/// reports the split with each token, exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_finds_the_nodes_through_sentinel_and_reports_a_split() {
    let set = tokio::task::spawn_blocking(|| SentinelSet::start(2))
        .await
        .unwrap();
    let lock = format!("rl:{{{}}}:lock", CacheKey::new("job").to_hex());
    let primary = set.server(set.primary_port());
    let mut c = primary.connection().await;
    let _: () = redis::cmd("SET")
        .arg(&lock)
        .arg("token-a")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut c)
        .await
        .unwrap();
    primary.wait_replicated(2).await;
    let replica = set
        .servers()
        .iter()
        .find(|s| s.port() != primary.port())
        .unwrap();
    let mut r = replica.connection().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("replica-read-only")
        .arg("no")
        .query_async(&mut r)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(&lock)
        .arg("token-b")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut r)
        .await
        .unwrap();

    let j = split_report(&set).await;
    assert_eq!(j["holders"]["token-a"], 2, "{j}");
    assert_eq!(j["holders"]["token-b"], 1, "{j}");
}

/// A real failover split: the replicas' link cut, a lease taken on the
/// primary (so no replica has it), the primary frozen and a replica
/// promoted, the same lease taken again on the new primary (and replicated
/// to the other replica), then the old primary thawed. Until the sentinels
/// turn it into a replica (they wait 8 s after it is back), `locks
/// --sentinel` finds it among the replicas and reports the split: the old
/// token on one node, the new one on two, exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_reports_the_split_a_real_failover_leaves() {
    let handle = tokio::runtime::Handle::current();
    let (set, vip) = tokio::task::spawn_blocking(move || {
        let mut vip = None;
        let set = SentinelSet::start_through(
            2,
            |primary| {
                let v = handle.block_on(support::Vip::start(primary));
                let port = v.port();
                vip = Some(v);
                port
            },
            Duration::from_secs(60),
        );
        (set, vip.expect("the replication link"))
    })
    .await
    .unwrap();
    let lock = format!("rl:{{{}}}:lock", CacheKey::new("job").to_hex());
    let take = |token: &'static str| {
        let mut cmd = redis::cmd("SET");
        cmd.arg(&lock).arg(token).arg("NX").arg("PX").arg(60_000);
        cmd
    };

    vip.blackhole();
    let old = set.primary_port();
    let mut c = set.server(old).connection().await;
    let taken: Option<String> = take("token-old").query_async(&mut c).await.unwrap();
    assert_eq!(taken.as_deref(), Some("OK"));
    set.server(old).freeze();
    let set = tokio::task::spawn_blocking(move || {
        let (new, _) = set.wait_for_promotion(old, Duration::from_secs(30));
        for port in set.servers().iter().map(|s| s.port()) {
            if port != old && port != new {
                set.wait_for_replica(port, Duration::from_secs(30));
            }
        }
        set
    })
    .await
    .unwrap();
    let new = set.server(set.primary_port());
    let mut c = new.connection().await;
    let taken: Option<String> = take("token-new").query_async(&mut c).await.unwrap();
    assert_eq!(
        taken.as_deref(),
        Some("OK"),
        "the promoted replica never had the old lease"
    );
    new.wait_replicated(1).await;
    set.server(old).thaw();

    let j = split_report(&set).await;
    assert_eq!(j["holders"]["token-old"], 1, "{j}");
    assert_eq!(j["holders"]["token-new"], 2, "{j}");
    drop((set, vip));
}

/// `herdguard --json locks job` through the sentinels of `set`: it exits 1
/// and reports the lease split over the three nodes; the report.
async fn split_report(set: &SentinelSet) -> serde_json::Value {
    let sentinels = set.sentinel_urls().join(",");
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_herdguard"))
        .args(["--json", "locks", "job", "--namespace", "rl", "--sentinel"])
        .arg(&sentinels)
        .args(["--master-name", set.master_name()])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the CLI finishes within 30 s")
        .expect("the CLI runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout} {:?}", out.stderr);
    let j: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(j["nodes"].as_array().map(Vec::len), Some(3), "{j}");
    assert_eq!(j["state"], "split", "{j}");
    j
}
