//! `herdguard proxy --redis-sentinel … --redis-master-name …`, the binary,
//! against a real Sentinel topology: two proxies share one fill through the
//! primary the sentinels name.

use herdguard_testkit as support;

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing;
use axum::Router;
use support::sentinel::SentinelSet;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// A `herdguard proxy` on 127.0.0.1:0, killed on drop, and its address.
async fn proxy(args: &[&str]) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_herdguard"))
        .arg("proxy")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the proxy starts");
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), out.next_line())
        .await
        .expect("the proxy is ready within 30 s")
        .unwrap()
        .expect("a ready line");
    assert!(line.ends_with("redis on"), "{line}");
    let addr = line
        .split("listening on http://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .expect("the address in the ready line")
        .to_owned();
    (child, addr)
}

/// One HTTP/1.1 GET over a raw socket (bounded); the whole answer.
async fn get(addr: &str, path: &str) -> String {
    let answer = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nhost: app.test\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        text
    };
    tokio::time::timeout(Duration::from_secs(20), answer)
        .await
        .expect("answered within 20 s")
}

/// Two proxies on Sentinel: the second serves the first one's fill, and the origin is called once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_on_sentinel_share_one_fill() {
    let set = tokio::task::spawn_blocking(|| SentinelSet::start(1))
        .await
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let app = Router::new().fallback(routing::get(move || {
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move { ([("cache-control", "max-age=60")], format!("call={n}")) }
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let sentinels = set.sentinel_urls().join(",");
    let node = set.node_url();
    let args = [
        "--upstream",
        &upstream,
        "--redis-sentinel",
        &sentinels,
        "--redis-master-name",
        set.master_name(),
        "--redis-node-url",
        &node,
    ];
    let (_first, a) = proxy(&args).await;
    let (_second, b) = proxy(&args).await;
    let one = get(&a, "/page").await;
    assert!(
        one.starts_with("HTTP/1.1 200") && one.ends_with("call=1"),
        "{one}"
    );
    let two = get(&b, "/page").await;
    assert!(
        two.starts_with("HTTP/1.1 200") && two.ends_with("call=1"),
        "{two}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
