//! The read-through state machine, HTTP-agnostic.
//!
//! ```text
//! probe memory ── fresh ─► Hit
//!      │ stale ─► Stale now, one background refresh (if none runs)
//!      │ pass  ─► caller goes to the origin itself
//!      ▼ miss
//! join_or_lead ── follower ─► wait (bounded) for the leader's outcome
//!      │ leader
//!      ▼
//! spawn drive(): compute (timeout + catch_unwind) → fill memory → complete flight
//! ```
//! The computation runs in a spawned task so a caller that goes away does not
//! cancel it for everyone waiting on it.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

use crate::entry::{EntryMeta, Value};
use crate::error::{BoxError, Error};
use crate::flight::{FlightHandle, FlightState, Flights, Outcome, Role};
use crate::key::CacheKey;
use crate::metrics::{self, Counters, Source, Stats};
use crate::store::memory::{MemoryStore, Probe, Stored};

/// What a computation produced, and what may be done with it.
#[derive(Debug)]
pub(crate) enum Fill<V> {
    /// Store it and share it with every waiter.
    Store {
        value: V,
        fresh_for: Duration,
        stale_for: Duration,
    },
    /// Share it with the callers waiting right now, but do not store it.
    Share(V),
    /// Neither store nor share. The initiating caller gets the value (if any);
    /// everyone else goes to the origin on their own, and a short pass marker
    /// stops new callers from queueing behind a fill that will never come.
    Pass(Option<V>),
}

pub(crate) type ComputeFuture<V> = BoxFuture<'static, Result<Fill<V>, BoxError>>;

/// Something that can start a computation. A trait rather than a closure so a
/// follower that never led can take its inputs back for a fallback.
pub(crate) trait Compute<V> {
    fn start(self) -> ComputeFuture<V>;
}

/// Adapts a closure to [`Compute`].
#[derive(Debug)]
pub(crate) struct FnCompute<F>(pub(crate) F);

impl<V, F: FnOnce() -> ComputeFuture<V>> Compute<V> for FnCompute<F> {
    fn start(self) -> ComputeFuture<V> {
        (self.0)()
    }
}

/// The result of the miss path, for the caller to turn into an answer.
#[derive(Debug)]
pub(crate) enum Resolved<V> {
    Value {
        entry: Arc<Stored<V>>,
        source: Source,
    },
    /// Not shareable: `Some` only for the caller that led the computation.
    Pass(Option<V>),
    Failed(Error),
    /// The bounded wait ran out; the caller may go to the origin uncached.
    WaitTimedOut,
}

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

#[derive(Debug, Clone)]
pub(crate) struct EngineConfig {
    pub(crate) capacity_bytes: u64,
    pub(crate) max_wait: Duration,
    pub(crate) origin_timeout: Duration,
    pub(crate) pass_ttl: Duration,
    pub(crate) fallback_limit: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            capacity_bytes: 256 * 1024 * 1024,
            // Well above typical origin times (nginx gives up after 5 s); the
            // origin timeout below bounds the leader anyway.
            max_wait: Duration::from_secs(30),
            origin_timeout: Duration::from_secs(60),
            pass_ttl: Duration::from_secs(5),
            fallback_limit: 64,
        }
    }
}

/// State shared by every clone of a cache (and every route of a layer).
#[derive(Debug)]
pub(crate) struct Shared<V: Value> {
    pub(crate) memory: MemoryStore<V>,
    pub(crate) flights: Arc<Flights<V>>,
    pub(crate) config: EngineConfig,
    /// Caps origin calls by callers whose wait ran out, so a stuck leader
    /// cannot turn into an unbounded herd.
    fallback: Semaphore,
    pub(crate) counters: Counters,
}

impl<V: Value> Shared<V> {
    pub(crate) fn new(config: EngineConfig) -> Self {
        Self {
            memory: MemoryStore::new(config.capacity_bytes),
            flights: Arc::new(Flights::new()),
            fallback: Semaphore::new(config.fallback_limit.max(1)),
            config,
            counters: Counters::default(),
        }
    }

    pub(crate) fn probe(&self, key: &CacheKey) -> Probe<V> {
        self.memory.probe(key)
    }

    /// Start one background refresh of `key` unless a flight already runs.
    pub(crate) fn refresh_in_background(self: &Arc<Self>, key: CacheKey, compute: impl Compute<V>) {
        if self.flights.is_running(&key) {
            return;
        }
        if let Role::Leader(handle) = self.flights.join_or_lead(key) {
            self.spawn_drive(handle, compute.start());
        }
    }

    /// The miss path: lead a new flight or follow the running one.
    ///
    /// `compute` is taken only if this caller leads, so a follower keeps it for
    /// a fallback of its own.
    pub(crate) async fn resolve<C: Compute<V>>(
        self: &Arc<Self>,
        key: CacheKey,
        compute: &mut Option<C>,
    ) -> Resolved<V> {
        match self.flights.join_or_lead(key) {
            Role::Follower(rx) => self.wait(rx, false).await,
            Role::Leader(handle) => {
                // The previous flight fills memory before it leaves the map, so
                // a fill may have landed between our probe and our election.
                match self.memory.probe(&key) {
                    Probe::Fresh(entry) => {
                        handle.complete(Outcome::Value {
                            entry: Arc::clone(&entry),
                            stored: true,
                        });
                        return Resolved::Value {
                            entry,
                            source: Source::Hit,
                        };
                    }
                    Probe::Pass => {
                        handle.complete(Outcome::Pass(None));
                        return Resolved::Pass(None);
                    }
                    Probe::Stale(_) | Probe::Miss => {}
                }
                let Some(compute) = compute.take() else {
                    // Unreachable by construction (the caller passes Some);
                    // fail this flight rather than panic.
                    handle.complete(Outcome::Failed(Error::Aborted));
                    return Resolved::Failed(Error::Aborted);
                };
                let Some(rx) = handle.subscribe() else {
                    return Resolved::Failed(Error::Aborted);
                };
                self.spawn_drive(handle, compute.start());
                self.wait(rx, true).await
            }
        }
    }

    fn spawn_drive(self: &Arc<Self>, handle: FlightHandle<V>, fut: ComputeFuture<V>) {
        let shared = Arc::clone(self);
        tokio::spawn(async move { shared.drive(handle, fut).await });
    }

    /// The leader's task: run the computation and publish its outcome.
    async fn drive(self: Arc<Self>, handle: FlightHandle<V>, fut: ComputeFuture<V>) {
        let key = handle.key();
        self.counters.origin_call();
        let outcome = match self.run_compute(fut).await {
            Err(error) => {
                tracing::debug!(key = %key.short(), %error, "computation failed");
                Outcome::Failed(error)
            }
            Ok(fill) => self.fill_memory(key, fill),
        };
        handle.complete(outcome);
    }

    /// Run a computation with the origin timeout, turning a panic into an error.
    pub(crate) async fn run_compute(&self, fut: ComputeFuture<V>) -> Result<Fill<V>, Error> {
        match tokio::time::timeout(
            self.config.origin_timeout,
            AssertUnwindSafe(fut).catch_unwind(),
        )
        .await
        {
            Err(_) => Err(Error::OriginTimeout),
            Ok(Err(_panic)) => Err(Error::Panicked),
            Ok(Ok(Err(e))) => Err(Error::Compute(Arc::from(e))),
            Ok(Ok(Ok(fill))) => Ok(fill),
        }
    }

    /// Put a fill into memory and say what waiters get.
    fn fill_memory(&self, key: CacheKey, fill: Fill<V>) -> Outcome<V> {
        match fill {
            Fill::Store {
                value,
                fresh_for,
                stale_for,
            } => {
                let usable = fresh_for.saturating_add(stale_for);
                metrics::record_entry_bytes(value.weight());
                let meta = EntryMeta::now(fresh_for, stale_for, 0);
                let entry = Arc::new(Stored::new(value, meta, fresh_for, usable, Duration::ZERO));
                let stored = !usable.is_zero();
                if stored {
                    self.memory.insert(key, Arc::clone(&entry));
                }
                Outcome::Value { entry, stored }
            }
            Fill::Share(value) => Outcome::Value {
                entry: Arc::new(Stored::new(
                    value,
                    EntryMeta::now(Duration::ZERO, Duration::ZERO, 0),
                    Duration::ZERO,
                    Duration::ZERO,
                    Duration::ZERO,
                )),
                stored: false,
            },
            Fill::Pass(value) => {
                self.memory.insert_pass(key, self.config.pass_ttl);
                Outcome::Pass(value)
            }
        }
    }

    async fn wait(&self, mut rx: watch::Receiver<FlightState<V>>, initiator: bool) -> Resolved<V> {
        let started = Instant::now();
        // The leader's own caller always gets an outcome: the computation is
        // bounded by the origin timeout. Followers give up after `max_wait`.
        let bound = if initiator {
            self.config.origin_timeout + Duration::from_secs(1)
        } else {
            self.config.max_wait
        };
        let waited = tokio::time::timeout(bound, async {
            match rx.wait_for(|s| !matches!(s, FlightState::Running)).await {
                Ok(state) => match &*state {
                    FlightState::Stale(entry) => Ok(Err(Arc::clone(entry))),
                    FlightState::Done(outcome) => Ok(Ok(outcome.clone())),
                    FlightState::Running => Err(Error::Aborted),
                },
                Err(_closed) => Err(Error::Aborted),
            }
        })
        .await;
        if !initiator {
            metrics::record_wait(started.elapsed().as_secs_f64());
        }
        let shared_source = if initiator {
            Source::Miss
        } else {
            Source::Coalesced
        };
        match waited {
            Err(_elapsed) => Resolved::WaitTimedOut,
            Ok(Err(error)) => Resolved::Failed(error),
            Ok(Ok(Err(stale))) => Resolved::Value {
                entry: stale,
                source: Source::Stale,
            },
            Ok(Ok(Ok(Outcome::Value { entry, .. }))) => Resolved::Value {
                entry,
                source: shared_source,
            },
            Ok(Ok(Ok(Outcome::Pass(v)))) => Resolved::Pass(if initiator { v } else { None }),
            Ok(Ok(Ok(Outcome::Failed(e)))) => Resolved::Failed(e),
        }
    }

    /// A permit for a fallback origin call, waiting at most `max_wait`.
    pub(crate) async fn fallback_permit(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        tokio::time::timeout(self.config.max_wait, self.fallback.acquire())
            .await
            .ok()
            .and_then(Result::ok)
    }

    // ---- Hooks for the HTTP layer (http-semantics branch). Memory only for
    // now; a shared store extends them with its own write and purge fan-out.

    /// Store a value outside any flight: a client's `no-cache` refresh, or a
    /// response filed under a second key (a Vary variant learned at fill time).
    pub(crate) fn store_outside_flight(
        &self,
        key: CacheKey,
        value: V,
        freshness: Freshness,
    ) -> Option<Arc<Stored<V>>> {
        let fill = Fill::Store {
            value,
            fresh_for: freshness.fresh_for,
            stale_for: freshness.stale_for,
        };
        match self.fill_memory(key, fill) {
            Outcome::Value { entry, .. } => Some(entry),
            Outcome::Pass(_) | Outcome::Failed(_) => None,
        }
    }

    /// Drop every entry of this process for which `matches` holds (purge by
    /// URL or tag). A shared store should also delete its copies and publish
    /// the purge so every instance runs it on its L1.
    pub(crate) fn purge_where(
        &self,
        matches: impl Fn(&CacheKey, &V) -> bool + Send + Sync + 'static,
    ) {
        self.memory.purge_where(matches);
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
/// let cache: Cache<String> = Cache::builder().build();
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
    pub(crate) shared: Arc<Shared<V>>,
}

impl<V: Value> Clone for Cache<V> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<V: Value> Cache<V> {
    /// A builder with the documented defaults.
    pub fn builder() -> CacheBuilder<V> {
        CacheBuilder {
            config: EngineConfig::default(),
            _value: std::marker::PhantomData,
        }
    }

    /// Return the cached value for `key`, or compute it once for all
    /// concurrent callers.
    ///
    /// - Fresh: returned at once ([`Source::Hit`]).
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
        let shared = &self.shared;
        let as_fill = FnCompute(move || -> ComputeFuture<V> {
            let fut = compute();
            Box::pin(async move {
                let value = fut.await.map_err(Into::into)?;
                Ok(Fill::Store {
                    value,
                    fresh_for: freshness.fresh_for,
                    stale_for: freshness.stale_for,
                })
            })
        });
        let lookup = |entry: &Arc<Stored<V>>, source| Lookup {
            value: entry.value.clone(),
            source,
            age: entry.age(),
        };
        let result = match shared.probe(key) {
            Probe::Fresh(entry) => Ok(lookup(&entry, Source::Hit)),
            Probe::Stale(entry) => {
                shared.refresh_in_background(*key, as_fill);
                Ok(lookup(&entry, Source::Stale))
            }
            Probe::Pass | Probe::Miss => {
                let mut compute = Some(as_fill);
                match shared.resolve(*key, &mut compute).await {
                    Resolved::Value { entry, source } => Ok(lookup(&entry, source)),
                    Resolved::Failed(e) => Err(e),
                    Resolved::Pass(_) | Resolved::WaitTimedOut => match compute.take() {
                        Some(compute) => self.fallback(compute).await,
                        None => Err(Error::Aborted),
                    },
                }
            }
        };
        match &result {
            Ok(l) => shared.counters.record(l.source),
            Err(_) => shared.counters.record_error(),
        }
        result
    }

    async fn fallback(&self, compute: impl Compute<V>) -> Result<Lookup<V>, Error> {
        let Some(_permit) = self.shared.fallback_permit().await else {
            return Err(Error::Overloaded);
        };
        self.shared.counters.origin_call();
        let value = match self.shared.run_compute(compute.start()).await? {
            Fill::Store { value, .. } | Fill::Share(value) | Fill::Pass(Some(value)) => value,
            Fill::Pass(None) => return Err(Error::Aborted),
        };
        Ok(Lookup {
            value,
            source: Source::Bypass,
            age: Duration::ZERO,
        })
    }

    /// Drop the entry for `key` from this process.
    pub fn invalidate(&self, key: &CacheKey) {
        self.shared.memory.remove(key);
    }

    /// Counters since the cache was built.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// Entries held in memory right now (after pending evictions run).
    pub fn entry_count(&self) -> u64 {
        self.shared.memory.entry_count()
    }

    /// Flights (computations) running right now.
    pub fn flights_running(&self) -> usize {
        self.shared.flights.len()
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
    pub fn capacity_bytes(mut self, bytes: u64) -> Self {
        self.config.capacity_bytes = bytes;
        self
    }

    /// Longest a caller waits for another caller's computation (default 30 s).
    #[must_use]
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.config.max_wait = wait;
        self
    }

    /// Longest a computation may run before it counts as failed (default 60 s).
    #[must_use]
    pub fn origin_timeout(mut self, timeout: Duration) -> Self {
        self.config.origin_timeout = timeout;
        self
    }

    /// How long a "do not cache" verdict stops callers from queueing (default 5 s).
    #[must_use]
    pub fn pass_ttl(mut self, ttl: Duration) -> Self {
        self.config.pass_ttl = ttl;
        self
    }

    /// Most concurrent origin calls by callers whose wait ran out (default 64).
    #[must_use]
    pub fn fallback_limit(mut self, limit: usize) -> Self {
        self.config.fallback_limit = limit;
        self
    }

    /// Build the cache.
    pub fn build(self) -> Cache<V> {
        Cache {
            shared: Arc::new(Shared::new(self.config)),
        }
    }
}
