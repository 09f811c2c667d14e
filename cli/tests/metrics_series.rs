//! What a running `herdguard proxy` shows on `/metrics`, read over real
//! loopback: the shipped Grafana dashboard (dashboards/herdguard.json) asks
//! only for series the proxy registers, and no series carries anything a
//! request chose (a key, a URL, a header) as a label.

use herdguard_testkit as support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, Uri};
use axum::Router;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::proxy_process::ProxyProcess;
use support::RedisServer;

#[path = "metrics_series/promql.rs"]
mod promql;
use promql::{check_ref, dashboard_queries, label_values, metric_refs};

// ---------------------------------------------------------------------------
// The proxy process and its /metrics
// ---------------------------------------------------------------------------

/// A running `herdguard proxy` with an admin listener; killed on drop.
struct Proxy {
    _process: ProxyProcess,
    addr: SocketAddr,
    admin: SocketAddr,
}

impl Proxy {
    async fn start(args: &[&str]) -> Self {
        let mut all = vec!["--admin", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let process = ProxyProcess::start(env!("CARGO_BIN_EXE_herdguard"), &all).await;
        Self {
            addr: process.listen,
            admin: process.admin.expect("an admin port"),
            _process: process,
        }
    }

    async fn metrics(&self) -> Exposition {
        let (code, _, body) = get(&format!("http://{}/metrics", self.admin), &[]).await;
        assert_eq!(code, StatusCode::OK, "{body}");
        Exposition::parse(&body)
    }
}

async fn get(url: &str, headers: &[(&str, &str)]) -> (StatusCode, HeaderMap, String) {
    let mut r = Request::get(url);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let client = Client::builder(TokioExecutor::new()).build_http();
    let resp = tokio::time::timeout(
        Duration::from_secs(20),
        client.request(r.body(Body::empty()).unwrap()),
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

/// One sample line of the Prometheus text format.
#[derive(Debug)]
struct Series {
    name: String,
    labels: Vec<(String, String)>,
}

/// A parsed `/metrics` page: every sample, and each family's `# TYPE`.
#[derive(Debug)]
struct Exposition {
    text: String,
    series: Vec<Series>,
    types: BTreeMap<String, String>,
}

impl Exposition {
    fn parse(text: &str) -> Self {
        let mut series = Vec::new();
        let mut types = BTreeMap::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut w = rest.split_whitespace();
                let (name, kind) = (w.next().unwrap(), w.next().unwrap());
                types.insert(name.to_owned(), kind.to_owned());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            series.push(parse_sample(line));
        }
        Self {
            text: text.to_owned(),
            series,
            types,
        }
    }

    /// The kind of the series name as a query sees it: `counter`, `gauge`,
    /// or `histogram_part` for a histogram's `_bucket`, `_sum`, `_count`
    /// (a histogram's bare name is no series at all).
    fn kind_of(&self, name: &str) -> Option<&'static str> {
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                if matches!(
                    self.types.get(base).map(String::as_str),
                    Some("histogram" | "summary")
                ) {
                    // A summary has no buckets.
                    if suffix == "_bucket" && self.types[base] == "summary" {
                        return None;
                    }
                    return Some("histogram_part");
                }
            }
        }
        match self.types.get(name).map(String::as_str) {
            Some("counter") => Some("counter"),
            Some("gauge") => Some("gauge"),
            _ => None,
        }
    }

    /// Each series once: its family's name and its labels but a bucket's bound.
    fn label_sets(&self) -> BTreeSet<(String, Vec<(String, String)>)> {
        self.series
            .iter()
            .map(|s| {
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|x| {
                        s.name
                            .strip_suffix(x)
                            .filter(|b| self.types.contains_key(*b))
                    })
                    .unwrap_or(&s.name);
                let labels = s
                    .labels
                    .iter()
                    .filter(|(k, _)| k != "le" && k != "quantile")
                    .cloned()
                    .collect();
                (family.to_owned(), labels)
            })
            .collect()
    }

    /// Every sample of the series name `name`.
    fn of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Series> + 'a {
        self.series.iter().filter(move |s| s.name == name)
    }
}

/// `name{a="x",b="y"} value` (label values unescaped).
fn parse_sample(line: &str) -> Series {
    let name_end = line
        .find(['{', ' '])
        .unwrap_or_else(|| panic!("no value: {line}"));
    let name = line[..name_end].to_owned();
    let mut labels = Vec::new();
    if line[name_end..].starts_with('{') {
        let mut chars = line[name_end + 1..].chars();
        loop {
            let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
            let key = key.trim_start_matches(',').trim().to_owned();
            assert_eq!(chars.next(), Some('"'), "{line}");
            let mut value = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some('n') => value.push('\n'),
                        Some(other) => value.push(other),
                        None => panic!("{line}"),
                    },
                    '"' => break,
                    c => value.push(c),
                }
            }
            labels.push((key, value));
            match chars.next() {
                Some(',') if chars.clone().next() == Some('}') => break,
                Some(',') => {}
                Some('}') => break,
                other => panic!("{other:?} after a label in {line}"),
            }
        }
    }
    Series { name, labels }
}

/// Every query in dashboards/herdguard.json names a series that a running proxy (Redis, origin budget, cluster budget, breaker, access log) registers: histograms by their `_bucket`/`_sum`/`_count`, no gauge under rate(), every fixed label value one it shows.
#[tokio::test]
async fn dashboard_queries_name_registered_metrics() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../dashboards/herdguard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the dashboard"))
            .expect("the dashboard is JSON");
    let queries = dashboard_queries(&dashboard);
    assert!(
        queries.len() >= 10,
        "only {} queries in {path}",
        queries.len()
    );

    let redis = RedisServer::start();
    let origin = origin().await;
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{origin}"),
        "--redis",
        &redis.url(),
        "--origin-budget",
        "4",
        "--cluster-origin-budget",
        "8",
        "--breaker-failures",
        "3",
        "--access-log",
        "stderr",
    ])
    .await;
    // Everything is registered at 0 when the proxy starts: no request first.
    let exposition = proxy.metrics().await;

    let mut problems = Vec::new();
    let mut checked = BTreeSet::new();
    for (place, expr) in &queries {
        let refs = match label_values(expr) {
            Some((metric, label)) => {
                let mut refs = metric_refs(&metric);
                for r in &mut refs {
                    r.matchers.push((label.clone(), "=~".into(), "$".into()));
                }
                refs
            }
            None => metric_refs(expr),
        };
        if refs.is_empty() {
            problems.push(format!("{place}: no metric in {expr}"));
        }
        for r in refs {
            for p in check_ref(&r, &exposition) {
                problems.push(format!("{place}: {p}\n    in {expr}"));
            }
            checked.insert(r.name);
        }
    }
    assert!(
        problems.is_empty(),
        "the dashboard names what the proxy does not register:\n{}\n\nregistered:\n{}",
        problems.join("\n"),
        exposition
            .types
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(checked.len() >= 10, "{checked:?}");
    drop(proxy);
}

// ---------------------------------------------------------------------------
// Labels: nothing a request chose
// ---------------------------------------------------------------------------

/// In every hostile request: found anywhere on /metrics, a request leaked into it.
const CANARY: &str = "zqcanary";

/// An origin with one answer of each kind the cache counts apart: stored,
/// uncacheable for one reason or another, slow (so requests coalesce),
/// failing. Everything it is asked is cacheable unless the path says otherwise.
async fn origin() -> SocketAddr {
    async fn answer(uri: Uri) -> axum::response::Response {
        let path = uri.path();
        let mut r = axum::response::Response::builder();
        let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
        r = match first {
            "cookie" => r
                .header("cache-control", "max-age=60")
                .header("set-cookie", "s=1"),
            "private" => r.header("cache-control", "private, max-age=60"),
            "nostore" => r.header("cache-control", "no-store"),
            "varystar" => r.header("cache-control", "max-age=60").header("vary", "*"),
            "nofresh" => r,
            "fail" => r.status(StatusCode::SERVICE_UNAVAILABLE),
            "slow" => {
                // Long enough for the whole burst to arrive and wait on it.
                tokio::time::sleep(Duration::from_millis(500)).await;
                r.header("cache-control", "max-age=60")
            }
            _ => r
                .header("cache-control", "max-age=60")
                .header("vary", "x-canary"),
        };
        r.body(Body::from(format!("answer for {path}"))).unwrap()
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().fallback(answer);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// One request written as raw bytes (any Host, any header text), the
/// answer read to its end; bounded.
async fn raw(addr: SocketAddr, head: &str) -> String {
    let exchange = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer).await;
        String::from_utf8_lossy(&answer).into_owned()
    };
    tokio::time::timeout(Duration::from_secs(20), exchange)
        .await
        .expect("answered within 20 s")
}

/// A path segment of `len` characters that no two calls share.
fn noise(seed: u64, len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~";
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            // xorshift: reproducible, no dependency.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

/// The label names a series may carry, and for each the values it may take
/// (`None`: checked by shape below).
fn allowed_values(label: &str) -> Option<Option<&'static [&'static str]>> {
    const CACHE: &[&str] = &["herdguard"];
    const OUTCOME: &[&str] = &["hit", "stale", "miss", "coalesced", "bypass", "error"];
    const REASON: &[&str] = &[
        // herdguard_not_stored_total
        "set-cookie",
        "private",
        "no-store",
        "no-freshness",
        "too-large",
        "vary-star",
        "authorization",
        "status",
        "other",
        // herdguard_origin_refused_total
        "busy",
        "down",
        // herdguard_refreshes_skipped_total
        "budget",
        "breaker",
        "backoff",
        // herdguard_own_calls_total (too-large is above)
        "method",
        "request",
        "request-body",
        "unkeyed",
        "hit-for-pass",
        "wait-timeout",
        "stream-window-passed",
        "overloaded",
        "error-not-shared",
        "uncacheable",
        "vary-miss",
    ];
    const RESULT: &[&str] = &["acquired", "contended", "expired_mid_work"];
    const CLASS: &[&str] = &["connection", "timeout", "role", "oom", "foreign", "other"];
    const TO: &[&str] = &["open", "closed"];
    Some(match label {
        "cache" => Some(CACHE),
        "outcome" => Some(OUTCOME),
        "reason" => Some(REASON),
        "result" => Some(RESULT),
        "class" => Some(CLASS),
        "to" => Some(TO),
        // A Redis operation's name (a `&'static str` of the code), a bucket bound.
        "op" | "le" | "quantile" => None,
        _ => return None,
    })
}

/// After hostile traffic (long random paths, tokens in queries, odd Host headers, forwarding and other headers with meta characters, hundreds of distinct URLs, unsafe methods), every series on /metrics has only known label names and values from a bounded set, and no request text appears anywhere on the page.
#[tokio::test]
async fn no_label_carries_request_text() {
    let redis = RedisServer::start();
    let origin = origin().await;
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{origin}"),
        "--redis",
        &redis.url(),
        "--origin-budget",
        "16",
        "--breaker-failures",
        "3",
    ])
    .await;
    let before = proxy.metrics().await;
    assert!(
        !before.text.to_ascii_lowercase().contains(CANARY),
        "{}",
        before.text
    );

    // Many distinct URLs, each kind of answer, long random paths and
    // queries with tokens; through a plain client.
    let kinds = [
        "", "cookie", "private", "nostore", "varystar", "nofresh", "fail",
    ];
    let mut sent = 0u64;
    for i in 0..280u64 {
        let kind = kinds[i as usize % kinds.len()];
        let path = format!(
            "/{kind}/{CANARY}-{}?access_token={CANARY}{}&redirect=https%3A%2F%2F{CANARY}.test%2F%22%7D",
            noise(i, 16 + (i as usize * 37) % 1500),
            noise(i + 7, 24),
        );
        let bearer = format!("Bearer {CANARY}{i}");
        let headers: &[(&str, &str)] = if i % 5 == 0 {
            &[("authorization", &bearer), ("x-canary", CANARY)]
        } else {
            &[("x-canary", CANARY), ("user-agent", CANARY)]
        };
        get(&format!("http://{}{path}", proxy.addr), headers).await;
        sent += 1;
    }
    // The same hostile URL three times: a miss, then hits.
    let again = format!("http://{}/{CANARY}-again?token={CANARY}", proxy.addr);
    for _ in 0..3 {
        get(&again, &[("x-canary", CANARY)]).await;
        sent += 1;
    }
    // A burst on one slow key: coalesced waiters and a lease election.
    let burst: Vec<_> = (0..20)
        .map(|_| {
            let url = format!("http://{}/slow/{CANARY}-burst?t={CANARY}", proxy.addr);
            tokio::spawn(async move { get(&url, &[]).await.0 })
        })
        .collect();
    for b in burst {
        assert_eq!(b.await.unwrap(), StatusCode::OK);
        sent += 1;
    }
    // Odd Host headers, forwarding headers and header values with the
    // characters a label escape or a PromQL selector would trip on, and
    // unsafe methods; as raw bytes, so nothing is cleaned up on the way.
    let meta = format!(r#"{CANARY}"}},x="y\"\\{{a="b"}} ${{cache}} %22 ' ; | ` <script>"#);
    let hosts = [
        format!("{CANARY}.test"),
        format!("{CANARY}.test:99999"),
        format!("[::1]:{CANARY}"),
        format!("{CANARY}\"}}"),
        format!("user:{CANARY}@evil.test"),
        String::new(),
    ];
    for (i, host) in hosts.iter().enumerate() {
        for method in ["GET", "HEAD", "POST", "PURGE", CANARY] {
            let head = format!(
                "{method} /{CANARY}/{}?q={CANARY} HTTP/1.1\r\nhost: {host}\r\n\
                 x-forwarded-for: {CANARY}, 10.0.0.{i}\r\nx-forwarded-host: {CANARY}.test\r\n\
                 x-forwarded-proto: {CANARY}\r\nforwarded: for=\"{CANARY}\";host={CANARY}\r\n\
                 x-http-method-override: {CANARY}\r\nx-canary: {meta}\r\ncookie: sid={CANARY}\r\n\
                 content-length: 0\r\nconnection: close\r\n\r\n",
                noise(i as u64 + 1000, 40)
            );
            let answer = raw(proxy.addr, &head).await;
            assert!(
                answer.starts_with("HTTP/1.1 "),
                "{method} host {host:?}: {answer:?}"
            );
            sent += 1;
        }
    }
    // An absolute-form target naming another host.
    let answer = raw(
        proxy.addr,
        &format!(
            "GET http://{CANARY}.test/{CANARY}?x={CANARY} HTTP/1.1\r\nhost: {CANARY}.test\r\nconnection: close\r\n\r\n"
        ),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 "), "{answer:?}");

    // Last, failures in a row open the breaker (--breaker-failures 3); the next
    // call is refused or probes.
    for i in 0..5 {
        let url = format!("http://{}/fail/{CANARY}{i}?t={CANARY}", proxy.addr);
        get(&url, &[("x-canary", CANARY)]).await;
        sent += 1;
    }
    let after = proxy.metrics().await;
    let requests: f64 = after
        .text
        .lines()
        .filter(|l| l.starts_with("herdguard_requests_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    // The traffic reached the layer: the check below looks at series it made.
    assert!(
        requests >= 280.0,
        "{requests} requests counted of {sent} sent\n{}",
        after.text
    );
    // The traffic took the paths whose labels are checked below.
    for (name, label) in [
        ("herdguard_requests_total", r#"outcome="hit""#),
        ("herdguard_requests_total", r#"outcome="miss""#),
        ("herdguard_requests_total", r#"outcome="coalesced""#),
        ("herdguard_requests_total", r#"outcome="bypass""#),
        ("herdguard_not_stored_total", r#"reason="set-cookie""#),
        ("herdguard_not_stored_total", r#"reason="authorization""#),
        ("herdguard_not_stored_total", r#"reason="vary-star""#),
        ("herdguard_origin_breaker_transitions_total", r#"to="open""#),
        ("redis_lock_acquire_total", r#"result="acquired""#),
    ] {
        let counted = after.text.lines().any(|l| {
            l.starts_with(&format!("{name}{{")) && l.contains(label) && !l.ends_with(" 0")
        });
        assert!(counted, "no {name}{{{label}}} counted:\n{}", after.text);
    }
    assert!(
        !after.text.to_ascii_lowercase().contains(CANARY),
        "request text on /metrics:\n{}",
        after
            .text
            .lines()
            .filter(|l| l.to_ascii_lowercase().contains(CANARY))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let mut problems = BTreeSet::new();
    for s in &after.series {
        if !(s.name.starts_with("herdguard_") || s.name.starts_with("redis_lock_")) {
            problems.insert(format!("unknown metric {}", s.name));
        }
        for (k, v) in &s.labels {
            match allowed_values(k) {
                None => {
                    problems.insert(format!("{}: label {k}={v:?} is not a known label", s.name));
                }
                Some(Some(values)) if !values.contains(&v.as_str()) => {
                    problems.insert(format!("{}: {k}={v:?} is not one of {values:?}", s.name));
                }
                Some(Some(_)) => {}
                Some(None) => {
                    let ok = match k.as_str() {
                        "op" => {
                            (1..=32).contains(&v.len())
                                && v.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                        }
                        _ => v == "+Inf" || v.parse::<f64>().is_ok(),
                    };
                    if !ok {
                        problems.insert(format!("{}: {k}={v:?} has the wrong shape", s.name));
                    }
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "labels a request could choose:\n{}",
        problems.into_iter().collect::<Vec<_>>().join("\n")
    );
    // Hundreds of distinct URLs made no series per URL: beside the ones
    // registered at start, only a few (a Redis error's op and class).
    let (b, a) = (before.label_sets(), after.label_sets());
    let new: Vec<_> = a.difference(&b).collect();
    assert!(
        new.len() <= 10,
        "{} new series after {sent} requests: {new:#?}",
        new.len()
    );
}
