//! The metrics example's own router and recorder (tests of the example, run by
//! `cargo test`), two instances on one real redis-server, a stampede over
//! loopback HTTP, a forced fence rejection and a Redis outage; then `/metrics`
//! is scraped and parsed. One test: the recorder is global to this binary.

use herdguard_testkit as support;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use deadpool_redis::redis;
use herdguard::{CacheLayer, RedisOptions};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::RedisServer;
use tokio::time::{timeout, Instant};

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// One sample of the text format: name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parse the Prometheus text exposition format (comments skipped).
fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series.to_owned(), BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("labels end with }");
                (name.to_owned(), parse_labels(body))
            }
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

fn parse_labels(body: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"").expect("label is key=\"value\"");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => value.extend(chars.next().map(|(_, c)| c)),
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').to_owned(), value);
        rest = after[end..].trim_start_matches(',');
    }
    labels
}

async fn get(client: &HttpClient, url: String) -> (u16, String) {
    let fut = async {
        // One public host for both instances, as behind a load balancer: the
        // port a client dials is part of the key when it is in Host.
        let req = axum::http::Request::get(url)
            .header("host", "app.test")
            .body(Default::default())
            .unwrap();
        let resp = client.request(req).await.expect("request");
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    timeout(Duration::from_secs(10), fut)
        .await
        .expect("answered within 10 s")
}

async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{addr}")
}

fn instance(server: &RedisServer) -> CacheLayer {
    CacheLayer::builder()
        .redis(
            RedisOptions::new(server.url())
                .namespace("m")
                .breaker_backoff(Duration::from_secs(5), Duration::from_secs(5)),
        )
        .build()
        .unwrap()
}

/// After a two-instance stampede, a fence rejection and a Redis outage, every documented metric is on `/metrics` with its labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scraped_metrics_have_documented_names_and_labels() {
    let prometheus = super::install_prometheus().expect("first recorder in this binary");
    let mut server = RedisServer::start();
    let delay = Duration::from_millis(300);
    let a = serve(super::router(instance(&server), delay, prometheus.clone())).await;
    let b = serve(super::router(instance(&server), delay, prometheus.clone())).await;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();

    // The stampede: 8 requests on each instance for one cold key.
    let burst = (0..16).map(|i| {
        let (client, base) = (client.clone(), if i % 2 == 0 { &a } else { &b }.clone());
        tokio::spawn(async move { get(&client, format!("{base}/report/7")).await })
    });
    let mut origin_calls = Vec::new();
    for r in futures_util::future::join_all(burst).await {
        let (status, body) = r.unwrap();
        assert_eq!(status, 200);
        origin_calls.push(body.contains("\"origin_call\":1"));
    }
    assert!(
        origin_calls.iter().all(|first| *first),
        "one origin call served all"
    );
    assert_eq!(get(&client, format!("{a}/report/7")).await.0, 200, "a hit");

    // A fence rejection: bump the high-water mark while a leader works.
    let slow = tokio::spawn({
        let (client, a) = (client.clone(), a.clone());
        async move { get(&client, format!("{a}/report/9")).await }
    });
    let mut conn = server.connection().await;
    let start = Instant::now();
    let lock = loop {
        let locks: Vec<String> = redis::cmd("KEYS")
            .arg("m:*:lock")
            .query_async(&mut conn)
            .await
            .unwrap();
        if let Some(l) = locks.into_iter().next() {
            break l;
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "the leader never leased"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let fence = lock.replace(":lock", ":fence");
    let _: () = redis::cmd("SET")
        .arg(&fence)
        // `hw` above any token (a fresh counter starts from the clock in µs).
        .arg("9000000000000000:9000000000000000")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        slow.await.unwrap().0,
        200,
        "the origin's answer still goes out"
    );

    // Redis goes away: requests are still served, errors are counted.
    server.stop();
    assert_eq!(get(&client, format!("{a}/report/11")).await.0, 200);

    let (status, text) = get(&client, format!("{a}/metrics")).await;
    assert_eq!(status, 200);
    for described in [
        "herdguard_requests_total",
        "redis_lock_acquire_total",
        "herdguard_wait_seconds",
    ] {
        assert!(
            text.contains(&format!("# HELP {described} ")),
            "no help line for {described}"
        );
    }
    let samples = parse(&text);
    let has = |name: &str, label: Option<(&str, &str)>| {
        samples.iter().any(|s| {
            s.name == name && label.is_none_or(|(k, v)| s.labels.get(k).is_some_and(|x| x == v))
        })
    };
    let value = |name: &str, label: Option<(&str, &str)>| -> f64 {
        samples
            .iter()
            .filter(|s| {
                s.name == name && label.is_none_or(|(k, v)| s.labels.get(k).is_some_and(|x| x == v))
            })
            .map(|s| s.value)
            .sum()
    };
    let missing: Vec<String> = [
        ("herdguard_requests_total", Some(("outcome", "miss"))),
        ("herdguard_requests_total", Some(("outcome", "coalesced"))),
        ("herdguard_requests_total", Some(("outcome", "hit"))),
        ("herdguard_origin_calls_total", None),
        ("herdguard_wait_seconds_bucket", Some(("le", "+Inf"))),
        ("herdguard_wait_seconds_count", None),
        ("herdguard_fenced_writes_rejected_total", None),
        (
            "herdguard_redis_errors_total",
            Some(("op", "lookup_or_lease")),
        ),
        ("herdguard_redis_available", None),
        ("herdguard_entry_bytes_bucket", Some(("le", "+Inf"))),
        ("herdguard_lease_remaining_at_release_seconds_count", None),
        ("redis_lock_acquire_total", Some(("result", "acquired"))),
        ("redis_lock_acquire_total", Some(("result", "contended"))),
        ("redis_lock_held_seconds_count", None),
    ]
    .into_iter()
    .filter(|(name, label)| !has(name, *label))
    .map(|(name, label)| format!("{name} {label:?}"))
    .collect();
    assert!(missing.is_empty(), "missing {missing:?} in:\n{text}");

    // The values tell the story too.
    assert_eq!(value("herdguard_fenced_writes_rejected_total", None), 1.0);
    assert_eq!(
        value("herdguard_redis_available", None),
        0.0,
        "redis is down"
    );
    // Instance B's requests are answered from A's fill: hits there too.
    assert!(value("herdguard_requests_total", Some(("outcome", "hit"))) >= 1.0);
    if std::env::var_os("HERDGUARD_PRINT_METRICS").is_some() {
        println!("{text}");
    }
    // /report/7 once for the whole stampede, /report/9 once, /report/11 once.
    assert_eq!(value("herdguard_origin_calls_total", None), 3.0);
    let label_keys: Vec<&str> = samples
        .iter()
        .filter(|s| s.name.starts_with("herdguard_") || s.name.starts_with("redis_lock_"))
        .flat_map(|s| s.labels.keys().map(String::as_str))
        .filter(|k| *k != "le")
        .collect();
    assert!(
        label_keys
            .iter()
            .all(|k| ["cache", "outcome", "op", "class", "result", "reason", "to"].contains(k)),
        "only documented labels: {label_keys:?}"
    );
}
