//! [`CacheBuilder`]: every setting of a [`Cache`] with its default, and
//! [`Cache::builder`]. The bounds are checked when the engine is built.

use std::sync::Arc;
use std::time::Duration;

use super::cache::Cache;
use super::config::EngineConfig;
use super::gate::OriginBreaker;
use super::resolve::Engine;
use crate::entry::Value;
use crate::error::BuildError;
#[cfg(feature = "redis")]
use crate::lock::redlock::Redlock;
#[cfg(feature = "redis")]
use crate::store::redis::RedisOptions;

impl<V: Value> Cache<V> {
    /// A builder with the documented defaults.
    pub fn builder() -> CacheBuilder<V> {
        CacheBuilder {
            config: EngineConfig::default(),
            _value: std::marker::PhantomData,
        }
    }
}

/// Configures a [`Cache`]. Every bound has a default; none is "unbounded".
#[derive(Debug)]
pub struct CacheBuilder<V> {
    pub(crate) config: EngineConfig,
    _value: std::marker::PhantomData<fn() -> V>,
}

impl<V: Value> CacheBuilder<V> {
    /// Total bytes the in-process store may hold (default 256 MiB).
    #[must_use]
    pub fn capacity_bytes(mut self, bytes: usize) -> Self {
        self.config.capacity_bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        self
    }

    /// Longest a caller waits for another caller's computation (default: the
    /// origin timeout plus 5 s, so a slow but healthy computation never
    /// releases its waiters). After that it computes on its own, uncached,
    /// under the fallback cap; with the cap full it keeps waiting on the
    /// flight, at most one more origin timeout. Unlike the HTTP layer's,
    /// this may be shorter than the origin timeout: waiters then compute on
    /// their own past it, which suits computations that are cheap to repeat.
    #[must_use]
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.config.max_wait = Some(wait);
        self
    }

    /// Longest a computation may run before it counts as failed (default 60 s).
    #[must_use]
    pub fn origin_timeout(mut self, timeout: Duration) -> Self {
        self.config.origin_timeout = timeout;
        self
    }

    /// Most computations (flights) running at once (default 1024). Past it a
    /// caller with no flight to join computes on its own, uncached, under
    /// the fallback cap; a background refresh is skipped. At least 1:
    /// `build()` refuses 0.
    #[must_use]
    pub fn leader_limit(mut self, limit: usize) -> Self {
        self.config.max_leaders = limit;
        self
    }

    /// How long a "do not cache" verdict stops callers from queueing (default 5 s).
    #[must_use]
    pub fn pass_ttl(mut self, ttl: Duration) -> Self {
        self.config.pass_ttl = ttl;
        self
    }

    /// Most concurrent computations outside any flight: callers whose wait
    /// ran out, or past the leader limit (default 64). At least 1: `build()`
    /// refuses 0.
    #[must_use]
    pub fn fallback_limit(mut self, limit: usize) -> Self {
        self.config.fallback_limit = limit;
        self
    }

    /// Most computations this cache runs at once, of every kind (default
    /// 64); see [`CacheLayerBuilder::origin_budget`](crate::CacheLayerBuilder::origin_budget).
    /// A caller refused a permit gets [`Error::OriginBusy`](crate::Error::OriginBusy).
    #[must_use]
    pub fn origin_budget(mut self, permits: usize) -> Self {
        self.config.origin_budget = permits;
        self
    }

    /// The breaker over computations: after failed ones in a row (errors,
    /// panics, timeouts) callers get
    /// [`Error::OriginDown`](crate::Error::OriginDown) at once until a
    /// probe succeeds; see [`OriginBreaker`](crate::OriginBreaker).
    #[must_use]
    pub fn origin_breaker(mut self, breaker: OriginBreaker) -> Self {
        self.config.breaker = breaker;
        self
    }

    /// Refresh-ahead (default 0.25; 0 turns it off): a hit in the last
    /// `fraction` of a value's freshness starts one background computation,
    /// so a hot value is replaced before it expires. See
    /// [`CacheLayerBuilder::refresh_ahead`](crate::CacheLayerBuilder::refresh_ahead).
    /// `build()` refuses a fraction outside 0 ≤ f < 1, or NaN.
    #[must_use]
    pub fn refresh_ahead(mut self, fraction: f64) -> Self {
        self.config.refresh_ahead = fraction;
        self
    }

    /// Share entries, leases and fills through Redis: one computation per
    /// key across every process using the same Redis and namespace.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[must_use]
    pub fn redis(mut self, options: RedisOptions) -> Self {
        self.config.redis = Some(options);
        self
    }

    /// Take leases on a Redlock quorum instead of the main Redis. Entries and
    /// fence counters stay on the main Redis (set with [`redis`](Self::redis)):
    /// the fence must live with the data it protects.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[must_use]
    pub fn redlock(mut self, redlock: Redlock) -> Self {
        self.config.redlock = Some(Arc::new(redlock));
        self
    }

    /// The `cache` label on every metric this cache records (default
    /// `herdguard`), as [`CacheLayerBuilder::cache_name`] does for a layer:
    /// give each cache its own name to read its hit ratio apart.
    ///
    /// [`CacheLayerBuilder::cache_name`]: crate::CacheLayerBuilder::cache_name
    ///
    /// ```
    /// let tokens: herdguard::Cache<String> =
    ///     herdguard::Cache::builder().name("tokens").build()?;
    /// # let _ = tokens; Ok::<(), herdguard::BuildError>(())
    /// ```
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.metrics_name = name.into();
        self
    }

    /// How many keys [`Cache::hot_keys`] lists per measure (default 64; 0
    /// keeps none, at most 4096). Its memory is fixed by this number, about
    /// 1.9 KiB per key listed (120 KiB at 64), however many keys the cache sees.
    #[must_use]
    pub fn hot_keys(mut self, k: usize) -> Self {
        self.config.hot_keys = k;
        self
    }

    /// The window [`Cache::hot_keys`] counts over (default 60 s, at least
    /// 1 s): two epochs of half of it, so a report covers the last half
    /// window to the whole one.
    #[must_use]
    pub fn hot_key_window(mut self, window: std::time::Duration) -> Self {
        self.config.hot_key_window = window;
        self
    }

    /// Build the cache.
    ///
    /// # Errors
    /// [`BuildError::InvalidSetting`] naming the setting for a
    /// `refresh_ahead` outside 0 ≤ f < 1 (or NaN), a `leader_limit` or
    /// `fallback_limit` of 0, or an invalid Redis namespace;
    /// [`BuildError::Redis`] for a Redis URL that cannot be used. Nothing
    /// connects here: an unreachable Redis only makes the cache fall back
    /// to memory.
    pub fn build(self) -> Result<Cache<V>, BuildError> {
        Ok(Cache {
            engine: Arc::new(Engine::new(self.config)?),
        })
    }
}
