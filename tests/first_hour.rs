//! The first hour of a new user: an axum handler that sets no headers, behind
//! `CacheLayer::builder().build()?`, under 100 concurrent requests. Its
//! answers cannot be stored (no freshness), and the layer says so: one WARN
//! per route naming the fix, `Cache-Status: …; detail=no-freshness`, and
//! `herdguard_not_stored_total{reason="no-freshness"}`.
//!
//! The log and the metrics are global to this binary: each test uses a cache
//! name of its own and reads only the lines and samples carrying it.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use axum::routing::get;
use axum::Router;
use herdguard::{BuildError, CacheLayer};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tower::ServiceExt;

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The log of every test in this binary, and the metrics recorder.
struct Captured {
    log: Buffer,
    metrics: Snapshotter,
}

fn captured() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let log = Buffer::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber here");
        let recorder = DebuggingRecorder::new();
        let metrics = recorder.snapshotter();
        recorder.install().expect("the only recorder here");
        Captured { log, metrics }
    })
}

/// WARN lines of the layer named `cache`.
fn warnings(cache: &str) -> Vec<String> {
    let log = captured().log.0.lock().unwrap().clone();
    String::from_utf8(log)
        .unwrap()
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains(&format!("cache={cache} ")))
        .map(str::to_owned)
        .collect()
}

/// The new user's handler: 200 ms of work, no headers at all.
fn app(layer: CacheLayer, calls: &Arc<AtomicUsize>) -> Router {
    let report = {
        let calls = Arc::clone(calls);
        move || async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await;
            "expensive"
        }
    };
    Router::new()
        .route("/report/{id}", get(report.clone()))
        .route("/summary", get(report))
        .layer(layer)
}

/// `n` concurrent GETs of `path`; their `Cache-Status` values.
async fn burst(app: &Router, path: &str, n: usize) -> Vec<String> {
    let requests = (0..n).map(|_| {
        let req = Request::get(path)
            .header("host", "example.test")
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(req)
    });
    futures_util::future::join_all(requests)
        .await
        .into_iter()
        .map(|r| {
            let r = r.unwrap();
            assert_eq!(r.status(), 200);
            r.headers()["cache-status"].to_str().unwrap().to_owned()
        })
        .collect()
}

/// The trial: 100 handler calls, every answer says `detail=no-freshness`,
/// one WARN names the route and the fix, and the metric counts the reason.
#[tokio::test(start_paused = true)]
async fn headerless_handler_explains_itself() -> Result<(), BuildError> {
    let captured = captured();
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(CacheLayer::builder().cache_name("trial").build()?, &calls);

    let statuses = burst(&app, "/report/7", 100).await;

    assert_eq!(calls.load(Ordering::SeqCst), 100, "not stored: not shared");
    for status in &statuses {
        assert!(status.contains("detail=no-freshness"), "{status}");
    }
    let warned = warnings("trial");
    assert_eq!(
        warned.len(),
        1,
        "one per route, not per request: {warned:?}"
    );
    let line = &warned[0];
    for fix in [
        "no freshness",
        "Cache-Control: max-age=N",
        "default_ttl",
        "RoutePolicy::default_ttl",
    ] {
        assert!(line.contains(fix), "names {fix:?}: {line}");
    }
    #[cfg(feature = "axum")]
    assert!(line.contains(r#"route="/report/{id}""#), "{line}");
    let not_stored: u64 = captured
        .metrics
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, _, _, _)| {
            let labels: Vec<_> = k.key().labels().map(|l| (l.key(), l.value())).collect();
            k.key().name() == "herdguard_not_stored_total"
                && labels.contains(&("cache", "trial"))
                && labels.contains(&("reason", "no-freshness"))
        })
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(c) => c,
            other => panic!("a counter: {other:?}"),
        })
        .sum();
    // The flight's one answer; the 99 released requests call on their own
    // and store nothing.
    assert_eq!(not_stored, 1);
    Ok(())
}

/// The WARN is per route and rate-limited: another id of the same route
/// stays quiet, another route warns, and the first route warns again only
/// after 10 minutes. (Routes are axum's matched paths: without the `axum`
/// feature each path is a route of its own.)
#[cfg(feature = "axum")]
#[tokio::test(start_paused = true)]
async fn warning_is_once_per_route() -> Result<(), BuildError> {
    captured();
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(CacheLayer::builder().cache_name("routes").build()?, &calls);

    burst(&app, "/report/1", 10).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    burst(&app, "/report/2", 10).await;
    assert_eq!(warnings("routes").len(), 1, "{:?}", warnings("routes"));

    tokio::time::advance(Duration::from_secs(2)).await;
    burst(&app, "/summary", 10).await;
    assert_eq!(warnings("routes").len(), 2, "{:?}", warnings("routes"));

    tokio::time::advance(Duration::from_secs(600)).await;
    burst(&app, "/report/3", 10).await;
    assert_eq!(warnings("routes").len(), 3, "{:?}", warnings("routes"));
    assert_eq!(calls.load(Ordering::SeqCst), 40);
    Ok(())
}

/// The fix the WARN names works in one line: with `default_ttl`, 100
/// concurrent requests cost one handler call, and nothing is warned.
#[tokio::test(start_paused = true)]
async fn one_line_ttl_makes_one_call() -> Result<(), BuildError> {
    captured();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = CacheLayer::builder()
        .cache_name("fixed")
        .default_ttl(Duration::from_secs(5))
        .build()?;
    let app = app(layer, &calls);

    let statuses = burst(&app, "/report/7", 100).await;

    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(statuses.iter().filter(|s| s.contains("stored")).count(), 1);
    assert!(warnings("fixed").is_empty(), "{:?}", warnings("fixed"));
    Ok(())
}

/// A headerless answer that sets a cookie is not called `no-freshness`
/// (a TTL would not store it) and warns nothing.
#[tokio::test(start_paused = true)]
async fn cookie_answer_is_not_blamed_on_freshness() -> Result<(), BuildError> {
    captured();
    let layer = CacheLayer::builder().cache_name("cookie").build()?;
    let app = Router::new()
        .route(
            "/me",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                ([("set-cookie", "session=1")], "me")
            }),
        )
        .layer(layer);

    let statuses = burst(&app, "/me", 10).await;

    for status in &statuses {
        assert!(!status.contains("no-freshness"), "{status}");
        assert!(status.contains("detail=uncacheable"), "{status}");
    }
    assert!(warnings("cookie").is_empty(), "{:?}", warnings("cookie"));
    Ok(())
}

/// `purge_url` takes the string at hand: a bad one is an error to branch on
/// when awaited, and a WARN when the handle is dropped, never a panic.
#[tokio::test]
async fn purge_url_takes_a_str_and_says_when_it_is_bad() {
    captured();
    let bad_url_warnings = || {
        let log = captured().log.0.lock().unwrap().clone();
        String::from_utf8(log)
            .unwrap()
            .lines()
            .filter(|l| l.contains(" WARN ") && l.contains("nothing purged: invalid url"))
            .count()
    };
    let cache = CacheLayer::new();
    assert_eq!(
        cache
            .purge_url("http://shop.test/products/7")
            .await
            .unwrap(),
        herdguard::purge::Purged::Local
    );
    let e = cache.soft_purge_url("http://shop test/").await.unwrap_err();
    assert!(e.is_invalid_url(), "{e}");
    assert_eq!(
        bad_url_warnings(),
        0,
        "an awaited error is the caller's, not the log's"
    );

    drop(cache.purge_url(&String::from("http://shop test/")));
    assert_eq!(bad_url_warnings(), 1);
}
