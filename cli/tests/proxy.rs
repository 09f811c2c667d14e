//! `herdguard proxy`, the binary, over real loopback: an axum origin (or an
//! https one with a private CA) on 127.0.0.1:0, the proxy process on
//! 127.0.0.1:0, and hyper clients or raw sockets.

use herdguard_testkit as support;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing;
use axum::Router;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use support::tls::Certs;

/// Requests the origin has started on.
#[derive(Clone, Default)]
struct Seen(Arc<AtomicUsize>);

/// Forwarding headers a proxy does not set for itself.
const FOREIGN_FORWARDING: [(&str, &str); 10] = [
    ("x-forwarded-scheme", "javascript"),
    ("x-forwarded-port", "1337"),
    ("x-forwarded-prefix", "/evil"),
    ("x-forwarded-server", "evil.test"),
    ("x-forwarded-ssl", "on"),
    ("x-forwarded-anything", "evil"),
    ("x-host", "evil.test"),
    ("front-end-https", "on"),
    ("x-original-url", "/admin"),
    ("x-rewrite-url", "/admin"),
];

/// The forwarded headers the origin was given, one per line.
async fn echo(headers: HeaderMap) -> String {
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let foreign: Vec<&str> = FOREIGN_FORWARDING
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| headers.contains_key(*n))
        .collect();
    format!(
        "xff={}\nxfp={}\nxfh={}\nhost={}\nforwarded={}\nforeign={}\noverride={}\n",
        h("x-forwarded-for"),
        h("x-forwarded-proto"),
        h("x-forwarded-host"),
        h("host"),
        h("forwarded"),
        foreign.join(","),
        h("x-http-method-override"),
    )
}

/// `echo`, cacheable for a minute, counted.
async fn echo_cached(State(seen): State<Seen>, headers: HeaderMap) -> axum::response::Response {
    seen.0.fetch_add(1, Ordering::SeqCst);
    axum::response::Response::builder()
        .header("cache-control", "max-age=60")
        .body(Body::from(echo(headers).await))
        .unwrap()
}

/// Cacheable for a minute, after an optional wait (`?ms=`).
async fn slow(State(seen): State<Seen>, uri: axum::http::Uri) -> axum::response::Response {
    seen.0.fetch_add(1, Ordering::SeqCst);
    let ms = uri
        .query()
        .and_then(|q| q.strip_prefix("ms=")?.parse().ok());
    if let Some(ms) = ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    axum::response::Response::builder()
        .header("cache-control", "max-age=60")
        .body(Body::from("slow ok"))
        .unwrap()
}

/// A gzip-only origin: gzip when the request accepts it, else identity; counted.
async fn gzip_only(State(seen): State<Seen>, headers: HeaderMap) -> axum::response::Response {
    seen.0.fetch_add(1, Ordering::SeqCst);
    let accepts = headers
        .get("accept-encoding")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(',')
        .any(|c| c.trim() == "gzip");
    let mut r = axum::response::Response::builder()
        .header("cache-control", "max-age=60")
        .header("vary", "accept-encoding");
    if accepts {
        r = r.header("content-encoding", "gzip");
    }
    r.body(Body::from(if accepts { "gzipped" } else { "plain" }))
        .unwrap()
}

fn origin_app(seen: Seen) -> Router {
    Router::new()
        .route("/echo", routing::get(echo))
        .route("/echo-cached", routing::get(echo_cached))
        .route("/gzip-only", routing::get(gzip_only))
        .route("/slow/{n}", routing::get(slow))
        .with_state(seen)
}

async fn origin(seen: Seen) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, origin_app(seen)).await.unwrap() });
    addr
}

/// The origin over TLS with the test CA's `localhost` certificate.
async fn https_origin(certs: &Certs, seen: Seen) -> SocketAddr {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(certs.path("server.crt"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(certs.path("server.key")).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = origin_app(seen);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let app = app.clone();
                        async move {
                            use tower::ServiceExt;
                            app.oneshot(req.map(Body::new)).await
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

/// A running `herdguard proxy`; killed on drop.
struct Proxy {
    child: tokio::process::Child,
    addr: SocketAddr,
    admin: Option<SocketAddr>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    async fn start(args: &[&str]) -> Self {
        Self::start_env(args, &[]).await
    }

    async fn start_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_herdguard"));
        cmd.arg("proxy")
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("the proxy starts");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut err_lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let sink = Arc::clone(&stderr);
        // Drained all along, so a full pipe never blocks the proxy.
        tokio::spawn(async move {
            while let Ok(Some(line)) = err_lines.next_line().await {
                sink.lock().unwrap().push(line);
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), out.next_line())
            .await
            .expect("the proxy is ready within 30 s")
            .unwrap()
            .unwrap_or_else(|| panic!("no ready line; stderr: {:?}", stderr.lock().unwrap()));
        // "herdguard proxy listening on http://A upstream U admin http://B redis off"
        let word = |after: &str| {
            let rest = line.split(after).nth(1)?;
            let w = rest.split_whitespace().next()?;
            w.split("://").nth(1)?.parse::<SocketAddr>().ok()
        };
        let addr = word("listening on ").unwrap_or_else(|| panic!("{line}"));
        let admin = word(" admin ");
        Self {
            child,
            addr,
            admin,
            stderr,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }
}

fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Body> {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn get(url: &str, headers: &[(&str, &str)]) -> (StatusCode, HeaderMap, String) {
    let mut r = Request::get(url);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(20),
        client().request(r.body(Body::empty()).unwrap()),
    )
    .await
    .expect("answered within 20 s")
    .expect("a response");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn cache_status(h: &HeaderMap) -> &str {
    h.get("cache-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// An https upstream signed by a private CA is reached with --upstream-ca, and refused (502) without it.
#[tokio::test]
async fn https_upstream_with_private_ca() {
    let certs = Certs::make();
    let seen = Seen::default();
    let upstream = https_origin(&certs, seen.clone()).await;
    let url = format!("https://localhost:{}", upstream.port());
    let ca = certs.path("ca.crt");
    let proxy = Proxy::start(&["--upstream", &url, "--upstream-ca", ca.to_str().unwrap()]).await;
    let (code, h1, body) = get(&proxy.url("/slow/1"), &[]).await;
    assert_eq!((code, body.as_str()), (StatusCode::OK, "slow ok"));
    assert!(
        cache_status(&h1).contains("stored"),
        "{}",
        cache_status(&h1)
    );
    let (_, h2, _) = get(&proxy.url("/slow/1"), &[]).await;
    assert!(cache_status(&h2).contains("hit"), "{}", cache_status(&h2));
    assert_eq!(seen.0.load(Ordering::SeqCst), 1);

    // The system roots do not know the test CA: the certificate is checked.
    let untrusting = Proxy::start(&["--upstream", &url]).await;
    let (code, h, _) = get(&untrusting.url("/slow/2"), &[]).await;
    assert_eq!(code, StatusCode::BAD_GATEWAY);
    assert!(
        cache_status(&h).contains("fwd-status=502"),
        "{}",
        cache_status(&h)
    );
    assert_eq!(seen.0.load(Ordering::SeqCst), 1);
}

/// An upstream slower than --upstream-timeout is a 504 with Cache-Status, not a hang.
#[tokio::test]
async fn slow_upstream_is_504() {
    let upstream = origin(Seen::default()).await;
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--upstream-timeout",
        "300ms",
    ])
    .await;
    let (code, h, _) = get(&proxy.url("/slow/1?ms=5000"), &[]).await;
    assert_eq!(code, StatusCode::GATEWAY_TIMEOUT);
    assert!(
        cache_status(&h).contains("fwd-status=504"),
        "{}",
        cache_status(&h)
    );
}

/// CPDoS through the binary: after one `no-cache` GET with a 10 KB header that the origin answers 431, the next 10 plain GETs of the hot key cost 0 origin calls (cold key: exactly 1).
#[tokio::test]
async fn one_oversized_request_never_disables_caching() {
    // An origin with a smaller header limit than the proxy's (64 KiB), as
    // real ones have: 431 without freshness for a head over 1 KB.
    async fn limited(State(seen): State<Seen>, headers: HeaderMap) -> axum::response::Response {
        seen.0.fetch_add(1, Ordering::SeqCst);
        let big = headers.get("x-pad").is_some_and(|v| v.len() > 1024);
        let r = axum::response::Response::builder();
        let r = if big {
            r.status(431)
        } else {
            r.header("cache-control", "max-age=60")
        };
        r.body(Body::from("limited")).unwrap()
    }
    let seen = Seen::default();
    let app = Router::new()
        .route("/{name}", routing::get(limited))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let proxy = Proxy::start(&["--upstream", &format!("http://{upstream}")]).await;
    let pad = "a".repeat(10 * 1024);
    let hostile = [("cache-control", "no-cache"), ("x-pad", pad.as_str())];
    let calls = || seen.0.load(Ordering::SeqCst);

    get(&proxy.url("/hot"), &[]).await;
    get(&proxy.url("/hot"), &[]).await;
    let (code, _, _) = get(&proxy.url("/hot"), &hostile).await;
    assert_eq!(code, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert_eq!(calls(), 2);
    for _ in 0..10 {
        let (code, h, _) = get(&proxy.url("/hot"), &[]).await;
        assert_eq!(code, StatusCode::OK);
        assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    }
    assert_eq!(calls(), 2, "hot key: no origin call after the attack");

    let (code, _, _) = get(&proxy.url("/cold"), &hostile).await;
    assert_eq!(code, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    for _ in 0..10 {
        let (code, _, _) = get(&proxy.url("/cold"), &[]).await;
        assert_eq!(code, StatusCode::OK);
    }
    assert_eq!(calls(), 4, "cold key: the attack, then one fill");
}

/// Hit-for-miss through the binary: a cold key whose one request (a cookie) the origin answers `200 private` leaves the next 10 plain GETs exactly one origin call, the 9 after it hits.
#[tokio::test]
async fn one_private_answer_costs_one_more_call() {
    async fn per_user(State(seen): State<Seen>, headers: HeaderMap) -> axum::response::Response {
        let n = seen.0.fetch_add(1, Ordering::SeqCst) + 1;
        let cc = if headers.contains_key("cookie") {
            "private"
        } else {
            "max-age=60"
        };
        axum::response::Response::builder()
            .header("cache-control", cc)
            .body(Body::from(format!("call={n}")))
            .unwrap()
    }
    let seen = Seen::default();
    let app = Router::new()
        .route("/{name}", routing::get(per_user))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let proxy = Proxy::start(&["--upstream", &format!("http://{upstream}")]).await;
    let calls = || seen.0.load(Ordering::SeqCst);

    let (code, h, body) = get(&proxy.url("/cold"), &[("cookie", "user=mallory")]).await;
    assert_eq!((code, body.as_str()), (StatusCode::OK, "call=1"));
    assert!(
        cache_status(&h).contains("uncacheable"),
        "{}",
        cache_status(&h)
    );
    let (_, h, body) = get(&proxy.url("/cold"), &[]).await;
    assert_eq!(body, "call=2");
    assert!(
        cache_status(&h).contains("stored") && cache_status(&h).contains("hit-for-miss"),
        "{}",
        cache_status(&h)
    );
    for _ in 0..9 {
        let (code, h, body) = get(&proxy.url("/cold"), &[]).await;
        assert_eq!((code, body.as_str()), (StatusCode::OK, "call=2"));
        assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    }
    assert_eq!(calls(), 2, "the request, then one fill");
}

/// A client speaking HTTP/2 with prior knowledge (h2c) is served over HTTP/2.
#[tokio::test]
async fn h2c_client_is_served() {
    let upstream = origin(Seen::default()).await;
    let proxy = Proxy::start(&["--upstream", &format!("http://{upstream}")]).await;
    let h2: Client<_, Body> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let resp = h2
        .request(
            Request::get(proxy.url("/slow/1"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.version(), axum::http::Version::HTTP_2);
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "slow ok");
}

/// Read what the proxy sends on a raw connection until it closes (bounded).
async fn read_all(tcp: &mut TcpStream, within: Duration) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(within, tcp.read_to_end(&mut out))
        .await
        .expect("the proxy closes the connection in time");
    String::from_utf8_lossy(&out).into_owned()
}

/// A request head over --max-header-bytes is refused with 431 and never reaches the upstream.
#[tokio::test]
async fn oversized_headers_get_431() {
    let seen = Seen::default();
    let upstream = origin(seen.clone()).await;
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--max-header-bytes",
        "8192",
    ])
    .await;
    let mut tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let big = "a".repeat(20_000);
    let req = format!("GET /slow/1 HTTP/1.1\r\nhost: x\r\nx-big: {big}\r\n\r\n");
    let _ = tcp.write_all(req.as_bytes()).await;
    let answer = read_all(&mut tcp, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    assert_eq!(seen.0.load(Ordering::SeqCst), 0);
    // A normal head on a new connection is fine.
    let (code, _, _) = get(&proxy.url("/slow/1"), &[]).await;
    assert_eq!(code, StatusCode::OK);
}

/// A client that sends half a request head is cut off after --header-timeout.
#[tokio::test]
async fn slow_headers_are_cut_off() {
    let seen = Seen::default();
    let upstream = origin(seen.clone()).await;
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--header-timeout",
        "500ms",
    ])
    .await;
    let mut tcp = TcpStream::connect(proxy.addr).await.unwrap();
    tcp.write_all(b"GET /slow/1 HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let answer = read_all(&mut tcp, Duration::from_secs(10)).await;
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "closed after {:?}",
        started.elapsed()
    );
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer:?}"
    );
    assert_eq!(seen.0.load(Ordering::SeqCst), 0);
}

/// With --max-connections 1 a second client is not served until the first one leaves.
#[tokio::test]
async fn max_connections_holds_further_clients() {
    let upstream = origin(Seen::default()).await;
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--max-connections",
        "1",
    ])
    .await;
    let request = b"GET /slow/1 HTTP/1.1\r\nhost: x\r\n\r\n";
    let mut first = TcpStream::connect(proxy.addr).await.unwrap();
    first.write_all(request).await.unwrap();
    let mut buf = [0u8; 12];
    first.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200");

    let mut second = TcpStream::connect(proxy.addr).await.unwrap();
    second.write_all(request).await.unwrap();
    let early = tokio::time::timeout(Duration::from_millis(700), second.read(&mut buf)).await;
    assert!(
        early.is_err(),
        "the second client was served while the first was connected"
    );

    drop(first);
    tokio::time::timeout(Duration::from_secs(10), second.read_exact(&mut buf))
        .await
        .expect("served once the first client left")
        .unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200");
}

fn line<'a>(body: &'a str, name: &str) -> &'a str {
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or("")
}

/// From an untrusted peer, X-Forwarded-For and -Proto are replaced by what the connection shows; -Host is the keyed host.
#[tokio::test]
async fn untrusted_forwarded_headers_are_replaced() {
    let upstream = origin(Seen::default()).await;
    let proxy = Proxy::start(&["--upstream", &format!("http://{upstream}")]).await;
    let (_, _, body) = get(
        &proxy.url("/echo"),
        &[
            ("host", "Shop.test:8443"),
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "evil.test"),
        ],
    )
    .await;
    assert_eq!(line(&body, "xff"), "127.0.0.1", "{body}");
    assert_eq!(line(&body, "xfp"), "http", "{body}");
    assert_eq!(line(&body, "xfh"), "shop.test:8443", "{body}");
    assert_eq!(line(&body, "host"), "shop.test:8443", "{body}");
}

/// From a peer in --trusted-proxies, the X-Forwarded-For chain is extended and -Proto kept.
#[tokio::test]
async fn trusted_forwarded_headers_are_kept() {
    let upstream = origin(Seen::default()).await;
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--trusted-proxies",
        "10.0.0.0/8,127.0.0.0/8",
    ])
    .await;
    let (_, _, body) = get(
        &proxy.url("/echo"),
        &[
            ("x-forwarded-for", "203.0.113.7"),
            ("x-forwarded-proto", "https"),
        ],
    )
    .await;
    assert_eq!(line(&body, "xff"), "203.0.113.7, 127.0.0.1", "{body}");
    assert_eq!(line(&body, "xfp"), "https", "{body}");
}

/// The scheme the upstream is told is part of the key: an answer made for a trusted front's plain-HTTP request (`X-Forwarded-Proto: http`) is never served to its HTTPS requests, and each scheme's answer is still cached.
#[tokio::test]
async fn the_forwarded_scheme_is_keyed() {
    let seen = Seen::default();
    let upstream = origin(seen.clone()).await;
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--trusted-proxies",
        "127.0.0.0/8",
    ])
    .await;
    let url = proxy.url("/echo-cached");
    let (_, _, plain) = get(&url, &[("x-forwarded-proto", "http")]).await;
    assert_eq!(line(&plain, "xfp"), "http", "{plain}");
    let (_, _, tls) = get(&url, &[("x-forwarded-proto", "HTTPS")]).await;
    assert_eq!(
        line(&tls, "xfp"),
        "https",
        "the http answer was served over https: {tls}"
    );
    let (_, h, again) = get(&url, &[("x-forwarded-proto", "https")]).await;
    assert_eq!(again, tls);
    assert!(cache_status(&h).contains("hit"), "{h:?}");
    // A value that is no scheme counts as this connection's own (http).
    let (_, h, odd) = get(&url, &[("x-forwarded-proto", "gopher")]).await;
    assert_eq!(odd, plain);
    assert!(cache_status(&h).contains("hit"), "{h:?}");
    assert_eq!(
        seen.0.load(Ordering::SeqCst),
        2,
        "one upstream call per scheme"
    );
}

/// From an untrusted peer, Forwarded is replaced by the proxy's own and every forwarding header the proxy does not set is removed.
#[tokio::test]
async fn untrusted_foreign_forwarding_headers_are_removed() {
    let upstream = origin(Seen::default()).await;
    let proxy = Proxy::start(&["--upstream", &format!("http://{upstream}")]).await;
    let mut headers = vec![
        ("host", "app.test"),
        ("forwarded", "for=6.6.6.6;host=evil.test;proto=https"),
    ];
    headers.extend(FOREIGN_FORWARDING);
    let (_, _, body) = get(&proxy.url("/echo"), &headers).await;
    assert_eq!(
        line(&body, "forwarded"),
        "for=127.0.0.1;proto=http;host=\"app.test\"",
        "{body}"
    );
    assert_eq!(line(&body, "foreign"), "", "{body}");
    assert_eq!(line(&body, "xfh"), "app.test", "{body}");
}

/// From a peer in --trusted-proxies, Forwarded is extended with this hop and the other forwarding headers are kept.
#[tokio::test]
async fn trusted_forwarded_chain_is_extended() {
    let upstream = origin(Seen::default()).await;
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--trusted-proxies",
        "127.0.0.0/8",
    ])
    .await;
    let (_, _, body) = get(
        &proxy.url("/echo"),
        &[
            ("host", "app.test"),
            ("forwarded", "for=203.0.113.7;proto=https"),
            ("x-forwarded-prefix", "/shop"),
        ],
    )
    .await;
    assert_eq!(
        line(&body, "forwarded"),
        "for=203.0.113.7;proto=https, for=127.0.0.1;proto=http;host=\"app.test\"",
        "{body}"
    );
    assert_eq!(line(&body, "foreign"), "x-forwarded-prefix", "{body}");
}

/// On two proxies sharing Redis, a client's forwarding headers on one never reach the answer the other serves.
#[tokio::test]
async fn foreign_forwarding_headers_never_poison_another_instance() {
    let redis = support::RedisServer::start();
    let seen = Seen::default();
    let upstream = origin(seen.clone()).await;
    let args = [
        "--upstream",
        &format!("http://{upstream}"),
        "--redis",
        &redis.url(),
    ];
    let first = Proxy::start(&args).await;
    let second = Proxy::start(&args).await;
    let mut attack = vec![
        ("host", "app.test"),
        ("forwarded", "for=6.6.6.6;host=evil.test;proto=https"),
    ];
    attack.extend(FOREIGN_FORWARDING);
    let (_, _, poisoned) = get(&first.url("/echo-cached"), &attack).await;
    assert_eq!(line(&poisoned, "foreign"), "", "{poisoned}");
    let (_, h, body) = get(&second.url("/echo-cached"), &[("host", "app.test")]).await;
    assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    assert_eq!(line(&body, "foreign"), "", "{body}");
    assert!(!body.contains("evil"), "{body}");
    assert_eq!(seen.0.load(Ordering::SeqCst), 1);
}

/// A GET with a method override reaches the upstream past the cache, and the plain GET after it gets its own answer.
#[tokio::test]
async fn method_override_bypasses_the_proxy_cache() {
    let seen = Seen::default();
    let upstream = origin(seen.clone()).await;
    let proxy = Proxy::start(&["--upstream", &format!("http://{upstream}")]).await;
    let url = proxy.url("/echo-cached");
    let (_, h, body) = get(&url, &[("x-http-method-override", "DELETE")]).await;
    assert_eq!(line(&body, "override"), "DELETE", "{body}");
    let (_, _, plain) = get(&url, &[]).await;
    assert_eq!(line(&plain, "override"), "-", "{plain}");
    assert!(
        cache_status(&h).contains("detail=method-override"),
        "{}",
        cache_status(&h)
    );
    let (_, h, again) = get(&url, &[]).await;
    assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    assert_eq!(again, plain);
    assert_eq!(seen.0.load(Ordering::SeqCst), 2);
}

/// Through the proxy, a browser's Accept-Encoding gets gzip from a gzip-only origin, and a br-only client never gets it.
#[tokio::test]
async fn browsers_get_gzip_from_a_gzip_only_origin() {
    let seen = Seen::default();
    let upstream = origin(seen.clone()).await;
    let proxy = Proxy::start(&["--upstream", &format!("http://{upstream}")]).await;
    let url = proxy.url("/gzip-only");
    let (_, h, body) = get(&url, &[("accept-encoding", "gzip, deflate, br, zstd")]).await;
    assert_eq!(
        h.get("content-encoding").map(|v| v.as_bytes()),
        Some(&b"gzip"[..]),
        "{body}"
    );
    let (_, h, body) = get(&url, &[("accept-encoding", "br")]).await;
    assert!(h.get("content-encoding").is_none(), "{body}");
    assert_eq!(body, "plain");
    assert_eq!(seen.0.load(Ordering::SeqCst), 2);
}

/// Send one raw HTTP/1.x request head (and body) and read the answer.
async fn raw_request(proxy: &Proxy, request: &str) -> String {
    let mut tcp = TcpStream::connect(proxy.addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    read_all(&mut tcp, Duration::from_secs(10)).await
}

/// A Host RFC 9112 §3.2 calls invalid (userinfo, bad grammar, empty, missing on HTTP/1.1, two) is a 400 that never reaches the upstream; HTTP/1.0 may omit it.
#[tokio::test]
async fn invalid_hosts_get_400() {
    let seen = Seen::default();
    let upstream = origin(seen.clone()).await;
    let proxy = Proxy::start(&["--upstream", &format!("http://{upstream}")]).await;
    for host in [
        "host: evil.example@app.test\r\n",
        "host: app test\r\n",
        "host: app.test/evil\r\n",
        "host: app.test:abc\r\n",
        "host:\r\n",
        "",
        "host: app.test\r\nhost: evil.test\r\n",
    ] {
        let req = format!("GET /slow/1 HTTP/1.1\r\n{host}connection: close\r\n\r\n");
        let answer = raw_request(&proxy, &req).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{host:?}: {answer:?}");
    }
    let absolute = "GET http://evil.example@app.test/slow/1 HTTP/1.1\r\n\
                    host: evil.example@app.test\r\nconnection: close\r\n\r\n";
    let answer = raw_request(&proxy, absolute).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    assert_eq!(seen.0.load(Ordering::SeqCst), 0);
    let answer = raw_request(&proxy, "GET /slow/1 HTTP/1.0\r\n\r\n").await;
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "{answer:?}"
    );
    assert_eq!(seen.0.load(Ordering::SeqCst), 1);
}

/// An h2 :authority with userinfo is a 400 (RFC 9113 §8.3.1) that never reaches the upstream.
#[tokio::test]
async fn h2_authority_with_userinfo_gets_400() {
    let seen = Seen::default();
    let upstream = origin(seen.clone()).await;
    let proxy = Proxy::start(&["--upstream", &format!("http://{upstream}")]).await;
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::get(format!("http://evil.example@{}/slow/1", proxy.addr))
        .body(Body::empty())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(seen.0.load(Ordering::SeqCst), 0);
    let req = Request::get(format!("http://{}/slow/1", proxy.addr))
        .body(Body::empty())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(seen.0.load(Ordering::SeqCst), 1);
}

/// A request transfer coding other than chunked is a 501 that never reaches the upstream; chunked alone is forwarded.
#[tokio::test]
async fn unknown_transfer_codings_get_501() {
    let seen = Seen::default();
    let upstream = origin(seen.clone()).await;
    let proxy = Proxy::start(&["--upstream", &format!("http://{upstream}")]).await;
    let body = "5\r\nhello\r\n0\r\n\r\n";
    for te in ["gzip, chunked", "deflate,chunked", "x-custom, chunked"] {
        let req = format!(
            "GET /slow/1 HTTP/1.1\r\nhost: app.test\r\ntransfer-encoding: {te}\r\n\
             connection: close\r\n\r\n{body}"
        );
        let answer = raw_request(&proxy, &req).await;
        assert!(answer.starts_with("HTTP/1.1 501"), "{te}: {answer:?}");
    }
    assert_eq!(seen.0.load(Ordering::SeqCst), 0);
    let req = format!(
        "GET /slow/1 HTTP/1.1\r\nhost: app.test\r\ntransfer-encoding: chunked\r\n\
         connection: close\r\n\r\n{body}"
    );
    let answer = raw_request(&proxy, &req).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert_eq!(seen.0.load(Ordering::SeqCst), 1);
}

async fn admin_get(proxy: &Proxy, path: &str) -> (StatusCode, String) {
    let url = format!("http://{}{path}", proxy.admin.expect("admin listener"));
    let (code, _, body) = get(&url, &[]).await;
    (code, body)
}

/// The admin listener answers /healthz, says memory-only on /readyz, and serves the library's metrics.
#[tokio::test]
async fn admin_health_readiness_and_metrics() {
    let upstream = origin(Seen::default()).await;
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--admin",
        "127.0.0.1:0",
    ])
    .await;
    assert_eq!(admin_get(&proxy, "/healthz").await.0, StatusCode::OK);
    let (code, ready) = admin_get(&proxy, "/readyz").await;
    assert_eq!(code, StatusCode::OK);
    assert!(ready.contains("\"redis\":\"memory-only\""), "{ready}");
    get(&proxy.url("/slow/1"), &[]).await;
    get(&proxy.url("/slow/1"), &[]).await;
    let (code, metrics) = admin_get(&proxy, "/metrics").await;
    assert_eq!(code, StatusCode::OK);
    let hits = metrics
        .lines()
        .find(|l| l.starts_with("herdguard_requests_total") && l.contains("outcome=\"hit\""))
        .unwrap_or_else(|| panic!("no hit counter in:\n{metrics}"));
    assert!(hits.ends_with(" 1"), "{hits}");
}

/// The admin port's /hot-keys lists a burst's key: 20 requests, one origin call, 19 waiters, its query redacted.
#[tokio::test]
async fn admin_hot_keys_lists_the_burst() {
    let seen = Seen::default();
    let upstream = origin(seen.clone()).await;
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--admin",
        "127.0.0.1:0",
        "--hot-keys",
        "8",
    ])
    .await;
    let url = proxy.url("/slow/1?ms=1000");
    let burst: Vec<_> = (0..20)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { get(&url, &[]).await })
        })
        .collect();
    for b in burst {
        assert_eq!(b.await.unwrap().0, StatusCode::OK);
    }
    assert_eq!(seen.0.load(Ordering::SeqCst), 1);
    let (code, body) = admin_get(&proxy, "/hot-keys").await;
    assert_eq!(code, StatusCode::OK);
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["window_secs"], 60);
    assert_eq!(doc["k"], 8);
    let top = |list: &str| doc[list][0].clone();
    assert_eq!(top("requests")["name"], "/slow/1?…", "{body}");
    assert_eq!(top("requests")["count"], 20);
    assert_eq!(top("requests")["overcount"], 0);
    assert_eq!(top("requests")["key"].as_str().unwrap().len(), 32);
    assert_eq!(top("origin_calls")["count"], 1);
    assert_eq!(top("waiters")["count"], 19);
    assert!(top("waited_ms")["count"].as_u64().unwrap() > 0, "{body}");
    for list in ["stale", "passes"] {
        assert_eq!(doc[list], serde_json::json!([]), "{body}");
    }
    assert!(!body.contains("ms=1000"), "{body}");
}

/// With Redis, /readyz says it is connected.
#[tokio::test]
async fn readiness_shows_redis_connected() {
    let redis = support::RedisServer::start();
    let upstream = origin(Seen::default()).await;
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--admin",
        "127.0.0.1:0",
        "--redis",
        &redis.url(),
    ])
    .await;
    let (code, ready) = admin_get(&proxy, "/readyz").await;
    assert_eq!(code, StatusCode::OK);
    assert!(ready.contains("\"redis\":\"connected\""), "{ready}");
}

/// SIGTERM under load: every request accepted before the signal gets its 200, then the proxy exits 0 and stops accepting.
#[tokio::test]
async fn graceful_shutdown_finishes_in_flight_requests() {
    const N: usize = 24;
    let seen = Seen::default();
    let upstream = origin(seen.clone()).await;
    let mut proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--shutdown-timeout",
        "20s",
    ])
    .await;
    let mut clients = Vec::new();
    for i in 0..N {
        // Distinct URLs: each is its own upstream call, in flight at once.
        let url = proxy.url(&format!("/slow/{i}?ms=800"));
        clients.push(tokio::spawn(async move { get(&url, &[]).await.0 }));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while seen.0.load(Ordering::SeqCst) < N {
        assert!(
            std::time::Instant::now() < deadline,
            "requests never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pid = proxy.child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    for c in clients {
        assert_eq!(c.await.unwrap(), StatusCode::OK);
    }
    let status = tokio::time::timeout(Duration::from_secs(20), proxy.child.wait())
        .await
        .expect("the proxy exits after draining")
        .unwrap();
    assert_eq!(status.code(), Some(0), "stderr: {:?}", proxy.stderr());
    assert!(TcpStream::connect(proxy.addr).await.is_err());
}

/// `--log-format json` writes one access-log object per request with method, path, status, Cache-Status and timings.
#[tokio::test]
async fn access_log_has_the_fields() {
    let upstream = origin(Seen::default()).await;
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--log-format",
        "json",
    ])
    .await;
    get(&proxy.url("/slow/7?ms=1"), &[]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let entry = loop {
        let found = proxy
            .stderr()
            .into_iter()
            .find(|l| l.contains("herdguard::access"));
        if let Some(l) = found {
            break l;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no access log line: {:?}",
            proxy.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let v: serde_json::Value = serde_json::from_str(&entry).expect("one JSON object per line");
    assert_eq!(v["method"], "GET", "{entry}");
    assert_eq!(v["path"], "/slow/7", "{entry}");
    assert_eq!(v["status"], 200, "{entry}");
    assert!(
        v["cache_status"].as_str().unwrap().contains("stored"),
        "{entry}"
    );
    assert!(v["upstream_ms"].as_f64().is_some(), "{entry}");
    assert!(
        v["total_ms"].as_f64().unwrap() >= v["upstream_ms"].as_f64().unwrap(),
        "{entry}"
    );
}

/// `--access-log PATH` appends one text line per request to the file (hits too), and `off` writes none anywhere.
#[tokio::test]
async fn access_log_goes_to_a_file_or_nowhere() {
    let upstream = origin(Seen::default()).await;
    let dir = std::env::temp_dir().join(format!("herdguard-access-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("access.log");
    let _ = std::fs::remove_file(&path);
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--access-log",
        path.to_str().unwrap(),
    ])
    .await;
    get(&proxy.url("/slow/3?ms=1"), &[]).await;
    get(&proxy.url("/slow/3?ms=1"), &[]).await;
    // Written within the flush interval (1 s), not at exit.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.lines().count() >= 2 {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "log so far: {text:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].contains(" GET /slow/3 200 "), "{text}");
    assert!(lines[0].contains("stored"), "{text}");
    assert!(lines[1].contains("hit"), "{text}");
    assert!(
        !proxy.stderr().iter().any(|l| l.contains("/slow/3")),
        "the file log is not also written to stderr: {:?}",
        proxy.stderr()
    );

    let quiet = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--access-log",
        "off",
    ])
    .await;
    get(&quiet.url("/slow/4?ms=1"), &[]).await;
    // Longer than the flush interval: a line would have been written by now.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !quiet.stderr().iter().any(|l| l.contains("/slow/4")),
        "{:?}",
        quiet.stderr()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Options come from HERDGUARD_* variables and the --config file when no flag sets them, sizes and durations as people write them.
#[tokio::test]
async fn env_and_config_file_set_options() {
    let upstream = origin(Seen::default()).await;
    let dir = std::env::temp_dir().join(format!("herdguard-proxy-conf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("proxy.toml");
    std::fs::write(
        &conf,
        "purge-token = \"from-file\"\nupstream-timeout = \"5s\"\nmax-body-bytes = \"1MiB\"\n",
    )
    .unwrap();
    let proxy = Proxy::start_env(
        &["--config", conf.to_str().unwrap()],
        &[
            ("HERDGUARD_UPSTREAM", &format!("http://{upstream}")),
            ("HERDGUARD_CAPACITY_BYTES", "64MiB"),
            ("HERDGUARD_HEADER_TIMEOUT", "2500ms"),
        ],
    )
    .await;
    get(&proxy.url("/slow/1"), &[]).await;
    let purge = Request::builder()
        .method("PURGE")
        .uri(proxy.url("/slow/1"))
        .header("x-purge-token", "from-file")
        .body(Body::empty())
        .unwrap();
    let resp = client().request(purge).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let _ = std::fs::remove_dir_all(&dir);
}

/// With --tls-cert/--tls-key, a TLS client that offers h2 gets HTTP/2 by ALPN, and the upstream is told the proto is https.
#[tokio::test]
async fn tls_clients_get_h2_by_alpn() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let certs = Certs::make();
    let upstream = origin(Seen::default()).await;
    let (cert, key) = (certs.path("server.crt"), certs.path("server.key"));
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ])
    .await;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(certs.path("ca.crt")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(b"h2".as_ref()));
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::get("https://localhost/echo")
        .body(Body::empty())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.version(), axum::http::Version::HTTP_2);
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(line(&body, "xfp"), "https", "{body}");
}

/// PURGE answers what happened: 200 when Redis took it, 503 "this instance only" when Redis is unreachable.
#[tokio::test]
async fn purge_status_says_how_far_the_purge_reached() {
    let mut redis = support::RedisServer::start();
    let upstream = origin(Seen::default()).await;
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--redis",
        &redis.url(),
        "--purge-token",
        "t",
    ])
    .await;
    let purge = || async {
        let req = Request::builder()
            .method("PURGE")
            .uri(proxy.url("/slow/1"))
            .header("x-purge-token", "t")
            .body(Body::empty())
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(20), client().request(req))
            .await
            .expect("answered within 20 s")
            .unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    get(&proxy.url("/slow/1"), &[]).await;
    let (status, body) = purge().await;
    assert_eq!(status, StatusCode::OK, "{body}");
    redis.stop();
    let (status, body) = purge().await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("this instance only"), "{body}");
}
