//! What Redis holds stays trustworthy through faults, against a real
//! redis-server: fence counters that vanish (FLUSHALL, an evicted fence
//! hash) never let an older write replace a newer one nor block later
//! writes, and corrupt entries are misses that the next fill overwrites.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::Duration;

use deadpool_redis::redis;
use herdguard::metrics::Source;
use herdguard::redlock::FencedStore;
use herdguard::{Cache, CacheKey, Freshness, RedisOptions};
use support::origin::{cache_status, get_req, send, Origin};
use support::RedisServer;
use tokio::sync::oneshot;
use tokio::time::Instant;

const NS: &str = "integrity";

fn opts(server: &RedisServer) -> RedisOptions {
    RedisOptions::new(server.url()).namespace(NS)
}

fn cache(server: &RedisServer) -> Cache<String> {
    Cache::builder().redis(opts(server)).build().unwrap()
}

fn name(key: &CacheKey, suffix: &str) -> String {
    format!("{NS}:{{{}}}:{suffix}", key.to_hex())
}

async fn cmd(server: &RedisServer, args: &[&str]) {
    let mut c = server.connection().await;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let _: redis::Value = cmd.query_async(&mut c).await.unwrap();
}

const FRESH: Freshness = Freshness::new(Duration::from_secs(60));

/// A leader on `cache` whose computation starts, then waits for the returned
/// sender before answering `value`.
async fn slow_leader(
    cache: &Cache<String>,
    key: CacheKey,
    value: &'static str,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<herdguard::Lookup<String>, herdguard::Error>>,
) {
    let (started_tx, started_rx) = oneshot::channel();
    let (go_tx, go_rx) = oneshot::channel::<()>();
    let cache = cache.clone();
    let task = tokio::spawn(async move {
        cache
            .get_or_compute(&key, FRESH, move || async move {
                let _ = started_tx.send(());
                let _ = go_rx.await;
                Ok::<_, std::io::Error>(value.to_owned())
            })
            .await
    });
    started_rx.await.expect("the slow leader started computing");
    (go_tx, task)
}

/// What a new instance (empty memory) reads for `key`, and whether it computed.
async fn read_fresh(server: &RedisServer, key: CacheKey) -> (String, Source) {
    let l = cache(server)
        .get_or_compute(&key, FRESH, || async {
            Ok::<_, std::io::Error>("recomputed".to_owned())
        })
        .await
        .unwrap();
    (l.value, l.source)
}

/// A slow leader holds fence N, FLUSHALL, a new leader writes; the old leader's write is refused and the newer value stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_under_a_slow_leader_keeps_the_newer_value() {
    let server = RedisServer::start();
    let key = CacheKey::new("flushed");
    let fenced = FencedStore::new(opts(&server)).unwrap();
    for _ in 0..5 {
        fenced.next_fence("flushed").await.unwrap(); // the old leader's N is well above 1
    }
    let (a, b) = (cache(&server), cache(&server));
    let (go, old) = slow_leader(&a, key, "old").await;
    cmd(&server, &["FLUSHALL"]).await;
    let new = b
        .get_or_compute(&key, FRESH, || async {
            Ok::<_, std::io::Error>("new".to_owned())
        })
        .await
        .unwrap();
    assert_eq!((new.value.as_str(), new.source), ("new", Source::Miss));
    go.send(()).unwrap();
    let old = old.await.unwrap().unwrap();
    assert_eq!(
        old.value, "old",
        "the old leader's waiters still get its answer"
    );
    assert_eq!(a.stats().fenced_rejections, 1, "its write was refused");
    assert_eq!(
        read_fresh(&server, key).await,
        ("new".to_owned(), Source::Hit)
    );
}

/// After a FLUSHALL whose old leader writes first, later leases rank above its fence: the next fill is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_then_old_write_does_not_block_later_fills() {
    let server = RedisServer::start();
    let key = CacheKey::new("later");
    let fenced = FencedStore::new(opts(&server)).unwrap();
    for _ in 0..5 {
        fenced.next_fence("later").await.unwrap();
    }
    let a = cache(&server);
    let (go, old) = slow_leader(&a, key, "old").await;
    cmd(&server, &["FLUSHALL"]).await;
    go.send(()).unwrap();
    assert_eq!(old.await.unwrap().unwrap().value, "old");
    // The entry expires (by hand here): the next fill must land.
    cmd(&server, &["DEL", &name(&key, "v"), &name(&key, "fresh")]).await;
    let later = cache(&server)
        .get_or_compute(&key, FRESH, || async {
            Ok::<_, std::io::Error>("later".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(later.source, Source::Miss);
    assert_eq!(
        read_fresh(&server, key).await,
        ("later".to_owned(), Source::Hit),
        "the later fill was stored"
    );
}

/// With the fence evicted after a newer write, an old leader's write is refused: the entry's own fence stands in for the lost mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_fence_hash_keeps_the_newer_entry() {
    let server = RedisServer::start();
    let key = CacheKey::new("evicted");
    let (a, b) = (cache(&server), cache(&server));
    let (go, old) = slow_leader(&a, key, "old").await;
    // A's lease lapses (by hand), B leads and writes with a newer token.
    cmd(&server, &["DEL", &name(&key, "lock")]).await;
    let new = b
        .get_or_compute(&key, FRESH, || async {
            Ok::<_, std::io::Error>("new".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(new.source, Source::Miss);
    cmd(&server, &["DEL", &name(&key, "fence")]).await;
    go.send(()).unwrap();
    assert_eq!(old.await.unwrap().unwrap().value, "old");
    assert_eq!(a.stats().fenced_rejections, 1);
    assert_eq!(
        read_fresh(&server, key).await,
        ("new".to_owned(), Source::Hit)
    );
}

/// On the fenced store alone: after FLUSHALL a token issued before it is refused, one issued after is accepted, and so is the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_store_survives_a_flush() {
    let server = RedisServer::start();
    let fenced = FencedStore::new(opts(&server)).unwrap();
    let mut old = 0;
    for _ in 0..5 {
        old = fenced.next_fence("r").await.unwrap();
    }
    cmd(&server, &["FLUSHALL"]).await;
    let new = fenced.next_fence("r").await.unwrap();
    assert!(
        new > old,
        "a reset counter starts above every earlier token"
    );
    assert!(fenced.write("r", new, b"new").await.unwrap());
    assert!(!fenced.write("r", old, b"old").await.unwrap());
    assert_eq!(fenced.read("r").await.unwrap().unwrap(), &b"new"[..]);
    let next = fenced.next_fence("r").await.unwrap();
    assert!(fenced.write("r", next, b"next").await.unwrap());
}

/// A stored entry cut short, bit-flipped, of the previous version, or sealed around 30000 headers is a miss on a new instance: one origin call, a whole answer, and the entry overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_entries_are_misses_and_are_overwritten() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let layer = || {
        herdguard::CacheLayer::builder()
            .redis(opts(&server))
            .build()
            .unwrap()
    };
    let first = layer();
    let (status, _, body) = send(&origin.app(first.clone()), get_req("/c")).await;
    assert_eq!(status, 200);
    let key = first.key_for(&get_req("/c"));
    let v = name(&key, "v");
    let good = until_value(&server, &v, |_| true).await;
    let mut hostile = vec![200, 0, 0, 0, 0, 0];
    hostile.extend_from_slice(&[0; 16 + 12 + 1]);
    hostile.extend_from_slice(&30000u16.to_le_bytes());
    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 0x01;
    let mut older = good.clone();
    older[2] = 2;
    let mutations = [
        ("truncated", good[..good.len() - 5].to_vec()),
        ("flipped", flipped),
        ("version 2", older),
        ("30000 headers", sealed_response(&hostile)),
    ];
    let mut calls = 1;
    for (what, bad) in mutations {
        let mut c = server.connection().await;
        let _: () = redis::cmd("SET")
            .arg(&v)
            .arg(&bad)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut c)
            .await
            .unwrap();
        let (status, headers, got) = send(&origin.app(layer()), get_req("/c")).await;
        calls += 1;
        assert_eq!(status, 200, "{what}");
        assert!(!cache_status(&headers).contains("hit"), "{what}: served");
        assert_eq!(origin.calls(), calls, "{what}: one origin call");
        assert_eq!(got.len(), body.len(), "{what}: a whole answer");
        let now = until_value(&server, &v, |b| b != bad.as_slice()).await;
        herdguard::inspect::decode_envelope(&now)
            .unwrap_or_else(|e| panic!("{what}: not overwritten with an intact entry: {e}"));
    }
}

/// A response entry around `payload` with a correct checksum (src/entry/envelope.rs, v3).
fn sealed_response(payload: &[u8]) -> Vec<u8> {
    let mut v = b"HG\x03\x01".to_vec();
    for field in [0u64, 60_000, 0, 1, payload.len() as u64] {
        v.extend_from_slice(&field.to_le_bytes());
    }
    let mut h = blake3::Hasher::new();
    h.update(&v);
    h.update(payload);
    v.extend_from_slice(&h.finalize().as_bytes()[..8]);
    v.extend_from_slice(payload);
    v
}

/// Poll `key` (at most 5 s) until its value satisfies `ok`: writes land from the leader's task.
async fn until_value(server: &RedisServer, key: &str, ok: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let start = Instant::now();
    let mut c = server.connection().await;
    loop {
        let v: Option<Vec<u8>> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut c)
            .await
            .unwrap();
        if let Some(v) = v.filter(|v| ok(v)) {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{key} never changed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
