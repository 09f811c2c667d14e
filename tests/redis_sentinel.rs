//! Redis Sentinel against real redis-server and redis-sentinel processes: one
//! origin call per key across instances through the primary the sentinels
//! name, and a SIGKILL of that primary under load: no client errors, one
//! call per key per cluster again soon after the promotion, fill notices
//! and purge notices heard on the new primary.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::Router;
use herdguard::purge::Purged;
use herdguard::{CacheLayer, RedisOptions};
use support::logs::Logs;
use support::origin::{cache_status, get_req, send};
use support::sentinel::SentinelSet;
use support::Vip;

/// An origin that counts its calls per path, answering after `delay`.
#[derive(Clone)]
struct Counting {
    calls: Arc<Mutex<HashMap<String, usize>>>,
    delay: Duration,
}

impl Counting {
    fn new(delay: Duration) -> Self {
        Self {
            calls: Arc::default(),
            delay,
        }
    }

    fn calls(&self, path: &str) -> usize {
        self.calls.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    fn app(&self, layer: CacheLayer) -> Router {
        Router::new()
            .fallback(axum::routing::get(answer))
            .layer(layer)
            .with_state(self.clone())
    }
}

async fn answer(State(o): State<Counting>, uri: Uri) -> impl axum::response::IntoResponse {
    let n = {
        let mut calls = o.calls.lock().unwrap();
        let n = calls.entry(uri.path().to_owned()).or_default();
        *n += 1;
        *n
    };
    tokio::time::sleep(o.delay).await;
    (
        [("cache-control", "max-age=60")],
        format!("{} call={n}", uri.path()),
    )
}

fn layer(set: &SentinelSet, opts: impl FnOnce(RedisOptions) -> RedisOptions) -> CacheLayer {
    let redis = RedisOptions::sentinel(set.master_name(), set.sentinel_urls())
        .node_url(set.node_url())
        .namespace("t");
    CacheLayer::builder()
        .redis(opts(redis))
        .build()
        .expect("valid layer")
}

/// `per_app` concurrent GETs of `uri` on every app; their statuses.
async fn burst(apps: &[Router], uri: &str, per_app: usize) -> Vec<StatusCode> {
    let mut tasks = Vec::new();
    for app in apps {
        for _ in 0..per_app {
            let (app, uri) = (app.clone(), uri.to_owned());
            tasks.push(tokio::spawn(
                async move { send(&app, get_req(&uri)).await.0 },
            ));
        }
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request task"));
    }
    out
}

fn entry_key(uri: &str) -> String {
    format!(
        "t:{{{}}}:v",
        CacheLayer::new().key_for(&get_req(uri)).to_hex()
    )
}

/// A cold burst across 3 instances on Sentinel costs one origin call, and the entry is on the primary the sentinels name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_burst_across_three_instances_calls_origin_once() {
    let set = tokio::task::spawn_blocking(|| SentinelSet::start(1))
        .await
        .unwrap();
    let origin = Counting::new(Duration::from_millis(300));
    let apps: Vec<Router> = (0..3).map(|_| origin.app(layer(&set, |o| o))).collect();
    let codes = burst(&apps, "/cold", 10).await;
    assert!(codes.iter().all(|c| *c == StatusCode::OK), "{codes:?}");
    assert_eq!(
        origin.calls("/cold"),
        1,
        "one origin call across 3 instances"
    );
    let primary = set.server(set.primary_port());
    let mut c = primary.connection().await;
    let stored: bool = deadpool_redis::redis::cmd("EXISTS")
        .arg(entry_key("/cold"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(stored, "the entry is on the primary");
}

/// Sentinels that require their own ACL user and data nodes that require another: with each tier's credentials in its URL a cold burst costs 1 origin call and a second layer is served from Redis; with wrong data-node credentials the layer fails open as documented (200s from the origin, coalesced and then served from memory, `authentication failed` logged, nothing written), and no password is logged.
#[tokio::test(flavor = "current_thread")]
async fn sentinel_and_data_node_credentials_are_each_used_where_they_belong() {
    // current_thread: the layers' tasks log on this thread, into `logs`.
    let logs = Logs::default();
    let _guard = logs.capture();
    let set = tokio::task::spawn_blocking(|| SentinelSet::start_with_auth(1))
        .await
        .unwrap();
    let origin = Counting::new(Duration::from_millis(300));
    let first = origin.app(layer(&set, |o| o));
    let codes = burst(std::slice::from_ref(&first), "/auth", 10).await;
    assert!(codes.iter().all(|c| *c == StatusCode::OK), "{codes:?}");
    assert_eq!(origin.calls("/auth"), 1, "one origin call for the burst");
    // A layer with an empty memory can only have it from the primary.
    let second = origin.app(layer(&set, |o| o));
    let (code, headers, body) = send(&second, get_req("/auth")).await;
    assert_eq!(code, StatusCode::OK);
    assert!(cache_status(&headers).contains("hit"), "{headers:?}");
    assert_eq!(body, &b"/auth call=1"[..]);
    assert_eq!(origin.calls("/auth"), 1, "the second layer read Redis");

    let wrong = origin.app(layer(&set, |o| {
        o.node_url("redis://herdguard:not-the-password@localhost")
    }));
    let codes = burst(std::slice::from_ref(&wrong), "/wrong", 10).await;
    assert!(
        codes.iter().all(|c| *c == StatusCode::OK),
        "fails open: {codes:?}"
    );
    assert_eq!(origin.calls("/wrong"), 1, "coalesced in the instance");
    let (code, headers, _) = send(&wrong, get_req("/wrong")).await;
    assert_eq!(code, StatusCode::OK);
    assert!(
        cache_status(&headers).contains("hit"),
        "from memory: {headers:?}"
    );
    assert_eq!(origin.calls("/wrong"), 1);
    let mut c = set.server(set.primary_port()).connection().await;
    let stored: bool = deadpool_redis::redis::cmd("EXISTS")
        .arg(entry_key("/wrong"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(!stored, "nothing written with wrong credentials");
    let text = logs.text();
    assert!(
        text.contains("authentication failed"),
        "the log says why: {text}"
    );
    for pw in set.passwords() {
        assert!(!text.contains(pw), "{pw} logged: {text}");
    }
}

/// What one request of the load saw.
struct Answer {
    /// The 250 ms window it was sent in (and the key it asked for).
    window: u128,
    code: StatusCode,
    took: Duration,
}

const WINDOW_MS: u128 = 250;

/// Requests from `app` until `stop`, each for the key of the current window
/// (so every window is a cold key asked for by every instance at once).
async fn load(app: Router, start: Instant, stop: Arc<AtomicBool>) -> Vec<Answer> {
    let mut seen = Vec::new();
    while !stop.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(90) {
        let window = start.elapsed().as_millis() / WINDOW_MS;
        let sent = Instant::now();
        let (code, _, _) = send(&app, get_req(&format!("/load/{window}"))).await;
        seen.push(Answer {
            window,
            code,
            took: sent.elapsed(),
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    seen
}

/// SIGKILL of the primary under load from 3 instances: no client errors, one origin call per key per cluster (fills heard by notice, polls off) within 5 s of the promotion, the purge listeners on the new primary within 1.5 s of it, and purges acknowledged by every instance there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_under_load_recovers_coalescing_and_purges() {
    primary_lost_under_load(false).await;
}

/// The same with the primary frozen (SIGSTOP: connections to it hang, none breaks): the sentinels' +switch-master moves the purge listeners within 1.5 s of the promotion, not at their next PING (5 s apart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_frozen_under_load_is_left_on_switch_master() {
    primary_lost_under_load(true).await;
}

/// The primary is lost (`freeze`: SIGSTOP, else SIGKILL) under load from 3
/// instances; see the two tests above for what must hold.
async fn primary_lost_under_load(freeze: bool) {
    let set = tokio::task::spawn_blocking(|| SentinelSet::start(2))
        .await
        .unwrap();
    let origin = Counting::new(Duration::from_millis(50));
    // Waiters poll every 10 s: a fill is heard by its notice or late.
    let opts = |o: RedisOptions| {
        o.poll_interval(Duration::from_secs(10))
            .fallback_poll_interval(Duration::from_secs(10))
            .l1_ttl(Duration::from_secs(30))
    };
    let layers: Vec<CacheLayer> = (0..3).map(|_| layer(&set, opts)).collect();
    // The purge listeners start now and PING every 5 s from here.
    let built = Instant::now();
    let apps: Vec<Router> = layers.iter().map(|l| origin.app(l.clone())).collect();
    assert!(burst(&apps, "/warm", 4)
        .await
        .iter()
        .all(|c| c.is_success()));
    assert_eq!(origin.calls("/warm"), 1);

    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = apps
        .iter()
        .flat_map(|app| (0..4).map(move |_| app.clone()))
        .map(|app| tokio::spawn(load(app, start, stop.clone())))
        .collect();
    // Just past a PING of the purge listeners: one that heard nothing of
    // the switch would find a frozen primary only some 3 s after the
    // promotion, at its next PING.
    tokio::time::sleep_until((built + Duration::from_millis(5500)).into()).await;
    let killed = Instant::now();
    let (set, old, (new, promoted)) = lose_primary(set, freeze).await;
    let listening = until_subscribed(set.server(new), "t:purge", 3).await;
    tokio::time::sleep_until((promoted + Duration::from_secs(8)).into()).await;
    stop.store(true, Ordering::SeqCst);
    let mut answers = Vec::new();
    for t in tasks {
        answers.extend(t.await.expect("load task"));
    }

    let sum = summarize(&answers, &origin, start, (killed, promoted));
    let what = if freeze { "frozen" } else { "killed" };
    sum.print(
        format!("{what} primary {old} -> {new}"),
        promoted - killed,
        listening.saturating_duration_since(promoted),
    );
    assert_eq!(sum.errors, 0, "no client sees an error");
    assert!(
        listening < promoted + Duration::from_millis(1500),
        "the purge listeners move with the promotion, not at their next PING"
    );
    assert!(
        sum.back <= sum.promoted_w + 5_000 / WINDOW_MS,
        "one call per key per cluster within 5 s of the promotion (window {}, promoted in {})",
        sum.back,
        sum.promoted_w
    );
    assert!(
        sum.longest_after_back < Duration::from_millis(2500),
        "fills are heard by notice on the new primary (polls are 10 s)"
    );

    purge_heard_everywhere(&layers, &apps, &origin).await;
    drop(set);
}

/// What the load saw around a failover, by window.
struct Summary {
    answers: usize,
    errors: usize,
    /// The window the promotion was seen in.
    promoted_w: u128,
    /// The first window from which every window asked for cost one origin
    /// call (`u128::MAX`: none).
    back: u128,
    /// Origin calls, and keys, from the loss of the primary until `back`.
    during: usize,
    keys: usize,
    longest: Duration,
    longest_after_back: Duration,
}

impl Summary {
    fn print(&self, what: String, promotion: Duration, listeners: Duration) {
        eprintln!(
            "{what}: promoted {promotion:?} after the kill; {} answers, {} errors; \
             one call per key again {} after the promotion; origin calls from the kill until then: {} \
             over {} keys; longest answer {:?} (after recovery {:?}); purge listeners back {listeners:?} after it",
            self.answers,
            self.errors,
            match self.back.checked_sub(self.promoted_w) {
                _ if self.back == u128::MAX => "never".to_owned(),
                Some(w) => format!("{} ms", w * WINDOW_MS),
                None => "before the promotion".to_owned(),
            },
            self.during,
            self.keys,
            self.longest,
            self.longest_after_back,
        );
    }
}

/// Lose the primary of `set` (SIGSTOP when `freeze`, else SIGKILL) and wait
/// for the promotion: the set, the old primary's port, and the new one's
/// with when it was seen.
async fn lose_primary(set: SentinelSet, freeze: bool) -> (SentinelSet, u16, (u16, Instant)) {
    tokio::task::spawn_blocking(move || {
        let mut set = set;
        let old = if freeze {
            set.freeze_primary()
        } else {
            set.kill_primary()
        };
        let promoted = set.wait_for_promotion(old, Duration::from_secs(30));
        (set, old, promoted)
    })
    .await
    .unwrap()
}

fn summarize(
    answers: &[Answer],
    origin: &Counting,
    start: Instant,
    (killed, promoted): (Instant, Instant),
) -> Summary {
    let window_of = |t: Instant| (t - start).as_millis() / WINDOW_MS;
    let (killed_w, promoted_w) = (window_of(killed), window_of(promoted));
    let mut windows: Vec<u128> = answers.iter().map(|a| a.window).collect();
    windows.sort_unstable();
    windows.dedup();
    let calls = |w: u128| origin.calls(&format!("/load/{w}"));
    let back = windows
        .iter()
        .rposition(|&w| calls(w) != 1)
        .map_or(windows[0], |i| {
            windows.get(i + 1).copied().unwrap_or(u128::MAX)
        });
    let longest_after = |from: u128| {
        answers
            .iter()
            .filter(|a| a.window >= from)
            .map(|a| a.took)
            .max()
            .unwrap_or_default()
    };
    let failing = || windows.iter().filter(|&&w| w >= killed_w && w < back);
    Summary {
        answers: answers.len(),
        errors: answers.iter().filter(|a| a.code != StatusCode::OK).count(),
        promoted_w,
        back,
        during: failing().map(|&w| calls(w)).sum(),
        keys: failing().count(),
        longest: longest_after(0),
        longest_after_back: longest_after(back),
    }
}

/// When `n` clients listen on `channel` of `server` (polled; at most 15 s).
async fn until_subscribed(server: &support::RedisServer, channel: &str, n: i64) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut c = server.connection().await;
    loop {
        let counts: Vec<(String, i64)> = deadpool_redis::redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(&mut c)
            .await
            .unwrap();
        if counts.first().is_some_and(|(_, k)| *k >= n) {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "{n} never listened on {channel}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every instance holds "/p"; a purge on one is acknowledged by all three
/// listeners, and the others ask the origin again.
async fn purge_heard_everywhere(layers: &[CacheLayer], apps: &[Router], origin: &Counting) {
    assert!(burst(apps, "/p", 1).await.iter().all(|c| c.is_success()));
    assert_eq!(origin.calls("/p"), 1);
    let purged = layers[0].purge_url("http://example.test/p").await;
    assert_eq!(
        purged.unwrap(),
        Purged::Redis,
        "every listener acknowledged"
    );
    for app in &apps[1..] {
        assert!(send(app, get_req("/p")).await.0.is_success());
    }
    assert_eq!(origin.calls("/p"), 2, "the purge reached every instance");
}

/// An origin answering `tag`, counting calls to `/split` in `calls`; with a
/// `gate`, `/split` answers only once the gate has a permit (at most 30 s).
fn tagged(
    layer: CacheLayer,
    tag: &'static str,
    calls: Arc<AtomicUsize>,
    gate: Option<Arc<tokio::sync::Semaphore>>,
) -> Router {
    Router::new()
        .fallback(axum::routing::get(move |uri: Uri| {
            let (calls, gate) = (calls.clone(), gate.clone());
            async move {
                if uri.path() == "/split" {
                    calls.fetch_add(1, Ordering::SeqCst);
                    if let Some(g) = gate {
                        let _ = tokio::time::timeout(Duration::from_secs(30), g.acquire()).await;
                    }
                }
                ([("cache-control", "max-age=60")], tag)
            }
        }))
        .layer(layer)
}

/// Requests on `app` (new keys) until `layer` has had two Redis calls in a
/// row succeed: it is on the new primary (bounded: 15 s).
async fn until_on_redis(app: &Router, layer: &CacheLayer, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut good = 0;
    for i in 0.. {
        assert!(send(app, get_req(&format!("/probe/{name}/{i}")))
            .await
            .0
            .is_success());
        good = if layer.redis_connected() == Some(true) {
            good + 1
        } else {
            0
        };
        if good == 2 {
            return;
        }
        assert!(Instant::now() < deadline, "{name} never got back to redis");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A Sentinel topology whose `replicas` replicate through a [`Vip`] the test
/// can cut (`blackhole`), with a long `failover-timeout` so the sentinels
/// leave that link as it is.
async fn start_cuttable(replicas: usize) -> (SentinelSet, Vip) {
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut vip = None;
        let set = SentinelSet::start_through(
            replicas,
            |primary| {
                let v = handle.block_on(Vip::start(primary));
                let port = v.port();
                vip = Some(v);
                port
            },
            Duration::from_secs(60),
        );
        (set, vip.expect("the replication link"))
    })
    .await
    .unwrap()
}

/// What [`split_across_failover`] saw.
struct Split {
    /// Whether the old primary held A's lease while A's origin call ran.
    lease_on_old_primary: bool,
    /// Origin calls for the key, in all.
    calls: usize,
    /// A's writes the fence refused.
    refused: u64,
    /// What an instance that holds no copy reads afterwards.
    kept: bytes::Bytes,
}

/// The seed's failover case, with two replicas: replication stops (their
/// link goes silent), A
/// leases the key on the primary and calls its origin (held open), the
/// primary is SIGKILLed and the replica promoted, B asks for the key on the
/// new primary, then A's origin answers. `opts` applies to every instance.
async fn split_across_failover(opts: fn(RedisOptions) -> RedisOptions) -> Split {
    let (set, vip) = start_cuttable(2).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (la, lb, lc) = (layer(&set, opts), layer(&set, opts), layer(&set, opts));
    let a = tagged(la.clone(), "A", calls.clone(), Some(gate.clone()));
    let b = tagged(lb.clone(), "B", calls.clone(), None);
    let c = tagged(lc.clone(), "C", calls.clone(), None);
    for (app, l, name) in [(&a, &la, "a"), (&b, &lb, "b"), (&c, &lc, "c")] {
        until_on_redis(app, l, name).await;
    }

    vip.blackhole();
    let first = tokio::spawn({
        let a = a.clone();
        async move { send(&a, get_req("/split")).await }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "A never called its origin");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lease = entry_key("/split").replace(":v", ":lock");
    let mut old = set.server(set.primary_port()).connection().await;
    let lease_on_old_primary: bool = deadpool_redis::redis::cmd("EXISTS")
        .arg(&lease)
        .query_async(&mut old)
        .await
        .unwrap();
    // The other replica replicates from the new primary (directly: the
    // sentinels reconfigure it), so the new primary has one again.
    let set = tokio::task::spawn_blocking(move || {
        let mut set = set;
        set.fail_over(Duration::from_secs(30));
        set
    })
    .await
    .unwrap();
    until_on_redis(&a, &la, "a").await;
    until_on_redis(&b, &lb, "b").await;

    // The new primary never saw A's lease: B leads a fill of its own.
    let (code, _, body) = send(&b, get_req("/split")).await;
    assert_eq!((code, &body[..]), (StatusCode::OK, &b"B"[..]));
    gate.add_permits(1);
    let (code, _, body) = first.await.unwrap();
    assert_eq!((code, &body[..]), (StatusCode::OK, &b"A"[..]));
    if lease_on_old_primary {
        // A's fill, older, lands last: wait until the fence refused it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while la.stats().fenced_rejections == 0 {
            assert!(Instant::now() < deadline, "A's write was never refused");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (_, _, kept) = send(&c, get_req("/split")).await;
    drop((set, vip));
    Split {
        lease_on_old_primary,
        calls: calls.load(Ordering::SeqCst),
        refused: la.stats().fenced_rejections,
        kept,
    }
}

/// A lease the dead primary never replicated splits: the promoted replica leases the key again, two leaders run (exactly 2 origin calls), and the fence keeps the newer fill: the older leader's write, landing last on the new primary, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_lease_across_a_failover_keeps_the_newer_fill() {
    let split = split_across_failover(|o| o).await;
    assert!(
        split.lease_on_old_primary,
        "A led under a lease no replica had"
    );
    assert_eq!(split.calls, 2, "two leaders, one origin call each");
    assert_eq!(split.refused, 1, "A's older write is refused");
    assert_eq!(&split.kept[..], b"B", "the newer fill is kept");
}

/// With `lease_replicas`, the same case cannot split: A's lease, which no replica acknowledged, is given back before A calls its origin (as when Redis is down), so there is never a lease only the dead primary knew and no leader write to refuse; B's fill is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_replicas_never_leads_on_an_unreplicated_lease() {
    let split = split_across_failover(|o| o.lease_replicas(1, Duration::from_millis(300))).await;
    assert!(
        !split.lease_on_old_primary,
        "no lease only the old primary had"
    );
    assert_eq!(split.calls, 2, "A computed on its own, B led");
    assert_eq!(split.refused, 0, "no leader's write to refuse");
    assert_eq!(&split.kept[..], b"B");
}

/// A purge the replicas do not have yet (their link cut) is answered `Purged::Unconfirmed` with `lease_replicas` (a failover now would lose it), and `Purged::Redis` without; both `Redis` while replication flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_unreplicated_is_unconfirmed_with_lease_replicas() {
    let (set, vip) = start_cuttable(1).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let waiting = layer(&set, |o| o.lease_replicas(1, Duration::from_millis(200)));
    let plain = layer(&set, |o| o);
    for (l, name) in [(&waiting, "waiting"), (&plain, "plain")] {
        until_on_redis(&tagged(l.clone(), "x", calls.clone(), None), l, name).await;
    }
    let purge = |l: &CacheLayer| l.purge_url("http://example.test/q");
    assert_eq!(purge(&waiting).await.unwrap(), Purged::Redis);
    assert_eq!(purge(&plain).await.unwrap(), Purged::Redis);
    vip.blackhole();
    assert_eq!(purge(&waiting).await.unwrap(), Purged::Unconfirmed);
    assert_eq!(purge(&plain).await.unwrap(), Purged::Redis);
    drop((set, vip));
}

/// With `lease_replicas`, a leader calls its origin only once a replica has its lease (the replicas frozen, it waits), so the replica promoted after SIGKILL of the primary holds that lease: a second instance there waits for the first one's fill instead of leading (1 origin call in all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_replicas_lease_survives_the_failover() {
    let set = tokio::task::spawn_blocking(|| SentinelSet::start(2))
        .await
        .unwrap();
    // A WAIT long enough to outlast the freeze below, and a lease that
    // outlasts the failover whatever the watchdog manages meanwhile.
    let opts = |o: RedisOptions| {
        o.lease_replicas(1, Duration::from_secs(5))
            .lease_ttl(Duration::from_secs(20))
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (la, lb) = (layer(&set, opts), layer(&set, opts));
    let a = tagged(la.clone(), "A", calls.clone(), Some(gate.clone()));
    let b = tagged(lb.clone(), "B", calls.clone(), None);
    until_on_redis(&a, &la, "a").await;
    until_on_redis(&b, &lb, "b").await;

    let lease = entry_key("/split").replace(":v", ":lock");
    let primary = set.primary_port();
    let mut on_primary = set.server(primary).connection().await;
    let replicas: Vec<u16> = set
        .servers()
        .iter()
        .map(|s| s.port())
        .filter(|p| *p != primary)
        .collect();
    for port in &replicas {
        set.server(*port).freeze();
    }
    let first = tokio::spawn({
        let a = a.clone();
        async move { send(&a, get_req("/split")).await }
    });
    // A holds the lease on the primary, and does not lead while no replica
    // can acknowledge it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let token = loop {
        let held: Option<String> = deadpool_redis::redis::cmd("GET")
            .arg(&lease)
            .query_async(&mut on_primary)
            .await
            .unwrap();
        if let Some(token) = held {
            break token;
        }
        assert!(Instant::now() < deadline, "A never took the lease");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "A waits for a replica to have its lease"
    );
    for port in &replicas {
        set.server(*port).thaw();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "A never led once the replicas had its lease"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The other replica replicates from the new primary (directly: the
    // sentinels reconfigure it), so the new primary has one again.
    let set = tokio::task::spawn_blocking(move || {
        let mut set = set;
        set.fail_over(Duration::from_secs(30));
        set
    })
    .await
    .unwrap();
    let mut on_new = set.server(set.primary_port()).connection().await;
    let held: Option<String> = deadpool_redis::redis::cmd("GET")
        .arg(&lease)
        .query_async(&mut on_new)
        .await
        .unwrap();
    assert_eq!(held, Some(token), "the promoted replica has A's lease");
    until_on_redis(&a, &la, "a").await;
    until_on_redis(&b, &lb, "b").await;

    // B finds A's lease on the new primary and waits for A's fill.
    let before = lb.stats();
    let mut second = tokio::spawn({
        let b = b.clone();
        async move { send(&b, get_req("/split")).await }
    });
    assert!(
        tokio::time::timeout(Duration::from_secs(1), &mut second)
            .await
            .is_err(),
        "B waits while A holds the lease"
    );
    gate.add_permits(1);
    let (code, _, body) = first.await.unwrap();
    assert_eq!((code, &body[..]), (StatusCode::OK, &b"A"[..]));
    let (code, _, body) = second.await.unwrap();
    assert_eq!(
        (code, &body[..]),
        (StatusCode::OK, &b"A"[..]),
        "B got A's fill"
    );
    // A fill notice a waiter hears is counted as a hit.
    let after = lb.stats();
    assert_eq!(after.hits - before.hits, 1, "B was answered by A's fill");
    assert_eq!(after.origin_calls, before.origin_calls, "B never led");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one origin call in all");
    drop(set);
}
