#![cfg(feature = "redis")]
mod support;
use futures_util::future::join_all;
use herdguard::{CacheLayer, RedisOptions};
use std::time::Duration;
use support::cluster::RedisCluster;
use support::origin::{get_req, send, Origin};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_flight_experiment() {
    for round in 0..5 {
        let cluster = RedisCluster::start();
        let origin =
            Origin::new(&[("cache-control", "max-age=60")]).delay(Duration::from_millis(200));
        let apps: Vec<_> = (0..3)
            .map(|_| {
                origin.app(
                    CacheLayer::builder()
                        .redis(RedisOptions::cluster(cluster.urls()).namespace("ff"))
                        .build()
                        .unwrap(),
                )
            })
            .collect();
        let uri = format!("/first/{round}");
        let reqs = (0..1500).map(|i| send(&apps[i % 3], get_req(&uri)));
        let t = std::time::Instant::now();
        join_all(reqs).await;
        eprintln!(
            "ROUND {round}: calls {} in {:?}",
            origin.calls(),
            t.elapsed()
        );
    }
}
