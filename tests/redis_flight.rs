//! Cluster-wide single flight against real redis-server processes: one origin
//! call per key across instances, stale across instances, dead leaders, lapsed
//! leases and fencing, corrupt entries, Redis outages, hostile keys, and the
//! number of Redis commands a flight costs.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::Method;
use axum::Router;
use bytes::Bytes;
use deadpool_redis::redis;
use herdguard::{CacheLayer, RedisOptions};
use support::origin::{cache_status, get_req, req, send, Origin};
use support::{Monitor, RedisServer};

const CACHEABLE: &[(&str, &str)] = &[("cache-control", "max-age=60")];

fn layer(server: &RedisServer, opts: impl FnOnce(RedisOptions) -> RedisOptions) -> CacheLayer {
    CacheLayer::builder()
        .redis(opts(RedisOptions::new(server.url()).namespace("t")))
        .build()
        .expect("valid layer")
}

/// `n` concurrent GETs of `uri` against `app`.
async fn burst(
    app: &Router,
    uri: &'static str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<(axum::http::StatusCode, axum::http::HeaderMap, Bytes)>> {
    (0..n)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, get_req(uri)).await })
        })
        .collect()
}

/// 4 instances with their own pools, 250 concurrent requests each on one cold key: exactly 1 origin call, identical bodies, and the other 999 requests counted as its followers (on the leader's instance and on the three that waited for its fill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_burst_across_four_instances_calls_origin_once() {
    let server = RedisServer::start();
    let origin = Origin::new(CACHEABLE).delay(Duration::from_millis(300));
    // Healthy but loaded: replies slower than the 250 ms default would open
    // the breaker, which is the outage case tested elsewhere, not this one.
    let patient = |o: RedisOptions| {
        o.response_timeout(Duration::from_secs(2))
            .pool_wait_timeout(Duration::from_secs(2))
    };
    let layers: Vec<CacheLayer> = (0..4).map(|_| layer(&server, patient)).collect();
    let apps: Vec<Router> = layers.iter().map(|l| origin.app(l.clone())).collect();
    let mut tasks = Vec::new();
    for app in &apps {
        tasks.extend(burst(app, "/cold", 250).await);
    }
    let mut bodies = Vec::new();
    for t in tasks {
        let (code, _, body) = t.await.unwrap();
        assert_eq!(code, 200);
        bodies.push(body);
    }
    assert_eq!(bodies.len(), 1000);
    assert_eq!(origin.calls(), 1);
    assert!(bodies.iter().all(|b| b == &bodies[0]));
    let followers: u64 = layers.iter().map(|l| l.stats().followers).sum();
    assert_eq!(
        followers,
        999,
        "{:?}",
        layers.iter().map(CacheLayer::stats).collect::<Vec<_>>()
    );
}

/// An expired entry inside its grace, requested on 4 instances at once: everyone gets stale and exactly 1 refresh runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_across_instances_refreshes_once() {
    let server = RedisServer::start();
    // Every answer must be given before the refresh lands (after it they
    // are hits): a 3 s refresh leaves a loaded machine that much time for
    // the 400 answers (200 ms did not). The fill goes through a fifth
    // instance with a fast origin so the entry is fresh when stored.
    let origin = Origin::new(&[("cache-control", "max-age=1, stale-while-revalidate=30")])
        .delay(Duration::from_secs(3));
    let filler = Origin::new(&[("cache-control", "max-age=1, stale-while-revalidate=30")])
        .sharing_calls_with(&origin)
        .app(layer(&server, |o| o));
    let apps: Vec<Router> = (0..4).map(|_| origin.app(layer(&server, |o| o))).collect();
    let (_, _, first) = send(&filler, get_req("/swr")).await;
    tokio::time::sleep(Duration::from_millis(1300)).await; // past max-age and the 1 s L1

    let mut tasks = Vec::new();
    for app in &apps {
        tasks.extend(burst(app, "/swr", 100).await);
    }
    for t in tasks {
        let (code, h, body) = t.await.unwrap();
        assert_eq!(code, 200);
        assert!(
            cache_status(&h).contains("detail=stale"),
            "{}",
            cache_status(&h)
        );
        assert_eq!(body, first);
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(origin.calls(), 2, "the first fill and exactly one refresh");
}

/// A leader killed mid-work: its lease expires, exactly one new leader is elected, and the waiters get its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_leader_is_replaced_by_exactly_one() {
    let server = RedisServer::start();
    let short_lease = |o: RedisOptions| o.lease_ttl(Duration::from_millis(500));

    // The doomed leader runs on its own runtime, dropped mid-flight (as a
    // killed process would stop: no release, no write).
    let doomed_origin = Origin::new(CACHEABLE)
        .delay(Duration::from_secs(30))
        .tag("doomed");
    let doomed = doomed_origin.app(layer(&server, short_lease));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let handle = std::thread::spawn(move || {
        rt.block_on(async {
            tokio::spawn(async move { send(&doomed, get_req("/dies")).await });
            tokio::time::sleep(Duration::from_millis(150)).await;
        });
        drop(rt); // every task of that "process" dies here
    });
    handle.join().unwrap();
    assert_eq!(doomed_origin.calls(), 1, "the doomed leader had started");

    let origin = Origin::new(CACHEABLE)
        .delay(Duration::from_millis(100))
        .tag("survivor");
    let apps: Vec<Router> = (0..3)
        .map(|_| origin.app(layer(&server, short_lease)))
        .collect();
    let mut tasks = Vec::new();
    for app in &apps {
        tasks.extend(burst(app, "/dies", 50).await);
    }
    let mut bodies = Vec::new();
    for t in tasks {
        let (code, _, body) = t.await.unwrap();
        assert_eq!(code, 200);
        bodies.push(body);
    }
    assert_eq!(origin.calls(), 1, "exactly one new leader");
    assert!(bodies.iter().all(|b| b.starts_with(b"survivor call=1")));
}

/// With the watchdog off and an origin slower than the lease, a second leader writes fence n+1; the first leader's late write (fence n) is rejected and the newer value stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_write_of_a_lapsed_leader_is_fenced_off() {
    let server = RedisServer::start();
    let no_watchdog = |o: RedisOptions| o.lease_ttl(Duration::from_millis(300)).watchdog(false);
    let slow = Origin::new(CACHEABLE)
        .delay(Duration::from_millis(1200))
        .tag("old");
    let fast = Origin::new(CACHEABLE)
        .delay(Duration::from_millis(50))
        .tag("new");
    let layer_a = layer(&server, no_watchdog);
    let (a, b) = (
        slow.app(layer_a.clone()),
        fast.app(layer(&server, no_watchdog)),
    );

    let first = tokio::spawn(async move { send(&a, get_req("/fenced")).await });
    tokio::time::sleep(Duration::from_millis(500)).await; // A's lease has lapsed
    let (_, _, from_b) = send(&b, get_req("/fenced")).await;
    assert!(from_b.starts_with(b"new"));
    let (_, _, from_a) = first.await.unwrap();
    assert!(
        from_a.starts_with(b"old"),
        "A still answers its own request"
    );
    assert_eq!(layer_a.stats().fenced_rejections, 1);

    let reader = Origin::new(CACHEABLE).tag("reader");
    let (_, h, stored) = send(&reader.app(layer(&server, |o| o)), get_req("/fenced")).await;
    assert_eq!(stored, from_b, "the newer value stays");
    assert!(cache_status(&h).contains("hit"));
    let ttl: i64 = cache_status(&h)
        .split("ttl=")
        .nth(1)
        .and_then(|t| t.split(';').next())
        .and_then(|t| t.trim().parse().ok())
        .expect("a hit names its ttl");
    assert!(
        ttl >= 55,
        "ttl is the entry's freshness (max-age=60), not the 1 s L1 bound: {ttl}"
    );
    assert_eq!(reader.calls(), 0);
}

/// A lapsed leader's write never releases the lease a newer leader took meanwhile (the write deletes the lease without reading it only while the last token issued is its own): the newer leader's waiters keep waiting on it instead of electing a third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_leaders_write_leaves_the_newer_lease() {
    let server = RedisServer::start();
    let short = |o: RedisOptions| o.lease_ttl(Duration::from_millis(300)).watchdog(false);
    let long = |o: RedisOptions| o.lease_ttl(Duration::from_secs(20)).watchdog(false);
    let slow = Origin::new(CACHEABLE)
        .delay(Duration::from_millis(1000))
        .tag("old");
    let slower = Origin::new(CACHEABLE)
        .delay(Duration::from_millis(4000))
        .tag("new");
    let (a, b) = (
        slow.app(layer(&server, short)),
        slower.app(layer(&server, long)),
    );
    let first = tokio::spawn(async move { send(&a, get_req("/lapsed")).await });
    tokio::time::sleep(Duration::from_millis(500)).await; // A's lease has lapsed
    let second = tokio::spawn(async move { send(&b, get_req("/lapsed")).await });
    let (_, _, from_a) = first.await.unwrap();
    assert!(from_a.starts_with(b"old"), "A's answer, written by now");
    assert!(!second.is_finished(), "B is still inside its origin call");
    let lock = format!(
        "t:{{{}}}:lock",
        probe_key(&slower.app(CacheLayer::new()), "/lapsed")
    );
    let mut conn = server.connection().await;
    let held: Option<String> = redis::cmd("GET")
        .arg(&lock)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(held.is_some(), "A's write released B's lease");
    let (_, _, from_b) = second.await.unwrap();
    assert!(from_b.starts_with(b"new"));
    assert_eq!((slow.calls(), slower.calls()), (1, 1));
}

/// Corrupt bytes, an unknown version, or a truncated payload in the value key are a miss: logged, recomputed, overwritten, no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_entries_are_misses_and_get_overwritten() {
    let server = RedisServer::start();
    let origin = Origin::new(CACHEABLE);
    let probe = origin.app(layer(&server, |o| o));
    let mut conn = server.connection().await;
    // A real entry of the current version, cut inside its payload: the
    // header passes the script's check, the decoder must refuse it.
    send(&probe, get_req("/model")).await;
    let model_key = probe_key(&probe, "/model");
    let real: Vec<u8> = redis::cmd("GET")
        .arg(format!("t:{{{model_key}}}:v"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let truncated = real[..real.len().min(48)].to_vec();
    let cases: [&[u8]; 3] = [
        b"\x00\xffnot an entry at all",
        b"HG\xfe\x00future version",
        &truncated,
    ];
    let before_cases = origin.calls();
    for (i, bytes) in cases.into_iter().enumerate() {
        let uri = format!("/corrupt/{i}");
        let key = probe_key(&probe, &uri);
        let _: () = redis::cmd("SET")
            .arg(format!("t:{{{key}}}:v"))
            .arg(bytes)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let before = origin.calls();
        let fresh_instance = origin.app(layer(&server, |o| o));
        let (code, _, body) = send(&fresh_instance, get_req(Box::leak(uri.into_boxed_str()))).await;
        assert_eq!(code, 200);
        assert_eq!(origin.calls(), before + 1, "case {i} was recomputed");
        let stored: Vec<u8> = redis::cmd("GET")
            .arg(format!("t:{{{key}}}:v"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            stored.starts_with(&real[..3]),
            "case {i} was overwritten with the current version"
        );
        assert_ne!(stored, bytes);
        let another = origin.app(layer(&server, |o| o));
        let (_, h, again) = send(
            &another,
            get_req(Box::leak(format!("/corrupt/{i}").into_boxed_str())),
        )
        .await;
        assert!(cache_status(&h).contains("hit"));
        assert_eq!(again, body);
    }
    assert_eq!(origin.calls(), before_cases + 3);
}

/// The hex cache key of a GET to `uri` as the layers derive it.
fn probe_key(_app: &Router, uri: &str) -> String {
    let layer = CacheLayer::new();
    layer.key_for(&get_req(uri)).to_hex()
}

/// Redis killed while requests are in flight (every key's leader inside its origin call, the other instance waiting on it): no 5xx, exactly one origin call per instance per key during the outage, and after a restart the layer uses Redis again by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_mid_burst_fails_open_and_recovers() {
    const KEYS: usize = 10;
    let mut server = RedisServer::start();
    // One origin per instance, so the calls can be told apart.
    let origins = [
        Origin::new(CACHEABLE).delay(Duration::from_millis(400)),
        Origin::new(CACHEABLE).delay(Duration::from_millis(400)),
    ];
    let fast_breaker =
        |o: RedisOptions| o.breaker_backoff(Duration::from_millis(100), Duration::from_millis(400));
    let apps: Vec<Router> = origins
        .iter()
        .map(|o| o.app(layer(&server, fast_breaker)))
        .collect();
    let calls = || origins[0].calls() + origins[1].calls();

    // Both instances ask for every key: one leads it (lease in Redis), the
    // other waits for its fill.
    let mut tasks = Vec::new();
    for _wave in 0..2 {
        for app in &apps {
            for k in 0..KEYS {
                let (app, uri) = (app.clone(), format!("/outage/{k}"));
                tasks.push(tokio::spawn(
                    async move { send(&app, get_req(&uri)).await.0 },
                ));
            }
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while calls() < KEYS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "leaders never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(calls(), KEYS, "one leader per key across instances");
    server.stop(); // every leader is inside its origin call now
                   // More requests for the same keys while Redis is down.
    for app in &apps {
        for k in 0..KEYS {
            let (app, uri) = (app.clone(), format!("/outage/{k}"));
            tasks.push(tokio::spawn(
                async move { send(&app, get_req(&uri)).await.0 },
            ));
        }
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200, "no 5xx while redis is down");
    }
    // And once those flights are over, still during the outage: memory answers.
    for app in &apps {
        for k in 0..KEYS {
            assert_eq!(send(app, get_req(&format!("/outage/{k}"))).await.0, 200);
        }
    }
    assert_eq!(
        [origins[0].calls(), origins[1].calls()],
        [KEYS, KEYS],
        "one origin call per instance per key: the leader's, and the waiting instance's own once Redis was gone"
    );

    server.restart();
    let mut conn = server.connection().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut i = 0;
    loop {
        i += 1;
        let uri = format!("/after-restart/{i}");
        assert_eq!(send(&apps[0], get_req(&uri)).await.0, 200);
        let size: i64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
        if size > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the layer never went back to redis"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Hostile paths, queries and hosts cannot change the hash tag or make two requests share a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_cannot_steer_or_collide_keys() {
    let server = RedisServer::start();
    let origin = Origin::new(CACHEABLE);
    let app = origin.app(layer(&server, |o| o));
    let long = format!("/{}", "x".repeat(8000));
    let uris: Vec<String> = vec![
        "/{tag}".into(),
        "/%7Btag%7D".into(),
        "/a}{b".into(),
        "/a?b={c}".into(),
        "/a?b=%7Bc%7D".into(),
        "/%FF%FE%00".into(),
        "/%2e%2e/%2e%2e/etc".into(),
        "/a%20b".into(),
        "/a+b".into(),
        long,
    ];
    for uri in &uris {
        let (code, _, body) = send(&app, get_req(uri)).await;
        assert_eq!(code, 200);
        assert!(
            body.ends_with(format!("uri={uri}").as_bytes()),
            "each request gets its own response"
        );
    }
    let mut conn = server.connection().await;
    // The purge index is written off the request path: give it a bounded
    // moment to land before listing the keys.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let keys: Vec<Vec<u8>> = loop {
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut conn)
            .await
            .unwrap();
        let groups = keys.iter().filter(|k| k.starts_with(b"t:g:{")).count();
        if groups >= uris.len() || tokio::time::Instant::now() > deadline {
            break keys;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut tags = std::collections::BTreeSet::new();
    let mut url_groups = 0;
    for k in &keys {
        let k = std::str::from_utf8(k).expect("key names are ASCII");
        if let Some(group) = k.strip_prefix("t:g:{") {
            // A purge index: named by a hash too, nothing after the tag.
            let hex = group
                .strip_suffix('}')
                .expect("group key ends with its tag");
            assert!(
                hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
                "group {k}"
            );
            url_groups += 1;
            continue;
        }
        let rest = k.strip_prefix("t:{").expect("namespace, then the tag");
        let (tag, suffix) = rest
            .split_once("}:")
            .expect("closing brace right after the tag");
        assert!(
            tag.len() == 32 && tag.bytes().all(|b| b.is_ascii_hexdigit()),
            "tag {tag:?}"
        );
        assert!(
            ["v", "fresh", "fence"].contains(&suffix),
            "unexpected key {k}"
        );
        tags.insert(tag.to_owned());
    }
    assert_eq!(
        tags.len(),
        uris.len(),
        "one distinct tag per distinct request"
    );
    assert_eq!(url_groups, uris.len(), "one purge index per distinct URL");
    assert_eq!(origin.calls(), uris.len());
}

/// A cold burst of 500 in one process sends one lookup-or-lease and one fenced write (the purge-index update folded into it on a single server): at most 4 commands in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flight_costs_two_script_calls() {
    let server = RedisServer::start();
    let origin = Origin::new(CACHEABLE).delay(Duration::from_millis(100));
    let app = origin.app(layer(&server, |o| o));
    // Warm up: open every connection and load the scripts.
    for i in 0..4 {
        send(&app, get_req(&format!("/warm/{i}"))).await;
    }
    let monitor = Monitor::start(&server);
    let mut tasks = burst(&app, "/counted", 500).await;
    for t in tasks.drain(..) {
        assert_eq!(t.await.unwrap().0, 200);
    }
    // On a single server the URL index is recorded inside the write.
    let sent = monitor.client_commands_once(|c| c.iter().filter(|c| *c == "EVALSHA").count() >= 2);
    let evalsha = sent.iter().filter(|c| *c == "EVALSHA").count();
    assert_eq!(
        evalsha, 2,
        "lookup-or-lease + write-and-release with the URL index: {sent:?}"
    );
    assert!(sent.len() <= 4, "{sent:?}");
    assert_eq!(origin.calls.load(Ordering::SeqCst), 5);
}

/// Fill `uri` (max-age=1, stale-while-revalidate=30, origin 800 ms) through
/// instance A, let it go stale, and have A start its refresh. Returns the
/// origin and a second instance B that has not seen the key yet.
async fn remote_refresh_running(server: &RedisServer, uri: &'static str) -> (Origin, Router) {
    let origin = Origin::new(&[("cache-control", "max-age=1, stale-while-revalidate=30")])
        .delay(Duration::from_millis(800));
    let (a, b) = (
        origin.app(layer(server, |o| o)),
        origin.app(layer(server, |o| o)),
    );
    send(&a, get_req(uri)).await;
    tokio::time::sleep(Duration::from_millis(1200)).await; // stale now
    let (_, h, _) = send(&a, get_req(uri)).await; // A starts the 800 ms refresh
    assert!(cache_status(&h).contains("detail=stale"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    (origin, b)
}

/// While another instance refreshes a stale entry, a burst of stale answers on this instance costs a handful of Redis commands, not one per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_answers_during_a_remote_refresh_do_not_poll_redis_per_request() {
    let server = RedisServer::start();
    let (origin, b) = remote_refresh_running(&server, "/slow-refresh").await;

    let monitor = Monitor::start(&server);
    for _ in 0..50 {
        let (code, h, _) = send(&b, get_req("/slow-refresh")).await;
        assert_eq!(code, 200);
        assert!(
            cache_status(&h).contains("detail=stale"),
            "{}",
            cache_status(&h)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let lookups = monitor
        .client_commands()
        .iter()
        .filter(|c| *c == "EVALSHA")
        .count();
    assert!(lookups <= 8, "{lookups} script calls for 50 stale answers");
    assert_eq!(origin.calls(), 2, "the first fill and A's one refresh");
}

/// A stale copy shared while another instance refreshes is not served to a request whose own directives refuse stale (min-fresh): that request goes to the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_stale_copy_respects_request_directives() {
    let server = RedisServer::start();
    let (origin, b) = remote_refresh_running(&server, "/picky").await;

    let (_, h, _) = send(&b, get_req("/picky")).await;
    assert!(
        cache_status(&h).contains("detail=stale"),
        "a plain request takes the stale copy"
    );
    let (code, h, _) = send(
        &b,
        req(Method::GET, "/picky", &[("cache-control", "min-fresh=5")]),
    )
    .await;
    assert_eq!(code, 200);
    assert!(!cache_status(&h).contains("stale"), "{}", cache_status(&h));
    assert_eq!(
        origin.calls(),
        3,
        "first fill, A's refresh, and the picky request's own call"
    );
}
