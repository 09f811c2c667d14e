//! A purge holds everywhere: against fills its notice never
//! reaches, Vary copies, a fence that is gone, a failover to a lagging
//! replica, and copies made while Redis was down. Real redis-server
//! processes; an instance that "never hears" purges runs as an ACL user that
//! may not SUBSCRIBE, so only what Redis itself holds can stop it. Origins
//! that race a purge are held at a gate until the purge has answered.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Response, Uri};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use deadpool_redis::redis;
use herdguard::purge::Purged;
use herdguard::redlock::FencedStore;
use herdguard::{Cache, CacheKey, CacheLayer, Freshness, RedisOptions};
use support::origin::{cache_status, req, send};
use support::{RedisServer, Vip};
use tokio::sync::Semaphore;

const NS: &str = "hold";

/// An origin that holds its `held`-th call at a gate until [`open`](Self::open).
#[derive(Clone)]
struct Gated {
    calls: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
    held: usize,
    vary: bool,
    tag: Option<&'static str>,
}

impl Gated {
    fn new(held: usize, vary: bool) -> Self {
        Self {
            calls: Arc::new(AtomicUsize::new(0)),
            gate: Arc::new(Semaphore::new(0)),
            held,
            vary,
            tag: None,
        }
    }

    /// Tag every answer with `Surrogate-Key: tag`.
    fn tag(mut self, tag: &'static str) -> Self {
        self.tag = Some(tag);
        self
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn open(&self) {
        self.gate.add_permits(1);
    }

    /// Wait (at most 10 s) until the origin was called `n` times.
    async fn wait_calls(&self, n: usize) {
        let start = tokio::time::Instant::now();
        while self.calls() < n {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "origin never reached call {n}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn app(&self, layer: CacheLayer) -> Router {
        Router::new()
            .fallback(get(gated))
            .layer(layer)
            .with_state(self.clone())
    }
}

async fn gated(State(o): State<Gated>, uri: Uri, headers: HeaderMap) -> Response<Body> {
    let n = o.calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n == o.held {
        let _ = o.gate.acquire().await.map(|p| p.forget());
    }
    let lang = headers
        .get("accept-language")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    let mut r = Response::new(Body::from(format!("call={n} lang={lang} uri={uri}")));
    r.headers_mut()
        .insert("cache-control", "max-age=60".parse().unwrap());
    if let Some(tag) = o.tag {
        r.headers_mut()
            .insert("surrogate-key", tag.parse().unwrap());
    }
    if o.vary {
        r.headers_mut()
            .insert("vary", "accept-language".parse().unwrap());
    }
    r
}

fn layer(url: String) -> CacheLayer {
    CacheLayer::builder()
        .redis(
            RedisOptions::new(url)
                .namespace(NS)
                .l1_ttl(Duration::from_secs(30)),
        )
        .build()
        .unwrap()
}

/// A user that can do everything but SUBSCRIBE: it never hears purge notices.
async fn deaf(server: &RedisServer) -> String {
    server
        .acl_user("deaf", &["~*", "&*", "+@all", "-subscribe"])
        .await
}

fn call(body: &Bytes) -> String {
    String::from_utf8_lossy(body)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn get_lang(uri: &str, lang: &'static str) -> axum::http::Request<Body> {
    req(axum::http::Method::GET, uri, &[("accept-language", lang)])
}

fn url(path: &str) -> Uri {
    format!("http://example.test{path}").parse().unwrap()
}

/// A URL purge beats a first fill (not yet indexed) on an instance that never hears the notice: the fill, held at the origin until the purge answered, is stored nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_purge_beats_a_first_fill_that_never_hears_it() {
    let server = RedisServer::start();
    let origin = Gated::new(1, false);
    let a = origin.app(layer(deaf(&server).await));
    let lb = layer(server.url());
    let b = origin.app(lb.clone());
    let first = tokio::spawn({
        let a = a.clone();
        async move { send(&a, req(axum::http::Method::GET, "/r", &[])).await }
    });
    origin.wait_calls(1).await;
    assert_eq!(lb.purge_url(&url("/r")).await.unwrap(), Purged::Redis);
    origin.open();
    let (_, _, body) = first.await.unwrap();
    assert_eq!(
        call(&body),
        "call=1",
        "the request that started the fill gets it"
    );

    let (_, headers, body) = send(&b, req(axum::http::Method::GET, "/r", &[])).await;
    assert_eq!(
        call(&body),
        "call=2",
        "Redis does not hold the pre-purge fill"
    );
    assert!(!cache_status(&headers).contains("hit"));
    let (_, headers, body) = send(&a, req(axum::http::Method::GET, "/r", &[])).await;
    assert_eq!(
        call(&body),
        "call=2",
        "nor does the filling instance's memory"
    );
    assert!(cache_status(&headers).contains("hit"));
    assert_eq!(origin.calls(), 2);
}

/// A tag purge beats a first fill of a tagged answer on an instance that never hears the notice: nothing of that fill is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tag_purge_beats_a_first_fill_that_never_hears_it() {
    let server = RedisServer::start();
    let origin = Gated::new(1, false).tag("t1");
    let a = origin.app(layer(deaf(&server).await));
    let lb = layer(server.url());
    let b = origin.app(lb.clone());
    let first = tokio::spawn({
        let a = a.clone();
        async move { send(&a, req(axum::http::Method::GET, "/t", &[])).await }
    });
    origin.wait_calls(1).await;
    assert_eq!(lb.purge_tag("t1").await.unwrap(), Purged::Redis);
    origin.open();
    let (_, _, body) = first.await.unwrap();
    assert_eq!(call(&body), "call=1");

    let (_, headers, body) = send(&b, req(axum::http::Method::GET, "/t", &[])).await;
    assert_eq!(
        call(&body),
        "call=2",
        "Redis does not hold the pre-purge fill"
    );
    assert!(!cache_status(&headers).contains("hit"));
    assert_eq!(origin.calls(), 2);
}

/// A Vary variant copy kept in memory answers fresh for at most `l1_ttl`: after another instance stored a newer answer for that variant, the next request past `l1_ttl` gets the newer one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vary_copy_in_memory_lives_at_most_l1_ttl() {
    let server = RedisServer::start();
    let origin = Gated::new(0, true);
    let l1 = Duration::from_millis(300);
    let short = |url: String| {
        CacheLayer::builder()
            .redis(RedisOptions::new(url).namespace(NS).l1_ttl(l1))
            .build()
            .unwrap()
    };
    let a = origin.app(short(server.url()));
    let b = origin.app(short(server.url()));
    // A fills the base key; its answer is also filed under the `de` variant.
    let (_, _, body) = send(&a, get_lang("/v", "de")).await;
    assert_eq!(call(&body), "call=1");
    // B learns the Vary names from Redis, then reloads the `de` variant.
    let (_, _, body) = send(&b, get_lang("/v", "de")).await;
    assert_eq!(call(&body), "call=1");
    let reload = req(
        axum::http::Method::GET,
        "/v",
        &[("accept-language", "de"), ("cache-control", "no-cache")],
    );
    let (_, _, body) = send(&b, reload).await;
    assert_eq!(call(&body), "call=2");
    tokio::time::sleep(l1 + Duration::from_millis(200)).await;
    let (_, _, body) = send(&a, get_lang("/v", "de")).await;
    assert_eq!(
        call(&body),
        "call=2",
        "A's variant copy did not outlive l1_ttl"
    );
    assert_eq!(origin.calls(), 2);
}

/// A URL purge during a Vary fill leaves no copy of the pre-purge answer under the URL's base key: an instance that never saw the URL misses instead of hitting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_during_a_vary_fill_leaves_no_base_copy() {
    let server = RedisServer::start();
    let origin = Gated::new(2, true);
    let a = origin.app(layer(deaf(&server).await));
    let lb = layer(server.url());
    // A learns the Vary names, so its next fill is a variant key's, and its
    // answer is also filed under the base key.
    let (_, _, body) = send(&a, get_lang("/v", "de")).await;
    assert_eq!(call(&body), "call=1");
    let second = tokio::spawn({
        let a = a.clone();
        async move { send(&a, get_lang("/v", "fr")).await }
    });
    origin.wait_calls(2).await;
    assert_eq!(lb.purge_url(&url("/v")).await.unwrap(), Purged::Redis);
    origin.open();
    let (_, _, body) = second.await.unwrap();
    assert_eq!(call(&body), "call=2");

    let c = origin.app(layer(server.url()));
    let (_, headers, body) = send(&c, get_lang("/v", "fr")).await;
    assert_eq!(
        call(&body),
        "call=3",
        "no pre-purge copy under the base key"
    );
    assert!(!cache_status(&headers).contains("hit"));
    assert_eq!(origin.calls(), 3);
}

/// An older Vary fill whose lease was lost (as eviction would take it) files no copy under the base key after a newer fill of the same variant stored its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_vary_fill_does_not_overwrite_a_newer_base_copy() {
    let server = RedisServer::start();
    let origin = Gated::new(2, true);
    let a = origin.app(layer(server.url()));
    let b = origin.app(layer(server.url()));
    let (_, _, body) = send(&a, get_lang("/v", "de")).await;
    assert_eq!(call(&body), "call=1");
    let (_, _, body) = send(&b, get_lang("/v", "de")).await;
    assert_eq!(call(&body), "call=1", "B learns the Vary names from Redis");
    let older = tokio::spawn({
        let a = a.clone();
        async move { send(&a, get_lang("/v", "fr")).await }
    });
    origin.wait_calls(2).await;
    // A's lease on the `fr` variant is lost mid-fill.
    let mut c = server.connection().await;
    let locks: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{NS}:{{*}}:lock"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(locks.len(), 1, "{locks:?}");
    let _: i64 = redis::cmd("DEL")
        .arg(&locks[0])
        .query_async(&mut c)
        .await
        .unwrap();
    let (_, _, body) = send(&b, get_lang("/v", "fr")).await;
    assert_eq!(call(&body), "call=3", "B leads a newer fill of the variant");
    origin.open();
    let (_, _, body) = older.await.unwrap();
    assert_eq!(call(&body), "call=2");

    let fresh = origin.app(layer(server.url()));
    let (_, headers, body) = send(&fresh, get_lang("/v", "fr")).await;
    assert_eq!(call(&body), "call=3", "the base key holds the newer answer");
    assert!(cache_status(&headers).contains("hit"));
    assert_eq!(origin.calls(), 3);
}

/// A key purge raises the fence when the fence is gone while a lease is held: the fill in flight, on an instance that never hears the purge, is refused in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_raises_a_lost_fence_under_a_held_lease() {
    let server = RedisServer::start();
    let key = CacheKey::new("k");
    let fresh = Freshness::new(Duration::from_secs(60));
    let a: Cache<String> = Cache::builder()
        .redis(RedisOptions::new(deaf(&server).await).namespace(NS))
        .build()
        .unwrap();
    let (started, gate) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let fill = tokio::spawn({
        let (started, gate) = (started.clone(), gate.clone());
        async move {
            a.get_or_compute(&key, fresh, || async move {
                started.add_permits(1);
                let _ = gate.acquire().await.map(|p| p.forget());
                Ok::<_, std::io::Error>("old".to_owned())
            })
            .await
        }
    });
    let _ = started.acquire().await.unwrap();
    let mut c = server.connection().await;
    let tag = key.to_hex();
    let (fence, lock) = (
        format!("{NS}:{{{tag}}}:fence"),
        format!("{NS}:{{{tag}}}:lock"),
    );
    let gone: i64 = redis::cmd("DEL")
        .arg(&fence)
        .query_async(&mut c)
        .await
        .unwrap();
    let held: i64 = redis::cmd("EXISTS")
        .arg(&lock)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!((gone, held), (1, 1), "the fence is gone, the lease held");

    let purger = layer(server.url());
    let purged = purger.purge_key(&key).await.unwrap();
    assert_ne!(purged, herdguard::purge::Purged::Local);
    gate.add_permits(1);
    assert_eq!(fill.await.unwrap().unwrap().value, "old");

    let b: Cache<String> = Cache::builder()
        .redis(RedisOptions::new(server.url()).namespace(NS))
        .build()
        .unwrap();
    let next = b
        .get_or_compute(&key, fresh, || async {
            Ok::<_, std::io::Error>("new".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(
        next.value, "new",
        "the fill that leased before the purge was refused"
    );
}

/// After a failover to a replica that missed the last token, the new primary never issues that token again, and the older holder's write loses to the newer one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_repeat_after_failover_to_a_lagging_replica() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary).await;
    let vip = Vip::start(primary.port()).await;
    let opts = || RedisOptions::new(vip.url()).namespace(NS);
    let before = FencedStore::new(opts()).unwrap();
    let t0 = before.next_fence("r").await.unwrap();
    assert!(before.write("r", t0, b"v0").await.unwrap());
    primary.wait_replicated(1).await;
    // The replica stops following here: what the primary issues next, it never sees.
    replica.promote().await;
    let old_a = before.next_fence("r").await.unwrap();

    vip.point_to(replica.port());
    let b = FencedStore::new(opts()).unwrap();
    let new_b = b.next_fence("r").await.unwrap();
    assert_ne!(new_b, old_a, "the new primary issued a token twice");
    assert!(b.write("r", new_b, b"newer").await.unwrap());
    // A, reconnected to the new primary, finally writes its older fill.
    let a = FencedStore::new(opts()).unwrap();
    assert!(
        !a.write("r", old_a, b"older").await.unwrap(),
        "an older token is refused"
    );
    assert_eq!(a.read("r").await.unwrap().unwrap(), &b"newer"[..]);
}

/// With Redis configured but down, a copy computed locally answers at most `l1_ttl`; then the next request goes to the origin again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_made_while_redis_is_down_live_at_most_l1_ttl() {
    let mut server = RedisServer::start();
    let origin = Gated::new(0, false);
    let l1 = Duration::from_millis(300);
    let a = origin.app(
        CacheLayer::builder()
            .redis(RedisOptions::new(server.url()).namespace(NS).l1_ttl(l1))
            .build()
            .unwrap(),
    );
    server.stop();
    let (_, _, body) = send(&a, req(axum::http::Method::GET, "/r", &[])).await;
    assert_eq!(call(&body), "call=1");
    let (_, headers, body) = send(&a, req(axum::http::Method::GET, "/r", &[])).await;
    assert_eq!(call(&body), "call=1");
    assert!(cache_status(&headers).contains("hit"), "kept meanwhile");
    tokio::time::sleep(l1 + Duration::from_millis(200)).await;
    let (_, _, body) = send(&a, req(axum::http::Method::GET, "/r", &[])).await;
    assert_eq!(call(&body), "call=2", "not kept past l1_ttl");
    assert_eq!(origin.calls(), 2);
}

/// A fence outlives its entry only by what a fill that leased before may still take (origin timeout + max wait + lease, 130 s by default), not by a day.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_hashes_outlive_their_entries_only_briefly() {
    let server = RedisServer::start();
    let origin = Gated::new(0, false);
    let a = origin.app(layer(server.url()));
    let (_, _, body) = send(&a, req(axum::http::Method::GET, "/f", &[])).await;
    assert_eq!(call(&body), "call=1");
    let mut c = server.connection().await;
    let fences: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{NS}:{{*}}:fence"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(fences.len(), 1, "{fences:?}");
    let left: i64 = redis::cmd("PTTL")
        .arg(&fences[0])
        .query_async(&mut c)
        .await
        .unwrap();
    // max-age=60 + 60 s origin timeout + 65 s max wait + 5 s lease.
    assert!(left > 60_000 && left <= 190_000, "fence kept {left} ms");
}
