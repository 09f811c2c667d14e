//! Grace (stale-while-updating on the operator's say-so), refresh-ahead, and
//! the memory budget: in memory under paused time, and across layers on one
//! real redis-server.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Response, StatusCode};
use axum::routing::get;
use axum::Router;
use herdguard::{CacheLayer, RedisOptions};
use support::origin::{cache_status, get_req, req, send, Origin};
use support::RedisServer;

fn age(h: &HeaderMap) -> u64 {
    h.get("age")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn grace_layer() -> CacheLayer {
    CacheLayer::builder()
        .grace(Duration::from_secs(60))
        .build()
        .expect("valid layer")
}

/// With grace on and no stale-while-revalidate, a burst on an expired entry is served stale at once and exactly one refresh runs.
#[tokio::test(start_paused = true)]
async fn grace_serves_stale_at_once_with_one_refresh() {
    let origin = Origin::new(&[("cache-control", "max-age=1")]).delay(Duration::from_millis(200));
    let app = origin.app(grace_layer());
    send(&app, get_req("/g")).await;
    tokio::time::advance(Duration::from_secs(3)).await;

    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, get_req("/g")).await })
        })
        .collect();
    for t in tasks {
        let (code, h, body) = t.await.unwrap();
        assert_eq!(code, StatusCode::OK);
        assert!(
            cache_status(&h).contains("detail=grace"),
            "{}",
            cache_status(&h)
        );
        assert!(body.starts_with(b"origin call=1 "));
    }
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "nobody waited for the origin"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(origin.calls(), 2, "exactly one refresh");
    let (_, h, body) = send(&app, get_req("/g")).await;
    assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    assert!(body.starts_with(b"origin call=2 "));
}

/// Grace never serves stale what the origin forbade: must-revalidate, proxy-revalidate, s-maxage or no-cache.
#[tokio::test(start_paused = true)]
async fn grace_never_overrides_the_origin() {
    let cases: [&[(&'static str, &'static str)]; 4] = [
        &[("cache-control", "max-age=1, must-revalidate")],
        &[("cache-control", "max-age=1, proxy-revalidate")],
        &[("cache-control", "s-maxage=1")],
        &[("cache-control", "max-age=1, no-cache"), ("etag", "\"v1\"")],
    ];
    for headers in cases {
        let origin = Origin::new(headers);
        let app = origin.app(grace_layer());
        send(&app, get_req("/f")).await;
        tokio::time::advance(Duration::from_secs(3)).await;
        let (_, h, _) = send(&app, get_req("/f")).await;
        let status = cache_status(&h).to_owned();
        assert!(!status.contains("detail="), "{headers:?}: {status}");
        assert!(status.contains("fwd="), "{headers:?}: {status}");
        assert_eq!(origin.calls(), 2, "{headers:?}: went to the origin");
    }
}

/// Without the grace option an expired entry without stale-while-revalidate is not served stale (RFC 9111 §4.2.4).
#[tokio::test(start_paused = true)]
async fn grace_is_off_by_default() {
    let origin = Origin::new(&[("cache-control", "max-age=1")]);
    let app = origin.app(CacheLayer::new());
    send(&app, get_req("/d")).await;
    tokio::time::advance(Duration::from_secs(3)).await;
    let (_, h, body) = send(&app, get_req("/d")).await;
    assert!(
        cache_status(&h).contains("fwd=stale"),
        "{}",
        cache_status(&h)
    );
    assert!(body.starts_with(b"origin call=2 "));
}

/// One request every 100 ms for `total`; returns every answer's Cache-Status and Age.
async fn steady(app: &Router, uri: &'static str, total: Duration) -> Vec<(String, u64)> {
    let end = tokio::time::Instant::now() + total;
    let mut answers = Vec::new();
    while tokio::time::Instant::now() < end {
        let (code, h, _) = send(app, get_req(uri)).await;
        assert_eq!(code, StatusCode::OK);
        answers.push((cache_status(&h).to_owned(), age(&h)));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    answers
}

/// Refresh-ahead under steady load costs exactly one origin call per freshness window.
#[tokio::test(start_paused = true)]
async fn refresh_ahead_makes_one_call_per_window() {
    // Fresh 10 s, refreshed from 7.5 s of age: the fill at 0.2 s, then
    // refreshes stored at about 7.9, 15.6, 23.3 and 31.0 s; the next would
    // be at 38.7 s, well after the run.
    let origin = Origin::new(&[("cache-control", "max-age=10")]).delay(Duration::from_millis(200));
    let app = origin.app(CacheLayer::new());
    steady(&app, "/s", Duration::from_secs(35)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(origin.calls(), 5);
}

/// Under steady load with refresh-ahead (the default) no request after the first waits for the origin or gets an answer past max-age.
#[tokio::test(start_paused = true)]
async fn steady_load_never_waits_and_never_serves_past_max_age() {
    let origin = Origin::new(&[("cache-control", "max-age=2")]).delay(Duration::from_millis(200));
    let app = origin.app(CacheLayer::new());
    let answers = steady(&app, "/s", Duration::from_secs(20)).await;
    assert!(answers[0].0.contains("fwd=uri-miss"), "{:?}", answers[0]);
    for (status, age) in &answers[1..] {
        assert!(status.starts_with("herdguard; hit; ttl="), "{status}");
        assert!(!status.contains("detail="), "{status}");
        assert!(*age < 2, "age {age} past max-age=2");
    }
    assert!(
        origin.calls() >= 10,
        "refreshed every window: {}",
        origin.calls()
    );
}

fn redis_layer(server: &RedisServer) -> CacheLayer {
    CacheLayer::builder()
        .redis(RedisOptions::new(server.url()).namespace("ra"))
        .build()
        .expect("valid layer")
}

/// Two layers on one Redis, both hitting an entry in the last part of its freshness: exactly one refresh-ahead call for the cluster, and every answer a hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_ahead_is_one_call_for_two_layers_on_redis() {
    let server = RedisServer::start();
    // Fresh 8 s, refreshed from 6 s of age: generous margins for a loaded machine.
    let origin = Origin::new(&[("cache-control", "max-age=8")]).delay(Duration::from_millis(300));
    let a = origin.app(redis_layer(&server));
    let b = Origin::new(&[("cache-control", "max-age=8")])
        .delay(Duration::from_millis(300))
        .sharing_calls_with(&origin)
        .app(redis_layer(&server));
    send(&a, get_req("/h")).await;
    let stored = std::time::Instant::now();
    send(&b, get_req("/h")).await;
    assert_eq!(origin.calls(), 1);

    tokio::time::sleep(Duration::from_millis(6500).saturating_sub(stored.elapsed())).await;
    // Several rounds: a round may find its L1 copy past the 1 s L1 bound and
    // reload it from Redis; the next one hits that copy.
    for _ in 0..4 {
        let tasks: Vec<_> = (0..40)
            .map(|i| {
                let app = if i % 2 == 0 { a.clone() } else { b.clone() };
                tokio::spawn(async move { send(&app, get_req("/h")).await })
            })
            .collect();
        for t in tasks {
            let (code, h, body) = t.await.unwrap();
            assert_eq!(code, StatusCode::OK);
            assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
            assert!(body.starts_with(b"origin call=1 "));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        stored.elapsed() < Duration::from_millis(7500),
        "the machine is too slow for this test's margins"
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(origin.calls(), 2, "one refresh for the cluster");
    // Past the first entry's freshness: both layers answer from the refresh.
    tokio::time::sleep(Duration::from_secs(9).saturating_sub(stored.elapsed())).await;
    for app in [&a, &b] {
        let (_, h, body) = send(app, get_req("/h")).await;
        assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
        assert!(body.starts_with(b"origin call=2 "));
    }
    assert_eq!(origin.calls(), 2);
}

/// Everything the layer keeps in memory (entries, retained copies, the Vary index) stays within `capacity_bytes`.
#[tokio::test]
async fn capacity_bounds_entries_retained_copies_and_vary_index() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let layer = CacheLayer::builder()
        .capacity_bytes(1 << 20)
        .build()
        .expect("valid layer");
    let app = Router::new()
        .fallback(get(move || {
            let c = c.clone();
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                Response::builder()
                    .header("cache-control", "max-age=60")
                    .header("etag", "\"e\"")
                    .header("vary", "accept-language")
                    .body(Body::from(vec![b'x'; 16 * 1024]))
                    .unwrap()
            }
        }))
        .layer(layer.clone());
    // 300 URLs × 16 KiB: nearly 5 MiB through a 1 MiB cache.
    for i in 0..300 {
        let uri: &'static str = Box::leak(format!("/m/{i}").into_boxed_str());
        send(
            &app,
            req(axum::http::Method::GET, uri, &[("accept-language", "en")]),
        )
        .await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 300);
    let held = layer.memory_bytes();
    assert!(held <= 1 << 20, "holds {held} bytes, capacity {}", 1 << 20);
    assert!(held > 1 << 19, "the cache is in use: {held} bytes");
}

/// Several layers in one process on one Redis, an entry without stale-while-revalidate caught in the moment Redis still holds it but no longer calls it fresh: exactly one origin call, and nobody is handed the expired copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_in_one_process_make_one_call_when_the_fresh_marker_ends_first() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=1")]).delay(Duration::from_millis(300));
    let layers: Vec<CacheLayer> = (0..4).map(|_| redis_layer(&server)).collect();
    let apps: Vec<Router> = layers
        .iter()
        .map(|l| {
            Origin::new(&[("cache-control", "max-age=1")])
                .delay(Duration::from_millis(300))
                .sharing_calls_with(&origin)
                .app(l.clone())
        })
        .collect();
    send(&apps[0], get_req("/e")).await;
    assert_eq!(origin.calls(), 1);
    // What Redis shows in the last millisecond of the entry's freshness
    // (its PTTL rounds down to 0 while the value is still there), held
    // open: the value present with no expiry, so the lookup finds no
    // freshness left (PTTL -1) and no stale window.
    let key = layers[0].key_for(&get_req("/e")).to_hex();
    let mut conn = server.connection().await;
    let _: () = deadpool_redis::redis::cmd("PERSIST")
        .arg(format!("ra:{{{key}}}:v"))
        .query_async(&mut conn)
        .await
        .unwrap();
    // Past max-age by every clock, so no request may take the old copy.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let app = apps[i % 4].clone();
            tokio::spawn(async move { send(&app, get_req("/e")).await })
        })
        .collect();
    for t in tasks {
        let (code, h, body) = t.await.unwrap();
        assert_eq!(code, StatusCode::OK);
        assert!(
            !cache_status(&h).contains("detail="),
            "{}",
            cache_status(&h)
        );
        assert!(
            body.starts_with(b"origin call=2 "),
            "handed the expired copy"
        );
    }
    assert_eq!(origin.calls(), 2);
}

/// A purge while a refresh ahead of expiry runs: a request after the purge joins that refresh but is never handed the copy it started from (the purged answer), in memory and with Redis alike.
#[tokio::test(start_paused = true)]
async fn a_purge_during_a_refresh_ahead_never_hands_out_the_purged_copy() {
    let origin = Origin::new(&[("cache-control", "max-age=10")]).delay(Duration::from_secs(2));
    let layer = CacheLayer::new();
    let app = origin.app(layer.clone());
    let (_, _, body) = send(&app, get_req("/p")).await;
    assert!(body.starts_with(b"origin call=1 "));
    // Past 75 % of its freshness: the second of two hits close together
    // (a hot key) starts the refresh (2 s long).
    tokio::time::sleep(Duration::from_secs(8)).await;
    for _ in 0..2 {
        let (_, h, _) = send(&app, get_req("/p")).await;
        assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(origin.calls(), 2, "the refresh runs");
    let url: axum::http::Uri = "http://example.test/p".parse().unwrap();
    layer.purge_url(&url).await.unwrap();
    let (_, h, body) = send(&app, get_req("/p")).await;
    assert!(
        !body.starts_with(b"origin call=1 "),
        "the purged copy was served: {}",
        cache_status(&h)
    );
}
