//! Redis Sentinel against real redis-server and redis-sentinel processes: one
//! origin call per key across instances through the primary the sentinels
//! name, and a SIGKILL of that primary under load: no client errors, one
//! call per key per cluster again soon after the promotion, fill notices
//! and purge notices heard on the new primary.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::Router;
use herdguard::{CacheLayer, Purged, RedisOptions};
use support::origin::{get_req, send};
use support::sentinel::SentinelSet;

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

/// SIGKILL of the primary under load from 3 instances: no client errors, one origin call per key per cluster (fills heard by notice, polls off) within 5 s of the promotion, and purges acknowledged by every instance on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_under_load_recovers_coalescing_and_purges() {
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
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed = Instant::now();
    let (set, old, (new, promoted)) = tokio::task::spawn_blocking(move || {
        let mut set = set;
        let old = set.kill_primary();
        let promoted = set.wait_for_promotion(old, Duration::from_secs(30));
        (set, old, promoted)
    })
    .await
    .unwrap();
    tokio::time::sleep_until((promoted + Duration::from_secs(8)).into()).await;
    stop.store(true, Ordering::SeqCst);
    let mut answers = Vec::new();
    for t in tasks {
        answers.extend(t.await.expect("load task"));
    }

    let errors = answers.iter().filter(|a| a.code != StatusCode::OK).count();
    let window_of = |t: Instant| (t - start).as_millis() / WINDOW_MS;
    let (killed_w, promoted_w) = (window_of(killed), window_of(promoted));
    let mut windows: Vec<u128> = answers.iter().map(|a| a.window).collect();
    windows.sort_unstable();
    windows.dedup();
    let calls = |w: u128| origin.calls(&format!("/load/{w}"));
    // The first window from which every window asked for cost one call.
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
    let during: usize = windows
        .iter()
        .filter(|&&w| w >= killed_w && w < back)
        .map(|&w| calls(w))
        .sum();
    eprintln!(
        "primary {old} -> {new}: promoted {:?} after the kill; {} answers, {errors} errors; \
         one call per key again {} after the promotion; origin calls from the kill until then: {during} \
         over {} keys; longest answer {:?} (after recovery {:?})",
        promoted - killed,
        answers.len(),
        match back.checked_sub(promoted_w) {
            _ if back == u128::MAX => "never".to_owned(),
            Some(w) => format!("{} ms", w * WINDOW_MS),
            None => "before the promotion".to_owned(),
        },
        windows.iter().filter(|&&w| w >= killed_w && w < back).count(),
        longest_after(0),
        longest_after(back),
    );
    assert_eq!(errors, 0, "no client sees an error");
    assert!(
        back <= promoted_w + 5_000 / WINDOW_MS,
        "one call per key per cluster within 5 s of the promotion (window {back}, promoted in {promoted_w})"
    );
    assert!(
        longest_after(back) < Duration::from_millis(2500),
        "fills are heard by notice on the new primary (polls are 10 s)"
    );

    // Purges: every instance holds "/p"; a purge on one is acknowledged by
    // all three listeners on the new primary, and the others ask again.
    assert!(burst(&apps, "/p", 1).await.iter().all(|c| c.is_success()));
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
    drop(set);
}
