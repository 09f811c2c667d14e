//! The origin as a whole on one layer (memory, paused time): the budget
//! and its priorities, the breaker, a failing key's backoff, and
//! refresh-ahead only for keys that are hot.

use herdguard_testkit as support;

use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use herdguard::{CacheLayer, OriginBreaker};
use support::faulty::FaultyOrigin;
use support::origin::{cache_status, get_req, send};

fn retry_after(h: &axum::http::HeaderMap) -> &str {
    h.get("retry-after")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Wait (at most 5 s of the test's clock) until the origin has had `n` calls.
async fn until_called(origin: &FaultyOrigin, n: usize) {
    let wait = async {
        while origin.calls() < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .expect("the origin was not called in time");
}

fn spawn_get(app: &Router, path: &'static str) -> tokio::task::JoinHandle<StatusCode> {
    let app = app.clone();
    tokio::spawn(async move { send(&app, get_req(path)).await.0 })
}

/// With the budget full, a stale refresh is deferred and a refresh ahead of
/// expiry skipped (both copies served), while a miss queues and is the
/// next call to reach the origin once the permit is free.
#[tokio::test(start_paused = true)]
async fn priorities_hold_with_the_budget_full() {
    let origin = FaultyOrigin::new();
    let layer = CacheLayer::builder().origin_budget(1).build().unwrap();
    let app = origin.app(layer.clone());
    send(&app, get_req("/swr/a")).await;
    send(&app, get_req("/hot/b")).await;
    assert_eq!(origin.calls(), 2);
    // /swr/a is stale (within stale-while-revalidate); /hot/b, fresh for
    // 20 s, is in the last quarter of its freshness.
    tokio::time::advance(Duration::from_secs(16)).await;
    let slow = spawn_get(&app, "/slow/c");
    until_called(&origin, 3).await;

    let (code, h, body) = send(&app, get_req("/swr/a")).await;
    assert_eq!(code, StatusCode::OK);
    assert!(
        cache_status(&h).contains("detail=stale"),
        "{}",
        cache_status(&h)
    );
    assert!(body.starts_with(b"ok call=1 "));
    for _ in 0..2 {
        let (code, h, _) = send(&app, get_req("/hot/b")).await;
        assert_eq!(code, StatusCode::OK);
        assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    }
    assert_eq!(
        layer.stats().refreshes_skipped,
        2,
        "stale refresh and refresh-ahead"
    );
    let miss = spawn_get(&app, "/d");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(origin.calls(), 3, "the miss waits for the permit");

    origin.release(1);
    assert_eq!(slow.await.unwrap(), StatusCode::OK);
    assert_eq!(miss.await.unwrap(), StatusCode::OK);
    assert_eq!(origin.calls(), 4, "the queued miss, and nothing else");
    assert_eq!(origin.peak(), 1, "never more than the budget at once");
}

/// Under the budget, a background call still goes out only while this
/// instance has fewer origin calls in flight than requests waiting on it:
/// two requests waiting on one call leave room for one refresh, not two,
/// however large the budget. Without that rule, four instances with a
/// budget each (and 64 clients among them) had 74 calls at once at the
/// origin.
#[tokio::test(start_paused = true)]
async fn background_calls_never_outnumber_the_clients() {
    let origin = FaultyOrigin::new();
    let layer = CacheLayer::builder().build().unwrap();
    let app = origin.app(layer.clone());
    origin.release(2);
    send(&app, get_req("/slow/a")).await;
    send(&app, get_req("/slow/b")).await;
    // Both fresh for 20 s: 16 s on, each in the last quarter.
    tokio::time::advance(Duration::from_secs(16)).await;
    let waiting = [spawn_get(&app, "/slow/c"), spawn_get(&app, "/slow/c")];
    until_called(&origin, 3).await;

    // /slow/a, hit twice in the window: its refresh goes out (two requests
    // wait, one call runs).
    for _ in 0..2 {
        let (_, h, _) = send(&app, get_req("/slow/a")).await;
        assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    }
    until_called(&origin, 4).await;
    // /slow/b: two calls run for two waiting requests; skipped.
    for _ in 0..2 {
        let (_, h, _) = send(&app, get_req("/slow/b")).await;
        assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(origin.calls(), 4, "/slow/b's refresh never went out");
    assert_eq!(layer.stats().refreshes_skipped, 1);

    // Both calls answered: the next hit on /slow/b may refresh it.
    origin.release(2);
    for w in waiting {
        assert_eq!(w.await.unwrap(), StatusCode::OK);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    send(&app, get_req("/slow/b")).await;
    until_called(&origin, 5).await;
    assert_eq!(origin.peak(), 2);
    origin.release(1);
}

/// A miss that finds no permit within `max_wait` gets the layer's own 503
/// with `Retry-After`, and the origin is not called for it.
#[tokio::test(start_paused = true)]
async fn a_queued_miss_past_max_wait_gets_503() {
    let origin = FaultyOrigin::new();
    let layer = CacheLayer::builder()
        .origin_budget(1)
        .origin_timeout(Duration::from_secs(30))
        .max_wait(Duration::from_secs(30))
        .build()
        .unwrap();
    let app = origin.app(layer.clone());
    // The permit stays taken past the miss's wait: the first slow call
    // holds it until its timeout (30 s), the second, queued before the
    // miss, from then on (its own queue deadline is 30.5 s).
    let first = spawn_get(&app, "/slow/a");
    until_called(&origin, 1).await;
    tokio::time::advance(Duration::from_millis(500)).await;
    let slow = [first, spawn_get(&app, "/slow/b")];
    tokio::time::advance(Duration::from_millis(500)).await;

    let (code, h, _) = send(&app, get_req("/c")).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        cache_status(&h).contains("detail=origin-busy"),
        "{}",
        cache_status(&h)
    );
    assert_eq!(retry_after(&h), "1");
    assert_eq!(
        origin.calls(),
        2,
        "the refused miss never reached the origin"
    );
    assert_eq!(layer.stats().origin_refused, 1);
    origin.release(2);
    for s in slow {
        s.await.unwrap();
    }
}

/// Five failed calls in a row open the breaker: the next request gets a
/// fast 503 without an origin call; one probe per interval, the interval
/// doubling after a failed one; an answered probe closes it.
#[tokio::test(start_paused = true)]
async fn the_breaker_opens_probes_and_closes() {
    let origin = FaultyOrigin::new();
    let breaker = OriginBreaker::default().backoff(Duration::from_secs(1), Duration::from_secs(30));
    let layer = CacheLayer::builder()
        .origin_breaker(breaker)
        .build()
        .unwrap();
    let app = origin.app(layer.clone());
    origin.fail(true);
    for i in 0..5 {
        let path: &'static str = ["/k0", "/k1", "/k2", "/k3", "/k4"][i];
        let (code, h, _) = send(&app, get_req(path)).await;
        assert_eq!(
            code,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            cache_status(&h)
        );
    }
    assert_eq!(origin.calls(), 5);
    let (code, h, _) = send(&app, get_req("/k5")).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        cache_status(&h).contains("detail=origin-down"),
        "{}",
        cache_status(&h)
    );
    assert_eq!(retry_after(&h), "1");
    assert_eq!(origin.calls(), 5, "open: no call");

    // The first probe fails: the next is due 2 s later.
    tokio::time::advance(Duration::from_millis(1001)).await;
    send(&app, get_req("/k6")).await;
    assert_eq!(origin.calls(), 6, "one probe");
    send(&app, get_req("/k7")).await;
    assert_eq!(origin.calls(), 6, "one probe at a time");
    tokio::time::advance(Duration::from_millis(1500)).await;
    let (_, h, _) = send(&app, get_req("/k8")).await;
    assert!(
        cache_status(&h).contains("detail=origin-down"),
        "{}",
        cache_status(&h)
    );
    assert_eq!(origin.calls(), 6, "the interval doubled");

    origin.fail(false);
    tokio::time::advance(Duration::from_millis(600)).await;
    let (code, _, _) = send(&app, get_req("/k9")).await;
    assert_eq!(code, StatusCode::OK, "the probe is answered");
    assert_eq!(origin.calls(), 7);
    let (code, _, _) = send(&app, get_req("/k10")).await;
    assert_eq!(code, StatusCode::OK, "closed again");
    assert_eq!(origin.calls(), 8);
    assert_eq!(layer.stats().probes, 2);
}

/// While the breaker is open, a copy `stale-if-error` allows is served at
/// once (`detail=origin-down`), without an origin call or a wait.
#[tokio::test(start_paused = true)]
async fn stale_if_error_copies_answer_at_once_while_the_origin_is_down() {
    let origin = FaultyOrigin::new();
    let layer = CacheLayer::builder().build().unwrap();
    let app = origin.app(layer.clone());
    send(&app, get_req("/sie/a")).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    origin.fail(true);
    for path in ["/x0", "/x1", "/x2", "/x3", "/x4"] {
        send(&app, get_req(path)).await;
    }
    assert_eq!(origin.calls(), 6);

    let started = tokio::time::Instant::now();
    let (code, h, body) = send(&app, get_req("/sie/a")).await;
    assert_eq!(code, StatusCode::OK);
    assert!(
        cache_status(&h).contains("detail=origin-down"),
        "{}",
        cache_status(&h)
    );
    assert!(body.starts_with(b"ok call=1 "));
    assert_eq!(started.elapsed(), Duration::ZERO, "no wait");
    assert_eq!(origin.calls(), 6, "no origin call");
}

/// After a key's fill fails, its stale-if-error copy answers alone for the
/// backoff (no new attempt), and the next attempt goes out after it.
#[tokio::test(start_paused = true)]
async fn a_failing_keys_backoff_holds() {
    let origin = FaultyOrigin::new();
    let layer = CacheLayer::builder()
        .origin_breaker(OriginBreaker::off())
        .failure_backoff(Duration::from_secs(1))
        .build()
        .unwrap();
    let app = origin.app(layer.clone());
    send(&app, get_req("/sie/a")).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    origin.fail(true);
    let (code, h, _) = send(&app, get_req("/sie/a")).await;
    assert_eq!(code, StatusCode::OK);
    assert!(
        cache_status(&h).contains("stale-if-error"),
        "{}",
        cache_status(&h)
    );
    assert_eq!(origin.calls(), 2, "the failed attempt");
    for _ in 0..5 {
        let (code, h, body) = send(&app, get_req("/sie/a")).await;
        assert_eq!(code, StatusCode::OK);
        assert!(
            cache_status(&h).contains("detail=origin-backoff"),
            "{}",
            cache_status(&h)
        );
        assert!(body.starts_with(b"ok call=1 "), "never the error page");
    }
    assert_eq!(origin.calls(), 2, "no attempt within the backoff");
    tokio::time::advance(Duration::from_millis(1001)).await;
    send(&app, get_req("/sie/a")).await;
    assert_eq!(origin.calls(), 3, "the next attempt after it");
}

/// Refresh-ahead is for hot keys: one hit in the last part of the
/// freshness starts nothing; a second soon after it starts the refresh.
#[tokio::test(start_paused = true)]
async fn refresh_ahead_only_for_a_key_hit_again_before_expiry() {
    let origin = FaultyOrigin::new();
    let layer = CacheLayer::builder().build().unwrap();
    let app = origin.app(layer.clone());
    send(&app, get_req("/once")).await;
    send(&app, get_req("/twice")).await;
    // Fresh for 20 s: the refresh-ahead window starts at 15 s.
    tokio::time::advance(Duration::from_secs(16)).await;
    send(&app, get_req("/once")).await;
    send(&app, get_req("/twice")).await;
    tokio::time::advance(Duration::from_millis(500)).await;
    send(&app, get_req("/twice")).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(origin.calls(), 3, "one refresh, for the key hit twice");
    // A key whose second hit comes later than the freshness left: no refresh.
    tokio::time::advance(Duration::from_millis(3400)).await;
    send(&app, get_req("/once")).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        origin.calls(),
        3,
        "the gap (3.9 s) is past what is left (0.1 s)"
    );
}

/// A run of plain 500s (what one client can draw from a buggy URL) leaves
/// the breaker closed: every request still reaches the origin.
#[tokio::test(start_paused = true)]
async fn plain_500s_do_not_open_the_breaker() {
    let origin = FaultyOrigin::new();
    let layer = CacheLayer::builder().build().unwrap();
    let app = origin.app(layer.clone());
    origin.fail_with(StatusCode::INTERNAL_SERVER_ERROR);
    for path in ["/b0", "/b1", "/b2", "/b3", "/b4", "/b5", "/b6", "/b7"] {
        let (code, h, body) = send(&app, get_req(path)).await;
        assert_eq!(
            code,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{}",
            cache_status(&h)
        );
        assert!(body.starts_with(b"down call="), "the origin's own page");
    }
    assert_eq!(origin.calls(), 8);
    assert_eq!(layer.stats().origin_refused, 0);
}
