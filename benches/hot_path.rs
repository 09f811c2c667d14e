//! Micro benches of the hot paths, on the small harness in
//! `benches/common/timing.rs` (median time per call, p10 and p90).
//!
//! ```text
//! cargo bench --bench hot_path
//! cargo bench --bench hot_path -- tower        # one group (any substring of `group/name`)
//! cargo bench --bench hot_path -- '^(tower|engine/get_or_compute)'
//! ```
//! Groups: `tower` (an L1 hit through `CacheService` next to the bare inner
//! service, as `service_fn` and as an axum `Router`, and an axum handler
//! whose answer is all static), `engine`
//! (`Cache::get_or_compute` hit, a coalesced miss of N tasks on one cold key
//! next to N uncached computations), `key` (`CacheKey::from_parts`, and one
//! BLAKE3 call over the same bytes for scale), `anatomy` (the parts an L1 hit
//! is built from, priced one by one), `redis` (a Redis hit with L1 off,
//! lease acquire+release on 1 node and on a 5-node Redlock, a fenced write;
//! it starts its own redis-servers on loopback).
//!
//! Defaults are short (1 s warm-up, 2 s measurement, 30 samples) because the
//! machine is shared; pass `--measurement-time 10` for publishable numbers.

mod common;

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use herdguard::redlock::{FencedStore, Redlock};
use herdguard::service::RequestBody;
use herdguard::{Cache, CacheKey, CacheLayer, Freshness, RedisOptions};
use http_body_util::BodyExt;
use tokio::runtime::Runtime;
use tower::{Layer, ServiceExt};

use common::args::Args;
use common::hit::{body_len, origin_response, request};
use common::timing::{self, Timing};

const BODY_BYTES: usize = 512;
/// Tasks per coalesced miss.
const WAITERS: usize = 64;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"))
}

/// Poll once without a runtime (a hit must be ready at once); fall back to
/// the runtime if it is not, so a regression shows as a slower number
/// rather than a crash.
fn run<F: Future>(rt: &Runtime, fut: F) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => rt.block_on(fut),
    }
}

/// An L1 hit through the Tower service next to the same inner service alone;
/// both read the whole body, so the difference is what the layer costs.
fn tower_paths(t: &Timing) {
    let rt = runtime();
    service_fn_pair(t, &rt);

    let bytes = Bytes::from(vec![b'x'; BODY_BYTES]);
    let handler = move || {
        let bytes = bytes.clone();
        async move { ([(header::CACHE_CONTROL, "max-age=3600")], bytes) }
    };
    axum_pair(
        t,
        &rt,
        ("tower/bare axum Router", "tower/L1 hit axum Router"),
        handler,
    );

    // Everything static: an `&'static str` body (and so its content type)
    // and a `from_static` header. The stored copy makes these counted
    // copies, which every hit's clone pays for (src/docs/memory.md).
    let static_answer = || async {
        (
            [(
                header::CACHE_CONTROL,
                header::HeaderValue::from_static("max-age=3600"),
            )],
            "a static body",
        )
    };
    axum_pair(
        t,
        &rt,
        (
            "tower/bare axum, static answer",
            "tower/L1 hit axum, static answer",
        ),
        static_answer,
    );
}

/// An L1 hit through `CacheService` over a `service_fn` against that
/// `service_fn` alone, after checking that hits share the stored body.
fn service_fn_pair(t: &Timing, rt: &Runtime) {
    let body = Bytes::from(vec![b'x'; BODY_BYTES]);
    let inner = tower::service_fn(move |_req: Request<RequestBody<Body>>| {
        let body = body.clone();
        async move { Ok::<_, Infallible>(origin_response(body)) }
    });
    let cached = CacheLayer::new().layer(inner.clone());

    // Fill the entry once; every measured call is a hit.
    let warm = rt.block_on(cached.clone().oneshot(request()));
    let warm = warm.unwrap_or_else(|e| match e {});
    assert!(
        warm.headers().contains_key("cache-status"),
        "the layer answered the warm-up"
    );

    // Two hits must hand out the same stored bytes: a reference count, not a copy.
    let body_ptr = || {
        let r = rt.block_on(cached.clone().oneshot(request()));
        let r = r.unwrap_or_else(|e| match e {});
        let b = rt.block_on(r.into_body().collect());
        // The layer's body error is boxed (a streamed fill can fail mid-body).
        b.unwrap_or_else(|e| panic!("a hit body never fails: {e}"))
            .to_bytes()
            .as_ptr()
    };
    let shared = body_ptr() == body_ptr();
    eprintln!("tower/L1 hit body is the stored Bytes (no copy): {shared}");

    // Each pair is timed in turn, sample by sample: the ratio is the goal's
    // number (the goal: an L1 hit at most 1.5x the bare service_fn).
    let bare_fn = || {
        run(rt, async {
            let r = inner
                .clone()
                .oneshot(request().map(RequestBody::new))
                .await
                .unwrap_or_else(|e| match e {});
            black_box(body_len(r).await)
        })
    };
    let hit_fn = || {
        run(rt, async {
            let r = cached
                .clone()
                .oneshot(request())
                .await
                .unwrap_or_else(|e| match e {});
            black_box(body_len(r).await)
        })
    };
    t.pair(
        ("tower/bare service_fn", bare_fn),
        ("tower/L1 hit service_fn", hit_fn),
    );
}

/// Time `handler` in a bare axum `Router` against the same behind the
/// layer (filled once first, so every measured call is a hit).
fn axum_pair<H, T>(t: &Timing, rt: &Runtime, (bare_name, hit_name): (&str, &str), handler: H)
where
    H: axum::handler::Handler<T, ()> + Clone,
    T: 'static,
{
    let bare: Router = Router::new().route("/k/{key}", get(handler.clone()));
    let cached: Router = Router::new()
        .route("/k/{key}", get(handler))
        .layer(CacheLayer::new());
    let _ = rt.block_on(cached.clone().oneshot(request()));
    let through = |router: &Router| {
        run(rt, async {
            let r = router
                .clone()
                .oneshot(request())
                .await
                .unwrap_or_else(|e| match e {});
            black_box(body_len(r).await)
        })
    };
    t.pair(
        (bare_name, || through(&bare)),
        (hit_name, || through(&cached)),
    );
}

/// The HTTP-agnostic engine: a hit, and a miss that N tasks coalesce on.
fn engine_paths(t: &Timing) {
    let rt = runtime();
    let fresh = Freshness::new(Duration::from_secs(3600));
    let cache: Cache<Bytes> = Cache::builder().build().expect("valid cache");
    let hot = CacheKey::new("hot");
    let value = Bytes::from(vec![b'x'; BODY_BYTES]);
    let v = value.clone();
    let _ = rt
        .block_on(cache.get_or_compute(&hot, fresh, move || async move { Ok::<_, Infallible>(v) }));

    t.bench("engine/get_or_compute hit", 1, || {
        let lookup = run(
            &rt,
            cache.get_or_compute(&hot, fresh, || async { Ok::<_, Infallible>(Bytes::new()) }),
        );
        black_box(lookup.map(|l| l.value.len()))
    });

    // A fresh cold key per iteration; the computation yields once so the
    // waiters really queue behind it.
    let next = AtomicU64::new(0);
    let calls = Arc::new(AtomicU64::new(0));
    t.bench(
        &format!("engine/coalesced miss, {WAITERS} tasks"),
        WAITERS as u64,
        || {
            let key = CacheKey::new(next.fetch_add(1, Ordering::Relaxed).to_le_bytes());
            rt.block_on(async {
                let tasks: Vec<_> = (0..WAITERS)
                    .map(|_| {
                        let (cache, value, calls) = (cache.clone(), value.clone(), calls.clone());
                        tokio::spawn(async move {
                            cache
                                .get_or_compute(&key, fresh, move || async move {
                                    calls.fetch_add(1, Ordering::Relaxed);
                                    tokio::task::yield_now().await;
                                    Ok::<_, Infallible>(value)
                                })
                                .await
                                .map(|l| l.value.len())
                        })
                    })
                    .collect();
                for t in tasks {
                    black_box(t.await.ok());
                }
            });
            cache.invalidate(&key);
        },
    );
    t.bench(
        &format!("engine/uncached, {WAITERS} tasks each computing"),
        WAITERS as u64,
        || {
            rt.block_on(async {
                let tasks: Vec<_> = (0..WAITERS)
                    .map(|_| {
                        let value = value.clone();
                        tokio::spawn(async move {
                            tokio::task::yield_now().await;
                            value.len()
                        })
                    })
                    .collect();
                for t in tasks {
                    black_box(t.await.ok());
                }
            });
        },
    );
    let iterations = next.load(Ordering::Relaxed);
    let computed = calls.load(Ordering::Relaxed);
    if iterations > 0 {
        eprintln!(
            "engine/coalesced miss: {computed} computations for {iterations} cold keys (want equal)"
        );
    }
}

/// Key derivation through the public API; the HTTP layer's derivation is
/// internal but hashes the same kind of length-prefixed parts.
fn key_paths(t: &Timing) {
    let parts: [&[u8]; 5] = [
        b"GET",
        b"api.example.com",
        b"/v1/reports/42",
        b"a=1&b=2",
        b"\x00",
    ];
    t.bench("key/from_parts, 5 parts", 1, || {
        CacheKey::from_parts(black_box(&parts))
    });
    t.bench("key/new, one string", 1, || {
        CacheKey::new(black_box("GET api.example.com/v1/reports/42?a=1&b=2"))
    });
    // For scale: one BLAKE3 call over the same bytes, length prefixes included.
    let mut flat = Vec::new();
    for p in parts {
        flat.extend_from_slice(&(p.len() as u64).to_le_bytes());
        flat.extend_from_slice(p);
    }
    t.bench("key/one blake3 call over the same bytes", 1, || {
        blake3::hash(black_box(&flat))
    });
    {
        let k = CacheKey::new("x");
        t.bench("key/to_hex", 1, || black_box(&k).to_hex());
    }
}

/// The building blocks an L1 hit is made of today (see `LayerState::respond`
/// and `MemoryStore::probe`), priced one by one so the gap between
/// `tower/L1 hit` and `tower/bare` can be attributed.
fn hit_anatomy(t: &Timing) {
    struct Expire;
    impl moka::Expiry<CacheKey, Arc<(Bytes, u64)>> for Expire {
        fn expire_after_create(
            &self,
            _: &CacheKey,
            _: &Arc<(Bytes, u64)>,
            _: std::time::Instant,
        ) -> Option<Duration> {
            Some(Duration::from_secs(3600))
        }
    }
    let moka: moka::sync::Cache<CacheKey, Arc<(Bytes, u64)>> = moka::sync::Cache::builder()
        .max_capacity(256 << 20)
        .weigher(|_: &CacheKey, v: &Arc<(Bytes, u64)>| v.0.len() as u32 + 128)
        .expire_after(Expire)
        .build();
    let key = CacheKey::new("hot");
    moka.insert(key, Arc::new((Bytes::from_static(b"x"), 1)));
    t.bench("anatomy/moka sync get (weigher + expiry, as L1)", 1, || {
        black_box(moka.get(black_box(&key)))
    });

    t.bench(
        "anatomy/Cache-Status: format! + HeaderValue::from_str",
        1,
        || {
            let s = format!(
                "{}; hit; ttl={}",
                black_box("herdguard"),
                black_box(3599i64)
            );
            black_box(axum::http::HeaderValue::from_str(&s).ok())
        },
    );
    t.bench("anatomy/Age: HeaderValue::from(u64)", 1, || {
        black_box(axum::http::HeaderValue::from(black_box(17u64)))
    });

    // Header values as a proxied origin's would be: parsed, not static.
    let mut stored = axum::http::HeaderMap::new();
    for (k, v) in [
        ("content-type", "application/json"),
        ("cache-control", "max-age=3600"),
        ("etag", "\"5d8c72a5edda8d6a\""),
        ("date", "Tue, 05 May 2026 04:44:48 GMT"),
    ] {
        stored.insert(
            axum::http::HeaderName::from_static(k),
            axum::http::HeaderValue::from_bytes(v.as_bytes()).unwrap_or_else(|_| unreachable!()),
        );
    }
    t.bench("anatomy/stored HeaderMap clone (4 headers)", 1, || {
        black_box(stored.clone())
    });
    t.bench(
        "anatomy/Instant::now (x3 per hit)",
        1,
        tokio::time::Instant::now,
    );
}

/// Against private redis-servers on loopback: a Redis hit (L1 off), a lease
/// acquire+release on 1 node and on a 5-node Redlock quorum (one parallel
/// round each, so the ratio is the point), and a fenced write.
fn redis_paths(t: &Timing) {
    let names = [
        "redis/redis hit (L1 off)",
        "redis/lease acquire+release, 1 node(s)",
        "redis/lease acquire+release, 5 node(s)",
        "redis/fenced write",
    ];
    if !names.iter().any(|n| t.selects(n)) {
        return;
    }
    let servers: Vec<common::redis::RedisServer> = match (0..5)
        .map(|_| common::redis::RedisServer::start())
        .collect()
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("redis paths skipped: cannot start redis-server ({e}); apt-get install redis-server");
            return;
        }
    };
    let urls: Vec<String> = servers
        .iter()
        .map(|s| format!("redis://{}", s.addr))
        .collect();
    let rt = Runtime::new().expect("runtime");

    let cache: Cache<Bytes> = rt.block_on(async {
        Cache::builder()
            .redis(
                RedisOptions::new(urls[0].as_str())
                    .namespace("hp")
                    .l1_ttl(Duration::ZERO),
            )
            .build()
            .expect("valid cache")
    });
    let key = CacheKey::new("redis-hit");
    let fresh = Freshness::new(Duration::from_secs(600));
    let fill = || async { Ok::<_, Infallible>(Bytes::from_static(&[b'x'; 512])) };
    rt.block_on(cache.get_or_compute(&key, fresh, fill))
        .expect("fill");
    t.bench("redis/redis hit (L1 off)", 1, || {
        rt.block_on(cache.get_or_compute(&key, fresh, fill))
            .expect("hit")
    });

    for n in [1usize, 5] {
        let lock = Redlock::builder(urls[..n].iter().cloned())
            .namespace("hp")
            .build()
            .expect("valid redlock");
        t.bench(
            &format!("redis/lease acquire+release, {n} node(s)"),
            1,
            || {
                rt.block_on(async {
                    let lease = lock.acquire("bench-lock").await.expect("free lock");
                    lock.release(lease).await;
                })
            },
        );
    }

    let store =
        FencedStore::new(RedisOptions::new(urls[0].as_str()).namespace("hp")).expect("store");
    let fence = AtomicU64::new(1);
    t.bench("redis/fenced write", 1, || {
        let f = fence.fetch_add(1, Ordering::Relaxed);
        rt.block_on(store.write("bench-fenced", f, b"value"))
            .expect("write")
    });
    drop(servers);
}

const USAGE: &str = "cargo bench --bench hot_path -- [FILTER...] [--warm-up SECS] [--measurement-time SECS] [--samples N]";

fn main() {
    let t = Timing::from_args(&Args::parse(&timing::FLAGS, USAGE));
    tower_paths(&t);
    hit_anatomy(&t);
    engine_paths(&t);
    key_paths(&t);
    redis_paths(&t);
}
