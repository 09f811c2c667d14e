//! Metrics a team acts on: why an answer was not stored, which layer a metric
//! came from, and `Cache-Status` kept off client responses but logged. Read
//! back through a debugging recorder (global to this binary, so each test
//! holds one lock and reads only its own `cache` label).
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::http::Method;
use deadpool_redis::redis;
use herdguard::{CacheLayer, RedisOptions};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::origin::{cache_status, get_req, req, send, Origin};
use support::RedisServer;

/// One metric sample: name, labels, and the total seen (histograms: samples).
type Sample = (String, Vec<(String, String)>, u64);

/// The recorder's snapshotter and everything drained from it so far (a
/// debugging snapshot drains what it reads).
struct Recorded {
    snap: Snapshotter,
    seen: Vec<Sample>,
}

static RECORDED: OnceLock<tokio::sync::Mutex<Recorded>> = OnceLock::new();

fn recorded() -> &'static tokio::sync::Mutex<Recorded> {
    RECORDED.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder in this binary");
        tokio::sync::Mutex::new(Recorded {
            snap,
            seen: Vec::new(),
        })
    })
}

impl Recorded {
    /// Samples carrying `cache="{cache}"`.
    fn of(&mut self, cache: &str) -> Vec<Sample> {
        for (k, _, _, v) in self.snap.snapshot().into_vec() {
            let name = k.key().name().to_owned();
            let labels: Vec<(String, String)> = k
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let n = match v {
                DebugValue::Counter(c) => c,
                DebugValue::Histogram(h) => h.len() as u64,
                DebugValue::Gauge(_) => 1,
            };
            match self
                .seen
                .iter_mut()
                .find(|(a, b, _)| *a == name && *b == labels)
            {
                Some(s) => s.2 += n,
                None => self.seen.push((name, labels, n)),
            }
        }
        self.seen
            .iter()
            .filter(|(_, labels, _)| labels.iter().any(|(k, v)| k == "cache" && v == cache))
            .cloned()
            .collect()
    }
}

fn total(samples: &[Sample], name: &str, label: Option<(&str, &str)>) -> u64 {
    samples
        .iter()
        .filter(|(n, labels, _)| {
            n == name && label.is_none_or(|(k, v)| labels.iter().any(|(a, b)| a == k && b == v))
        })
        .map(|s| s.2)
        .sum()
}

/// A path, the origin's response headers, and the layer in front of it.
type Case<'a> = (&'a str, Vec<(&'static str, &'static str)>, &'a CacheLayer);

/// Each kind of unstorable origin answer counts once under its documented reason; a stored one counts nothing.
#[tokio::test]
async fn not_stored_counts_each_reason() {
    let mut rec = recorded().lock().await;
    let layer = CacheLayer::builder().cache_name("reasons").build().unwrap();
    let small = CacheLayer::builder()
        .cache_name("reasons")
        .max_body_bytes(8)
        .build()
        .unwrap();
    let cases: [Case<'_>; 7] = [
        (
            "/set-cookie",
            vec![("cache-control", "max-age=60"), ("set-cookie", "s=1")],
            &layer,
        ),
        (
            "/private",
            vec![("cache-control", "private, max-age=60")],
            &layer,
        ),
        ("/no-store", vec![("cache-control", "no-store")], &layer),
        ("/no-freshness", vec![], &layer),
        (
            "/vary-star",
            vec![("cache-control", "max-age=60"), ("vary", "*")],
            &layer,
        ),
        ("/stored", vec![("cache-control", "max-age=60")], &layer),
        // axum sets Content-Length from the body: over the limit as declared.
        ("/declared", vec![("cache-control", "max-age=60")], &small),
    ];
    for (path, headers, layer) in cases {
        let app = Origin::new(&headers).app(layer.clone());
        assert_eq!(send(&app, get_req(path)).await.0, 200, "{path}");
    }
    // No length known up front: over the limit only once the body streams in.
    let streamed = axum::Router::new()
        .route(
            "/streamed",
            axum::routing::get(|| async {
                let chunks = ["0123", "4567", "89ab"].map(Ok::<_, std::io::Error>);
                (
                    [("cache-control", "max-age=60")],
                    axum::body::Body::from_stream(futures_util::stream::iter(chunks)),
                )
            }),
        )
        .layer(small.clone());
    let (status, headers, body) = send(&streamed, get_req("/streamed")).await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"0123456789ab"[..]));
    assert!(!headers.contains_key("content-length"), "really streamed");
    let app = Origin::new(&[("cache-control", "max-age=60")]).app(layer.clone());
    send(
        &app,
        req(
            Method::GET,
            "/authorization",
            &[("authorization", "Bearer a")],
        ),
    )
    .await;

    let samples = rec.of("reasons");
    let reasons = |r| total(&samples, "herdguard_not_stored_total", Some(("reason", r)));
    for reason in [
        "set-cookie",
        "private",
        "no-store",
        "no-freshness",
        "vary-star",
        "authorization",
    ] {
        assert_eq!(reasons(reason), 1, "{reason} in {samples:?}");
    }
    assert_eq!(
        reasons("too-large"),
        2,
        "streamed past the limit and declared over it"
    );
    assert_eq!(
        total(&samples, "herdguard_not_stored_total", None),
        8,
        "the stored answer counts nothing: {samples:?}"
    );
}

/// Every metric a layer records, Redis and lease metrics included, carries its `cache_name`; two layers count apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_carries_the_cache_name() {
    let mut rec = recorded().lock().await;
    let server = RedisServer::start();
    let layer = |name: &str| {
        CacheLayer::builder()
            .cache_name(name)
            .redis(RedisOptions::new(server.url()).namespace(name))
            .build()
            .unwrap()
    };
    let origin = Origin::new(&[("cache-control", "max-age=60")]).delay(Duration::from_millis(100));
    let a = origin.app(layer("route-a"));
    let b = origin.app(layer("route-b"));
    // A miss with a waiter, then a hit, on route-a; one miss on route-b.
    let leader = tokio::spawn({
        let a = a.clone();
        async move { send(&a, get_req("/x")).await }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    send(&a, get_req("/x")).await;
    leader.await.unwrap();
    send(&a, get_req("/x")).await;
    send(&b, get_req("/x")).await;

    let route_a = rec.of("route-a");
    for name in [
        "herdguard_requests_total",
        "herdguard_origin_calls_total",
        "herdguard_wait_seconds",
        "herdguard_entry_bytes",
        "herdguard_lease_remaining_at_release_seconds",
        "herdguard_redis_available",
        "redis_lock_acquire_total",
        "redis_lock_held_seconds",
    ] {
        assert!(
            total(&route_a, name, None) > 0,
            "{name} without cache=route-a: {route_a:?}"
        );
    }
    assert_eq!(total(&route_a, "herdguard_origin_calls_total", None), 1);
    let outcome = |o| total(&route_a, "herdguard_requests_total", Some(("outcome", o)));
    assert_eq!((outcome("miss"), outcome("hit")), (1, 1), "{route_a:?}");
    let route_b = rec.of("route-b");
    assert_eq!(
        total(
            &route_b,
            "herdguard_requests_total",
            Some(("outcome", "miss"))
        ),
        1
    );
    assert_eq!(
        total(
            &route_b,
            "herdguard_requests_total",
            Some(("outcome", "hit"))
        ),
        0,
        "route-a's hit is not route-b's"
    );
    let unlabelled: Vec<&Sample> = rec
        .seen
        .iter()
        .filter(|(n, labels, _)| {
            (n.starts_with("herdguard_") || n.starts_with("redis_lock_"))
                && !labels.iter().any(|(k, _)| k == "cache")
        })
        .collect();
    assert!(
        unlabelled.is_empty(),
        "metrics without cache: {unlabelled:?}"
    );
}

/// A corrupt entry in Redis is counted under the cache name of the layer that met it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_entries_carry_the_cache_name() {
    let mut rec = recorded().lock().await;
    let server = RedisServer::start();
    let layer = CacheLayer::builder()
        .cache_name("corrupt-seen")
        .redis(RedisOptions::new(server.url()).namespace("cs"))
        .build()
        .unwrap();
    let key = |path| layer.key_for(&get_req(path)).to_hex();
    let (model, bad) = (key("/model"), key("/bad"));
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let app = origin.app(layer.clone());
    send(&app, get_req("/model")).await;
    // A real entry cut inside its payload: the script's header check passes,
    // so the decoder is the one that refuses it.
    let mut conn = server.connection().await;
    let real: Vec<u8> = redis::cmd("GET")
        .arg(format!("cs:{{{model}}}:v"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let truncated = real[..real.len().min(48)].to_vec();
    for (suffix, bytes) in [("v", &truncated[..]), ("fresh", &b"1"[..])] {
        let _: () = redis::cmd("SET")
            .arg(format!("cs:{{{bad}}}:{suffix}"))
            .arg(bytes)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let (code, _, _) = send(&app, get_req("/bad")).await;
    assert_eq!(code, 200);
    assert_eq!(origin.calls(), 2, "a corrupt entry is a miss");
    let samples = rec.of("corrupt-seen");
    assert_eq!(
        total(&samples, "herdguard_corrupt_entries_total", None),
        1,
        "{samples:?}"
    );
}

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

/// With `cache_status_header(false)`, clients get no `Cache-Status`, and its value is logged instead.
#[tokio::test]
async fn cache_status_can_be_logged_instead_of_sent() {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let hidden = origin.app(
        CacheLayer::builder()
            .cache_status_header(false)
            .build()
            .unwrap(),
    );
    let (_, miss, _) = send(&hidden, get_req("/quiet")).await;
    let (_, hit, _) = send(&hidden, get_req("/quiet")).await;
    assert_eq!(cache_status(&miss), "", "miss: {miss:?}");
    assert_eq!(cache_status(&hit), "", "hit: {hit:?}");
    let (_, shown, _) = send(&origin.app(CacheLayer::new()), get_req("/loud")).await;
    assert!(
        cache_status(&shown).starts_with("herdguard;"),
        "on by default"
    );

    let log = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    let logged: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("herdguard::cache_status"))
        .collect();
    assert_eq!(logged.len(), 2, "one line per hidden answer: {log}");
    assert!(
        logged[0].contains("cache_status=herdguard; fwd=uri-miss"),
        "{log}"
    );
    assert!(logged[1].contains("cache_status=herdguard; hit"), "{log}");
}

/// A streamed fill's metrics, waiter time to first byte and readers cut
/// off, carry the layer's cache name: two waiters read a body too large to
/// store, a third reads its first chunk and stops, and is cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_metrics_carry_the_cache_name() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let mut rec = recorded().lock().await;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<bytes::Bytes, std::io::Error>>();
    let rx = Arc::new(Mutex::new(Some(rx)));
    let layer = CacheLayer::builder()
        .cache_name("streamed")
        .max_body_bytes(4)
        .build()
        .unwrap();
    let app = axum::Router::new()
        .route(
            "/big",
            axum::routing::get(move || {
                let rx = rx.lock().unwrap().take().expect("one origin call");
                let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|c| (c, rx))
                });
                async move {
                    (
                        [("cache-control", "max-age=60")],
                        axum::body::Body::from_stream(chunks),
                    )
                }
            }),
        )
        .layer(layer);
    let responses: Vec<_> = (0..3)
        .map(|_| tokio::spawn(app.clone().oneshot(get_req("/big"))))
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Every request has its reader before the body outgrows storing.
    tx.send(Ok(bytes::Bytes::from_static(b"aaaa"))).unwrap();
    let mut bodies = Vec::new();
    for r in responses {
        bodies.push(r.await.unwrap().unwrap().into_body());
    }
    tx.send(Ok(bytes::Bytes::from_static(b"bbbb"))).unwrap();
    // The third reads its first chunk and stops; the others read on.
    let mut stopped = bodies.pop().unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), stopped.frame())
        .await
        .expect("a first chunk");
    assert_eq!(first.unwrap().unwrap().into_data().unwrap(), "aaaa");
    let readers: Vec<_> = bodies
        .into_iter()
        .map(|b| tokio::spawn(async move { b.collect().await.map(|c| c.to_bytes().len()) }))
        .collect();
    for _ in 0..20 {
        tx.send(Ok(bytes::Bytes::from_static(b"cccc"))).unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(tx);
    for r in readers {
        // Well before the 5 s a stalled reader is given: the stopped one is
        // less than a quarter as fast as the others, and cut off for that.
        let len = tokio::time::timeout(Duration::from_secs(3), r)
            .await
            .expect("the readers finish")
            .unwrap();
        assert_eq!(len.ok(), Some(88), "every byte");
    }
    let rest = tokio::time::timeout(Duration::from_secs(10), stopped.collect())
        .await
        .expect("the stopped reader ends");
    assert!(rest.is_err(), "the stopped reader is cut off");
    let samples = rec.of("streamed");
    assert_eq!(
        total(&samples, "herdguard_stream_readers_cut_off_total", None),
        1,
        "{samples:?}"
    );
    assert_eq!(
        total(&samples, "herdguard_stream_waiter_ttfb_seconds", None),
        2,
        "{samples:?}"
    );
}

/// Two routes with their own `cache_label` on one layer: one origin call for a key they share, each route's requests counted under its own label, the flight's origin call under the layer's.
#[tokio::test]
async fn route_labels_split_metrics_not_flights() {
    let mut rec = recorded().lock().await;
    let cache = CacheLayer::builder().cache_name("engine").build().unwrap();
    let route = |label: &'static str| {
        cache.with_policy(
            herdguard::RoutePolicy::new()
                .key(|_: &axum::http::request::Parts| "one-resource")
                .cache_label(label),
        )
    };
    let origin = Origin::new(&[("cache-control", "max-age=60")]).delay(Duration::from_millis(100));
    let (x, y) = (origin.app(route("route-x")), origin.app(route("route-y")));
    let leader = tokio::spawn({
        let x = x.clone();
        async move { send(&x, get_req("/x")).await }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    send(&y, get_req("/y")).await;
    leader.await.unwrap();
    send(&y, get_req("/y")).await;
    assert_eq!(origin.calls(), 1, "the routes share the flight");

    let outcome =
        |samples: &[Sample], o| total(samples, "herdguard_requests_total", Some(("outcome", o)));
    let route_x = rec.of("route-x");
    let route_y = rec.of("route-y");
    let engine = rec.of("engine");
    assert_eq!(
        (outcome(&route_x, "miss"), outcome(&route_x, "hit")),
        (1, 0),
        "{route_x:?}"
    );
    assert_eq!(
        (outcome(&route_y, "coalesced"), outcome(&route_y, "hit")),
        (1, 1),
        "{route_y:?}"
    );
    assert_eq!(
        total(&engine, "herdguard_requests_total", None),
        0,
        "{engine:?}"
    );
    assert_eq!(
        total(&engine, "herdguard_origin_calls_total", None),
        1,
        "{engine:?}"
    );
    let stats = cache.stats();
    assert_eq!(
        (stats.misses, stats.coalesced, stats.hits),
        (1, 1, 1),
        "stats count every route"
    );
}

/// Requests answered by another request's call count as `coalesced` (the
/// leader as `miss`); requests that had to call the origin on their own
/// count apart, by why: a flight's answer not storable, an unsafe method.
/// Each burst: one leader, four others.
#[tokio::test(start_paused = true)]
async fn own_calls_count_apart_from_followers() {
    let mut rec = recorded().lock().await;
    const LANGS: [&str; 5] = ["l0", "l1", "l2", "l3", "l4"];
    let burst = |app: axum::Router, path: &'static str| async move {
        let all = LANGS.map(|l| send(&app, req(Method::GET, path, &[("accept-language", l)])));
        futures_util::future::join_all(all).await
    };
    let layer = CacheLayer::builder()
        .cache_name("own-calls")
        .build()
        .unwrap();
    let delay = Duration::from_millis(200);
    let shared = Origin::new(&[("cache-control", "max-age=60")]).delay(delay);
    burst(shared.app(layer.clone()), "/shared").await;
    assert_eq!(shared.calls(), 1);
    let private = Origin::new(&[("cache-control", "private, max-age=60")]).delay(delay);
    burst(private.app(layer.clone()), "/private").await;
    assert_eq!(private.calls(), 5, "each asks for its own");
    // Another variant than the flight's is a flight of its own: not alone.
    let varies =
        Origin::new(&[("cache-control", "max-age=60"), ("vary", "accept-language")]).delay(delay);
    burst(varies.app(layer.clone()), "/varies").await;
    assert_eq!(varies.calls(), 5, "one call per variant");
    let post = send(
        &shared.app(layer.clone()),
        req(Method::POST, "/shared", &[]),
    )
    .await;
    assert_eq!(post.0, 200);

    let stats = layer.stats();
    assert_eq!(stats.coalesced, 4, "only /shared's four");
    assert_eq!(stats.own_calls, 5);
    let samples = rec.of("own-calls");
    let own = |r| total(&samples, "herdguard_own_calls_total", Some(("reason", r)));
    assert_eq!(own("uncacheable"), 4, "{samples:?}");
    assert_eq!(own("method"), 1, "{samples:?}");
    assert_eq!(total(&samples, "herdguard_own_calls_total", None), 5);
}
