//! Soft purge (`CacheLayer::soft_purge_url` / `soft_purge_tag`): the entry
//! is kept but stale on every instance, one refresh runs per cluster, and
//! every request is answered stale until it lands, within the entry's own
//! stale window counted from the purge. Real redis-server processes; the
//! origin holds the refresh at a gate, so an answer that arrives while the
//! gate is shut did not wait for the origin.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Response, Uri};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use deadpool_redis::redis;
use herdguard::purge::Purged;
use herdguard::{CacheLayer, RedisOptions};
use support::origin::{cache_status, req, send};
use support::{RedisServer, SlowLink};
use tokio::sync::Semaphore;

const NS: &str = "soft";

/// Fresh for a minute, then served stale for up to 30 s while one refresh runs.
const SWR: &str = "max-age=60, stale-while-revalidate=30";

/// An origin that holds its `held`-th call at a gate until [`open`](Self::open).
#[derive(Clone)]
struct Gated {
    calls: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
    held: usize,
    /// Hold every call from the `held`-th on, each until its own `open`.
    every: bool,
    cache_control: &'static str,
}

impl Gated {
    fn new(held: usize, cache_control: &'static str) -> Self {
        Self {
            calls: Arc::new(AtomicUsize::new(0)),
            gate: Arc::new(Semaphore::new(0)),
            held,
            every: false,
            cache_control,
        }
    }

    /// Hold every call from the `held`-th on, each at the gate until one
    /// [`open`](Self::open).
    fn holding_from(held: usize, cache_control: &'static str) -> Self {
        Self {
            every: true,
            ..Self::new(held, cache_control)
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn open(&self) {
        self.gate.add_permits(1);
    }

    /// Wait (at most 10 s) until the origin was called `n` times.
    async fn wait_calls(&self, n: usize) {
        let start = tokio::time::Instant::now();
        while self.calls() < n {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "origin never reached call {n}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn app(&self, layer: CacheLayer) -> Router {
        Router::new()
            .fallback(get(gated))
            .layer(layer)
            .with_state(self.clone())
    }
}

async fn gated(State(o): State<Gated>, headers: HeaderMap) -> Response<Body> {
    let n = o.calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n == o.held || (o.every && n > o.held) {
        let _ = o.gate.acquire().await.map(|p| p.forget());
    }
    let mut r = Response::new(Body::from(format!("call={n}")));
    r.headers_mut()
        .insert("cache-control", o.cache_control.parse().unwrap());
    let tag = headers.get("x-tag").cloned();
    r.headers_mut()
        .insert("surrogate-key", tag.unwrap_or("t1".parse().unwrap()));
    r
}

fn layer(url: String) -> CacheLayer {
    CacheLayer::builder()
        .redis(
            RedisOptions::new(url)
                .namespace(NS)
                .l1_ttl(Duration::from_secs(30)),
        )
        .build()
        .unwrap()
}

fn url(path: &str) -> Uri {
    format!("http://example.test{path}").parse().unwrap()
}

fn get_req(path: &str) -> axum::http::Request<Body> {
    req(Method::GET, path, &[])
}

fn text(body: &Bytes) -> String {
    String::from_utf8_lossy(body).into_owned()
}

/// Send to `app` until the answer's body is `want` (at most 10 s); return its Cache-Status.
async fn until_body(app: &Router, path: &str, want: &str) -> String {
    let start = std::time::Instant::now();
    loop {
        let (_, h, body) = send(app, get_req(path)).await;
        if text(&body) == want {
            return cache_status(&h).to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never answered {want}: {} {}",
            text(&body),
            cache_status(&h)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// 64 concurrent GETs of `path`, alternating between `apps`; all must answer within 10 s.
async fn burst(apps: &[Router], path: &'static str) -> Vec<(String, String)> {
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let app = apps[i % apps.len()].clone();
            tokio::spawn(async move {
                let (_, h, body) = send(&app, get_req(path)).await;
                (text(&body), cache_status(&h).to_owned())
            })
        })
        .collect();
    let all = async {
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    };
    tokio::time::timeout(Duration::from_secs(10), all)
        .await
        .expect("every client was answered while the refresh was held at the origin")
}

fn assert_all_stale(answers: &[(String, String)], body: &str) {
    for (b, status) in answers {
        assert_eq!(b, body, "{status}");
        assert!(
            status.contains("fwd=stale") && status.contains("detail=soft-purge"),
            "{status}"
        );
    }
}

/// A soft purge of a hot key under 64 concurrent clients on two instances costs exactly one origin call, and every client is answered stale (`fwd=stale`) while that call is still held at the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_costs_one_refresh_and_nobody_waits() {
    let server = RedisServer::start();
    let origin = Gated::new(2, SWR);
    let (la, lb) = (layer(server.url()), layer(server.url()));
    server.wait_for_subscribers(&format!("{NS}:purge"), 2).await;
    let (a, b) = (origin.app(la.clone()), origin.app(lb));
    let (_, _, body) = send(&a, get_req("/hot")).await;
    assert_eq!(text(&body), "call=1");
    let (_, h, body) = send(&b, get_req("/hot")).await;
    assert_eq!(text(&body), "call=1", "B reads A's fill from Redis");
    assert!(cache_status(&h).contains("hit"));

    assert_eq!(
        la.soft_purge_url(&url("/hot")).await.unwrap(),
        Purged::Redis
    );
    // A marked its copy before the call returned; B marks its copy when the
    // notice arrives (until then it answers its fresh copy).
    let (_, h, body) = send(&a, get_req("/hot")).await;
    assert_eq!(text(&body), "call=1");
    assert!(
        cache_status(&h).contains("detail=soft-purge"),
        "{}",
        cache_status(&h)
    );
    let start = std::time::Instant::now();
    loop {
        let (_, h, body) = send(&b, get_req("/hot")).await;
        assert_eq!(text(&body), "call=1");
        if cache_status(&h).contains("detail=soft-purge") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "B never heard the soft purge"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The one refresh for the cluster is at the origin, held there.
    origin.wait_calls(2).await;

    let answers = burst(&[a.clone(), b.clone()], "/hot").await;
    assert_all_stale(&answers, "call=1");
    assert_eq!(origin.calls(), 2, "one refresh for the whole cluster");

    origin.open();
    until_body(&a, "/hot", "call=2").await;
    until_body(&b, "/hot", "call=2").await;
    let (_, h, _) = send(&b, get_req("/hot")).await;
    assert!(
        cache_status(&h).starts_with("herdguard; hit"),
        "{}",
        cache_status(&h)
    );
    assert_eq!(origin.calls(), 2);
}

/// Right after a soft purge returns, a burst across two instances on one
/// redis-server costs exactly one origin call, and nobody waits for it:
/// every answer is the old copy while that call is held, stale on the
/// purger (and on the other instance once it heard the notice). Round after
/// round, so a refresh that leases right after the purge's stamp is stored,
/// not refused as older than the purge (which ran a second refresh): by the
/// index check's reply-time rule, or by the purge log when the notice
/// arrived during the refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn right_after_a_soft_purge_exactly_one_refresh_lands() {
    const ROUNDS: usize = 24;
    let server = RedisServer::start();
    let origin = Gated::holding_from(2, SWR);
    let (la, lb) = (layer(server.url()), layer(server.url()));
    server.wait_for_subscribers(&format!("{NS}:purge"), 2).await;
    let (a, b) = (origin.app(la.clone()), origin.app(lb));
    let (_, _, body) = send(&a, get_req("/now")).await;
    assert_eq!(text(&body), "call=1");
    let (_, h, _) = send(&b, get_req("/now")).await;
    assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    for round in 1..=ROUNDS {
        let old = format!("call={round}");
        assert_eq!(
            la.soft_purge_url(&url("/now")).await.unwrap(),
            Purged::Redis
        );
        for _ in 0..2 {
            // `burst` alternates: A's answers at even places, B's at odd.
            let answers = burst(&[a.clone(), b.clone()], "/now").await;
            for (i, (body, status)) in answers.iter().enumerate() {
                let who = ["A", "B"][i % 2];
                assert_eq!(body, &old, "round {round}, {who}: {status}");
                let stale = status.contains("fwd=stale") && status.contains("detail=soft-purge");
                let unheard = i % 2 == 1 && status.starts_with("herdguard; hit");
                assert!(stale || unheard, "round {round}, {who}: {status}");
            }
            origin.wait_calls(round + 1).await;
        }
        origin.open();
        let fresh = format!("call={}", round + 1);
        until_body(&a, "/now", &fresh).await;
        let status = until_body(&b, "/now", &fresh).await;
        assert!(
            status.starts_with("herdguard; hit"),
            "round {round}: {status}"
        );
        assert_eq!(origin.calls(), round + 1, "round {round}: one refresh");
    }
}

/// A refresh that leases right after a soft purge and whose Redis replies
/// are slow (30 ms each, on an instance with no copy of its own) is stored:
/// its lease's fence token dates it after the purge's stamp, where the time
/// since it asked, measured after the index call's slow reply, would count
/// it as older and run a second refresh. One refresh per round, a few
/// rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_with_slow_replies_is_dated_by_its_token() {
    let server = RedisServer::start();
    let slow = SlowLink::start(server.port(), Duration::from_millis(30)).await;
    let origin = Gated::holding_from(2, SWR);
    let purger = layer(server.url());
    let pa = origin.app(purger.clone());
    let (_, _, body) = send(&pa, get_req("/slow")).await;
    assert_eq!(text(&body), "call=1");
    for round in 1..=3 {
        // A new reader each round: no copy of its own, in memory or kept
        // aside; it reads Redis on every request.
        let reader = CacheLayer::builder()
            .redis(
                RedisOptions::new(slow.url())
                    .namespace(NS)
                    .l1_ttl(Duration::ZERO),
            )
            .build()
            .unwrap();
        let ra = origin.app(reader);
        let old = format!("call={round}");
        let (_, h, body) = send(&ra, get_req("/slow")).await;
        assert_eq!(text(&body), old, "{}", cache_status(&h));
        assert_eq!(
            purger.soft_purge_url(&url("/slow")).await.unwrap(),
            Purged::Redis
        );
        let (_, h, body) = send(&ra, get_req("/slow")).await;
        assert_eq!(text(&body), old, "round {round}: {}", cache_status(&h));
        assert!(
            cache_status(&h).contains("detail=soft-purge"),
            "round {round}: {}",
            cache_status(&h)
        );
        origin.wait_calls(round + 1).await;
        origin.open();
        let fresh = format!("call={}", round + 1);
        until_body(&ra, "/slow", &fresh).await;
        until_body(&pa, "/slow", &fresh).await;
        assert_eq!(origin.calls(), round + 1, "round {round}: one refresh");
    }
}

/// Without Redis, a soft purge of a hot key under 64 concurrent clients costs exactly one origin call, and every client is answered stale while it is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_only_a_hot_key_costs_one_refresh_and_nobody_waits() {
    let origin = Gated::new(2, SWR);
    let layer = CacheLayer::new();
    let app = origin.app(layer.clone());
    let (_, _, body) = send(&app, get_req("/hot")).await;
    assert_eq!(text(&body), "call=1");
    assert_eq!(
        layer.soft_purge_url(&url("/hot")).await.unwrap(),
        Purged::Local
    );

    let answers = burst(std::slice::from_ref(&app), "/hot").await;
    assert_all_stale(&answers, "call=1");
    origin.wait_calls(2).await;
    let answers = burst(std::slice::from_ref(&app), "/hot").await;
    assert_all_stale(&answers, "call=1");
    assert_eq!(origin.calls(), 2);

    origin.open();
    let status = until_body(&app, "/hot", "call=2").await;
    assert!(status.contains("hit"), "{status}");
    assert_eq!(origin.calls(), 2);
}

/// Without Redis, a fill that started before a soft purge (a reload held at the origin) is handed to its request but not stored: the next request gets the soft-purged copy, stale, and one refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_only_an_older_fill_is_not_stored_after_a_soft_purge() {
    let origin = Gated::new(2, SWR);
    let layer = CacheLayer::new();
    let app = origin.app(layer.clone());
    send(&app, get_req("/race")).await;
    let older = tokio::spawn({
        let app = app.clone();
        async move {
            let reload = req(Method::GET, "/race", &[("cache-control", "no-cache")]);
            send(&app, reload).await
        }
    });
    origin.wait_calls(2).await;
    assert_eq!(
        layer.soft_purge_url(&url("/race")).await.unwrap(),
        Purged::Local
    );
    origin.open();
    let (_, _, body) = older.await.unwrap();
    assert_eq!(text(&body), "call=2", "the reload gets its own answer");
    let (_, h, body) = send(&app, get_req("/race")).await;
    assert_eq!(text(&body), "call=1", "{}", cache_status(&h));
    assert!(
        cache_status(&h).contains("detail=soft-purge"),
        "{}",
        cache_status(&h)
    );
    until_body(&app, "/race", "call=3").await;
    assert_eq!(origin.calls(), 3);
}

/// A `must-revalidate` entry is never served stale after a soft purge: it is deleted from Redis and every instance's next answer comes from the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_must_revalidate_entry_is_purged_as_by_a_purge() {
    let server = RedisServer::start();
    let origin = Gated::new(0, "max-age=60, stale-while-revalidate=30, must-revalidate");
    let (la, lb) = (layer(server.url()), layer(server.url()));
    server.wait_for_subscribers(&format!("{NS}:purge"), 2).await;
    let (a, b) = (origin.app(la.clone()), origin.app(lb));
    send(&a, get_req("/mr")).await;
    let (_, h, _) = send(&b, get_req("/mr")).await;
    assert!(cache_status(&h).contains("hit"));

    assert_eq!(la.soft_purge_url(&url("/mr")).await.unwrap(), Purged::Redis);
    let mut c = server.connection().await;
    let entries: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{NS}:{{*}}:v"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(entries.is_empty(), "deleted in Redis: {entries:?}");
    let (_, h, body) = send(&a, get_req("/mr")).await;
    assert_eq!(text(&body), "call=2", "{}", cache_status(&h));
    assert!(
        !cache_status(&h).contains("soft-purge"),
        "{}",
        cache_status(&h)
    );
    // B answers its copy fresh until the notice arrives, then the refill:
    // never the old copy as stale.
    let start = std::time::Instant::now();
    loop {
        let (_, h, body) = send(&b, get_req("/mr")).await;
        let status = cache_status(&h);
        assert!(
            !status.contains("soft-purge") && !status.contains("detail=stale"),
            "{status}"
        );
        if text(&body) == "call=2" {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{status}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(origin.calls(), 2);
}

/// A fill that started before a soft purge (a reload held at the origin, on an instance that never hears the notice) does not land fresh after it: the next instance is answered the soft-purged copy, stale, and refreshes it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_fill_does_not_land_fresh_after_a_soft_purge() {
    let server = RedisServer::start();
    // The reload (call 2) and the refresh (call 3) are each held: a refresh
    // landing before its request reads the flight would answer it fresh.
    let origin = Gated::holding_from(2, SWR);
    let deaf = server
        .acl_user("deaf", &["~*", "&*", "+@all", "-subscribe"])
        .await;
    let d = origin.app(layer(deaf));
    let lp = layer(server.url());
    send(&d, get_req("/race")).await;
    let older = tokio::spawn({
        let d = d.clone();
        async move {
            let reload = req(Method::GET, "/race", &[("cache-control", "no-cache")]);
            send(&d, reload).await
        }
    });
    origin.wait_calls(2).await;
    assert_eq!(
        lp.soft_purge_url(&url("/race")).await.unwrap(),
        Purged::Redis
    );
    origin.open();
    let (_, _, body) = older.await.unwrap();
    assert_eq!(text(&body), "call=2", "the reload gets its own answer");

    let e = origin.app(layer(server.url()));
    let (_, h, body) = send(&e, get_req("/race")).await;
    assert_eq!(text(&body), "call=1", "{}", cache_status(&h));
    assert!(
        cache_status(&h).contains("detail=soft-purge"),
        "{}",
        cache_status(&h)
    );
    origin.open();
    let status = until_body(&e, "/race", "call=3").await;
    assert!(status.contains("hit"), "{status}");
    assert_eq!(origin.calls(), 3);
}

/// Past its stale window (here the layer's 300 ms grace), counted from the soft purge, a soft-purged entry is not served, though Redis keeps it for stale-if-error: an instance reading it from Redis and the ones holding a copy all wait for the refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_stale_window_requests_wait_for_the_refresh() {
    let server = RedisServer::start();
    let origin = Gated::new(0, "max-age=60, stale-if-error=60");
    let graced = || {
        CacheLayer::builder()
            .grace(Duration::from_millis(300))
            .redis(
                RedisOptions::new(server.url())
                    .namespace(NS)
                    .l1_ttl(Duration::from_secs(30)),
            )
            .build()
            .unwrap()
    };
    let (la, lb) = (graced(), graced());
    server.wait_for_subscribers(&format!("{NS}:purge"), 2).await;
    let (a, b) = (origin.app(la.clone()), origin.app(lb));
    send(&a, get_req("/b")).await;
    let (_, h, _) = send(&b, get_req("/b")).await;
    assert!(cache_status(&h).contains("hit"));
    assert_eq!(la.soft_purge_url(&url("/b")).await.unwrap(), Purged::Redis);
    tokio::time::sleep(Duration::from_millis(600)).await;

    // An instance with no copy reads the entry from Redis.
    let c = origin.app(graced());
    let (_, h, body) = send(&c, get_req("/b")).await;
    assert_eq!(text(&body), "call=2", "{}", cache_status(&h));
    assert!(
        !cache_status(&h).contains("soft-purge"),
        "{}",
        cache_status(&h)
    );
    // A's and B's own copies are past the window too.
    for app in [&a, &b] {
        let (_, h, body) = send(app, get_req("/b")).await;
        assert_eq!(text(&body), "call=2", "{}", cache_status(&h));
    }
    assert_eq!(origin.calls(), 2);
}

/// A soft tag purge marks stale the tagged entries only, on both instances: the tagged URL is answered stale and refreshed once, the other stays a hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soft_tag_purge_marks_only_tagged_entries() {
    let server = RedisServer::start();
    // The refresh (call 3) is held: a request whose refresh lands before
    // it reads its flight is answered the refresh, not the stale copy
    // (correct, but not what this test looks at).
    let origin = Gated::new(3, SWR);
    let (la, lb) = (layer(server.url()), layer(server.url()));
    server.wait_for_subscribers(&format!("{NS}:purge"), 2).await;
    let (a, b) = (origin.app(la), origin.app(lb.clone()));
    let tagged = || req(Method::GET, "/red", &[("x-tag", "red")]);
    send(&a, tagged()).await;
    send(&a, req(Method::GET, "/blue", &[("x-tag", "blue")])).await;
    assert_eq!(lb.soft_purge_tag("red").await.unwrap(), Purged::Redis);
    let (_, h, body) = send(&b, tagged()).await;
    assert_eq!(text(&body), "call=1");
    assert!(
        cache_status(&h).contains("detail=soft-purge"),
        "{}",
        cache_status(&h)
    );
    let (_, h, _) = send(&b, get_req("/blue")).await;
    assert!(
        cache_status(&h).starts_with("herdguard; hit"),
        "{}",
        cache_status(&h)
    );
    origin.open();
    until_body(&b, "/red", "call=3").await;
    until_body(&a, "/red", "call=3").await;
    assert_eq!(origin.calls(), 3);
}

/// A soft-purged entry stays in its URL's index: a purge after it still finds and deletes it, so an instance reading Redis next misses instead of being answered the stale copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_after_a_soft_purge_still_removes_the_entry() {
    let server = RedisServer::start();
    let origin = Gated::new(0, SWR);
    let la = layer(server.url());
    let a = origin.app(la.clone());
    send(&a, get_req("/sh")).await;
    assert_eq!(la.soft_purge_url(&url("/sh")).await.unwrap(), Purged::Redis);
    assert_eq!(la.purge_url(&url("/sh")).await.unwrap(), Purged::Redis);
    let c = origin.app(layer(server.url()));
    let (_, h, body) = send(&c, get_req("/sh")).await;
    assert_eq!(text(&body), "call=2", "{}", cache_status(&h));
    assert!(
        cache_status(&h).contains("fwd=uri-miss"),
        "{}",
        cache_status(&h)
    );
    assert_eq!(origin.calls(), 2);
}
