//! [`CacheLayer`]: configuration plus the shared state every route uses.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Uri};
use tower_layer::Layer;

use crate::engine::retained::RetainedStore;
use crate::engine::Internal;
use crate::engine::{Engine, EngineConfig};
use crate::error::BuildError;
use crate::http::purge::{url_key, AsUri, PurgeHandle, PurgeMode, PurgeTarget};
use crate::http::route::RoutePolicy;
use crate::http::service::CacheService;
use crate::http::state::{HttpConfig, LayerState, MemoryBudget, ReloadMode, VARY_URL_BYTES};
use crate::http::vary::VaryIndex;
use crate::key::CacheKey;
use crate::metrics::Stats;
#[cfg(feature = "redis")]
use crate::store::redis::RedisOptions;

/// A Tower layer that caches GET and HEAD responses and lets exactly one
/// request per key compute a missing entry.
///
/// Clones share all state (entries, flights, counters), so one layer added to
/// several routes coalesces across all of them.
#[derive(Debug, Clone)]
pub struct CacheLayer {
    pub(crate) state: Arc<LayerState>,
}

impl CacheLayer {
    /// A layer with the documented defaults: in-memory store of 256 MiB,
    /// 8 MiB body limit, no default TTL, 60 s origin timeout, 65 s maximum wait.
    pub fn new() -> Self {
        Self::builder()
            .build()
            .unwrap_or_else(|_| unreachable!("the default configuration is valid"))
    }

    /// Configure a layer.
    pub fn builder() -> CacheLayerBuilder {
        CacheLayerBuilder {
            engine: EngineConfig::default(),
            http: HttpConfig::default(),
        }
    }

    /// Counters since the layer was built, across all routes.
    pub fn stats(&self) -> Stats {
        self.state.engine.counters.snapshot()
    }

    /// Entries held in memory right now.
    pub fn entry_count(&self) -> u64 {
        self.state.engine.memory.entry_count()
    }

    /// A layer for one route (or a group of routes) with its own
    /// [`RoutePolicy`] on this same cache: the store, the Redis client, the
    /// flights and the counters are shared, so requests of different routes
    /// that come to the same key coalesce into one origin call.
    ///
    /// The policy of the request that leads a flight decides how its answer
    /// is stored; routes that share keys should share policies. Waiters from
    /// any route get the answer only under the rules of
    /// [what is shared between users](crate#what-is-shared-between-users).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// use axum::{body::Body, extract::Path, routing::get, Router};
    /// use herdguard::{CacheLayer, RoutePolicy};
    /// use http::{request::Parts, Request};
    /// use tower::ServiceExt;
    ///
    /// let calls = Arc::new(AtomicUsize::new(0));
    /// let report = {
    ///     let calls = Arc::clone(&calls);
    ///     move |Path(id): Path<String>| async move {
    ///         calls.fetch_add(1, Ordering::SeqCst);
    ///         tokio::time::sleep(Duration::from_millis(50)).await;
    ///         format!("report {id}") // no cache headers at all
    ///     }
    /// };
    /// // Both routes name a report by its id alone.
    /// fn report_key(parts: &Parts) -> String {
    ///     let id = parts.uri.path().rsplit('/').next().unwrap_or("");
    ///     format!("report:{id}")
    /// }
    ///
    /// let cache = CacheLayer::new();
    /// let app = Router::new()
    ///     .route(
    ///         "/reports/{id}",
    ///         get(report.clone()).layer(cache.with_policy(
    ///             RoutePolicy::new()
    ///                 .key(report_key)
    ///                 .ignore_origin_cache_control()
    ///                 .default_ttl(Duration::from_secs(30)),
    ///         )),
    ///     )
    ///     .route(
    ///         "/legacy/report/{id}",
    ///         get(report).layer(cache.with_policy(
    ///             RoutePolicy::new()
    ///                 .key(report_key)
    ///                 .default_ttl(Duration::from_secs(30))
    ///                 .max_ttl(Duration::from_secs(10)),
    ///         )),
    ///     );
    ///
    /// // Eight concurrent requests over both routes, one key: one handler call.
    /// let requests = (0..8).map(|i| {
    ///     let uri = if i % 2 == 0 { "/reports/7" } else { "/legacy/report/7" };
    ///     let req = Request::get(uri).header("host", "example.com").body(Body::empty()).unwrap();
    ///     app.clone().oneshot(req)
    /// });
    /// for response in futures_util::future::join_all(requests).await {
    ///     assert_eq!(response.unwrap().status(), 200);
    /// }
    /// assert_eq!(calls.load(Ordering::SeqCst), 1);
    /// # }
    /// ```
    #[must_use]
    pub fn with_policy(&self, policy: RoutePolicy) -> CacheLayer {
        let root = self
            .state
            .root
            .clone()
            .unwrap_or_else(|| Arc::clone(&self.state));
        let mut http = self.state.http.clone();
        if let Some(key) = policy.key {
            http.route_key = Some(key);
        }
        if let Some(predicate) = policy.predicate {
            http.predicate = Some(predicate);
        }
        if let Some(ttl) = policy.ttl {
            http.rules.default_ttl = Some(ttl);
        }
        if let Some(max) = policy.max_ttl {
            http.rules.max_ttl = Some(max);
        }
        http.rules.ignore_cache_control |= policy.ignore_cache_control;
        let state = LayerState {
            engine: Arc::clone(&self.state.engine),
            http,
            // Clones of these share their contents.
            vary: self.state.vary.clone(),
            retained: self.state.retained.clone(),
            // Flights are shared, so the streams they offer are too.
            streams: Arc::clone(&self.state.streams),
            too_large: self.state.too_large.clone(),
            root: Some(root),
            warnings: Arc::clone(&self.state.warnings),
            route_counters: match policy.cache_label {
                Some(label) => Some(Arc::new(self.state.engine.counters.relabel(&label))),
                None => self.state.route_counters.clone(),
            },
        };
        CacheLayer {
            state: Arc::new(state),
        }
    }

    /// Bytes the layer holds in memory, as counted against
    /// [`capacity_bytes`](CacheLayerBuilder::capacity_bytes): entries,
    /// retained copies and the Vary index (after pending evictions run).
    /// Never above the capacity; a body held both as an entry and as a
    /// retained copy is counted twice, so the real use is at most this.
    pub fn memory_bytes(&self) -> usize {
        let state = &self.state;
        let bytes = state.engine.memory.weighted_bytes()
            + state.retained.weighted_bytes()
            + state.vary.len() * VARY_URL_BYTES;
        // At most the capacity, which was a usize.
        usize::try_from(bytes).unwrap_or(usize::MAX)
    }

    /// Whether this layer works with Redis: `None` when it has none (memory
    /// only), `Some(false)` while its Redis calls are failing and it serves
    /// from memory (probing again after a back-off), `Some(true)` otherwise.
    ///
    /// ```
    /// assert_eq!(herdguard::CacheLayer::new().redis_connected(), None);
    /// ```
    pub fn redis_connected(&self) -> Option<bool> {
        self.state.engine.remote.as_ref().map(|r| r.available())
    }

    /// The cache key this layer derives for `request` (the `{H}` of the Redis
    /// keys is its hex form).
    pub fn key_for<B>(&self, request: &http::Request<B>) -> CacheKey {
        let route_key = self.state.http.route_key.as_ref().map(|k| {
            // Not the request path: a copy of the parts is fine here.
            let mut copy = http::Request::new(());
            *copy.method_mut() = request.method().clone();
            *copy.uri_mut() = request.uri().clone();
            *copy.version_mut() = request.version();
            *copy.headers_mut() = request.headers().clone();
            *copy.extensions_mut() = request.extensions().clone();
            k.key(&copy.into_parts().0)
        });
        self.state.target_for(request, route_key).key
    }
}

impl Default for CacheLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for CacheLayer {
    type Service = CacheService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CacheService::new(inner, Arc::clone(&self.state))
    }
}

/// Builder for [`CacheLayer`]. Every wait and size has a bound by default.
#[derive(Debug, Clone)]
pub struct CacheLayerBuilder {
    engine: EngineConfig,
    http: HttpConfig,
}

impl CacheLayerBuilder {
    /// Largest response body that is buffered and stored (default 8 MiB).
    /// Larger responses stream through uncached and are never buffered whole.
    /// At most [`fill_buffer_bytes`](Self::fill_buffer_bytes): `build()`
    /// refuses more, since such bodies could never be buffered.
    #[must_use]
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.http.max_body_bytes = bytes;
        self
    }

    /// Freshness for responses that carry none of s-maxage, max-age or
    /// Expires (default: none, such responses are not stored). Applies only
    /// to statuses that are cacheable by default (200, 404, 301, …).
    #[must_use]
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.http.rules.default_ttl = Some(ttl);
        self
    }

    /// The longest any response is kept fresh, whatever its `max-age`,
    /// `s-maxage`, `Expires` or [`default_ttl`](Self::default_ttl) say
    /// (default: no cap; the stale grace is not shortened). The layer-wide form of [`RoutePolicy::max_ttl`];
    /// a route's own cap replaces it.
    ///
    /// ```
    /// use std::time::Duration;
    /// let cache = herdguard::CacheLayer::builder()
    ///     .max_ttl(Duration::from_secs(60))
    ///     .build()?;
    /// # let _ = cache; Ok::<(), herdguard::BuildError>(())
    /// ```
    #[must_use]
    pub fn max_ttl(mut self, max: Duration) -> Self {
        self.http.rules.max_ttl = Some(max);
        self
    }

    /// Ignore the origin's freshness directives (`Cache-Control`, targeted
    /// fields, `Expires`, heuristics) and store every storable answer for
    /// [`default_ttl`](Self::default_ttl) (without one nothing is stored):
    /// the layer-wide form of
    /// [`RoutePolicy::ignore_origin_cache_control`], with the same
    /// protections (`no-store`, `private`, `Set-Cookie` and `Vary` obeyed,
    /// answers to requests with `Authorization` not stored, only statuses
    /// cacheable by default). Off by default.
    ///
    /// ```
    /// use std::time::Duration;
    /// let cache = herdguard::CacheLayer::builder()
    ///     .ignore_origin_cache_control()
    ///     .default_ttl(Duration::from_secs(30))
    ///     .build()?;
    /// # let _ = cache; Ok::<(), herdguard::BuildError>(())
    /// ```
    #[must_use]
    pub fn ignore_origin_cache_control(mut self) -> Self {
        self.http.rules.ignore_cache_control = true;
        self
    }

    /// Turn on heuristic freshness (RFC 9111 §4.2.2) for responses without
    /// explicit freshness that carry `Last-Modified`: 10 % of the time since
    /// it, at most `max`. Off by default. Takes precedence over
    /// [`default_ttl`](Self::default_ttl) when both apply.
    #[must_use]
    pub fn heuristic_freshness(mut self, max: Duration) -> Self {
        self.http.rules.heuristic_max = Some(max);
        self
    }

    /// Grace: serve a stored response up to `grace` past its freshness, at
    /// once, while one refresh runs (Varnish's grace, nginx's
    /// `proxy_cache_use_stale updating`), even when the origin sent no
    /// `stale-while-revalidate`. Off by default, as RFC 9111 §4.2.4 asks.
    ///
    /// Never for responses with `must-revalidate`, `proxy-revalidate`,
    /// `s-maxage` (which implies proxy-revalidate for a shared cache) or
    /// `no-cache`. Such answers say `Cache-Status: …; detail=grace`. Entries
    /// are kept (in memory and in Redis) for freshness plus grace, so a long
    /// grace holds more entries at once within the same
    /// [`capacity_bytes`](Self::capacity_bytes).
    ///
    /// ```
    /// use std::time::Duration;
    /// let cache = herdguard::CacheLayer::builder()
    ///     .grace(Duration::from_secs(60))
    ///     .build()
    ///     .unwrap();
    /// # let _ = cache;
    /// ```
    #[must_use]
    pub fn grace(mut self, grace: Duration) -> Self {
        self.http.rules.grace = grace;
        self
    }

    /// How long a stored response is kept after it stops being servable
    /// (default 10 min): a response with a validator (ETag, Last-Modified)
    /// is then revalidated with a conditional request instead of fetched
    /// whole, and a client's `max-stale` can still be answered. Zero keeps
    /// only what `stale-while-revalidate` and `stale-if-error` need.
    #[must_use]
    pub fn keep_for_revalidation(mut self, keep: Duration) -> Self {
        self.http.keep = keep;
        self
    }

    /// Give a response that may not be stored (no freshness information,
    /// `no-store`, `private`, `Set-Cookie`, credentials) to every request
    /// that waited on the same key, so everyone gets the same answer from one
    /// origin call. Off by default: each waiter then calls the origin itself.
    ///
    /// **Hazard:** a response made for one user (their cookie, their
    /// credentials, a `/me` endpoint without cache headers) then reaches
    /// every user whose request arrived while it was being fetched. Turn it on
    /// only for origins whose answers do not depend on who asks. To share
    /// headerless responses *and* store them, use
    /// [`default_ttl`](Self::default_ttl) instead. The Vary check still
    /// applies: a waiter whose varied headers differ never gets it. With the
    /// option on, such answers set no hit-for-pass marker either: requests
    /// keep coalescing on one origin call per key. This includes error pages
    /// the cache does not store (a 500 without freshness, made with the
    /// leader's cookie): off, each waiter gets its own.
    #[must_use]
    pub fn share_uncacheable_with_waiters(mut self, share: bool) -> Self {
        self.http.share_uncacheable = share;
        self
    }

    /// A targeted cache-control field of your own (RFC 9213), for example
    /// `herdguard-cache-control`: a response header, a Structured Fields
    /// Dictionary of cache directives, that this cache obeys above
    /// `CDN-Cache-Control` and `Cache-Control`. Off by default;
    /// `CDN-Cache-Control` is always obeyed. It is removed from responses
    /// unless [`forward_targeted_cache_control`](Self::forward_targeted_cache_control)
    /// turns that on.
    ///
    /// ```
    /// use http::HeaderName;
    /// let cache = herdguard::CacheLayer::builder()
    ///     .targeted_cache_control(HeaderName::from_static("herdguard-cache-control"))
    ///     .build()?;
    /// # let _ = cache; Ok::<(), herdguard::BuildError>(())
    /// ```
    #[must_use]
    pub fn targeted_cache_control(mut self, name: HeaderName) -> Self {
        self.http.rules.own_cache_control = Some(name);
        self
    }

    /// The former name of [`targeted_cache_control`](Self::targeted_cache_control).
    #[deprecated(since = "0.1.0", note = "renamed to `targeted_cache_control`")]
    #[must_use]
    pub fn cache_control_header(self, name: HeaderName) -> Self {
        self.targeted_cache_control(name)
    }

    /// Whether the [`targeted_cache_control`](Self::targeted_cache_control)
    /// field is passed on in responses this layer sends (default off: it is
    /// meant for this cache alone). `CDN-Cache-Control` is always passed
    /// on, for caches further down.
    #[must_use]
    pub fn forward_targeted_cache_control(mut self, on: bool) -> Self {
        self.http.strip_own_cache_control = !on;
        self
    }

    /// The former, inverted form of
    /// [`forward_targeted_cache_control`](Self::forward_targeted_cache_control):
    /// `strip_cache_control_header(x)` is `forward_targeted_cache_control(!x)`.
    #[deprecated(since = "0.1.0", note = "use `forward_targeted_cache_control(!strip)`")]
    #[must_use]
    pub fn strip_cache_control_header(self, strip: bool) -> Self {
        self.forward_targeted_cache_control(!strip)
    }

    /// The cache's name in `Cache-Status` (default `herdguard`), and the
    /// `cache` label on every metric this layer records: give each layer its
    /// own name to read per-route hit ratios. Must be a token.
    #[must_use]
    pub fn cache_name(mut self, name: impl Into<String>) -> Self {
        self.http.cache_name = name.into();
        self.engine.metrics_name.clone_from(&self.http.cache_name);
        self
    }

    /// Whether responses to clients carry the `Cache-Status` header (default
    /// on). Off, the header is removed before the response leaves the layer
    /// and its value is logged instead: an `info` event with target
    /// `herdguard::cache_status` and field `cache_status`, inside the
    /// caller's span. For deployments that do not want to show clients
    /// what was cached.
    ///
    /// ```
    /// let cache = herdguard::CacheLayer::builder()
    ///     .cache_status_header(false)
    ///     .build()?;
    /// # let _ = cache; Ok::<(), herdguard::BuildError>(())
    /// ```
    #[must_use]
    pub fn cache_status_header(mut self, on: bool) -> Self {
        self.http.show_cache_status = on;
        self
    }

    /// Request headers whose values become part of the cache key (each value
    /// length-prefixed and the values counted, so no two lists collide).
    ///
    /// Name every header your service reads to build an answer that the
    /// URL and the response's `Vary` do not cover, above all forwarding
    /// headers (`X-Forwarded-Host`, `-Proto`, `-Prefix`): otherwise one
    /// request's value decides what everyone with the URL gets
    /// (docs/operations.md, "Hostile requests").
    ///
    /// ```
    /// use http::HeaderName;
    ///
    /// let cache = herdguard::CacheLayer::builder()
    ///     .key_header(HeaderName::from_static("x-forwarded-host"))
    ///     .key_header(HeaderName::from_static("x-forwarded-proto"))
    ///     .build()?;
    /// # let _ = cache; Ok::<(), herdguard::BuildError>(())
    /// ```
    #[must_use]
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.http.key_headers.push(name);
        self
    }

    /// Total bytes the layer keeps in memory (default 256 MiB), carved up
    /// so the parts never add up to more:
    ///
    /// | part | share | holds |
    /// |---|---|---|
    /// | entries (L1) | the rest, ~73 % | fresh and stale entries; with Redis, the L1 copies |
    /// | retained copies | 25 % | responses past their stale window, kept for revalidation (304s), `stale-if-error` and `max-stale` |
    /// | Vary index | 1/64 (≥ 16 KiB) | the header names each URL varies on |
    ///
    /// Each part evicts its least useful items when full. Not in this
    /// budget: fill buffers (bodies being received, at most
    /// [`max_body_bytes`](Self::max_body_bytes) each, bounded by the caps on
    /// leader tasks and fill bytes) and the process itself. Size a container
    /// at about 1.25 × capacity + 64 MiB (measured by `cargo bench --bench
    /// soak -- --large`).
    #[must_use]
    pub fn capacity_bytes(mut self, bytes: usize) -> Self {
        self.engine.capacity_bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        self
    }

    /// Longest a request waits for another request's origin call (default:
    /// [`origin_timeout`](Self::origin_timeout) plus 5 s, so a slow but
    /// healthy origin never releases the waiters). After that it goes to the
    /// origin itself, uncached, under the fallback cap; with the cap full it
    /// keeps waiting on the flight, at most one more origin timeout.
    ///
    /// At least `origin_timeout`: `build()` refuses a shorter wait, which
    /// would send waiters of a slow but healthy call to the origin too.
    #[must_use]
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.engine.max_wait = Some(wait);
        self
    }

    /// Longest an origin call may take (default 60 s): a flight's call
    /// (response and body), after which its waiters get 504, and every call
    /// outside a flight (until the response head arrives).
    #[must_use]
    pub fn origin_timeout(mut self, timeout: Duration) -> Self {
        self.engine.origin_timeout = timeout;
        self
    }

    /// Most flights (leader tasks) running at once (default 1024). A leader
    /// task runs on when its client goes away, so this bounds abandoned work
    /// too. Past it, a miss with no flight to join goes to the origin
    /// uncached, under the fallback cap (`Cache-Status: …; detail=overloaded`).
    /// At least 1: `build()` refuses 0.
    #[must_use]
    pub fn leader_limit(mut self, limit: usize) -> Self {
        self.engine.max_leaders = limit;
        self
    }

    /// Most response bytes buffered for fills at once, over all flights
    /// (default 64 MiB). A fill that would pass it streams to the request
    /// that started it, is not stored, and its waiters go to the origin
    /// themselves under the fallback cap.
    #[must_use]
    pub fn fill_buffer_bytes(mut self, bytes: usize) -> Self {
        self.engine.max_fill_bytes = bytes;
        self
    }

    /// What a request's own refusal of the stored response (`no-cache`,
    /// `Pragma: no-cache`, `max-age=0`, a `max-age` below the entry's age,
    /// `min-fresh`) does; default [`ReloadMode::Coalesce`].
    #[must_use]
    pub fn reload(mut self, mode: ReloadMode) -> Self {
        self.http.reload = mode;
        self
    }

    /// How long an uncacheable verdict sends requests straight to the origin
    /// instead of queueing them (default 5 s). Only an answer uncacheable for
    /// every request of the URL (`no-store`, `private`, no freshness, `Vary:
    /// *`, with a 2xx or 3xx status) sets the marker, and never while a
    /// usable entry is stored; an error status never sets it. A GET under
    /// the marker still asks the origin for itself (hit-for-miss, under a
    /// free [`fallback_limit`](Self::fallback_limit) permit), never
    /// coalesced: a storable answer is stored and ends the marker, since
    /// the uncacheable one may have been made for one request alone (a
    /// `private` page for its cookie). With Redis, such a GET first looks
    /// the key up there (one lookup): an entry another instance stored over
    /// the marker is a hit.
    #[must_use]
    pub fn pass_ttl(mut self, ttl: Duration) -> Self {
        self.engine.pass_ttl = ttl;
        self
    }

    /// Most concurrent origin calls outside any flight (default 64): waiters
    /// whose wait ran out, waiters of an answer they may not share, misses
    /// past the leader limit, and [`ReloadMode::Honor`] reloads. At least 1:
    /// `build()` refuses 0.
    #[must_use]
    pub fn fallback_limit(mut self, limit: usize) -> Self {
        self.engine.fallback_limit = limit;
        self
    }

    /// Refresh-ahead (default 0.25; 0 turns it off): a hit in the last
    /// `fraction` of an entry's freshness starts one background refresh, so
    /// a hot entry is replaced before it expires and no request waits for the
    /// origin. The lead is at least twice the origin time this instance last
    /// measured for the entry. See the crate docs, "Refresh-ahead".
    /// `build()` refuses a fraction outside 0 ≤ f < 1, or NaN.
    #[must_use]
    pub fn refresh_ahead(mut self, fraction: f64) -> Self {
        self.engine.refresh_ahead = fraction;
        self
    }

    /// Share entries, leases and fills through Redis: one origin call per key
    /// across every instance using the same Redis and namespace. Without this
    /// the layer runs on memory alone.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[must_use]
    pub fn redis(mut self, options: RedisOptions) -> Self {
        self.engine.redis = Some(options);
        self
    }

    /// Take leases on a Redlock quorum instead of the main Redis (for origins
    /// where a double call is unsafe, not just wasteful). Entries and fence
    /// counters stay on the main Redis, which [`redis`](Self::redis) must set.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[must_use]
    pub fn redlock(mut self, redlock: crate::Redlock) -> Self {
        self.engine.redlock = Some(Arc::new(redlock));
        self
    }

    /// Whether `Surrogate-Key` is passed on in responses to clients
    /// (default off). Either way the layer reads the tags of every response
    /// it stores, for [`CacheLayer::purge_tag`]: the header is addressed to
    /// the cache, and tags often name internal things (tables, tenants).
    /// Turn it on when a cache downstream purges by the same tags.
    ///
    /// ```
    /// let cache = herdguard::CacheLayer::builder()
    ///     .forward_surrogate_key(true)
    ///     .build()?;
    /// # let _ = cache; Ok::<(), herdguard::BuildError>(())
    /// ```
    #[must_use]
    pub fn forward_surrogate_key(mut self, on: bool) -> Self {
        self.http.strip_surrogate_key = !on;
        self
    }

    /// The former, inverted form of
    /// [`forward_surrogate_key`](Self::forward_surrogate_key):
    /// `strip_surrogate_key(x)` is `forward_surrogate_key(!x)`.
    #[deprecated(since = "0.1.0", note = "use `forward_surrogate_key(!strip)`")]
    #[must_use]
    pub fn strip_surrogate_key(self, strip: bool) -> Self {
        self.forward_surrogate_key(!strip)
    }

    /// Build the layer.
    ///
    /// # Errors
    /// [`BuildError::InvalidSetting`], naming the setting, when:
    /// - `max_wait` is below `origin_timeout` (`"max_wait"`);
    /// - `refresh_ahead` is outside 0 ≤ f < 1 or NaN (`"refresh_ahead"`);
    /// - `max_body_bytes` is above `fill_buffer_bytes` (`"max_body_bytes"`);
    /// - `leader_limit` or `fallback_limit` is 0;
    /// - the cache name is not an RFC 9651 token (`"cache_name"`), or a
    ///   [`RedisOptions`] value is out of range (`"RedisOptions::namespace"` …).
    ///
    /// [`BuildError::Redis`] when the Redis URL cannot be used, and
    /// [`BuildError::MissingFeature`] for `rediss://` without the `tls`
    /// feature. Nothing connects here: an unreachable Redis only makes the
    /// layer fall back to memory.
    ///
    /// ```
    /// let err = herdguard::CacheLayer::builder().leader_limit(0).build().unwrap_err();
    /// assert_eq!(err.setting(), Some("leader_limit"));
    /// ```
    pub fn build(self) -> Result<CacheLayer, BuildError> {
        let name = &self.http.cache_name;
        let first_ok = name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'*');
        let rest_ok = name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b));
        if !first_ok || !rest_ok {
            return Err(BuildError::invalid(
                "cache_name",
                format!("cache name {name:?} is not a token"),
            ));
        }
        self.check_bounds()?;
        let budget = MemoryBudget::of(self.engine.capacity_bytes);
        let mut engine = self.engine;
        engine.capacity_bytes = budget.l1;
        let retained = RetainedStore::new(budget.retained);
        let mut engine = Engine::new(engine)?;
        // Entries read from Redis past their stale grace are kept there too.
        engine.retained = Some(retained.clone());
        let state = Arc::new(LayerState {
            vary: VaryIndex::new(budget.vary / VARY_URL_BYTES),
            retained,
            engine: Arc::new(engine),
            http: self.http,
            streams: Arc::new(crate::http::stream::Streams::new()),
            too_large: crate::http::range::TooLarge::new(),
            root: None,
            warnings: Arc::default(),
            route_counters: None,
        });
        if let Some(remote) = &state.engine.remote {
            // Weak: the store lives inside the state, so a strong handle
            // here would keep both alive forever.
            let weak = Arc::downgrade(&state);
            remote.set_purge_handler(Arc::new(move |payload: &[u8]| {
                if let Some(state) = weak.upgrade() {
                    state.apply_notice(payload);
                }
            }));
        }
        Ok(CacheLayer { state })
    }
}

impl CacheLayerBuilder {
    /// Bounds that contradict each other, which would otherwise quietly
    /// change what the layer does (see *Bounds and timeouts* in the crate
    /// docs). The engine checks its own settings as it is built.
    fn check_bounds(&self) -> Result<(), BuildError> {
        let origin = self.engine.origin_timeout;
        if let Some(wait) = self.engine.max_wait.filter(|w| *w < origin) {
            return Err(BuildError::invalid(
                "max_wait",
                format!(
                    "{wait:?} is below origin_timeout ({origin:?}): waiters would leave a slow \
                     but healthy origin call and each call the origin themselves"
                ),
            ));
        }
        let (body, fill) = (self.http.max_body_bytes, self.engine.max_fill_bytes);
        if body > fill {
            return Err(BuildError::invalid(
                "max_body_bytes",
                format!(
                    "{body} is above fill_buffer_bytes ({fill}): bodies between the two could \
                     never be buffered, so they would silently stop being shared"
                ),
            ));
        }
        Ok(())
    }
}

impl CacheLayer {
    /// The key of a URL: what [`purge_key`](Self::purge_key) takes to remove
    /// every stored variant of it. Scheme and fragment are ignored; the host
    /// is compared case-insensitively and the port counts, as in the cache
    /// key (a request's `Host: shop.test:1337` is another site than
    /// `shop.test`).
    ///
    /// ```
    /// use herdguard::CacheLayer;
    /// let cache = CacheLayer::new();
    /// let a = cache.url_key(&"http://example.test/r?x=1".parse().unwrap());
    /// let b = cache.url_key(&"https://EXAMPLE.test/r?x=1".parse().unwrap());
    /// let c = cache.url_key(&"http://example.test:8443/r?x=1".parse().unwrap());
    /// assert_eq!(a, b);
    /// assert_ne!(a, c);
    /// ```
    pub fn url_key(&self, url: &Uri) -> CacheKey {
        url_key(
            url.authority().map(|a| a.as_str().as_bytes()),
            url.path().as_bytes(),
            url.query().map(str::as_bytes),
        )
    }

    /// The key a [`RoutePolicy::key`](crate::RoutePolicy::key) function
    /// that returns `key` names its entries by: what
    /// [`purge_key`](Self::purge_key) and
    /// [`soft_purge_key`](Self::soft_purge_key) take to remove every entry
    /// stored under it (every variant, with and without Authorization, on
    /// every route whose key function returned these bytes).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use herdguard::{CacheLayer, Purged, RoutePolicy};
    ///
    /// let cache = CacheLayer::new();
    /// let reports = cache.with_policy(RoutePolicy::new().key(|req: &http::request::Parts| {
    ///     format!("report:{}", req.uri.path().trim_start_matches("/report/"))
    /// }));
    /// # let _ = reports;
    /// // Later, when report 7 changes:
    /// let purged = cache.purge_key(&cache.route_key("report:7")).await;
    /// assert_eq!(purged.unwrap(), Purged::Local);
    /// # }
    /// ```
    pub fn route_key(&self, key: impl AsRef<[u8]>) -> CacheKey {
        crate::http::route::route_key(key.as_ref())
    }

    /// Remove every stored variant of `url` (with and without Authorization,
    /// every Vary variant): from this process at once, and from Redis and
    /// every instance through the returned [`PurgeHandle`].
    ///
    /// `url` is what you have at hand, borrowed: a `&str`, a `&String` or a
    /// `&`[`Uri`] (see [`AsUri`]). Give it the host the requests carried
    /// (`http://shop.test/products/7`): a URL without one names only
    /// entries stored for requests without a host (see
    /// [`url_key`](Self::url_key)). A string that is not a URL purges
    /// nothing: the handle resolves to a [`PurgeError`](crate::PurgeError)
    /// whose [`is_invalid_url`](crate::PurgeError::is_invalid_url) is true
    /// (logged as a warning if the handle is dropped instead), as reqwest's
    /// `get` reports a bad URL when the request is sent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use herdguard::{CacheLayer, Purged};
    ///
    /// let cache = CacheLayer::new();
    /// assert_eq!(cache.purge_url("http://shop.test/products/7").await.unwrap(), Purged::Local);
    /// let uri: http::Uri = "http://shop.test/products/8".parse().unwrap();
    /// assert_eq!(cache.purge_url(&uri).await.unwrap(), Purged::Local);
    ///
    /// let bad = cache.purge_url("http://shop test/").await.unwrap_err();
    /// assert!(bad.is_invalid_url());
    /// # }
    /// ```
    pub fn purge_url<U: AsUri + ?Sized>(&self, url: &U) -> PurgeHandle {
        match url.sealed_uri(Internal) {
            Ok(url) => self.purge_key(&self.url_key(&url)),
            Err(e) => PurgeHandle::invalid_url(e),
        }
    }

    /// Remove the entry with `key`, or every entry of the URL whose
    /// [`url_key`](Self::url_key) it is, or every entry stored under the
    /// [`route_key`](Self::route_key) it is. See [`PurgeHandle`].
    pub fn purge_key(&self, key: &CacheKey) -> PurgeHandle {
        self.state.purge(PurgeTarget::Key(*key))
    }

    /// Remove every entry whose response carried `tag` in its space-separated
    /// `Surrogate-Key` header. See [`PurgeHandle`].
    pub fn purge_tag(&self, tag: &str) -> PurgeHandle {
        self.state.purge(PurgeTarget::Tag(Box::from(tag)))
    }

    /// Mark every stored variant of `url` stale instead of removing it
    /// (Fastly's soft purge), in this process at once and in Redis and
    /// every instance through the returned [`PurgeHandle`].
    ///
    /// The next request starts one refresh (one per cluster, with Redis)
    /// and it and every request after it are answered with the stale copy
    /// until the refresh lands (`Cache-Status: …; fwd=stale; …;
    /// detail=soft-purge`), so a purge of a hot URL does not make its
    /// requests wait. The bound is the entry's own stale window counted
    /// from the purge: the larger of its `stale-while-revalidate` and the
    /// layer's [`grace`](CacheLayerBuilder::grace), and never past the end
    /// it already had. Past that, requests wait for the refresh as after a
    /// purge. An entry with no stale window (`must-revalidate`,
    /// `proxy-revalidate`, `s-maxage`, `no-cache`, or neither
    /// `stale-while-revalidate` nor grace) is never served stale: for it a
    /// soft purge is a purge. `stale-if-error` also counts from the purge.
    ///
    /// As with [`purge_url`](Self::purge_url), a fill that started before
    /// the soft purge is handed to the requests waiting on it but stored
    /// nowhere, and a soft-purged copy counts as stale on every instance
    /// (its `Age` says so too). The stale copies' responses are never
    /// fresh again: only the refresh's answer is. `url` is taken as by
    /// [`purge_url`](Self::purge_url), a bad one included.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use herdguard::{CacheLayer, Purged};
    ///
    /// let cache = CacheLayer::new();
    /// assert_eq!(cache.soft_purge_url("http://example.test/products/7").await.unwrap(), Purged::Local);
    /// # }
    /// ```
    pub fn soft_purge_url<U: AsUri + ?Sized>(&self, url: &U) -> PurgeHandle {
        match url.sealed_uri(Internal) {
            Ok(url) => self.soft_purge_key(&self.url_key(&url)),
            Err(e) => PurgeHandle::invalid_url(e),
        }
    }

    /// [`purge_key`](Self::purge_key), soft: the entry with `key` (or every
    /// entry of the URL whose [`url_key`](Self::url_key) it is, or stored
    /// under the [`route_key`](Self::route_key) it is) is marked stale and
    /// kept. See [`soft_purge_url`](Self::soft_purge_url).
    pub fn soft_purge_key(&self, key: &CacheKey) -> PurgeHandle {
        self.state
            .purge_with(PurgeTarget::Key(*key), PurgeMode::Soft)
    }

    /// [`purge_tag`](Self::purge_tag), soft: every entry whose response
    /// carried `tag` in `Surrogate-Key` is marked stale and kept. See
    /// [`soft_purge_url`](Self::soft_purge_url).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let cache = herdguard::CacheLayer::new();
    /// assert!(cache.soft_purge_tag("product-7").await.is_ok());
    /// # }
    /// ```
    pub fn soft_purge_tag(&self, tag: &str) -> PurgeHandle {
        self.state
            .purge_with(PurgeTarget::Tag(Box::from(tag)), PurgeMode::Soft)
    }
}
