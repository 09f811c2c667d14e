//! Never a wrong answer: who may receive a response, proved over real
//! loopback HTTP through the reverse proxy example, against an echo origin
//! that reports whose request it answered, and (for the cross-instance
//! cases) real redis-server processes.

use herdguard_cli::app as proxy;
use herdguard_testkit as support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use bytes::Bytes;
use herdguard::{CacheLayer, RedisOptions};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::echo::{encode, Echo, Seen};
use support::RedisServer;

/// A reverse proxy in front of `echo`, on a loopback port.
async fn proxy(echo: &Echo, layer: CacheLayer) -> SocketAddr {
    let config = proxy::Config {
        upstream: echo.url().parse().expect("echo url"),
        purge_token: None,
    };
    let app = proxy::app(config, layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("proxy serves");
    });
    addr
}

fn redis_layer(redis: &RedisServer) -> CacheLayer {
    CacheLayer::builder()
        .redis(RedisOptions::new(redis.url()).namespace("iso"))
        .build()
        .expect("valid layer")
}

/// A path on the echo origin with these response rules.
fn path(name: &str, cc: &str, vary: &str, extra: &str) -> String {
    format!("/{name}?cc={}&vary={}{extra}", encode(cc), encode(vary))
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn seen(&self) -> Seen {
        Seen::parse(&self.body).unwrap_or_else(|| {
            panic!(
                "not an echo answer ({}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn cache_status(&self) -> &str {
        self.headers
            .get("cache-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

async fn get(
    client: &Client<HttpConnector, Body>,
    proxy: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Answer {
    let mut r = Request::builder()
        .method(Method::GET)
        .uri(format!("http://{proxy}{path}"));
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        r = r.header("host", "example.test");
    }
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let resp = client
        .request(r.body(Body::empty()).expect("valid request"))
        .await
        .expect("proxy answers");
    let (parts, body) = resp.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.expect("body").to_bytes(),
    }
}

fn client() -> Client<HttpConnector, Body> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Send raw bytes and read the whole answer (the request says `Connection: close`).
async fn raw(proxy: SocketAddr, request: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(proxy)
        .await
        .expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the proxy answers within 10 s")
        .expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

/// Concurrent GETs of one URL, one header set each.
async fn burst(
    proxy: SocketAddr,
    path: &str,
    each: Vec<Vec<(&'static str, String)>>,
) -> Vec<Answer> {
    let client = client();
    let tasks = each.into_iter().map(|headers| {
        let client = client.clone();
        let path = path.to_owned();
        async move {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            get(&client, proxy, &path, &h).await
        }
    });
    futures_util::future::join_all(tasks).await
}

// ---------------------------------------------------------------------------
// Six ways one user could be served another's answer
// ---------------------------------------------------------------------------

/// A headerless answer made for one user's cookie never reaches the other users coalesced behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_waiters_never_get_an_answer_the_cache_could_not_store() {
    let echo = Echo::start().await;
    let proxy = proxy(&echo, CacheLayer::new()).await;
    let users = ["alice", "bob", "carol", "dave"];
    let each = users
        .iter()
        .map(|u| vec![("cookie", format!("user={u}"))])
        .collect();
    let answers = burst(proxy, "/me?delay=400", each).await;
    for (user, a) in users.iter().zip(&answers) {
        assert_eq!(a.status, StatusCode::OK);
        let seen = a.seen();
        assert_eq!(
            seen.cookie.as_deref(),
            Some(&*format!("user={user}")),
            "{}",
            a.cache_status()
        );
    }
    assert_eq!(
        echo.calls(),
        4,
        "each user's request reached the origin once"
    );
}

/// Vary: Cookie stored by one instance is honoured by a second instance on the same Redis that starts afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_names_reach_an_instance_that_never_saw_the_url() {
    let redis = RedisServer::start();
    let echo = Echo::start().await;
    let c = client();
    let p = path("vary-cookie", "max-age=60", "Cookie", "");
    let a = proxy(&echo, redis_layer(&redis)).await;
    let first = get(&c, a, &p, &[("cookie", "user=alice")]).await;
    assert_eq!(first.seen().cookie.as_deref(), Some("user=alice"));
    // Let the fenced write land in Redis before the second instance starts.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let b = proxy(&echo, redis_layer(&redis)).await;
    let bob = get(&c, b, &p, &[("cookie", "user=bob")]).await;
    assert_eq!(
        bob.seen().cookie.as_deref(),
        Some("user=bob"),
        "{}",
        bob.cache_status()
    );
    // Variants coexist: alice is still a hit, on either instance.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c2 = client();
    let alice_b = get(&c2, b, &p, &[("cookie", "user=alice")]).await;
    assert_eq!(alice_b.seen().cookie.as_deref(), Some("user=alice"));
    assert!(
        alice_b.cache_status().contains("hit"),
        "{}",
        alice_b.cache_status()
    );
    let bob_a = get(&c2, a, &p, &[("cookie", "user=bob")]).await;
    assert_eq!(bob_a.seen().cookie.as_deref(), Some("user=bob"));
    assert_eq!(echo.calls(), 2, "one origin call per variant");
}

/// An instance that never saw a varied URL finds another request's stored variant in two Redis lookups, without the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_instance_finds_its_variant_in_two_lookups() {
    let redis = RedisServer::start();
    let echo = Echo::start().await;
    let c = client();
    let p = path("vary-rt", "max-age=60", "Cookie", "");
    let a = proxy(&echo, redis_layer(&redis)).await;
    get(&c, a, &p, &[("cookie", "user=alice")]).await;
    get(&c, a, &p, &[("cookie", "user=bob")]).await;
    assert_eq!(echo.calls(), 2);
    // Let the background writes of the variant copies land.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The base key now holds bob's variant (the latest fill): alice's
    // request learns the names there and follows them to her own.
    let fresh = proxy(&echo, redis_layer(&redis)).await;
    let monitor = support::Monitor::start(&redis);
    let alice = get(&c, fresh, &p, &[("cookie", "user=alice")]).await;
    assert_eq!(alice.seen().cookie.as_deref(), Some("user=alice"));
    assert!(
        alice.cache_status().contains("hit"),
        "{}",
        alice.cache_status()
    );
    let lookups = monitor
        .client_commands()
        .iter()
        .filter(|c| *c == "EVALSHA")
        .count();
    assert_eq!(lookups, 2, "the base key, then the variant it names");
    assert_eq!(echo.calls(), 2);
}

/// A must-revalidate answer to one bearer token is never a hit for another token; the same token still hits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_reused_only_with_public_or_s_maxage() {
    let echo = Echo::start().await;
    let proxy = proxy(&echo, CacheLayer::new()).await;
    let c = client();
    let private = path("account", "max-age=60, must-revalidate", "", "");
    let alice = get(&c, proxy, &private, &[("authorization", "Bearer alice")]).await;
    assert_eq!(alice.seen().authorization.as_deref(), Some("Bearer alice"));
    let bob = get(&c, proxy, &private, &[("authorization", "Bearer bob")]).await;
    assert_eq!(
        bob.seen().authorization.as_deref(),
        Some("Bearer bob"),
        "{}",
        bob.cache_status()
    );
    let again = get(&c, proxy, &private, &[("authorization", "Bearer alice")]).await;
    assert_eq!(again.seen().authorization.as_deref(), Some("Bearer alice"));
    assert!(
        again.cache_status().contains("hit"),
        "{}",
        again.cache_status()
    );
    assert_eq!(echo.calls(), 2);

    // `public` says the answer is the same for every credential.
    let public = path("catalog", "public, max-age=60", "", "");
    get(&c, proxy, &public, &[("authorization", "Bearer alice")]).await;
    let shared = get(&c, proxy, &public, &[("authorization", "Bearer bob")]).await;
    assert!(
        shared.cache_status().contains("hit"),
        "{}",
        shared.cache_status()
    );
    assert_eq!(echo.calls(), 3);
}

/// A GET with a body reaches the origin untouched, body and framing together, and is not cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_with_a_body_bypasses_the_cache_untouched() {
    let echo = Echo::start().await;
    let proxy = proxy(&echo, CacheLayer::new()).await;
    let p = path("search", "max-age=60", "", "");
    let request = format!(
        "GET {p} HTTP/1.1\r\nHost: example.test\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    );
    let answer = raw(proxy, &request).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#""body":"hello""#), "{answer}");
    assert!(answer.contains(r#""content-length":"5""#), "{answer}");
    assert!(answer.contains("detail=request-body"), "{answer}");
    // Nothing was stored: the next plain GET goes to the origin.
    let c = client();
    let next = get(&c, proxy, &p, &[]).await;
    assert_eq!(next.seen().body, "");
    assert_eq!(echo.calls(), 2);
}

/// A chunked GET bypasses the cache too, its body reaching the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_get_bypasses_the_cache_with_its_body() {
    let echo = Echo::start().await;
    let proxy = proxy(&echo, CacheLayer::new()).await;
    let p = path("chunked", "max-age=60", "", "");
    let request = format!(
        "GET {p} HTTP/1.1\r\nHost: example.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    );
    let answer = raw(proxy, &request).await;
    assert!(answer.contains(r#""body":"hello""#), "{answer}");
    assert!(answer.contains("detail=request-body"), "{answer}");
}

/// Requests the cache builds for the origin carry no body framing headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuilt_origin_requests_carry_no_body_framing() {
    let echo = Echo::start().await;
    let proxy = proxy(&echo, CacheLayer::new()).await;
    let p = path("framing", "max-age=60", "", "");
    let request = format!(
        "GET {p} HTTP/1.1\r\nHost: example.test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let answer = raw(proxy, &request).await;
    assert!(
        answer.contains("fwd=uri-miss"),
        "went through the cache: {answer}"
    );
    assert!(answer.contains(r#""content-length":null"#), "{answer}");
}

/// The host in the key is the host the origin is told, port included: shop.test:1337 never answers shop.test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_host_is_what_the_origin_is_told() {
    let echo = Echo::start().await;
    let proxy = proxy(&echo, CacheLayer::new()).await;
    let c = client();
    let p = path("links", "max-age=60", "", "");
    let with_port = get(&c, proxy, &p, &[("host", "Shop.Test:1337")]).await;
    assert_eq!(
        with_port.seen().forwarded_host.as_deref(),
        Some("shop.test:1337")
    );
    assert_eq!(with_port.seen().host.as_deref(), Some("shop.test:1337"));
    let without = get(&c, proxy, &p, &[("host", "shop.test")]).await;
    assert_eq!(
        without.seen().forwarded_host.as_deref(),
        Some("shop.test"),
        "{}",
        without.cache_status()
    );
    let again = get(&c, proxy, &p, &[("host", "SHOP.test:1337")]).await;
    assert!(
        again.cache_status().contains("hit"),
        "{}",
        again.cache_status()
    );
    assert_eq!(
        again.seen().forwarded_host.as_deref(),
        Some("shop.test:1337")
    );
    assert_eq!(echo.calls(), 2);
}

/// An absolute-form target whose authority disagrees with Host is refused with 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_target_disagreeing_with_host_is_a_400() {
    let echo = Echo::start().await;
    let proxy = proxy(&echo, CacheLayer::new()).await;
    let answer = raw(
        proxy,
        "GET http://other.test/x HTTP/1.1\r\nHost: shop.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert_eq!(echo.calls(), 0);
    let agreeing = raw(
        proxy,
        "GET http://Shop.test/x HTTP/1.1\r\nHost: shop.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(agreeing.starts_with("HTTP/1.1 200"), "{agreeing}");
}

/// Headers named in Connection are dropped before the key: they cannot file an answer under a variant the origin never saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_named_headers_never_select_a_variant() {
    let echo = Echo::start().await;
    let proxy = proxy(&echo, CacheLayer::new()).await;
    let c = client();
    let p = path("negotiated", "max-age=60", "Accept", "");
    let hop = get(
        &c,
        proxy,
        &p,
        &[("accept", "application/json"), ("connection", "accept")],
    )
    .await;
    assert_eq!(hop.seen().accept, None, "the origin never saw Accept");
    let json = get(&c, proxy, &p, &[("accept", "application/json")]).await;
    assert_eq!(
        json.seen().accept.as_deref(),
        Some("application/json"),
        "{}",
        json.cache_status()
    );
}

// ---------------------------------------------------------------------------
// Waiters of uncacheable answers
// ---------------------------------------------------------------------------

/// N waiters of an answer that may not be stored (no freshness information) make exactly N origin calls, each with its own headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_an_uncacheable_answer_each_call_the_origin() {
    let echo = Echo::start().await;
    let proxy = proxy(&echo, CacheLayer::new()).await;
    let p = "/session?delay=1000";
    let n = 6;
    let each = (0..n)
        .map(|i| vec![("cookie", format!("user=u{i}"))])
        .collect();
    let answers = burst(proxy, p, each).await;
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(a.seen().cookie.as_deref(), Some(&*format!("user=u{i}")));
    }
    assert_eq!(echo.calls(), n);
}

/// With the opt-in, waiters of an answer that may not be stored share the one origin call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_opt_in_waiters_share_one_uncacheable_answer() {
    let echo = Echo::start().await;
    let layer = CacheLayer::builder()
        .share_uncacheable_with_waiters(true)
        .build()
        .expect("valid layer");
    let proxy = proxy(&echo, layer).await;
    let n = 6;
    let each = (0..n).map(|_| vec![("x-any", "1".to_owned())]).collect();
    let answers = burst(proxy, "/same-for-all?delay=1000", each).await;
    let first = answers[0].seen().call;
    assert!(answers.iter().all(|a| a.seen().call == first));
    assert_eq!(echo.calls(), 1);
}

// ---------------------------------------------------------------------------
// One request cannot turn caching off for others
// ---------------------------------------------------------------------------

async fn redis_exists(redis: &RedisServer, key: &str) -> bool {
    let mut conn = redis.connection().await;
    let n: i64 = deadpool_redis::redis::cmd("EXISTS")
        .arg(key)
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    n == 1
}

/// Whether `key` holds the hit-for-pass marker (entry version 4's magic and
/// version, then `pass`).
async fn is_pass_marker(redis: &RedisServer, key: &str) -> bool {
    let mut conn = redis.connection().await;
    let v: Option<Vec<u8>> = deadpool_redis::redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .expect("GET");
    v.as_deref() == Some(b"HG\x04pass")
}

/// Wait (bounded) until the origin has answered `n` calls.
async fn until_calls(echo: &Echo, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while echo.calls() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "origin calls stuck at {}",
            echo.calls()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A Set-Cookie answer to one request's refresh leaves the stored entry in place and sets no pass marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_cookie_answer_keeps_the_entry_for_everyone() {
    let redis = RedisServer::start();
    let echo = Echo::start().await;
    let layer = redis_layer(&redis);
    let proxy = proxy(&echo, layer.clone()).await;
    let c = client();
    let p = path(
        "shop",
        "max-age=1, stale-while-revalidate=60",
        "",
        "&setcookie=if-cookie",
    );
    let first = get(&c, proxy, &p, &[]).await;
    assert!(
        first.cache_status().contains("stored"),
        "{}",
        first.cache_status()
    );
    // Redis expiry runs on real time: let freshness (1 s) end.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Stale: served at once, and its refresh carries this request's cookie.
    let cookie = get(&c, proxy, &p, &[("cookie", "user=alice")]).await;
    assert!(
        cookie.cache_status().contains("detail=stale"),
        "{}",
        cookie.cache_status()
    );
    until_calls(&echo, 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let key = layer
        .key_for(
            &Request::get(&p)
                .header("host", "example.test")
                .body(())
                .expect("request"),
        )
        .to_hex();
    assert!(
        !is_pass_marker(&redis, &format!("iso:{{{key}}}:v")).await,
        "no pass marker"
    );
    assert!(
        redis_exists(&redis, &format!("iso:{{{key}}}:v")).await,
        "entry kept"
    );
    let next = get(&c, proxy, &p, &[]).await;
    assert!(
        !next.cache_status().contains("hit-for-pass"),
        "{}",
        next.cache_status()
    );
    assert!(
        next.cache_status().starts_with("herdguard; hit"),
        "{}",
        next.cache_status()
    );
}

/// An answer with no freshness information is uncacheable for everyone: it sets the pass marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_without_freshness_sets_the_pass_marker() {
    let redis = RedisServer::start();
    let echo = Echo::start().await;
    let layer = redis_layer(&redis);
    let proxy = proxy(&echo, layer.clone()).await;
    let c = client();
    get(&c, proxy, "/plain", &[]).await;
    let key = layer
        .key_for(
            &Request::get("/plain")
                .header("host", "example.test")
                .body(())
                .expect("request"),
        )
        .to_hex();
    assert!(is_pass_marker(&redis, &format!("iso:{{{key}}}:v")).await);
    let next = get(&c, proxy, "/plain", &[]).await;
    assert!(
        next.cache_status().contains("hit-for-pass"),
        "{}",
        next.cache_status()
    );
}

// ---------------------------------------------------------------------------
// Randomized: no response carries another request's identity
// ---------------------------------------------------------------------------

/// SplitMix64: a seeded, dependency-free generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

const CCS: [&str; 7] = [
    "max-age=60",
    "",
    "no-store",
    "private, max-age=60",
    "max-age=60, must-revalidate",
    "public, max-age=60",
    "s-maxage=60",
];
const VARYS: [&str; 5] = ["", "Cookie", "Accept", "Cookie, Accept", "Authorization"];

/// One URL's rules, and what may be shared between requests to it.
#[derive(Clone)]
struct Url {
    path: String,
    cc: &'static str,
    vary: &'static str,
    set_cookie: bool,
}

impl Url {
    /// Whether the answer made for `made` could be stored for everyone.
    fn storable(&self, made: &Seen) -> bool {
        (self.cc.contains("max-age") || self.cc.contains("s-maxage"))
            && !self.cc.contains("no-store")
            && !self.cc.contains("private")
            // The origin sets a cookie only for requests that sent one.
            && !(self.set_cookie && made.cookie.is_some())
    }

    fn varies(&self, name: &str) -> bool {
        self.vary.to_ascii_lowercase().contains(name)
    }

    /// Whether an answer made for `made` may be served to `asked`.
    fn may_share(&self, made: &Seen, asked: &Ident) -> bool {
        let same = |a: &Option<String>, b: &Option<String>| a == b;
        let cookie = same(&made.cookie, &asked.cookie);
        let accept = same(&made.accept, &asked.accept);
        let auth = same(&made.authorization, &asked.authorization);
        if cookie && accept && auth {
            return true;
        }
        if !self.storable(made) {
            return false;
        }
        let cookie_ok = cookie || !self.varies("cookie");
        let accept_ok = accept || !self.varies("accept");
        let auth_ok = auth
            || (made.authorization.is_some() == asked.authorization.is_some()
                && !self.varies("authorization")
                && (self.cc.contains("public") || self.cc.contains("s-maxage")));
        cookie_ok && accept_ok && auth_ok
    }
}

#[derive(Clone, Debug)]
struct Ident {
    cookie: Option<String>,
    authorization: Option<String>,
    accept: Option<String>,
}

async fn hammer(proxies: &[SocketAddr], seed: u64, rounds: usize, per_round: usize) -> usize {
    let mut rng = Rng(seed);
    let mut urls = Vec::new();
    for (i, cc) in CCS.iter().enumerate() {
        for (j, vary) in VARYS.iter().enumerate() {
            for set_cookie in [false, true] {
                let extra = format!(
                    "&delay=30{}",
                    if set_cookie {
                        "&setcookie=if-cookie"
                    } else {
                        ""
                    }
                );
                urls.push(Url {
                    path: path(&format!("r{seed}-{i}-{j}"), cc, vary, &extra),
                    cc,
                    vary,
                    set_cookie,
                });
            }
        }
    }
    let cookies = [None, Some("user=alice"), Some("user=bob")];
    let auths = [None, Some("Bearer alice"), Some("Bearer bob")];
    let accepts = [None, Some("application/json"), Some("text/html")];
    let client = client();
    let mut checked = 0;
    for _ in 0..rounds {
        // Each round hits a few URLs at once, so requests coalesce.
        let hot: Vec<Url> = (0..3).map(|_| rng.pick(&urls).clone()).collect();
        let mut batch = Vec::new();
        for _ in 0..per_round {
            let url = rng.pick(&hot).clone();
            let ident = Ident {
                cookie: rng.pick(&cookies).map(str::to_owned),
                authorization: rng.pick(&auths).map(str::to_owned),
                accept: rng.pick(&accepts).map(str::to_owned),
            };
            let proxy = *rng.pick(proxies);
            let client = client.clone();
            batch.push(async move {
                let mut h: Vec<(&str, &str)> = Vec::new();
                if let Some(v) = &ident.cookie {
                    h.push(("cookie", v));
                }
                if let Some(v) = &ident.authorization {
                    h.push(("authorization", v));
                }
                if let Some(v) = &ident.accept {
                    h.push(("accept", v));
                }
                let answer = get(&client, proxy, &url.path, &h).await;
                (url, ident, answer)
            });
        }
        for (url, ident, answer) in futures_util::future::join_all(batch).await {
            let made = answer.seen();
            assert_eq!(made.path, url.path);
            assert!(
                url.may_share(&made, &ident),
                "{} (cc={:?} vary={:?} set-cookie={}) made for {made:?} served to {ident:?}: {}",
                url.path,
                url.cc,
                url.vary,
                url.set_cookie,
                answer.cache_status()
            );
            checked += 1;
        }
    }
    checked
}

/// Random concurrent mixes of cookies, credentials and Accept on one layer never leak an identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_mixes_on_one_layer_never_leak_an_identity() {
    let echo = Echo::start().await;
    let p = proxy(&echo, CacheLayer::new()).await;
    let checked = tokio::time::timeout(Duration::from_secs(120), hammer(&[p], 11, 40, 24))
        .await
        .expect("bounded in time");
    assert_eq!(checked, 40 * 24);
}

/// The same on two layers sharing one Redis, requests spread over both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_mixes_on_two_layers_on_redis_never_leak_an_identity() {
    let redis = RedisServer::start();
    let echo = Echo::start().await;
    let a = proxy(&echo, redis_layer(&redis)).await;
    let b = proxy(&echo, redis_layer(&redis)).await;
    let checked = tokio::time::timeout(Duration::from_secs(120), hammer(&[a, b], 23, 40, 24))
        .await
        .expect("bounded in time");
    assert_eq!(checked, 40 * 24);
}
