//! The cluster origin budget across real `herdguard proxy` processes on one
//! real redis-server: a proxy SIGKILLed while its call holds the cluster's
//! only permit holds it until the permit expires (a second past the origin
//! timeout), never longer; then another proxy's miss is served. And a
//! proxy on Redis shares its origin budget with the fleet unless told not to.

use herdguard_testkit::proxy_process::ProxyProcess;
use herdguard_testkit::RedisServer;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing;
use axum::Router;
use deadpool_redis::redis;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

/// Where the cluster budget's permits live (namespace and layer name are
/// the proxy's defaults).
const PERMITS: &str = "herdguard:{origin:herdguard}:budget";

/// `/slow/…` answers after 30 s (past every bound here), anything else at
/// once; calls counted.
async fn origin(calls: Arc<AtomicUsize>) -> SocketAddr {
    async fn answer(State(calls): State<Arc<AtomicUsize>>, Path(p): Path<String>) -> &'static str {
        calls.fetch_add(1, Ordering::SeqCst);
        if p.starts_with("slow") {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        "ok"
    }
    let app = Router::new()
        .route("/{*p}", routing::get(answer))
        .with_state(calls);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn permits_taken(server: &RedisServer) -> i64 {
    let mut conn = server.connection().await;
    redis::cmd("ZCARD")
        .arg(PERMITS)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Waits (10 s at most) until the origin has seen `n` calls.
async fn origin_saw(calls: &AtomicUsize, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls.load(Ordering::SeqCst) < n {
        assert!(
            Instant::now() < deadline,
            "the slow call never reached the origin"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// With `--redis` and no `--cluster-origin-budget`, a call holds a permit
/// of the cluster budget (sized like `--origin-budget`); with
/// `--cluster-origin-budget 0` it holds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_shares_the_origin_budget_unless_told_not_to() {
    let server = RedisServer::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let upstream = format!("http://{}", origin(Arc::clone(&calls)).await);
    let url = server.url();
    let bin = env!("CARGO_BIN_EXE_herdguard");
    let client = Client::builder(TokioExecutor::new()).build_http::<axum::body::Body>();
    let base = [
        "--upstream",
        &upstream,
        "--redis",
        &url,
        "--origin-budget",
        "2",
    ];
    for (extra, calls_seen, permits) in [
        (&[][..], 1, 1),
        (&["--cluster-origin-budget", "0"][..], 2, 0),
    ] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let proxy = ProxyProcess::start(bin, &args).await;
        let slow = format!("http://{}/slow", proxy.listen).parse().unwrap();
        let pending = tokio::spawn(client.get(slow));
        origin_saw(&calls, calls_seen).await;
        assert_eq!(permits_taken(&server).await, permits, "with {extra:?}");
        drop(proxy);
        let _ = pending.await;
        let mut conn = server.connection().await;
        let _: () = redis::cmd("DEL")
            .arg(PERMITS)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_proxys_permit_expires() {
    let server = RedisServer::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let upstream = format!("http://{}", origin(Arc::clone(&calls)).await);
    let url = server.url();
    let args = [
        "--upstream",
        &upstream,
        "--redis",
        &url,
        "--cluster-origin-budget",
        "1",
        "--origin-timeout",
        "2s",
        "--max-wait",
        "10s",
    ];
    let bin = env!("CARGO_BIN_EXE_herdguard");
    let doomed = ProxyProcess::start(bin, &args).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<axum::body::Body>();
    let slow = format!("http://{}/slow", doomed.listen).parse().unwrap();
    let pending = tokio::spawn(client.get(slow));
    origin_saw(&calls, 1).await;
    assert_eq!(
        permits_taken(&server).await,
        1,
        "the call holds the only permit"
    );
    drop(doomed); // SIGKILL: nothing of it gives the permit back.
    let killed = Instant::now();
    let _ = pending.await;

    let other = ProxyProcess::start(bin, &args).await;
    let fast = format!("http://{}/fast", other.listen).parse().unwrap();
    let res = tokio::time::timeout(Duration::from_secs(10), client.get(fast))
        .await
        .expect("served within the wait")
        .unwrap();
    assert_eq!(res.status(), 200);
    let waited = killed.elapsed();
    assert!(
        waited >= Duration::from_millis(1500),
        "served after {waited:?}: before the killed proxy's permit (3 s) expired"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(permits_taken(&server).await, 0, "given back after the call");
}
