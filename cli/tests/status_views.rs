//! The live views of a running `herdguard proxy`, over real loopback: the
//! admin port's `/status.json` during and after a burst, `herdguard top`
//! reading it, and the `/status` page in a real headless browser (Debian's
//! `chromium`, which `.ci/run` installs): it loads with no console error,
//! shows the burst, and leaves a screenshot in `target/status-page.png`.

use herdguard_testkit::proxy_process::ProxyProcess;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing;
use axum::Router;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// Requests in the burst: one leader and the rest waiting on it.
const BURST: usize = 50;

/// An origin whose `/slow` answers after 1.5 s, cacheable for a minute.
async fn origin(calls: Arc<AtomicUsize>) -> SocketAddr {
    async fn slow(
        State(calls): State<Arc<AtomicUsize>>,
    ) -> ([(&'static str, &'static str); 1], &'static str) {
        calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        ([("cache-control", "max-age=60")], "slow ok")
    }
    let app = Router::new()
        .route("/slow", routing::get(slow))
        .with_state(calls);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// The proxy in front of `upstream`, with its admin port.
async fn proxy(upstream: SocketAddr) -> (ProxyProcess, SocketAddr, SocketAddr) {
    let upstream = format!("http://{upstream}");
    let args = ["--admin", "127.0.0.1:0", "--upstream", &upstream];
    let proxy = ProxyProcess::start(env!("CARGO_BIN_EXE_herdguard"), &args).await;
    let (listen, admin) = (proxy.listen, proxy.admin.expect("an admin port"));
    (proxy, listen, admin)
}

async fn get(url: String) -> (u16, String) {
    get_as(url, None).await
}

/// GET `url`, with `host` as its Host (several instances behind one name).
async fn get_as(url: String, host: Option<&'static str>) -> (u16, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<axum::body::Body>();
    let mut req = http::Request::get(url);
    if let Some(host) = host {
        req = req.header("host", host);
    }
    let req = req.body(axum::body::Body::empty()).unwrap();
    let res = tokio::time::timeout(Duration::from_secs(20), client.request(req))
        .await
        .expect("answered within 20 s")
        .expect("a response");
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// `herdguard top ARGS…`, which must stop by itself within 20 s.
async fn top(args: &[&str]) -> std::process::Output {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_herdguard"))
        .arg("top")
        .args(args)
        .output();
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("top stops after its count")
        .expect("top runs")
}

async fn status(admin: SocketAddr) -> Value {
    let (code, body) = get(format!("http://{admin}/status.json")).await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// A burst of [`BURST`] on one cold key: while it runs, `/status.json`
/// lists one flight with every other request waiting on it; once answered,
/// one origin call and the rest followers. `herdguard top` shows the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_and_top_show_a_burst() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (_child, listen, admin) = proxy(origin(Arc::clone(&calls)).await).await;
    let burst: Vec<_> = (0..BURST)
        .map(|_| tokio::spawn(get(format!("http://{listen}/slow"))))
        .collect();
    // Bounded: the burst is all in within the origin's 1.5 s.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1400);
    let flight = loop {
        let snap = status(admin).await;
        let flights = snap["flights"].as_array().unwrap().clone();
        if flights
            .first()
            .is_some_and(|f| f["waiters"] == (BURST - 1) as u64)
        {
            assert_eq!(flights.len(), 1, "{snap}");
            break flights[0].clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the burst never all waited: {snap}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(flight["key"].as_str().unwrap().len(), 32, "{flight}");
    assert_eq!(flight["lease_left_ms"], Value::Null, "no Redis: no lease");
    for b in burst {
        assert_eq!(b.await.unwrap().0, 200);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let snap = status(admin).await;
    assert_eq!(snap["stats"]["origin_calls"], 1, "{snap}");
    assert_eq!(snap["stats"]["misses"], 1, "{snap}");
    assert_eq!(snap["stats"]["coalesced"], (BURST - 1) as u64, "{snap}");
    assert_eq!(snap["flights"].as_array().unwrap().len(), 0, "{snap}");
    assert_eq!(snap["origin"]["budget_limit"], 64, "{snap}");
    let hot = &snap["hot_keys"];
    assert_eq!(hot["requests"][0]["count"], BURST as u64, "{snap}");
    assert_eq!(hot["origin_calls"][0]["count"], 1, "{snap}");
    assert_eq!(hot["waiters"][0]["count"], (BURST - 1) as u64, "{snap}");
    assert_eq!(hot["requests"][0]["name"], "/slow", "{snap}");

    let admin_url = format!("http://{admin}");
    let top = top(&[
        "--admin",
        &admin_url,
        "--count",
        "2",
        "--interval-ms",
        "200",
    ])
    .await;
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(
        top.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&top.stderr)
    );
    assert!(
        !text.contains("\x1b["),
        "plain text when stdout is no terminal"
    );
    assert_eq!(
        text.matches("herdguard top: 1 of 1 instance(s) answering")
            .count(),
        2,
        "{text}"
    );
    assert!(text.contains("hot keys, last 60 s"), "{text}");
    let row = text
        .lines()
        .find(|l| l.contains(" pid "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        row.ends_with(&format!(" {BURST}")),
        "requests so far: {row}"
    );
}

/// `herdguard top` with no instance answering fails plainly (exit 2).
#[tokio::test]
async fn top_fails_when_no_instance_answers() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = top(&["--admin", &format!("http://{closed}"), "--count", "1"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&closed.to_string()));
}

/// The browser, or `None` with a note where it is missing outside CI
/// (`.ci/run` installs it, and in CI a missing browser fails the test).
fn chromium() -> Option<&'static str> {
    let found = ["chromium", "chromium-browser"].into_iter().find(|b| {
        std::process::Command::new(b)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs chromium (.ci/run installs it)"
        );
        eprintln!("note: chromium is not installed; the status page's browser test did not run");
    }
    found
}

/// The browser's profile, out of the user's home; removed by the test.
fn profile() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("herdguard-chromium-{}", std::process::id()))
}

/// Headless chromium on `url`: the DOM once the page's script has run
/// (virtual time: its polls run without waiting), and what it logged.
async fn browse(browser: &str, args: &[&str], url: &str) -> (String, String) {
    let out = tokio::process::Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .args([
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=4000",
        ])
        .arg(format!("--user-data-dir={}", profile().display()))
        .args(args)
        .arg(url)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("chromium ends within 60 s")
        .expect("chromium runs");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The page loads in a real browser with no console message, draws its
/// charts, and shows the burst's numbers read from `/status.json`; a
/// screenshot is left in `target/status-page.png` for the docs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_in_a_browser() {
    let Some(browser) = chromium() else { return };
    let calls = Arc::new(AtomicUsize::new(0));
    let (_child, listen, admin) = proxy(origin(Arc::clone(&calls)).await).await;
    let burst: Vec<_> = (0..BURST)
        .map(|_| tokio::spawn(get(format!("http://{listen}/slow"))))
        .collect();
    for b in burst {
        assert_eq!(b.await.unwrap().0, 200);
    }
    // The charts draw the history the proxy samples each second: a line
    // needs three samples.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while status(admin).await["history"].as_array().unwrap().len() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "no history sampled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let url = format!("http://{admin}/status");
    let (dom, log) = browse(browser, &["--dump-dom"], &url).await;
    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:#?}");
    assert!(
        dom.contains(&format!(
            "requests {BURST}, origin calls 1, followers {}, own calls 0",
            BURST - 1
        )),
        "{dom}"
    );
    assert!(dom.contains("redis: memory-only"), "{dom}");
    assert!(dom.contains("<polyline"), "the charts drew lines: {dom}");
    assert!(
        dom.contains(r#"<div id="error"></div>"#),
        "no read failed: {dom}"
    );

    let shot = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/status-page.png");
    let shot_arg = format!("--screenshot={}", shot.display());
    browse(browser, &[&shot_arg, "--window-size=1280,900"], &url).await;
    let _ = std::fs::remove_dir_all(profile());
    assert!(
        std::fs::metadata(&shot).is_ok_and(|m| m.len() > 10_000),
        "{}",
        shot.display()
    );
}

/// Four proxies on one real redis-server, a burst spread over them on one
/// cold key: `herdguard top` over the four shows the key on top with its
/// one origin call and every other request as a waiter, summed over the
/// instances (those that waited for another instance's fill included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_sums_a_burst_over_four_instances_on_redis() {
    let server = herdguard_testkit::RedisServer::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let upstream = format!("http://{}", origin(Arc::clone(&calls)).await);
    let url = server.url();
    let args = [
        "--admin",
        "127.0.0.1:0",
        "--upstream",
        &upstream,
        "--redis",
        &url,
    ];
    let bin = env!("CARGO_BIN_EXE_herdguard");
    let mut proxies = Vec::new();
    for _ in 0..4 {
        proxies.push(ProxyProcess::start(bin, &args).await);
    }
    let burst: Vec<_> = proxies
        .iter()
        .flat_map(|p| {
            (0..BURST / 2).map(move |_| {
                let url = format!("http://{}/slow", p.listen);
                tokio::spawn(get_as(url, Some("app.test")))
            })
        })
        .collect();
    for b in burst {
        assert_eq!(b.await.unwrap().0, 200);
    }
    let all = 4 * (BURST / 2);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let mut followers = 0;
    for p in &proxies {
        followers += status(p.admin.unwrap()).await["stats"]["followers"]
            .as_u64()
            .unwrap();
    }
    assert_eq!(followers, all as u64 - 1);

    let admins: Vec<String> = proxies
        .iter()
        .map(|p| format!("http://{}", p.admin.unwrap()))
        .collect();
    // Named one by one, and found through the Redis they share (each says
    // its admin address there).
    let listed = ["--admin", &admins.join(",")];
    let said = ["--redis", &url];
    for which in [&listed[..], &said[..]] {
        let top = top(&[which, &["--count", "1"]].concat()).await;
        let text = String::from_utf8_lossy(&top.stdout);
        let err = String::from_utf8_lossy(&top.stderr);
        assert!(top.status.success(), "{which:?}: {text} {err}");
        assert!(
            text.contains("herdguard top: 4 of 4 instance(s) answering"),
            "{which:?}: {text}"
        );
        // key, requests, origin calls, waiters, …
        let row = text
            .lines()
            .find(|l| l.starts_with("/slow "))
            .unwrap_or_else(|| panic!("{text}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            &cells[..4],
            &["/slow", &all.to_string(), "1", &(all - 1).to_string()],
            "{which:?}: {text}"
        );
    }
}

/// With no proxy saying its admin address in a Redis, `top --redis` says
/// so plainly (exit 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_over_redis_without_instances_fails_plainly() {
    let server = herdguard_testkit::RedisServer::start();
    let out = top(&["--redis", &server.url(), "--count", "1"]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no instance says its admin address"), "{err}");
}
