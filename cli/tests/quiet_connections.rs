//! The per-connection watch behind --header-timeout, on the proxy's own
//! server over real loopback sockets, with tokio's clock paused: the
//! runtime jumps to the next timer whenever every task waits, so the
//! timeouts take no wall-clock time and the instants are exact.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use herdguard::CacheLayer;
use herdguard_cli::proxy::server::{self, ServerConfig};
use herdguard_cli::proxy::{Proxy, ProxyConfig};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

const TIMEOUT: Duration = Duration::from_secs(10);

/// The server, in this runtime, on 127.0.0.1:0, in front of `upstream`
/// (port 9, unreachable, when the requests never reach it).
async fn start_for(upstream: SocketAddr) -> SocketAddr {
    let proxy = Proxy::new(
        ProxyConfig::new(format!("http://{upstream}").parse().unwrap()),
        CacheLayer::new(),
    )
    .unwrap();
    let mut config = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    config.header_timeout = TIMEOUT;
    let (bound, addr) = tokio::sync::oneshot::channel();
    tokio::spawn(server::run(config, proxy, None, move |b| {
        let _ = bound.send(b.listen);
    }));
    addr.await.unwrap()
}

async fn start() -> SocketAddr {
    start_for(SocketAddr::from(([127, 0, 0, 1], 9))).await
}

/// An origin, in this runtime: `/late` answers after 3.5 timeouts; POST
/// `/drip` at once, with a body of four chunks 0.8 timeouts apart (a POST
/// passes the cache by, so the body streams to the client as it comes).
async fn slow_origin() -> SocketAddr {
    use axum::routing::get;
    let late = || async {
        tokio::time::sleep(TIMEOUT * 7 / 2).await;
        ([("cache-control", "no-store")], "late")
    };
    let drip = || async {
        let chunks = futures_util::stream::unfold(0, |n| async move {
            if n == 4 {
                return None;
            }
            tokio::time::sleep(TIMEOUT * 4 / 5).await;
            Some((Ok::<_, std::io::Error>(bytes::Bytes::from("drip ")), n + 1))
        });
        ([("cache-control", "no-store")], Body::from_stream(chunks))
    };
    let app = axum::Router::new()
        .route("/late", get(late))
        .route("/drip", axum::routing::post(drip));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// `method` `path` over HTTP/1.1 on a connection of its own: the body, and
/// how long the whole answer took.
async fn fetch(proxy: SocketAddr, method: &str, path: &str) -> (String, Duration) {
    use http_body_util::BodyExt;
    let started = Instant::now();
    let tcp = TcpStream::connect(proxy).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "app.test")
        .body(Body::empty())
        .unwrap();
    let resp = send.send_request(req).await.expect("answered, not cut");
    let body = resp.into_body().collect().await.expect("the whole body");
    let text = String::from_utf8(body.to_bytes().to_vec()).unwrap();
    (text, started.elapsed())
}

/// A client that connects and sends nothing is cut off after the header
/// timeout (hyper's own timer never started for it: it was held forever).
#[tokio::test(start_paused = true)]
async fn a_silent_client_is_cut_off() {
    let addr = start().await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let connected = Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(10 * TIMEOUT, tcp.read(&mut buf))
        .await
        .expect("cut off");
    let waited = connected.elapsed();
    assert_eq!(read.unwrap(), 0, "closed without an answer");
    assert!((TIMEOUT..2 * TIMEOUT).contains(&waited), "after {waited:?}");
}

/// An idle HTTP/2 connection that has been served is sent GOAWAY, so its
/// client ends cleanly, before the watch would drop it a timeout later.
#[tokio::test(start_paused = true)]
async fn an_idle_h2_connection_gets_goaway() {
    let addr = start().await;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    // Refused by the proxy itself (userinfo in :authority): no upstream.
    let req = Request::get(format!("http://user@{addr}/"))
        .body(Body::empty())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    drop(resp);
    let served = Instant::now();
    let ended = tokio::time::timeout(10 * TIMEOUT, conn)
        .await
        .expect("the connection ends");
    let waited = served.elapsed();
    ended.unwrap().expect("ended by GOAWAY, not cut");
    assert!((TIMEOUT..3 * TIMEOUT).contains(&waited), "after {waited:?}");
}

/// A request waiting on a slow upstream for longer than the header
/// timeout is in flight: its connection is not cut.
#[tokio::test(start_paused = true)]
async fn a_request_waiting_on_the_upstream_is_not_cut() {
    let proxy = start_for(slow_origin().await).await;
    let (body, took) = tokio::time::timeout(10 * TIMEOUT, fetch(proxy, "GET", "/late"))
        .await
        .expect("bounded");
    assert_eq!(body, "late");
    assert!(took >= TIMEOUT * 7 / 2, "{took:?}");
}

/// A response body still being sent keeps its request in flight: a body
/// longer than the header timeout arrives whole.
#[tokio::test(start_paused = true)]
async fn a_body_still_being_sent_is_not_cut() {
    let proxy = start_for(slow_origin().await).await;
    let (body, took) = tokio::time::timeout(10 * TIMEOUT, fetch(proxy, "POST", "/drip"))
        .await
        .expect("bounded");
    assert_eq!(body, "drip drip drip drip ");
    assert!(took >= TIMEOUT * 16 / 5, "{took:?}");
}
