//! The quickstart's burst (tests of the example, run by `cargo test`): the line
//! the README's demo prints must report one origin call, on one instance
//! and across instances sharing a real redis-server.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::Duration;

use herdguard::{CacheLayer, RedisOptions};
use support::RedisServer;

async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    addr.to_string()
}

const DELAY: Duration = Duration::from_millis(200);

/// The demo's own burst of 1000 concurrent requests prints "1000 requests → 1 origin call".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_burst_prints_one_origin_call() {
    let target = serve(super::router(CacheLayer::new(), DELAY)).await;
    let at_once = super::burst_width(1000, true);
    let burst = super::burst(&[target], 1000, at_once).await.unwrap();
    let line = burst.line();
    assert!(
        line.starts_with("1000 requests → 1 origin call ("),
        "printed: {line}"
    );
    assert_eq!(burst.origin_calls, 1, "{line}");
    assert_eq!(burst.errors, 0, "{line}");
    assert_eq!(burst.distinct_bodies, 1, "every request got the one answer");
}

/// Spread over two instances on one Redis, the burst still costs one origin call in total.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_burst_over_instances_on_redis_prints_one_origin_call() {
    let server = RedisServer::start();
    let instance = || {
        // Generous Redis timeouts: on a loaded machine a 250 ms reply bound
        // trips the breaker and the instance (rightly) leads on its own.
        let options = RedisOptions::new(server.url())
            .namespace("quickstart")
            .connect_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(5))
            .pool_wait_timeout(Duration::from_secs(5));
        let cache = CacheLayer::builder().redis(options).build().unwrap();
        super::router(cache, DELAY)
    };
    let targets = vec![serve(instance()).await, serve(instance()).await];
    let at_once = super::burst_width(400, true);
    let burst = super::burst(&targets, 400, at_once).await.unwrap();
    let line = burst.line();
    assert!(
        line.starts_with("400 requests over 2 instances → 1 origin call ("),
        "printed: {line}"
    );
    assert_eq!(burst.origin_calls, 1, "{line}");
    assert_eq!(burst.errors, 0, "{line}");
    assert_eq!(
        burst.distinct_bodies, 1,
        "both instances served the one fill"
    );
}
