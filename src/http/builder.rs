//! [`CacheLayerBuilder`]: every setting of a [`CacheLayer`], its bounds
//! checked when it is built. The settings of the origin calls (waits,
//! timeouts, caps, budget, breaker, refresh-ahead) are in `origin_settings.rs`.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;

use crate::engine::retained::RetainedStore;
use crate::engine::{Engine, EngineConfig};
use crate::error::BuildError;
use crate::http::layer::CacheLayer;
use crate::http::state::{HttpConfig, LayerState, MemoryBudget, ReloadMode, VARY_URL_BYTES};
use crate::http::vary::VaryIndex;
#[cfg(feature = "redis")]
use crate::lock::redlock::Redlock;
#[cfg(feature = "redis")]
use crate::store::redis::RedisOptions;

/// Builder for [`CacheLayer`]. Every wait and size has a bound by default.
#[derive(Debug, Clone)]
pub struct CacheLayerBuilder {
    pub(super) engine: EngineConfig,
    pub(super) http: HttpConfig,
}

impl CacheLayer {
    /// Configure a layer.
    pub fn builder() -> CacheLayerBuilder {
        CacheLayerBuilder {
            engine: EngineConfig::default(),
            http: HttpConfig::default(),
        }
    }
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
    /// (default: no cap; the stale grace is not shortened). The layer-wide form of [`RoutePolicy::max_ttl`](crate::RoutePolicy::max_ttl);
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
    /// [`RoutePolicy::ignore_origin_cache_control`](crate::RoutePolicy::ignore_origin_cache_control), with the same
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

    /// How many keys [`CacheLayer::hot_keys`](crate::CacheLayer::hot_keys)
    /// lists per measure (default 64; 0 keeps none, at most 4096). Its
    /// memory is fixed by this number, about 1.9 KiB per key listed, however
    /// many keys the layer sees; a hit on a listed key adds one uncontended
    /// lock and a counter.
    #[must_use]
    pub fn hot_keys(mut self, k: usize) -> Self {
        self.engine.hot_keys = k;
        self
    }

    /// The window hot keys are counted over (default 60 s, at least 1 s):
    /// two epochs of half of it, so a report covers the last half window to
    /// the whole one.
    #[must_use]
    pub fn hot_key_window(mut self, window: Duration) -> Self {
        self.engine.hot_key_window = window;
        self
    }

    /// Name hot keys by their whole URL, query included (default off: the
    /// path, with `?…` for a query, since queries can hold tokens). Keys
    /// under an axum route are named by the route either way.
    #[must_use]
    pub fn hot_key_full_urls(mut self, full: bool) -> Self {
        self.http.hot_key_full_urls = full;
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

    /// What a request's own refusal of the stored response (`no-cache`,
    /// `Pragma: no-cache`, `max-age=0`, a `max-age` below the entry's age,
    /// `min-fresh`) does; default [`ReloadMode::Coalesce`].
    #[must_use]
    pub fn reload(mut self, mode: ReloadMode) -> Self {
        self.http.reload = mode;
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
    pub fn redlock(mut self, redlock: Redlock) -> Self {
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
