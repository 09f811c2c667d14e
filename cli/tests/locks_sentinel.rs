//! `herdguard locks --sentinel`, the binary, against a real Sentinel
//! topology: the nodes come from the sentinels, and a lease held with two
//! tokens (as a failover that lost a lease leaves it) is reported split.

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
    assert_eq!(j["holders"]["token-a"], 2, "{j}");
    assert_eq!(j["holders"]["token-b"], 1, "{j}");
}
