//! Secure connections against a real TLS-only redis-server with a CA and
//! certificate made by the test and an ACL user: coalescing over TLS, and
//! failures (wrong password, unknown CA) that fail open, say why, and never
//! print the password.
#![cfg(feature = "tls")]

use herdguard_testkit as support;

use std::time::Duration;

use axum::Router;
use herdguard::{CacheLayer, RedisOptions};
use support::logs::Logs;
use support::origin::{cache_status, get_req, send, Origin};
use support::tls::{TlsRedisCluster, TlsRedisServer};

const CACHEABLE: &[(&str, &str)] = &[("cache-control", "max-age=60")];
const PASSWORD: &str = "pw-Zq81-hunter2";
const WRONG: &str = "wrong-Xy93-pass";

fn layer(options: RedisOptions) -> CacheLayer {
    CacheLayer::builder()
        .redis(options.namespace("t"))
        .build()
        .expect("valid layer")
}

/// Over TLS with a private CA and an ACL user, 3 instances coalesce a cold burst into 1 origin call; waiters are woken by the fill notification (poll interval 10 s); the password never reaches the logs.
#[tokio::test(flavor = "current_thread")]
async fn tls_with_private_ca_and_acl_user_coalesces() {
    let logs = Logs::default();
    let _guard = logs.capture();
    let server = TlsRedisServer::start(PASSWORD);
    let options = || {
        RedisOptions::new(server.url(PASSWORD))
            .tls_root_cert_pem(server.ca_pem())
            .poll_interval(Duration::from_secs(10))
            .fallback_poll_interval(Duration::from_secs(10))
            // TLS in a debug build on a loaded machine can miss the 250 ms
            // default, and a missed reply means fail-open, not coalescing:
            // this test is about TLS, not timeouts.
            .response_timeout(Duration::from_secs(2))
    };
    let origin = Origin::new(CACHEABLE).delay(Duration::from_millis(300));
    let apps: Vec<Router> = (0..3).map(|_| origin.app(layer(options()))).collect();
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for app in &apps {
        for _ in 0..30 {
            let app = app.clone();
            tasks.push(tokio::spawn(
                async move { send(&app, get_req("/secure")).await },
            ));
        }
    }
    let mut bodies = Vec::new();
    for t in tasks {
        let (code, _, body) = t.await.unwrap();
        assert_eq!(code, 200);
        bodies.push(body);
    }
    assert_eq!(origin.calls(), 1, "one origin call across the instances");
    assert!(bodies.iter().all(|b| b == &bodies[0]));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "waiters were woken by the fill, took {:?}",
        started.elapsed()
    );
    let keys: usize = server
        .cli(PASSWORD, &["dbsize"])
        .trim()
        .parse()
        .expect("DBSIZE");
    assert!(keys > 0, "the entry is in the TLS redis");
    let (_, h, _) = send(&origin.app(layer(options())), get_req("/secure")).await;
    assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    assert_eq!(origin.calls(), 1);
    assert!(!logs.text().contains(PASSWORD), "{}", logs.text());
}

/// A wrong password: the request still gets 200 from the origin, the log says authentication failed, and neither password appears in logs or Debug output.
#[tokio::test(flavor = "current_thread")]
async fn wrong_password_fails_open_with_a_clear_error() {
    let logs = Logs::default();
    let _guard = logs.capture();
    let server = TlsRedisServer::start(PASSWORD);
    let options = RedisOptions::new(server.url(WRONG)).tls_root_cert_pem(server.ca_pem());
    let debug = format!("{options:?}");
    let cache = layer(options);
    let origin = Origin::new(CACHEABLE);
    let app = origin.app(cache.clone());
    for i in 0..3 {
        let (code, _, body) = send(&app, get_req(&format!("/locked/{i}"))).await;
        assert_eq!(code, 200, "fails open");
        assert!(body.starts_with(b"origin call="));
    }
    assert_eq!(origin.calls(), 3);
    let text = logs.text();
    assert!(
        text.contains("authentication failed"),
        "the log says why: {text}"
    );
    for shown in [&text, &debug, &format!("{cache:?}")] {
        assert!(!shown.contains(WRONG), "{shown}");
        assert!(!shown.contains(PASSWORD), "{shown}");
    }
    assert_eq!(server.cli(PASSWORD, &["dbsize"]).trim(), "0");
}

/// Without the private CA the server's certificate is not trusted: no connection, requests fail open, nothing is written.
#[tokio::test(flavor = "current_thread")]
async fn unknown_certificate_authority_is_refused() {
    let logs = Logs::default();
    let _guard = logs.capture();
    let server = TlsRedisServer::start(PASSWORD);
    let origin = Origin::new(CACHEABLE);
    let app = origin.app(layer(RedisOptions::new(server.url(PASSWORD))));
    let (code, _, _) = send(&app, get_req("/untrusted")).await;
    assert_eq!(code, 200);
    assert_eq!(origin.calls(), 1);
    assert_eq!(server.cli(PASSWORD, &["dbsize"]).trim(), "0");
    let text = logs.text();
    assert!(text.contains("redis unavailable"), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");
}

/// A Redis Cluster over TLS with an ACL user: 2 instances, 12 cold keys, exactly one origin call per key, entries on every master, waiters woken by sharded notifications.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_cluster_with_acl_user_calls_origin_once_per_key() {
    let cluster = tokio::task::spawn_blocking(|| TlsRedisCluster::start(PASSWORD))
        .await
        .unwrap();
    let options = || {
        RedisOptions::cluster(cluster.urls(PASSWORD))
            .tls_root_cert_pem(cluster.ca_pem())
            .poll_interval(Duration::from_secs(10))
            .fallback_poll_interval(Duration::from_secs(10))
            // TLS in a debug build on a loaded machine can miss the 250 ms
            // default, and a missed reply means fail-open, not coalescing:
            // this test is about TLS, not timeouts. The same holds for the
            // first connect (TLS and AUTH to every node), which the other
            // leaders wait behind for the pool wait: 250 ms + 1 s by default.
            .response_timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(5))
            .pool_wait_timeout(Duration::from_secs(2))
    };
    let origin = Origin::new(CACHEABLE).delay(Duration::from_millis(300));
    let apps: Vec<Router> = (0..2).map(|_| origin.app(layer(options()))).collect();
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for app in &apps {
        for i in 0..12 {
            for _ in 0..5 {
                let app = app.clone();
                tasks.push(tokio::spawn(async move {
                    send(&app, get_req(&format!("/tls-cluster/{i}"))).await
                }));
            }
        }
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().0, 200);
    }
    assert_eq!(origin.calls(), 12, "one origin call per key");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "waiters were woken by the fills, took {:?}",
        started.elapsed()
    );
    let sizes = cluster.dbsizes();
    assert!(
        sizes.iter().all(|&n| n > 0),
        "entries on every master: {sizes:?}"
    );
}

/// Redlock nodes take the main Redis's connection options: with the private CA in `node_options`, a lease is taken on a `rediss://` node; without it, none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_nodes_use_the_private_ca_from_node_options() {
    use herdguard::redlock::Redlock;
    let server = TlsRedisServer::start(PASSWORD);
    let url = server.url(PASSWORD);
    // Generous per-node bound: a TLS handshake on a loaded machine.
    let builder = || {
        Redlock::builder([url.clone()])
            .node_timeout(Duration::from_millis(500))
            .ttl(Duration::from_secs(10))
    };

    let untrusted = builder().build().unwrap();
    assert!(untrusted.acquire("job").await.is_err(), "the CA is unknown");

    let trusted = builder()
        .node_options(RedisOptions::new("rediss://template").tls_root_cert_pem(server.ca_pem()))
        .build()
        .unwrap();
    let lease = trusted.acquire("job").await.expect("the CA is trusted");
    trusted.release(lease).await;
}
