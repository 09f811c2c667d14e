//! The public engine API: [`Cache`] and what a caller passes in and gets
//! back (its builder is in `cache_builder.rs`). Only drives the [`Engine`];
//! holds no state of its own.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::compute::{Compute, ComputeFuture, Fill, FnCompute, Work};
use super::flight::Flight;
use super::purge_log::key_name;
use super::resolve::{Engine, Resolved};
use crate::entry::Value;
use crate::error::{BoxError, Error};
use crate::hot::{HotKeys, Measure};
use crate::key::CacheKey;
use crate::metrics::{OwnCall, Source, Stats};
use crate::store::memory::{Probe, Stored};

/// How long a value stays fresh, and how long after that it may be served
/// stale while one refresh runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freshness {
    /// Time the value is served as a hit.
    pub fresh_for: Duration,
    /// Grace after freshness: served stale at once while one refresh runs.
    pub stale_for: Duration,
}

impl Freshness {
    /// Fresh for `fresh_for`, with no stale grace.
    pub const fn new(fresh_for: Duration) -> Self {
        Self {
            fresh_for,
            stale_for: Duration::ZERO,
        }
    }

    /// Add a stale-while-revalidate grace period.
    #[must_use]
    pub const fn with_stale(mut self, stale_for: Duration) -> Self {
        self.stale_for = stale_for;
        self
    }
}

/// A value and how it was obtained.
#[derive(Debug, Clone)]
pub struct Lookup<V> {
    /// The value.
    pub value: V,
    /// Where it came from.
    pub source: Source,
    /// Time since the value was computed.
    pub age: Duration,
}

impl<V: Value> Lookup<V> {
    fn of(entry: &Stored<V>, source: Source) -> Self {
        Self {
            value: entry.value.clone(),
            source,
            age: entry.age(),
        }
    }
}

/// The read-through cache engine, usable without HTTP.
///
/// Clones share one store and one set of flights. Concurrent callers of one
/// cold key run the computation once and share its outcome:
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use herdguard::{Cache, CacheKey, Freshness};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cache: Cache<String> = Cache::builder().build().unwrap();
/// let calls = Arc::new(AtomicUsize::new(0));
/// let key = CacheKey::new("report:7");
/// let fresh = Freshness::new(Duration::from_secs(5)).with_stale(Duration::from_secs(30));
///
/// let tasks: Vec<_> = (0..100)
///     .map(|_| {
///         let (cache, calls) = (cache.clone(), calls.clone());
///         tokio::spawn(async move {
///             cache
///                 .get_or_compute(&key, fresh, || async move {
///                     calls.fetch_add(1, Ordering::SeqCst);
///                     tokio::time::sleep(Duration::from_millis(20)).await;
///                     Ok::<_, std::io::Error>("expensive".to_string())
///                 })
///                 .await
///         })
///     })
///     .collect();
/// for t in tasks {
///     assert_eq!(t.await.unwrap().unwrap().value, "expensive");
/// }
/// assert_eq!(calls.load(Ordering::SeqCst), 1);
/// # }
/// ```
#[derive(Debug)]
pub struct Cache<V: Value> {
    pub(crate) engine: Arc<Engine<V>>,
}

impl<V: Value> Clone for Cache<V> {
    fn clone(&self) -> Self {
        Self {
            engine: Arc::clone(&self.engine),
        }
    }
}

impl<V: Value> Cache<V> {
    /// Return the cached value for `key`, or compute it once for all
    /// concurrent callers.
    ///
    /// - Fresh: returned at once ([`Source::Hit`]). The first hit in the last
    ///   quarter of the freshness also starts one background computation
    ///   (refresh-ahead, see [`CacheBuilder::refresh_ahead`](crate::CacheBuilder::refresh_ahead)).
    /// - Stale within the grace: returned at once ([`Source::Stale`]) while
    ///   exactly one refresh runs in the background.
    /// - Otherwise one caller per process leads ([`Source::Miss`]) and the rest
    ///   wait for its outcome ([`Source::Coalesced`]), at most `max_wait`;
    ///   after that they compute on their own, uncached, under a concurrency
    ///   cap ([`Source::Bypass`]).
    ///
    /// `compute` runs in a spawned task when this caller leads, so dropping
    /// this future does not cancel it for the others.
    ///
    /// # Errors
    /// Every waiter of a flight receives the same [`Error`]: the computation's
    /// own error ([`Error::Compute`]), a panic ([`Error::Panicked`]), the origin
    /// timeout ([`Error::OriginTimeout`]), or [`Error::Overloaded`] when the
    /// wait ran out and the fallback cap was full. The next call after a failure
    /// elects a new leader.
    pub async fn get_or_compute<F, Fut, E>(
        &self,
        key: &CacheKey,
        freshness: Freshness,
        compute: F,
    ) -> Result<Lookup<V>, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.get_or_compute_with(key, move || {
            let fut = compute();
            async move { fut.await.map(|value| (value, freshness)) }
        })
        .await
    }

    /// [`get_or_compute`](Self::get_or_compute) where the computation says
    /// how long its value stays fresh, as moka's `expire_after`: a token
    /// that expires in `expires_in`, a page whose age is known only once it
    /// is fetched. Everything else is as there: one computation for all
    /// concurrent callers, stale served while one refresh runs, the same
    /// [`Error`] for every waiter.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), herdguard::Error> {
    /// use std::time::Duration;
    /// use herdguard::{Cache, CacheKey, Freshness};
    ///
    /// let tokens: Cache<String> = Cache::builder().name("tokens").build().unwrap();
    /// let token = tokens
    ///     .get_or_compute_with(&CacheKey::new("api-token"), || async {
    ///         // What an OAuth token endpoint answers: the token and its lifetime.
    ///         let (token, expires_in) = ("t0k3n".to_string(), Duration::from_secs(3600));
    ///         // Renew a minute early.
    ///         let fresh = Freshness::new(expires_in.saturating_sub(Duration::from_secs(60)));
    ///         Ok::<_, std::io::Error>((token, fresh))
    ///     })
    ///     .await?;
    /// assert_eq!(token.value, "t0k3n");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`get_or_compute`](Self::get_or_compute).
    pub async fn get_or_compute_with<F, Fut, E>(
        &self,
        key: &CacheKey,
        compute: F,
    ) -> Result<Lookup<V>, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(V, Freshness), E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let engine = &self.engine;
        let as_fill = FnCompute(move || -> ComputeFuture<V> {
            let fut = compute();
            Box::pin(async move {
                let (value, freshness) = fut.await.map_err(Into::into)?;
                Ok(Fill::Store {
                    value,
                    fresh_for: freshness.fresh_for,
                    stale_for: freshness.stale_for,
                    copies: Vec::new(),
                })
            })
        });
        let result = match engine.probe(key) {
            Probe::Fresh(entry) => {
                if entry.claim_refresh(entry.age()) {
                    engine.refresh_ahead(*key, &entry, as_fill);
                }
                Ok(Lookup::of(&entry, Source::Hit))
            }
            // Past its L1 lifetime but still fresh: ask Redis, as for a miss.
            Probe::Stale(entry) if !entry.fresh_by_meta() => {
                engine.refresh_in_background(*key, &entry, as_fill);
                Ok(Lookup::of(&entry, Source::Stale))
            }
            Probe::Stale(_) | Probe::Pass | Probe::Miss => self.miss(key, as_fill).await,
        };
        self.record(key, &result);
        result
    }

    /// Nothing usable in memory: lead or follow the key's flight, or call
    /// alone when the flight cannot serve this caller.
    async fn miss(&self, key: &CacheKey, as_fill: impl Compute<V>) -> Result<Lookup<V>, Error> {
        let engine = &self.engine;
        // Waits on the origin: counted while it does (see `Caller`).
        let _caller = engine.gate.caller();
        let mut compute = Some(as_fill);
        let (permit, why) = match engine.resolve(*key, &mut compute).await {
            Resolved::Value { entry, source } => return Ok(Lookup::of(&entry, source)),
            Resolved::Failed(e) => return Err(e),
            Resolved::WaitTimedOut(permit) => (Some(permit), OwnCall::WaitTimeout),
            Resolved::Pass(_) => (None, OwnCall::HitForPass),
            Resolved::Overloaded => (None, OwnCall::Overloaded),
        };
        match compute.take() {
            Some(compute) => self.fallback(key, compute, permit, why).await,
            None => Err(Error::Aborted),
        }
    }

    /// Count the call's outcome, and its key among the hot ones.
    fn record(&self, key: &CacheKey, result: &Result<Lookup<V>, Error>) {
        let engine = &self.engine;
        match result {
            Ok(l) => engine.counters.record(l.source),
            Err(_) => engine.counters.record_error(),
        }
        let Some(hot) = &engine.hot else {
            return;
        };
        // Only the digest is known here: the name is its hex.
        hot.record(Measure::Requests, key, 1, Instant::now(), |out| {
            out.push_hex(key)
        });
        match result {
            Ok(Lookup {
                source: Source::Stale,
                ..
            }) => hot.record_known(Measure::Stale, key, 1),
            Ok(Lookup {
                source: Source::Bypass,
                ..
            }) => hot.record_known(Measure::Passes, key, 1),
            _ => {}
        }
    }

    async fn fallback(
        &self,
        key: &CacheKey,
        compute: impl Compute<V>,
        permit: Option<OwnedSemaphorePermit>,
        why: OwnCall,
    ) -> Result<Lookup<V>, Error> {
        let permit = match permit {
            Some(p) => Some(p),
            None => self.engine.fallback_permit().await,
        };
        let Some(_permit) = permit else {
            return Err(Error::Overloaded);
        };
        self.engine.counters.own_call(why);
        let work = Work::waited(compute.start());
        let value = match self.engine.run_compute(*key, work).await? {
            Fill::Store { value, .. }
            | Fill::Share(value)
            | Fill::Pass(Some(value))
            | Fill::Private(value) => value,
            Fill::Pass(None) | Fill::Unbuffered => return Err(Error::Aborted),
        };
        Ok(Lookup {
            value,
            source: Source::Bypass,
            age: Duration::ZERO,
        })
    }

    /// The fresh value this process holds for `key`, if any: no
    /// computation, no wait and no Redis round trip (and nothing counted).
    /// With Redis, this process keeps its copies at most `l1_ttl` (1 s by
    /// default), so a value another instance stored may be missing here:
    /// [`get_or_compute`](Self::get_or_compute) reads the shared store.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use herdguard::{Cache, CacheKey, Freshness};
    ///
    /// let cache: Cache<String> = Cache::builder().build().unwrap();
    /// let key = CacheKey::new("greeting");
    /// assert_eq!(cache.get(&key), None);
    /// cache.insert(&key, "hello".to_string(), Freshness::new(Duration::from_secs(60))).await;
    /// assert_eq!(cache.get(&key).as_deref(), Some("hello"));
    /// cache.invalidate(&key);
    /// assert_eq!(cache.get(&key), None);
    /// # }
    /// ```
    pub fn get(&self, key: &CacheKey) -> Option<V> {
        match self.engine.probe(key) {
            Probe::Fresh(entry) => Some(entry.value.clone()),
            Probe::Stale(_) | Probe::Pass | Probe::Miss => None,
        }
    }

    /// Store `value` for `key` without computing it: in this process at
    /// once and, with Redis, in Redis in the background (under a fence
    /// token of its own, so an older write cannot replace it). A
    /// computation of `key` already running when it is called stores
    /// nothing over it (its callers still get its value), as after
    /// [`invalidate`](Self::invalidate). A zero freshness and grace stores
    /// nothing and drops what was stored for `key` (as `invalidate` does):
    /// the value given is the current one, so an older one must not stay.
    pub async fn insert(&self, key: &CacheKey, value: V, freshness: Freshness) {
        if freshness
            .fresh_for
            .saturating_add(freshness.stale_for)
            .is_zero()
        {
            self.invalidate(key);
            return;
        }
        let engine = &self.engine;
        // Fills that started before this value are older than it.
        engine.record_purge([key_name(key)]);
        let started = engine.outside_start();
        let _ = engine.store_outside_flight(*key, value, freshness, Vec::new(), started);
    }

    /// Drop the entry for `key` from this process and, with Redis, from
    /// Redis (in the background, bounded by the Redis timeouts). A
    /// computation of `key` already running stores nothing.
    pub fn invalidate(&self, key: &CacheKey) {
        self.engine.invalidate(key);
    }

    /// Counters since the cache was built.
    pub fn stats(&self) -> Stats {
        self.engine.counters.snapshot()
    }

    /// Entries held in memory right now (after pending evictions run).
    pub fn entry_count(&self) -> u64 {
        self.engine.memory.entry_count()
    }

    /// The computations running right now, longest running first, at most
    /// `limit` of them, as [`CacheLayer::flights`](crate::CacheLayer::flights).
    pub fn flights(&self, limit: usize) -> Vec<Flight> {
        self.engine.flights.now_running(limit)
    }

    /// Flights (computations) running right now.
    pub fn flights_running(&self) -> usize {
        self.engine.flights.len()
    }

    /// The keys that stood out over the recent window: requests, origin
    /// calls, waiters, time waited, stale answers and passes, the top K of
    /// each (see [`HotKeys`] for the bounds). A `Cache` knows only its keys'
    /// digests, so each is named by its hex. Empty lists when
    /// [`hot_keys`](crate::CacheBuilder::hot_keys) is 0.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), herdguard::Error> {
    /// use std::time::Duration;
    /// use herdguard::{Cache, CacheKey, Freshness};
    ///
    /// let cache: Cache<String> = Cache::builder().build().unwrap();
    /// let key = CacheKey::new("user:7");
    /// for _ in 0..3 {
    ///     cache
    ///         .get_or_compute(&key, Freshness::new(Duration::from_secs(60)), || async {
    ///             Ok::<_, std::io::Error>("Ada".to_string())
    ///         })
    ///         .await?;
    /// }
    /// let hot = cache.hot_keys();
    /// assert_eq!(hot.requests[0].key, key.to_hex());
    /// assert_eq!(hot.requests[0].count, 3);
    /// assert_eq!(hot.origin_calls[0].count, 1);
    /// # Ok(()) }
    /// ```
    pub fn hot_keys(&self) -> HotKeys {
        match &self.engine.hot {
            Some(hot) => hot.report(),
            None => HotKeys::off(self.engine.config.hot_key_window),
        }
    }
}
