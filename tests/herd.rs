//! Herd rules: whatever a request's own directives say, and whatever its
//! variant, origin calls per key stay at one at a time, and every call
//! outside a flight is capped and timed. In-process cases run on paused
//! tokio time (a burst is all in flight before the origin's delay ends);
//! the Redis cases run two layers against a real redis-server.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Response, StatusCode};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use herdguard::redlock::Redlock;
use herdguard::{CacheLayer, CacheLayerBuilder, OriginBreaker, RedisOptions, ReloadMode};
use support::origin::{cache_status, get_req, req, send, Origin};
use support::RedisServer;

const HOT: &[(&str, &str)] = &[("cache-control", "max-age=3600")];

/// What browsers send on reload, and its equivalents.
const RELOADS: [(&str, &str); 3] = [
    ("cache-control", "no-cache"),
    ("cache-control", "max-age=0"),
    ("pragma", "no-cache"),
];

type Reply = (StatusCode, HeaderMap, Bytes);

/// `n` concurrent GETs of `uri`, the i-th with `headers(i)`.
fn burst(
    app: &Router,
    uri: &'static str,
    n: usize,
    headers: impl Fn(usize) -> Vec<(&'static str, &'static str)>,
) -> Vec<tokio::task::JoinHandle<Reply>> {
    (0..n)
        .map(|i| {
            let app = app.clone();
            let r = req(Method::GET, uri, &headers(i));
            tokio::spawn(async move { send(&app, r).await })
        })
        .collect()
}

async fn all(tasks: Vec<tokio::task::JoinHandle<Reply>>) -> Vec<Reply> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.expect("request task"));
    }
    out
}

fn body_str(b: &Bytes) -> &str {
    std::str::from_utf8(b).unwrap_or("")
}

fn redis_layer(server: &RedisServer) -> CacheLayerBuilder {
    CacheLayer::builder().redis(RedisOptions::new(server.url()).namespace("herd"))
}

/// 200 concurrent reloads (no-cache, max-age=0, Pragma) of a hot key: exactly one origin call, and every reload gets its new answer.
#[tokio::test(start_paused = true)]
async fn reload_burst_on_hot_key_calls_origin_once() {
    let origin = Origin::new(HOT).delay(Duration::from_millis(100));
    let app = origin.app(CacheLayer::new());
    send(&app, get_req("/hot")).await;
    assert_eq!(origin.calls(), 1);

    let replies = all(burst(&app, "/hot", 200, |i| vec![RELOADS[i % 3]])).await;
    assert_eq!(origin.calls(), 2, "the first fill and one shared refresh");
    for (code, h, body) in &replies {
        assert_eq!(*code, 200);
        assert!(body_str(body).contains("call=2"), "{}", body_str(body));
        assert!(
            cache_status(h).contains("fwd=request"),
            "{}",
            cache_status(h)
        );
    }
    // The refresh replaced the entry for everyone.
    let (_, h, body) = send(&app, get_req("/hot")).await;
    assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    assert!(body_str(&body).contains("call=2"));
}

/// Requests whose max-age or min-fresh refuse a fresh entry share one refresh too.
#[tokio::test(start_paused = true)]
async fn max_age_and_min_fresh_refusals_share_one_refresh() {
    let origin = Origin::new(HOT).delay(Duration::from_millis(100));
    let app = origin.app(CacheLayer::new());
    send(&app, get_req("/aged")).await;
    tokio::time::advance(Duration::from_secs(20)).await;

    let picky = [
        ("cache-control", "max-age=10"),
        ("cache-control", "min-fresh=3590"),
    ];
    let replies = all(burst(&app, "/aged", 200, |i| vec![picky[i % 2]])).await;
    assert_eq!(origin.calls(), 2);
    assert!(replies
        .iter()
        .all(|(c, _, b)| *c == 200 && body_str(b).contains("call=2")));
}

/// Honor mode: each reload makes its own origin call while the fallback cap allows.
#[tokio::test(start_paused = true)]
async fn honor_mode_gives_each_reload_its_own_call() {
    let origin = Origin::new(HOT).delay(Duration::from_millis(100));
    let layer = CacheLayer::builder()
        .reload(ReloadMode::Honor)
        .fallback_limit(500)
        .build()
        .unwrap();
    let app = origin.app(layer);
    send(&app, get_req("/honor")).await;

    let replies = all(burst(&app, "/honor", 200, |i| vec![RELOADS[i % 3]])).await;
    assert_eq!(origin.calls(), 201);
    assert!(replies.iter().all(|(c, _, _)| *c == 200));
}

/// Honor mode past the fallback cap: the reloads beyond it share one refresh.
#[tokio::test(start_paused = true)]
async fn honor_mode_past_the_fallback_cap_shares_a_refresh() {
    let origin = Origin::new(HOT).delay(Duration::from_millis(100));
    let layer = CacheLayer::builder()
        .reload(ReloadMode::Honor)
        .fallback_limit(10)
        .build()
        .unwrap();
    let app = origin.app(layer);
    send(&app, get_req("/capped")).await;

    let replies = all(burst(&app, "/capped", 200, |_| vec![RELOADS[0]])).await;
    assert_eq!(
        origin.calls(),
        1 + 10 + 1,
        "fill, 10 own calls, 1 shared refresh"
    );
    assert!(replies.iter().all(|(c, _, _)| *c == 200));
}

/// Ignore mode: reloads of a fresh entry are hits and never reach the origin.
#[tokio::test(start_paused = true)]
async fn ignore_mode_serves_reloads_from_the_cache() {
    let origin = Origin::new(HOT).delay(Duration::from_millis(100));
    let layer = CacheLayer::builder()
        .reload(ReloadMode::Ignore)
        .build()
        .unwrap();
    let app = origin.app(layer);
    send(&app, get_req("/ignored")).await;

    let replies = all(burst(&app, "/ignored", 200, |i| vec![RELOADS[i % 3]])).await;
    assert_eq!(origin.calls(), 1);
    for (code, h, _) in &replies {
        assert_eq!(*code, 200);
        assert!(cache_status(h).contains("hit"), "{}", cache_status(h));
    }
}

/// Two layers on one Redis, 100 reloads on each at once: exactly one origin call cluster-wide, and both layers' reloads get the new fill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_burst_across_two_layers_on_one_redis_calls_origin_once() {
    let server = RedisServer::start();
    let origin = Origin::new(HOT).delay(Duration::from_millis(400));
    let a = origin.app(redis_layer(&server).build().unwrap());
    let b = origin.app(redis_layer(&server).build().unwrap());
    send(&a, get_req("/cluster")).await;
    let (_, h, _) = send(&b, get_req("/cluster")).await;
    assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    assert_eq!(origin.calls(), 1);

    let mut tasks = burst(&a, "/cluster", 100, |i| vec![RELOADS[i % 3]]);
    tasks.extend(burst(&b, "/cluster", 100, |i| vec![RELOADS[i % 3]]));
    let replies = all(tasks).await;
    assert_eq!(
        origin.calls(),
        2,
        "the first fill and one refresh for both layers"
    );
    for (code, _, body) in &replies {
        assert_eq!(*code, 200);
        assert!(body_str(body).contains("call=2"), "{}", body_str(body));
    }
}

/// The same with Redlock as the lease backend: reloads on two layers cost one origin call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_burst_with_redlock_leases_calls_origin_once() {
    let lock_nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let main = RedisServer::start();
    let redlock = || {
        Redlock::builder(lock_nodes.iter().map(RedisServer::url))
            .namespace("herd-rl")
            .ttl(Duration::from_secs(5))
            .build()
            .unwrap()
    };
    let origin = Origin::new(HOT).delay(Duration::from_millis(400));
    let a = origin.app(redis_layer(&main).redlock(redlock()).build().unwrap());
    let b = origin.app(redis_layer(&main).redlock(redlock()).build().unwrap());
    send(&a, get_req("/rl")).await;
    send(&b, get_req("/rl")).await;
    assert_eq!(origin.calls(), 1);

    let mut tasks = burst(&a, "/rl", 100, |i| vec![RELOADS[i % 3]]);
    tasks.extend(burst(&b, "/rl", 100, |i| vec![RELOADS[i % 3]]));
    let replies = all(tasks).await;
    assert_eq!(origin.calls(), 2);
    assert!(replies
        .iter()
        .all(|(c, _, b)| *c == 200 && body_str(b).contains("call=2")));
}

/// A layer that meets a stored variant it has not keyed (another layer stored it in Redis): a burst of two other variants costs one origin call per variant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_miss_burst_gets_one_flight_per_variant() {
    let server = RedisServer::start();
    let origin = Origin::new(&[
        ("cache-control", "max-age=3600"),
        ("vary", "accept-language"),
    ])
    .delay(Duration::from_millis(300));
    let a = origin.app(redis_layer(&server).build().unwrap());
    let b = origin.app(redis_layer(&server).build().unwrap());
    let en = [("accept-language", "en")];
    send(&a, req(Method::GET, "/v", &en)).await;
    let (_, _, body) = send(&b, req(Method::GET, "/v", &en)).await;
    assert!(body_str(&body).contains("lang=en"));
    assert_eq!(origin.calls(), 1);

    let langs = [("accept-language", "fr"), ("accept-language", "de")];
    let replies = all(burst(&b, "/v", 200, |i| vec![langs[i % 2]])).await;
    assert_eq!(origin.calls(), 1 + 2, "one call per new variant");
    for (i, (code, _, body)) in replies.iter().enumerate() {
        assert_eq!(*code, 200);
        let want = if i % 2 == 0 { "lang=fr" } else { "lang=de" };
        assert!(body_str(body).contains(want), "{}", body_str(body));
    }
}

/// Past the leader cap, misses with no flight to join go to the origin uncached (detail=overloaded); once a leader ends, misses coalesce again.
#[tokio::test(start_paused = true)]
async fn leader_limit_sends_misses_past_it_to_the_origin_uncached() {
    let origin = Origin::new(HOT).delay(Duration::from_secs(1));
    let layer = CacheLayer::builder().leader_limit(2).build().unwrap();
    let app = origin.app(layer);
    let leaders = vec![
        burst(&app, "/a", 1, |_| vec![]),
        burst(&app, "/b", 1, |_| vec![]),
    ];
    tokio::task::yield_now().await;
    let past = all(burst(&app, "/c", 10, |_| vec![])).await;
    for (code, h, _) in &past {
        assert_eq!(*code, 200);
        assert!(
            cache_status(h).contains("detail=overloaded"),
            "{}",
            cache_status(h)
        );
    }
    for l in leaders {
        all(l).await;
    }
    assert_eq!(origin.calls(), 2 + 10);

    let again = all(burst(&app, "/c", 10, |_| vec![])).await;
    assert!(again.iter().all(|(c, _, _)| *c == 200));
    assert_eq!(
        origin.calls(),
        2 + 10 + 1,
        "the cap is free again: one flight"
    );
}

/// An origin whose body comes in two chunks, 400 bytes and 1 s later 200.
fn chunked_origin(calls: Arc<AtomicUsize>) -> Router {
    let handler = move || {
        let calls = Arc::clone(&calls);
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            let chunks = futures_util::stream::unfold(0u8, |n| async move {
                match n {
                    0 => Some((Ok::<_, std::io::Error>(Bytes::from(vec![b'a'; 400])), 1)),
                    1 => {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        Some((Ok(Bytes::from(vec![b'b'; 200])), 2))
                    }
                    _ => None,
                }
            });
            let mut r = Response::new(Body::from_stream(chunks));
            r.headers_mut()
                .insert("cache-control", "max-age=3600".parse().unwrap());
            r
        }
    };
    Router::new().fallback(get(handler))
}

/// Past the fill buffer budget a fill streams to its own request whole, stores nothing, and its waiters each call the origin; the budget comes back afterwards.
#[tokio::test(start_paused = true)]
async fn fill_buffer_budget_streams_past_it_and_stores_nothing() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = CacheLayer::builder()
        .fill_buffer_bytes(700)
        .max_body_bytes(700)
        .build()
        .unwrap();
    let app = chunked_origin(Arc::clone(&calls)).layer(layer);
    // /one buffers its first 400 bytes and holds them for 1 s; /two's first
    // 400 do not fit beside them.
    let one = burst(&app, "/one", 5, |_| vec![]);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let two = all(burst(&app, "/two", 5, |_| vec![])).await;
    let one = all(one).await;
    for (code, _, body) in one.iter().chain(two.iter()) {
        assert_eq!(*code, 200);
        assert_eq!(body.len(), 600);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1 + 1 + 4);

    // Nothing of /two was stored or marked; the budget is whole again.
    send(&app, get_req("/two")).await;
    let (_, h, _) = send(&app, get_req("/two")).await;
    assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    assert_eq!(calls.load(Ordering::SeqCst), 7);
}

/// A call outside any flight (a miss past the leader cap) is bounded by the origin timeout: a hung origin yields a 504, not a hung request.
#[tokio::test(start_paused = true)]
async fn direct_call_is_bounded_by_origin_timeout() {
    let origin = Origin::new(HOT).delay(Duration::from_secs(1000));
    let layer = CacheLayer::builder()
        .leader_limit(1)
        .origin_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let app = origin.app(layer);
    let leader = burst(&app, "/hung", 1, |_| vec![]);
    tokio::task::yield_now().await;
    let started = tokio::time::Instant::now();
    let outside = burst(&app, "/elsewhere", 1, |_| vec![]);
    let replies = tokio::time::timeout(Duration::from_secs(60), all(outside))
        .await
        .expect("the call outside the flight is bounded");
    let (code, h, _) = &replies[0];
    assert_eq!(*code, 504);
    assert!(
        cache_status(h).contains("detail=origin-timeout"),
        "{}",
        cache_status(h)
    );
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert_eq!(all(leader).await[0].0, 504);
}

/// With the default timeouts, an origin slower than the old 30 s wait but inside the origin timeout makes exactly one call for a burst.
#[tokio::test(start_paused = true)]
async fn slow_healthy_origin_never_releases_the_waiters() {
    let origin = Origin::new(HOT).delay(Duration::from_secs(45));
    let app = origin.app(CacheLayer::new());
    let replies = all(burst(&app, "/slow", 100, |_| vec![])).await;
    assert_eq!(origin.calls(), 1);
    assert!(replies.iter().all(|(c, _, _)| *c == 200));
}

/// Waiters whose wait ran out beyond the fallback cap keep waiting on the flight and get its answer, never a made-up error: instance B waits on a fill instance A leads, which takes longer than B's `max_wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_past_the_fallback_cap_keep_waiting_on_the_flight() {
    let server = RedisServer::start();
    let slow = Origin::new(HOT).delay(Duration::from_secs(4));
    let a = slow.app(redis_layer(&server).build().unwrap());
    let fast = Origin::new(HOT).delay(Duration::from_millis(500));
    let patient = redis_layer(&server)
        .origin_timeout(Duration::from_secs(3))
        .max_wait(Duration::from_secs(3))
        .fallback_limit(2)
        .build()
        .unwrap();
    let b = fast.app(patient);
    let leader = burst(&a, "/patient", 1, |_| vec![]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // B's flight waits for A's fill; after 3 s its leader calls B's origin,
    // two waiters hold the fallback permits, and the rest wait on the flight.
    let replies = all(burst(&b, "/patient", 10, |_| vec![])).await;
    assert_eq!(fast.calls(), 1 + 2, "B's flight and two capped calls");
    for (code, h, _) in &replies {
        assert_eq!(*code, 200, "{}", cache_status(h));
    }
    assert_eq!(all(leader).await[0].0, 200);
    assert_eq!(slow.calls(), 1);
}

/// An origin that never answers `/gone` and answers every other path at once.
fn hanging_origin(calls: Arc<AtomicUsize>) -> Router {
    let handler = move |uri: axum::http::Uri| {
        let calls = Arc::clone(&calls);
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            if uri.path() == "/gone" {
                tokio::time::sleep(Duration::from_secs(1000)).await;
            }
            ([("cache-control", "max-age=3600")], "ok")
        }
    };
    Router::new().fallback(get(handler))
}

/// A leader whose client went away runs on, holding its leader permit, only until the origin timeout.
#[tokio::test(start_paused = true)]
async fn abandoned_leader_is_bounded_by_cap_and_origin_timeout() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = CacheLayer::builder()
        .leader_limit(1)
        .origin_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let app = hanging_origin(Arc::clone(&calls)).layer(layer);
    let gone = burst(&app, "/gone", 1, |_| vec![]);
    tokio::time::sleep(Duration::from_millis(10)).await;
    gone.into_iter().for_each(|t| t.abort());

    // The abandoned flight still holds the only leader permit.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (code, h, _) = send(&app, get_req("/other")).await;
    assert_eq!(code, 200);
    assert!(
        cache_status(&h).contains("detail=overloaded"),
        "{}",
        cache_status(&h)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // Past the origin timeout it has ended: a miss leads and stores again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (_, h, _) = send(&app, get_req("/other")).await;
    assert!(cache_status(&h).contains("stored"), "{}", cache_status(&h));
    let (_, h, _) = send(&app, get_req("/other")).await;
    assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// An origin whose every answer is a 500 with no freshness, `error call=N`;
/// the first call waits for `open` (having told `started`).
fn failing_origin(calls: Arc<AtomicUsize>, started: Arc<Notify>, open: Arc<Notify>) -> Router {
    let handler = move || {
        let (calls, started, open) = (Arc::clone(&calls), Arc::clone(&started), Arc::clone(&open));
        async move {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            if n == 1 {
                started.notify_one();
                open.notified().await;
            }
            (StatusCode::INTERNAL_SERVER_ERROR, format!("error call={n}"))
        }
    };
    Router::new().fallback(get(handler))
}

/// Six requests that joined the flight whose leader drew an unstored 500 (Redis configured) never get that page: each makes its own origin call, exactly one more call each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_never_take_the_error_page_the_leader_drew() {
    let server = RedisServer::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let (started, open) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let origin = failing_origin(Arc::clone(&calls), Arc::clone(&started), Arc::clone(&open));
    // Seven failures in a row would open the breaker: this is about sharing.
    let layer = redis_layer(&server).origin_breaker(OriginBreaker::off());
    let app = origin.layer(layer.build().unwrap());
    let leader = burst(&app, "/drawn", 1, |_| vec![]);
    started.notified().await;
    let waiters = burst(&app, "/drawn", 6, |_| vec![]);
    // Real time (Redis is real): the waiters reach the running flight.
    tokio::time::sleep(Duration::from_millis(200)).await;
    open.notify_one();
    let (code, _, body) = &all(leader).await[0];
    assert_eq!(
        (*code, body_str(body)),
        (StatusCode::INTERNAL_SERVER_ERROR, "error call=1")
    );
    let mut bodies = Vec::new();
    for (code, h, body) in all(waiters).await {
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            cache_status(&h).contains("detail=error-not-shared"),
            "{}",
            cache_status(&h)
        );
        bodies.push(body_str(&body).to_owned());
    }
    bodies.sort();
    let own: Vec<String> = (2..=7).map(|n| format!("error call={n}")).collect();
    assert_eq!(
        bodies, own,
        "each waiter its own call, none the leader's page"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1 + 6);
}
