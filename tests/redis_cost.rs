//! What a cold burst costs Redis, counted on a real redis-server with
//! `INFO commandstats` (commands run inside scripts included): the leader's
//! whole fill, and each instance that waits for it.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Response, Uri};
use axum::routing::get;
use axum::Router;
use deadpool_redis::redis;
use herdguard::{CacheLayer, RedisOptions, RoutePolicy};
use support::origin::{get_req, send};
use support::RedisServer;
use tokio::sync::Semaphore;

/// Commands the test itself sends, and the subscriber's liveness PING
/// (every 5 s, not per key): left out of the counts.
const OURS: &[&str] = &[
    "info",
    "config|resetstat",
    "pubsub|shardnumsub",
    "pubsub|shardchannels",
    "ping",
];

/// Calls per command since the last reset, ours left out.
async fn commandstats(c: &mut redis::aio::MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (!OURS.contains(&name)).then(|| (name.to_owned(), calls))
        })
        .collect()
}

fn total(stats: &BTreeMap<String, u64>) -> u64 {
    stats.values().sum()
}

async fn reset(c: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(c)
        .await
        .expect("CONFIG RESETSTAT");
}

/// An origin that holds every call until the test opens its gate.
#[derive(Clone)]
struct Gated {
    calls: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
    body: Arc<Vec<u8>>,
    /// How much longer the gate stays shut once every waiter waits.
    hold: Duration,
}

impl Gated {
    fn new(body_len: usize) -> Self {
        Self {
            calls: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
            body: Arc::new(vec![b'x'; body_len]),
            hold: Duration::ZERO,
        }
    }

    fn app(&self, layer: CacheLayer) -> Router {
        let me = self.clone();
        Router::new()
            .fallback(get(move |uri: Uri| {
                let me = me.clone();
                async move {
                    me.calls.fetch_add(1, Ordering::SeqCst);
                    let _permit = me.gate.acquire().await.expect("gate open");
                    let mut body = format!("{uri} ").into_bytes();
                    body.extend_from_slice(&me.body);
                    Response::builder()
                        .header("cache-control", "max-age=60")
                        .body(Body::from(body))
                        .expect("response")
                }
            }))
            .layer(layer)
    }

    async fn wait_calls(&self, n: usize) {
        let start = Instant::now();
        while self.calls.load(Ordering::SeqCst) < n {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "origin never called"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// On the default user: the counts are of the cache's own work, without an
/// `AUTH` per connection (the rest of the suite runs as the documented user).
fn layer(server: &RedisServer, opts: impl FnOnce(RedisOptions) -> RedisOptions) -> CacheLayer {
    CacheLayer::builder()
        .redis(opts(
            RedisOptions::new(server.admin_url()).namespace("cost"),
        ))
        .build()
        .expect("valid layer")
}

/// Wait until `n` clients listen on fill channels (the waiters have
/// subscribed), then a little longer for the check they make after.
async fn wait_for_waiters(c: &mut redis::aio::MultiplexedConnection, n: i64) {
    let start = Instant::now();
    loop {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("SHARDCHANNELS")
            .query_async(c)
            .await
            .unwrap_or_default();
        let mut subs = 0;
        for ch in &channels {
            let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("SHARDNUMSUB")
                .arg(ch)
                .query_async(c)
                .await
                .expect("PUBSUB SHARDNUMSUB");
            subs += counts.first().map_or(0, |(_, k)| *k);
        }
        if subs >= n {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{n} waiters never subscribed ({subs})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}

struct Burst {
    all: BTreeMap<String, u64>,
    origin_calls: usize,
}

/// A cold burst of `per` requests on each of `apps` for `uri`: the first
/// app leads (its origin call is held until the others wait), the rest wait.
async fn cold_burst(
    c: &mut redis::aio::MultiplexedConnection,
    origin: &Gated,
    apps: &[Router],
    uri: &'static str,
    per: usize,
) -> Burst {
    let before = origin.calls.load(Ordering::SeqCst);
    reset(c).await;
    let lead = {
        let app = apps[0].clone();
        tokio::spawn(async move { send(&app, get_req(uri)).await })
    };
    origin.wait_calls(before + 1).await;
    let mut tasks = vec![lead];
    for app in apps {
        for _ in 0..per {
            let app = app.clone();
            tasks.push(tokio::spawn(async move { send(&app, get_req(uri)).await }));
        }
    }
    wait_for_waiters(c, apps.len() as i64 - 1).await;
    tokio::time::sleep(origin.hold).await;
    origin.gate.add_permits(1000);
    for t in tasks {
        let (code, _, body) = t.await.expect("request task");
        assert_eq!(code, 200);
        assert!(body.starts_with(uri.as_bytes()));
    }
    origin.gate.forget_permits(usize::MAX);
    // The leader's purge index is written in the background.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let all = commandstats(c).await;
    Burst {
        all,
        origin_calls: origin.calls.load(Ordering::SeqCst) - before,
    }
}

/// Warm `apps` up (connections, scripts, subscriber connections: once per
/// instance, not per key), then run a burst with the first app alone and
/// one with all of them. Returns (the leader's whole fill by command, per
/// waiting instance).
async fn leader_and_waiter_costs(
    server: &RedisServer,
    origin: &Gated,
    apps: &[Router],
) -> (BTreeMap<String, u64>, u64) {
    let mut c = server.connection().await;
    cold_burst(&mut c, origin, apps, "/warm", 5).await;
    let lone = cold_burst(&mut c, origin, &apps[..1], "/lone", 5).await;
    let all = cold_burst(&mut c, origin, apps, "/cold", 5).await;
    assert_eq!((lone.origin_calls, all.origin_calls), (1, 1));
    let waiters = apps.len() as u64 - 1;
    let extra = total(&all.all) - total(&lone.all);
    assert_eq!(
        extra % waiters,
        0,
        "waiters cost the same each: leader {:?}, all {:?}",
        lone.all,
        all.all
    );
    (lone.all, extra / waiters)
}

/// A cold burst on 4 instances: each waiting instance costs Redis exactly 6 commands (lookup script with its GET and SET NX GET, SSUBSCRIBE, one GET of the lease, SUNSUBSCRIBE) and is answered by the notice, with no read after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_instance_costs_redis_six_commands() {
    let server = RedisServer::start();
    let origin = Gated::new(512);
    let apps: Vec<Router> = (0..4)
        .map(|_| origin.app(layer(&server, |o| o.poll_interval(Duration::from_secs(5)))))
        .collect();
    let (leader, waiter) = leader_and_waiter_costs(&server, &origin, &apps).await;
    assert_eq!(waiter, 6, "per waiting instance (leader {leader:?})");
    // The lookup with a new fence (6: EVALSHA, GET v, SET NX lock, GET
    // fence, TIME, SET fence) and the fenced write with the URL's index
    // folded in (9: EVALSHA, GET fence, GET stamp, ZADD, PEXPIRE NX, SET v,
    // SET fence, DEL lock, SPUBLISH): BENCHMARKS.md lists them.
    assert_eq!(total(&leader), 15, "the leader's whole fill: {leader:?}");
}

/// A route's own key is one more purge group: the leader's fill costs the URL's 15 commands and the route key's index, as a tag's; waiters cost the same 6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_keyed_fill_costs_one_more_purge_group() {
    let server = RedisServer::start();
    let origin = Gated::new(512);
    let apps: Vec<Router> = (0..4)
        .map(|_| {
            let l = layer(&server, |o| o.poll_interval(Duration::from_secs(5)));
            origin.app(l.with_policy(
                RoutePolicy::new().key(|p: &axum::http::request::Parts| p.uri.path().to_owned()),
            ))
        })
        .collect();
    let (leader, waiter) = leader_and_waiter_costs(&server, &origin, &apps).await;
    assert_eq!(waiter, 6, "per waiting instance (leader {leader:?})");
    // The 15 of a URL-keyed fill, and the route key's group in the same
    // write: its purge-stamp GET, ZADD, PEXPIRE NX.
    assert_eq!(total(&leader), 18, "the leader's whole fill: {leader:?}");
}

/// An entry over `notice_entry_limit` is not in the notice: each waiting instance reads it once (one lookup script: EVALSHA, GET, PTTL), 9 commands in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_over_the_notice_bound_is_read_once_per_waiting_instance() {
    let server = RedisServer::start();
    let origin = Gated::new(4096);
    let apps: Vec<Router> = (0..4)
        .map(|_| {
            origin.app(layer(&server, |o| {
                o.poll_interval(Duration::from_secs(5))
                    .notice_entry_limit(1024)
            }))
        })
        .collect();
    let (_, waiter) = leader_and_waiter_costs(&server, &origin, &apps).await;
    assert_eq!(waiter, 9, "6 to wait, 3 to read the entry once");
}

/// While a slow origin runs, a waiting instance's polls (for a lost notice) are one GET of the lease each: every waiter runs the lookup script once, however many polls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polls_while_the_lease_runs_are_one_get_each() {
    let server = RedisServer::start();
    let mut origin = Gated::new(512);
    let apps: Vec<Router> = (0..4)
        .map(|_| {
            origin.app(layer(&server, |o| {
                o.poll_interval(Duration::from_millis(50))
            }))
        })
        .collect();
    let mut c = server.connection().await;
    cold_burst(&mut c, &origin, &apps, "/warm", 5).await;
    origin.hold = Duration::from_millis(500);
    let b = cold_burst(&mut c, &origin, &apps, "/slow", 5).await;
    assert_eq!(b.origin_calls, 1);
    // GETs less the leader's 4 (the lookup's entry and fence, the write's
    // fence and purge stamp) and each waiter's 2 (lookup, first check of
    // the lease): the polls.
    let polls = b.all["get"] - 4 - 3 * 2;
    assert_eq!(
        b.all["evalsha"],
        2 + 3,
        "the leader's 2 scripts and one lookup per waiter: {:?}",
        b.all
    );
    assert!(polls >= 3 * 5, "the waiters polled: {:?}", b.all);
}

/// A fill notice carrying an older write than the copy an instance holds is ignored: the instance keeps its newer copy instead of taking the notice's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_older_than_the_copy_held_is_ignored() {
    let server = RedisServer::start();
    let mut c = server.connection().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let app = |calls: Arc<AtomicUsize>| {
        Router::new()
            .fallback(get(move || {
                let calls = calls.clone();
                async move {
                    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    Response::builder()
                        .header("cache-control", "max-age=1, stale-while-revalidate=30")
                        .body(Body::from(format!("call={n}")))
                        .expect("response")
                }
            }))
            .layer(layer(&server, |o| o.poll_interval(Duration::from_secs(5))))
    };
    let (a, b) = (app(calls.clone()), app(calls.clone()));
    let key = CacheLayer::new().key_for(&get_req("/k")).to_hex();
    let (v, lock, channel) = (
        format!("cost:{{{key}}}:v"),
        format!("cost:{{{key}}}:lock"),
        format!("cost:{{{key}}}:fill"),
    );

    // Fill 1 through A; its notice is the stored entry itself.
    send(&a, get_req("/k")).await;
    let old_notice: Vec<u8> = redis::cmd("GET").arg(&v).query_async(&mut c).await.unwrap();
    // Fill 2 (a newer fence) through A's refresh once stale; B takes it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    send(&a, get_req("/k")).await; // stale answer, refresh in the background
    let start = Instant::now();
    while calls.load(Ordering::SeqCst) < 2 {
        assert!(start.elapsed() < Duration::from_secs(10), "no refresh");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (_, _, body) = send(&b, get_req("/k")).await;
    assert_eq!(&body[..], b"call=2");

    // B's copy goes stale; its refresh waits on a lease someone else holds.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let _: () = redis::cmd("SET")
        .arg(&lock)
        .arg("someone-else")
        .arg("PX")
        .arg(10_000)
        .query_async(&mut c)
        .await
        .unwrap();
    let (_, _, body) = send(&b, get_req("/k")).await;
    assert_eq!(
        &body[..],
        b"call=2",
        "the stale copy, while B's refresh waits"
    );
    wait_for_waiters(&mut c, 1).await;

    // The old notice arrives (late, or replayed): B must not take it.
    let _: i64 = redis::cmd("SPUBLISH")
        .arg(&channel)
        .arg(&old_notice)
        .query_async(&mut c)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, _, body) = send(&b, get_req("/k")).await;
    assert_eq!(&body[..], b"call=2", "B took the older write of the notice");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
