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

pub(crate) mod flight;
pub(crate) mod purge_log;
pub(crate) mod retained;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

#[cfg(feature = "redis")]
use crate::entry::{decode_entry, encode_entry};
use crate::entry::{EntryMeta, Value};
use crate::error::{BoxError, BuildError, Error};
use crate::flight::{FlightHandle, FlightState, Flights, Outcome, Role};
use crate::key::CacheKey;
use crate::lock::redlock::Redlock;
#[cfg(feature = "redis")]
use crate::lock::watchdog::{HeldLease, Watchdog};
#[cfg(feature = "redis")]
use crate::lock::{FenceToken, LeaseToken};
use crate::metrics::{Counters, Source, Stats};
use crate::purge_log::key_name;
use crate::store::memory::{MemoryStore, Probe, Stored};
#[cfg(feature = "redis")]
use crate::store::redis::{FillSubscription, RemoteLookup, WriteMode};
use crate::store::redis::{RedisOptions, RedisStore};

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
    /// Uncacheable because of the one request that made it (its credentials,
    /// a `Set-Cookie` made for it): only the initiating caller gets it, the
    /// others go to the origin on their own, and what is stored stays. No
    /// pass marker: one request must not switch caching off for everyone.
    Private(V),
    /// Not buffered (the fill buffer budget was spent): the initiating caller
    /// got the response streamed, everyone else goes to the origin on their
    /// own. Unlike `Pass` nothing is marked: the next caller tries again.
    Unbuffered,
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
    /// The bounded wait ran out; the caller may go to the origin uncached,
    /// under the fallback permit it was given.
    WaitTimedOut(OwnedSemaphorePermit),
    /// No flight runs for the key and the leader cap is full: the caller goes
    /// to the origin uncached, under the fallback cap.
    Overloaded,
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
    /// `None`: follow the origin timeout (see [`EngineConfig::max_wait`]).
    pub(crate) max_wait: Option<Duration>,
    pub(crate) origin_timeout: Duration,
    pub(crate) pass_ttl: Duration,
    pub(crate) fallback_limit: usize,
    pub(crate) max_leaders: usize,
    pub(crate) max_fill_bytes: usize,
    /// Refresh-ahead: the last fraction of an entry's freshness in which a
    /// hit starts one background refresh (0 turns it off).
    pub(crate) refresh_ahead: f64,
    pub(crate) redis: Option<RedisOptions>,
    pub(crate) redlock: Option<Arc<Redlock>>,
    /// The `cache` label on every metric (the layer's `cache_name`).
    pub(crate) metrics_name: String,
}

/// How much longer than the origin timeout a waiter waits by default: room
/// for the leader's Redis round trips and the fill notification, so a slow
/// but healthy origin never releases the waiters to call it themselves.
pub(crate) const WAIT_MARGIN: Duration = Duration::from_secs(5);

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            capacity_bytes: 256 * 1024 * 1024,
            max_wait: None,
            // Well above typical origin times (nginx gives up after 5 s).
            origin_timeout: Duration::from_secs(60),
            pass_ttl: Duration::from_secs(5),
            fallback_limit: 64,
            max_leaders: 1024,
            max_fill_bytes: 64 * 1024 * 1024,
            refresh_ahead: DEFAULT_REFRESH_AHEAD,
            redis: None,
            redlock: None,
            metrics_name: "herdguard".to_owned(),
        }
    }
}

impl EngineConfig {
    /// A waiter's longest wait: as set, else the origin timeout plus
    /// [`WAIT_MARGIN`], so it outlasts the call it waits for.
    pub(crate) fn max_wait(&self) -> Duration {
        self.max_wait
            .unwrap_or(self.origin_timeout.saturating_add(WAIT_MARGIN))
    }
}
/// The default refresh-ahead fraction: the last quarter of the freshness.
pub(crate) const DEFAULT_REFRESH_AHEAD: f64 = 0.25;

/// State shared by every clone of a cache (and every route of a layer).
#[derive(Debug)]
pub(crate) struct Shared<V: Value> {
    pub(crate) memory: MemoryStore<V>,
    pub(crate) flights: Arc<Flights<V>>,
    pub(crate) config: EngineConfig,
    /// Caps origin calls outside any flight (waits that ran out, answers
    /// that could not be shared, requests past the leader cap), so nothing
    /// reaches the origin uncapped.
    fallback: Arc<Semaphore>,
    /// Caps running flights (leader tasks): each holds one permit for its
    /// whole life, also after its caller went away.
    leaders: Arc<Semaphore>,
    /// Bytes of response bodies buffered for fills right now, in permits of
    /// one byte: past it a fill streams to its own request and stores nothing.
    pub(crate) fill_bytes: Arc<Semaphore>,
    pub(crate) counters: Counters,
    /// The shared store; `None` runs on memory alone (the embedded default).
    pub(crate) remote: Option<Arc<RedisStore>>,
    /// The lease backend when leases live on Redlock nodes.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    redlock: Option<Arc<Redlock>>,
}

impl<V: Value> Shared<V> {
    pub(crate) fn new(config: EngineConfig) -> Result<Self, BuildError> {
        let remote = match &config.redis {
            Some(opts) => {
                let mut store = RedisStore::new(opts.clone().metrics_name(&config.metrics_name))?;
                if config.redlock.is_some() {
                    store.set_lease_elsewhere();
                }
                Some(Arc::new(store))
            }
            None if config.redlock.is_some() => return Err(BuildError::new(
                "a redlock lease needs the redis main store too: values and the fence live there",
            )),
            None => None,
        };
        let redlock = config.redlock.clone();
        let memory = MemoryStore::new(config.capacity_bytes);
        let flights = Arc::new(Flights::new());
        if let Some(remote) = &remote {
            // Other instances' purges clear this process's copy too, and beat
            // this process's fills of the key. (The HTTP layer installs a
            // richer handler for URL and tag purges.)
            let (mem, fl) = (memory.clone(), Arc::clone(&flights));
            remote.set_purge_handler(Arc::new(move |payload: &[u8]| {
                if let Some(key) = payload.strip_prefix(b"k:").and_then(CacheKey::from_hex) {
                    fl.purges.record([key_name(&key)]);
                    mem.remove(&key);
                }
            }));
        }
        Ok(Self {
            memory,
            flights,
            fallback: Arc::new(Semaphore::new(config.fallback_limit.max(1))),
            leaders: Arc::new(Semaphore::new(config.max_leaders.max(1))),
            fill_bytes: Arc::new(Semaphore::new(
                config.max_fill_bytes.min(Semaphore::MAX_PERMITS),
            )),
            counters: Counters::new(&config.metrics_name),
            config,
            remote,
            redlock,
        })
    }

    /// Drop an entry here and, with Redis, there too (in the background,
    /// bounded by the Redis timeouts).
    pub(crate) fn invalidate(&self, key: &CacheKey) {
        self.flights.purges.record([key_name(key)]);
        self.memory.remove(key);
        if let Some(remote) = &self.remote {
            let remote = Arc::clone(remote);
            let key = *key;
            spawn_detached("purge", async move {
                let notice = format!("k:{}", key.to_hex());
                if let Err(e) = remote.purge(&key).await {
                    tracing::warn!(key = %key.short(), error = %e, "purge in redis failed");
                }
                let _ = remote.publish_purge(notice.as_bytes()).await;
            });
        }
    }

    pub(crate) fn probe(&self, key: &CacheKey) -> Probe<V> {
        self.memory.probe(key)
    }

    /// Start one background refresh of `key` unless a flight already runs
    /// (or the leader cap is full: the stale copy keeps being served).
    pub(crate) fn refresh_in_background(self: &Arc<Self>, key: CacheKey, compute: impl Compute<V>) {
        if self.flights.is_running(&key) {
            return;
        }
        if let (Role::Leader(handle), _) = self.flights.join_or_lead(key, &self.leaders, false) {
            self.spawn_drive(handle, compute.start());
        }
    }

    /// Refresh `current` ahead of its expiry, in the background, unless a
    /// flight for `key` already runs. With Redis, the lease makes it one
    /// refresh for the whole cluster: an instance that finds the lease taken
    /// (or a newer entry already written) computes nothing.
    pub(crate) fn refresh_ahead(
        self: &Arc<Self>,
        key: CacheKey,
        current: &Arc<Stored<V>>,
        compute: impl Compute<V>,
    ) {
        let (Role::Leader(handle), _) = self.flights.join_or_lead(key, &self.leaders, false) else {
            return;
        };
        // Requests that need a fresh copy meanwhile (their L1 bound ran out)
        // take this one while it is fresh, instead of waiting for the origin.
        handle.publish_fresh(Arc::clone(current));
        let shared = Arc::clone(self);
        let current = Arc::clone(current);
        let fut = compute.start();
        let span = tracing::Span::current();
        spawn_detached(
            "refresh-ahead",
            tracing::Instrument::instrument(
                async move {
                    let key = handle.key();
                    let outcome = match &shared.remote {
                        Some(remote) if remote.available() => {
                            shared
                                .drive_remote(remote, &handle, fut, Some(&current))
                                .await
                        }
                        _ => shared.compute_locally(key, fut).await,
                    };
                    handle.complete(outcome);
                },
                span,
            ),
        );
    }

    /// The age at which a hit on an entry fresh for `fresh_for` starts its
    /// refresh ahead: the last `refresh_ahead` fraction of the freshness, or
    /// twice the origin time measured here for it if that is longer.
    fn refresh_age(&self, fresh_for: Duration, origin_time: Duration) -> Duration {
        let fraction = self.config.refresh_ahead;
        // NaN and negative fractions turn it off, like zero.
        if fraction.is_nan() || fraction <= 0.0 || fresh_for.is_zero() {
            return Duration::MAX;
        }
        let lead = fresh_for
            .mul_f64(fraction.min(1.0))
            .max(origin_time.saturating_mul(2))
            .min(fresh_for);
        fresh_for - lead
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
        match self.flights.join_or_lead(key, &self.leaders, false) {
            (Role::Follower(rx), _) => self.wait(rx, false, true).await,
            (Role::Leader(handle), _) => self.lead(handle, compute).await,
            (Role::Overloaded, _) => Resolved::Overloaded,
        }
    }

    /// The path of a caller that refuses the stored entry (a client's
    /// `no-cache`, or a `max-age` the entry is too old for): join the flight
    /// running for `key`, or lead a forced refresh that never takes the
    /// stored entry back. An ordinary flight that ends with the stored entry
    /// (found fresh in Redis, or stale) is not an answer for this caller: it
    /// goes round once more, so it then shares or starts a refresh.
    pub(crate) async fn resolve_refresh<C: Compute<V>>(
        self: &Arc<Self>,
        key: CacheKey,
        compute: &mut Option<C>,
    ) -> Resolved<V> {
        let mut rounds = 0;
        loop {
            rounds += 1;
            match self.flights.join_or_lead(key, &self.leaders, true) {
                (Role::Follower(rx), forced) => {
                    let resolved = self.wait(rx, false, false).await;
                    let stored = matches!(
                        resolved,
                        Resolved::Value {
                            source: Source::Hit | Source::Stale,
                            ..
                        }
                    );
                    if forced || !stored || rounds > 1 {
                        return resolved;
                    }
                }
                (Role::Leader(handle), _) => return self.lead(handle, compute).await,
                (Role::Overloaded, _) => return Resolved::Overloaded,
            }
        }
    }

    /// Lead the flight `handle` stands for and wait for its outcome.
    async fn lead<C: Compute<V>>(
        self: &Arc<Self>,
        handle: FlightHandle<V>,
        compute: &mut Option<C>,
    ) -> Resolved<V> {
        let key = handle.key();
        let refresh = handle.is_refresh();
        // The previous flight fills memory before it leaves the map, so
        // a fill may have landed between our probe and our election. A
        // forced refresh was started to replace that very entry.
        match self.memory.probe(&key) {
            Probe::Fresh(entry) if !refresh => {
                handle.complete(Outcome::Value {
                    entry: Arc::clone(&entry),
                    source: Source::Hit,
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
            Probe::Fresh(_) | Probe::Stale(_) | Probe::Miss => {}
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
        self.wait(rx, true, !refresh).await
    }

    fn spawn_drive(self: &Arc<Self>, handle: FlightHandle<V>, fut: ComputeFuture<V>) {
        let shared = Arc::clone(self);
        // The leader's task carries the request's span, so its lease, fence
        // and outcome show up under the request that started it.
        let span = tracing::Span::current();
        // Outside a runtime the handle is dropped unrun: its flight ends as
        // aborted and the next request leads again.
        spawn_detached(
            "refresh",
            tracing::Instrument::instrument(async move { shared.drive(handle, fut).await }, span),
        );
    }

    /// The leader's task: find the value in Redis, or win the lease and
    /// compute it, or wait for whoever holds the lease; then publish the
    /// outcome to this process's waiters.
    async fn drive(self: Arc<Self>, handle: FlightHandle<V>, fut: ComputeFuture<V>) {
        let key = handle.key();
        let outcome = match &self.remote {
            Some(remote) if remote.available() => {
                self.drive_remote(remote, &handle, fut, None).await
            }
            _ => self.compute_locally(key, fut).await,
        };
        handle.complete(outcome);
    }

    /// Memory alone: the embedded default, and the fail-open path when Redis
    /// is down (memory then keeps entries for their whole lifetime).
    async fn compute_locally(&self, key: CacheKey, fut: ComputeFuture<V>) -> Outcome<V> {
        self.counters.origin_call();
        let started = Instant::now();
        match self.run_compute(fut).await {
            Err(error) => {
                tracing::debug!(key = %key.short(), %error, "computation failed");
                Outcome::Failed(error)
            }
            Ok(fill) => self.fill_memory(key, self.unless_purged(key, fill), 0, started.elapsed()),
        }
    }

    /// A fill that started before a purge of its key, URL or tag is still
    /// the answer for the requests waiting on it, but it is not stored.
    fn unless_purged(&self, key: CacheKey, fill: Fill<V>) -> Fill<V> {
        match fill {
            Fill::Store { value, .. }
                if self.flights.purged_during(&key, || value.purge_groups()) =>
            {
                tracing::debug!(key = %key.short(), "purged while filling: shared, not stored");
                Fill::Share(value)
            }
            other => other,
        }
    }

    /// Insert into memory, then look at the purge log again: a purge that
    /// recorded itself between our check and our insert may have removed
    /// the key before we inserted it.
    fn insert_checked(&self, key: CacheKey, entry: &Arc<Stored<V>>) {
        self.memory.insert(key, Arc::clone(entry));
        if self
            .flights
            .purged_during(&key, || entry.value.purge_groups())
        {
            self.memory.remove(&key);
        }
    }

    /// `ahead`: the copy a refresh-ahead started from. The first lookup then
    /// takes the lease while the entry is still fresh (near its end), and a
    /// copy of that same write found instead starts no further refresh.
    #[cfg(feature = "redis")]
    async fn drive_remote(
        &self,
        remote: &Arc<RedisStore>,
        handle: &FlightHandle<V>,
        fut: ComputeFuture<V>,
        ahead: Option<&Arc<Stored<V>>>,
    ) -> Outcome<V> {
        let key = handle.key();
        let deadline = Instant::now() + self.config.max_wait();
        let mut skip_entry = false;
        let mut subscription: Option<FillSubscription> = None;
        // A forced refresh refuses the entry Redis holds when it first looks
        // (by its fence) and any entry no newer; it then looks past it for the
        // lease, and after each wait reads again to pick up a newer fill.
        let refresh = handle.is_refresh();
        let mut looked = false;
        let mut refused: Option<u64> = None;
        let mut read_entry = true;
        let mut ahead = ahead;
        loop {
            let token = LeaseToken::random();
            let first = !looked;
            looked = true;
            let skip = skip_entry || !read_entry;
            // Only the first lookup: a later one follows an ordinary path.
            let current = ahead.take();
            // Lease a fresh entry if it has at most the refresh-ahead lead
            // left (plus slack for the clocks): the hit that started this
            // saw it within that lead by its own clock.
            let lead = current.map_or(Duration::ZERO, |c| {
                c.meta.fresh_for.saturating_sub(c.age()) + Duration::from_millis(50)
            });
            let found = match remote.lookup_or_lease_ahead(&key, &token, skip, lead).await {
                Ok(found) => found,
                Err(e) => {
                    tracing::debug!(key = %key.short(), error = %e, "redis lookup failed; computing locally");
                    return self.compute_locally(key, fut).await;
                }
            };
            match found {
                RemoteLookup::Fresh {
                    bytes,
                    fresh_left,
                    hard_left,
                } => match decode_entry::<V>(bytes) {
                    Ok((meta, _))
                        if refresh && (first || refused.is_some_and(|r| meta.fence <= r)) =>
                    {
                        refused = Some(refused.map_or(meta.fence, |r| r.max(meta.fence)));
                        read_entry = false;
                    }
                    Ok((meta, value)) => {
                        let entry =
                            self.fill_l1(key, value, meta, fresh_left, hard_left, Duration::ZERO);
                        if current.is_some_and(|c| c.same_write(&meta)) {
                            // Someone else holds the refresh: this copy of the
                            // same write must not start another one.
                            entry.mark_refresh_claimed();
                        }
                        // A refresh found a newer fill: another instance's
                        // refresh, which this one shares.
                        let source = if refresh {
                            Source::Coalesced
                        } else {
                            Source::Hit
                        };
                        return Outcome::Value { entry, source };
                    }
                    Err(e) => {
                        crate::entry::report_corrupt(&key, &e);
                        skip_entry = true;
                    }
                },
                RemoteLookup::Stale {
                    bytes,
                    hard_left,
                    fence,
                } => {
                    let decoded = decode_entry::<V>(bytes);
                    if let Err(e) = &decoded {
                        crate::entry::report_corrupt(&key, e);
                    }
                    // An entry stored without a stale window is never handed
                    // out stale: Redis reports one so only in the last
                    // millisecond of its freshness (PTTL rounds down to 0
                    // while the key still exists). Handing it out sent every
                    // request that then refused it to the origin on its own.
                    let decoded = decoded.map(|(meta, value)| {
                        let servable = !meta.stale_for.is_zero();
                        (meta, value, servable)
                    });
                    match (decoded, fence) {
                        (Ok((meta, value, servable)), Some(fence)) => {
                            if servable {
                                let entry = self.fill_l1(
                                    key,
                                    value,
                                    meta,
                                    Duration::ZERO,
                                    hard_left,
                                    Duration::ZERO,
                                );
                                handle.publish_stale(entry);
                            }
                            let lease = HeldLease::Single(token);
                            return self.lead_remote(remote, key, lease, fence, fut).await;
                        }
                        (Ok((meta, value, servable)), None) => {
                            let entry = servable.then(|| {
                                self.fill_l1(
                                    key,
                                    value,
                                    meta,
                                    Duration::ZERO,
                                    hard_left,
                                    Duration::ZERO,
                                )
                            });
                            // With Redlock the lookup never leases: try for the
                            // refresh lease there, serve stale either way.
                            if let RedlockTry::Won(lease, fence) =
                                self.redlock_lease(remote, key, None).await
                            {
                                if let Some(entry) = entry {
                                    handle.publish_stale(entry);
                                }
                                return self.lead_remote(remote, key, lease, fence, fut).await;
                            }
                            // Someone else refreshes it. Everyone waiting here
                            // takes the stale copy now; this flight stays open
                            // until the fill lands (bounded), so stale answers
                            // meanwhile do not each look Redis up again.
                            if let Some(entry) = &entry {
                                handle.publish_stale(Arc::clone(entry));
                            }
                            let poll = remote.options.poll_interval;
                            if self
                                .wait_for_fill(remote, key, &mut subscription, poll, deadline)
                                .await
                            {
                                match entry {
                                    Some(entry) if !refresh => {
                                        return Outcome::Value {
                                            entry,
                                            source: Source::Stale,
                                        }
                                    }
                                    // Waited as long as allowed for a fill.
                                    _ => return self.compute_unshared(fut).await,
                                }
                            }
                            read_entry = true;
                        }
                        (Err(_), Some(fence)) => {
                            let lease = HeldLease::Single(token);
                            return self.lead_remote(remote, key, lease, fence, fut).await;
                        }
                        (Err(_), None) => skip_entry = true,
                    }
                }
                RemoteLookup::Leased { fence } => {
                    let lease = HeldLease::Single(token);
                    return self.lead_remote(remote, key, lease, fence, fut).await;
                }
                RemoteLookup::Miss => {
                    let newer_than = if refresh { refused } else { None };
                    match self.redlock_lease(remote, key, newer_than).await {
                        RedlockTry::Won(lease, fence) => {
                            return self.lead_remote(remote, key, lease, fence, fut).await
                        }
                        RedlockTry::FilledMeanwhile => {
                            read_entry = true;
                            continue;
                        }
                        RedlockTry::Contended => {}
                    }
                    read_entry = true;
                    if self.redlock.is_none() {
                        // Only a Redlock lookup says Miss; be safe if not.
                        return self.compute_locally(key, fut).await;
                    }
                    if self
                        .wait_for_fill(
                            remote,
                            key,
                            &mut subscription,
                            remote.options.poll_interval,
                            deadline,
                        )
                        .await
                    {
                        // Waited as long as allowed: one uncached call for this
                        // whole process, shared with its waiters.
                        return self.compute_unshared(fut).await;
                    }
                }
                RemoteLookup::Pass { left } => {
                    self.memory.insert_pass(key, left.min(self.config.pass_ttl));
                    return Outcome::Pass(None);
                }
                RemoteLookup::Held { lease_left } => {
                    self.counters.lock_acquire("contended");
                    read_entry = true;
                    if self
                        .wait_for_fill(remote, key, &mut subscription, lease_left, deadline)
                        .await
                    {
                        // Waited as long as allowed: one uncached call for this
                        // whole process, shared with its waiters.
                        return self.compute_unshared(fut).await;
                    }
                }
            }
        }
    }

    /// Someone else holds the lease: wait for its fill, bounded. Returns
    /// true when the overall wait is over.
    #[cfg(feature = "redis")]
    async fn wait_for_fill(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        subscription: &mut Option<FillSubscription>,
        lease_left: Duration,
        deadline: Instant,
    ) -> bool {
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        match subscription {
            // First time: subscribe, then look again before waiting, so a fill
            // published in between is not missed.
            None => *subscription = Some(remote.subscribe_fills(key)),
            Some(sub) => {
                let poll = if remote.notifications_live() {
                    remote.options.poll_interval
                } else {
                    remote
                        .options
                        .fallback_poll_interval
                        .min(remote.options.poll_interval)
                };
                let wait = poll
                    .min(lease_left + Duration::from_millis(5))
                    .min(deadline - now);
                sub.wait(wait).await;
            }
        }
        false
    }

    /// With a Redlock backend: one acquisition attempt (no retries: others
    /// wait for the fill instead), then a fence from the main store.
    ///
    /// `newer_than`: a refresh's refused fence; only a newer entry counts as
    /// filled meanwhile.
    #[cfg(feature = "redis")]
    async fn redlock_lease(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        newer_than: Option<u64>,
    ) -> RedlockTry {
        let Some(redlock) = self.redlock.as_ref() else {
            return RedlockTry::Contended;
        };
        let Ok(lease) = redlock.acquire_key(key, 0).await else {
            return RedlockTry::Contended;
        };
        // Lookup and lease are two steps here: the previous holder may have
        // filled the entry just before we won. Look again before computing.
        let unused = LeaseToken::random();
        if let Ok(RemoteLookup::Fresh { bytes, .. }) =
            remote.lookup_or_lease(&key, &unused, false).await
        {
            let newer = newer_than
                .is_none_or(|r| decode_entry::<V>(bytes).is_ok_and(|(meta, _)| meta.fence > r));
            if newer {
                redlock.release(lease).await;
                return RedlockTry::FilledMeanwhile;
            }
        }
        match remote.next_fence(&key).await {
            Ok(fence) => RedlockTry::Won(HeldLease::Redlock(Arc::clone(redlock), lease), fence),
            Err(e) => {
                tracing::debug!(key = %key.short(), error = %e, "no fence from the main store");
                redlock.release(lease).await;
                RedlockTry::Contended
            }
        }
    }

    /// Holding the lease: compute under the watchdog, then fenced write.
    #[cfg(feature = "redis")]
    async fn lead_remote(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        lease: HeldLease,
        fence: FenceToken,
        fut: ComputeFuture<V>,
    ) -> Outcome<V> {
        let single = matches!(lease, HeldLease::Single(_));
        let ttl = match &lease {
            HeldLease::Single(_) => {
                self.counters.lock_acquire("acquired");
                remote.options.lease_ttl
            }
            HeldLease::Redlock(lock, _) => lock.ttl(),
        };
        let held_since = Instant::now();
        let (watchdog, token) = Watchdog::watch(remote, key, lease, ttl, remote.options.watchdog);
        let span = tracing::Span::current();
        span.record("lease", token.prefix());
        span.record("fence", fence.0);
        self.counters.origin_call();
        let started = Instant::now();
        let result = self.run_compute(fut).await;
        let took = started.elapsed();
        let stopped = watchdog.stop().await;
        let lost = stopped.lost;
        self.counters
            .lease_remaining(stopped.remaining.as_secs_f64());
        // A lease that lives elsewhere is released after the write, so no one
        // can take it between our compute and our fill.
        let redlock = stopped.redlock;
        let fill = match result {
            Ok(fill) => self.unless_purged(key, fill),
            Err(error) => {
                tracing::debug!(key = %key.short(), %error, "computation failed");
                // Release and wake waiters: the next request elects a new leader.
                let _ = remote
                    .write_and_release(&key, &token, fence, WriteMode::Release)
                    .await;
                if let Some((lock, lease)) = redlock {
                    lock.release(lease).await;
                }
                if single {
                    self.counters.lock_held(held_since.elapsed().as_secs_f64());
                }
                return Outcome::Failed(error);
            }
        };
        let written = match &fill {
            Fill::Store {
                value,
                fresh_for,
                stale_for,
            } => {
                let meta = EntryMeta::now(*fresh_for, *stale_for, fence.0);
                let bytes = encode_entry(&meta, value);
                let hard = fresh_for.saturating_add(*stale_for);
                let mode = WriteMode::Store {
                    bytes: &bytes,
                    fresh: *fresh_for,
                    hard,
                };
                remote
                    .write_and_release(&key, &token, fence, mode)
                    .await
                    .map(|w| (w, Some(meta)))
            }
            Fill::Share(_) | Fill::Private(_) | Fill::Unbuffered => remote
                .write_and_release(&key, &token, fence, WriteMode::Release)
                .await
                .map(|w| (w, None)),
            Fill::Pass(_) => {
                let mode = WriteMode::Pass {
                    ttl: self.config.pass_ttl,
                };
                remote
                    .write_and_release(&key, &token, fence, mode)
                    .await
                    .map(|w| (w, None))
            }
        };
        if let Some((lock, lease)) = redlock {
            lock.release(lease).await;
        }
        if single {
            self.counters.lock_held(held_since.elapsed().as_secs_f64());
        }
        match written {
            Err(e) => {
                // Redis went away mid-flight: memory carries the entry.
                tracing::debug!(key = %key.short(), error = %e, "fenced write failed; keeping the value in memory");
                self.fill_memory(key, fill, fence.0, took)
            }
            Ok((w, meta)) => {
                if single && !w.released && !lost {
                    self.counters.lock_acquire("expired_mid_work");
                }
                if !w.accepted
                    && !matches!(fill, Fill::Share(_) | Fill::Private(_) | Fill::Unbuffered)
                {
                    self.counters.fenced_rejection();
                    tracing::warn!(key = %key.short(), fence = fence.0, "fenced write rejected: a newer write already landed");
                }
                match (fill, meta) {
                    (Fill::Store { value, .. }, Some(meta)) if w.accepted => {
                        self.counters.entry_bytes(value.weight());
                        let hard = meta.fresh_for.saturating_add(meta.stale_for);
                        self.index_in_background(remote, key, &value, hard);
                        // Measured from the store, not from now: the write's
                        // round trip is part of the entry's age.
                        let since = meta.elapsed();
                        let entry = self.fill_l1(
                            key,
                            value,
                            meta,
                            meta.fresh_for.saturating_sub(since),
                            hard.saturating_sub(since),
                            took,
                        );
                        Outcome::Value {
                            entry,
                            source: Source::Miss,
                        }
                    }
                    // Rejected: our value is still a correct answer for the
                    // requests that waited on it, but it is not stored.
                    (Fill::Store { value, .. }, _) | (Fill::Share(value), _) => Outcome::Value {
                        entry: unstored(value),
                        source: Source::Miss,
                    },
                    (Fill::Pass(value), _) => {
                        self.memory.insert_pass(key, self.config.pass_ttl);
                        Outcome::Pass(value)
                    }
                    (Fill::Private(value), _) => Outcome::Pass(Some(value)),
                    (Fill::Unbuffered, _) => Outcome::Pass(None),
                }
            }
        }
    }

    /// Record the entry under its purge groups (URL, tags) in Redis, off the
    /// request path.
    #[cfg(feature = "redis")]
    fn index_in_background(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        value: &V,
        ttl: Duration,
    ) {
        let groups = value.purge_groups();
        if groups.is_empty() {
            return;
        }
        let remote = Arc::clone(remote);
        tokio::spawn(async move { remote.index_groups(&key, &groups, ttl).await });
    }

    /// The remote wait ran out: compute once for this process, store nothing.
    #[cfg(feature = "redis")]
    async fn compute_unshared(&self, fut: ComputeFuture<V>) -> Outcome<V> {
        self.counters.origin_call();
        match self.run_compute(fut).await {
            Err(e) => Outcome::Failed(e),
            Ok(Fill::Store { value, .. }) | Ok(Fill::Share(value)) => Outcome::Value {
                entry: unstored(value),
                source: Source::Miss,
            },
            Ok(Fill::Pass(v)) => Outcome::Pass(v),
            Ok(Fill::Private(v)) => Outcome::Pass(Some(v)),
            Ok(Fill::Unbuffered) => Outcome::Pass(None),
        }
    }

    /// Put an entry read from (or written to) Redis into memory for at most
    /// the L1 lifetime (fresh answers) or its stale grace (stale answers),
    /// and never as fresh beyond its freshness.
    #[cfg(feature = "redis")]
    fn fill_l1(
        &self,
        key: CacheKey,
        value: V,
        meta: EntryMeta,
        fresh_left: Duration,
        hard_left: Duration,
        origin_time: Duration,
    ) -> Arc<Stored<V>> {
        let l1 = self.remote.as_ref().map_or(hard_left, |r| r.options.l1_ttl);
        // Fresh here for at most the L1 lifetime: after that, a request that
        // needs a fresh copy asks Redis again. The copy stays (as stale) for
        // the rest of its grace, so a stale-while-revalidate answer never
        // waits for a Redis round trip; the refresh it starts asks Redis.
        // An L1 lifetime of zero keeps nothing here.
        let usable = if l1.is_zero() {
            Duration::ZERO
        } else {
            hard_left
        };
        let entry = Arc::new(
            Stored::new(value, meta, fresh_left.min(l1), usable, meta.elapsed())
                .refresh_after(self.refresh_age(meta.fresh_for, origin_time)),
        );
        if !usable.is_zero() {
            self.insert_checked(key, &entry);
        }
        entry
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

    /// Put a fill into memory for its whole lifetime and say what waiters get.
    fn fill_memory(
        &self,
        key: CacheKey,
        fill: Fill<V>,
        fence: u64,
        origin_time: Duration,
    ) -> Outcome<V> {
        match fill {
            Fill::Store {
                value,
                fresh_for,
                stale_for,
            } => {
                let usable = fresh_for.saturating_add(stale_for);
                self.counters.entry_bytes(value.weight());
                let meta = EntryMeta::now(fresh_for, stale_for, fence);
                let entry = Arc::new(
                    Stored::new(value, meta, fresh_for, usable, Duration::ZERO)
                        .refresh_after(self.refresh_age(fresh_for, origin_time)),
                );
                if !usable.is_zero() {
                    self.insert_checked(key, &entry);
                }
                Outcome::Value {
                    entry,
                    source: Source::Miss,
                }
            }
            Fill::Share(value) => Outcome::Value {
                entry: unstored(value),
                source: Source::Miss,
            },
            Fill::Unbuffered => Outcome::Pass(None),
            Fill::Pass(value) => {
                self.memory.insert_pass(key, self.config.pass_ttl);
                Outcome::Pass(value)
            }
            Fill::Private(value) => Outcome::Pass(Some(value)),
        }
    }

    /// Wait for the flight behind `rx`. `take_stale`: a stale copy the
    /// leader publishes is an answer (not for a caller that refuses it).
    async fn wait(
        &self,
        mut rx: watch::Receiver<FlightState<V>>,
        initiator: bool,
        take_stale: bool,
    ) -> Resolved<V> {
        let started = Instant::now();
        // The leader's own caller always gets an outcome: its task waits for
        // another instance's fill at most `max_wait`, then computes within the
        // origin timeout (Redis calls have their own bounds, well below the
        // margin). Followers give up after `max_wait`.
        let max_wait = self.config.max_wait();
        let bound = if initiator {
            max_wait + self.config.origin_timeout + WAIT_MARGIN
        } else {
            max_wait
        };
        let mut waited = tokio::time::timeout(bound, settle(&mut rx, take_stale)).await;
        let mut permit = None;
        if waited.is_err() && !initiator {
            permit = self.try_fallback_permit();
            if permit.is_none() {
                // Past the fallback cap, calling the origin would mean
                // queueing for a permit; the flight's own call ends within
                // the origin timeout, so wait for it instead of making up an
                // error.
                waited =
                    tokio::time::timeout(self.config.origin_timeout, settle(&mut rx, take_stale))
                        .await;
            }
        }
        if !initiator {
            self.counters.wait(started.elapsed().as_secs_f64());
        }
        tracing::Span::current().record("wait_ms", started.elapsed().as_millis() as u64);
        let shared_source = if initiator {
            Source::Miss
        } else {
            Source::Coalesced
        };
        match waited {
            Err(_elapsed) => match permit {
                Some(permit) => Resolved::WaitTimedOut(permit),
                None => Resolved::Failed(Error::OriginTimeout),
            },
            Ok(Err(error)) => Resolved::Failed(error),
            Ok(Ok(Err(stale))) => Resolved::Value {
                entry: stale,
                source: Source::Stale,
            },
            Ok(Ok(Ok(Outcome::Value { entry, source }))) => Resolved::Value {
                entry,
                source: if source == Source::Miss {
                    shared_source
                } else {
                    source
                },
            },
            Ok(Ok(Ok(Outcome::Pass(v)))) => Resolved::Pass(if initiator { v } else { None }),
            Ok(Ok(Ok(Outcome::Failed(e)))) => Resolved::Failed(e),
        }
    }

    /// A permit for an origin call outside any flight, waiting at most
    /// `max_wait`. The permit lives as long as the call (drop it to give it back).
    pub(crate) async fn fallback_permit(&self) -> Option<OwnedSemaphorePermit> {
        tokio::time::timeout(
            self.config.max_wait(),
            Arc::clone(&self.fallback).acquire_owned(),
        )
        .await
        .ok()
        .and_then(Result::ok)
    }

    /// A fallback permit if one is free right now.
    pub(crate) fn try_fallback_permit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.fallback).try_acquire_owned().ok()
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
        if let Some(remote) = &self.remote {
            self.write_outside_flight(remote, key, &value, freshness);
        }
        let fill = Fill::Store {
            value,
            fresh_for: freshness.fresh_for,
            stale_for: freshness.stale_for,
        };
        match self.fill_memory(key, fill, 0, Duration::ZERO) {
            Outcome::Value { entry, .. } => Some(entry),
            Outcome::Pass(_) | Outcome::Failed(_) => None,
        }
    }

    /// Write a value to the shared store only (not to memory), outside any
    /// flight: a copy for instances that look a key up without knowing more.
    pub(crate) fn store_remote_only(&self, key: CacheKey, value: &V, freshness: Freshness) {
        if let Some(remote) = &self.remote {
            if remote.available() {
                self.write_outside_flight(remote, key, value, freshness);
            }
        }
    }

    /// The Redis half of [`store_outside_flight`](Self::store_outside_flight):
    /// a fresh fence, a fenced write (no lease is held, so nothing to
    /// release), and the purge index; in the background.
    #[cfg(feature = "redis")]
    fn write_outside_flight(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        value: &V,
        freshness: Freshness,
    ) {
        let hard = freshness.fresh_for.saturating_add(freshness.stale_for);
        if hard.is_zero() {
            return;
        }
        let groups = value.purge_groups();
        let remote = Arc::clone(remote);
        let value = value.clone();
        tokio::spawn(async move {
            let Ok(fence) = remote.next_fence(&key).await else {
                return;
            };
            let meta = EntryMeta::now(freshness.fresh_for, freshness.stale_for, fence.0);
            let bytes = encode_entry(&meta, &value);
            let mode = WriteMode::Store {
                bytes: &bytes,
                fresh: freshness.fresh_for,
                hard,
            };
            let nobody = LeaseToken::random();
            if let Ok(w) = remote.write_and_release(&key, &nobody, fence, mode).await {
                if w.accepted && !groups.is_empty() {
                    remote.index_groups(&key, &groups, hard).await;
                }
            }
        });
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

    /// Note a purge of `names` (see [`crate::purge_log`]) before its
    /// removals, so fills running now do not store over it.
    pub(crate) fn record_purge(&self, names: impl IntoIterator<Item = String>) {
        self.flights.purges.record(names);
    }
}

/// Spawn background work on the current runtime. The sync entry points
/// (purge, invalidate, `Service::call`) may run outside one; then the work is
/// skipped with a warning instead of panicking.
pub(crate) fn spawn_detached<F>(what: &'static str, fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(fut);
        }
        Err(_) => tracing::warn!(what, "no tokio runtime here: background work skipped"),
    }
}

/// The flight's state once it has settled: its outcome, or a stale copy
/// (`Err`) when `take_stale`.
async fn settle<V: Value>(
    rx: &mut watch::Receiver<FlightState<V>>,
    take_stale: bool,
) -> Result<Result<Outcome<V>, Arc<Stored<V>>>, Error> {
    // A copy still fresh while refresh-ahead runs answers those who take a
    // stored copy; a caller that refuses stored copies waits for the refresh.
    let settled = |s: &FlightState<V>| match s {
        FlightState::Running => false,
        FlightState::Fresh(e) => take_stale && e.fresh_by_meta(),
        FlightState::Stale(_) => take_stale,
        FlightState::Done(_) => true,
    };
    match rx.wait_for(settled).await {
        Ok(state) => match &*state {
            FlightState::Stale(entry) => Ok(Err(Arc::clone(entry))),
            FlightState::Fresh(entry) => Ok(Ok(Outcome::Value {
                entry: Arc::clone(entry),
                source: Source::Hit,
            })),
            FlightState::Done(outcome) => Ok(Ok(outcome.clone())),
            FlightState::Running => Err(Error::Aborted),
        },
        Err(_closed) => Err(Error::Aborted),
    }
}

/// One attempt at the Redlock lease.
#[derive(Debug)]
#[cfg(feature = "redis")]
enum RedlockTry {
    Won(HeldLease, FenceToken),
    /// Won, but the entry was filled just before: look it up instead.
    FilledMeanwhile,
    Contended,
}

/// Without the `redis` feature no [`RedisStore`] value exists, so these
/// never run; they keep the engine's call sites free of `cfg`.
#[cfg(not(feature = "redis"))]
impl<V: Value> Shared<V> {
    async fn drive_remote(
        &self,
        remote: &Arc<RedisStore>,
        _handle: &FlightHandle<V>,
        _fut: ComputeFuture<V>,
        _ahead: Option<&Arc<Stored<V>>>,
    ) -> Outcome<V> {
        match **remote {}
    }

    fn write_outside_flight(
        &self,
        remote: &Arc<RedisStore>,
        _key: CacheKey,
        _value: &V,
        _freshness: Freshness,
    ) {
        match **remote {}
    }
}

/// A value handed to the requests waiting now, with no lifetime in memory.
fn unstored<V>(value: V) -> Arc<Stored<V>> {
    Arc::new(Stored::new(
        value,
        EntryMeta::now(Duration::ZERO, Duration::ZERO, 0),
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
    ))
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
    /// - Fresh: returned at once ([`Source::Hit`]). The first hit in the last
    ///   quarter of the freshness also starts one background computation
    ///   (refresh-ahead, see [`CacheBuilder::refresh_ahead`]).
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
            Probe::Fresh(entry) => {
                if entry.claim_refresh(entry.age()) {
                    shared.refresh_ahead(*key, &entry, as_fill);
                }
                Ok(lookup(&entry, Source::Hit))
            }
            // Past its L1 lifetime but still fresh: ask Redis, as for a miss.
            Probe::Stale(entry) if !entry.fresh_by_meta() => {
                shared.refresh_in_background(*key, as_fill);
                Ok(lookup(&entry, Source::Stale))
            }
            Probe::Stale(_) | Probe::Pass | Probe::Miss => {
                let mut compute = Some(as_fill);
                match shared.resolve(*key, &mut compute).await {
                    Resolved::Value { entry, source } => Ok(lookup(&entry, source)),
                    Resolved::Failed(e) => Err(e),
                    Resolved::WaitTimedOut(permit) => match compute.take() {
                        Some(compute) => self.fallback(compute, Some(permit)).await,
                        None => Err(Error::Aborted),
                    },
                    Resolved::Pass(_) | Resolved::Overloaded => match compute.take() {
                        Some(compute) => self.fallback(compute, None).await,
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

    async fn fallback(
        &self,
        compute: impl Compute<V>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Result<Lookup<V>, Error> {
        let permit = match permit {
            Some(p) => Some(p),
            None => self.shared.fallback_permit().await,
        };
        let Some(_permit) = permit else {
            return Err(Error::Overloaded);
        };
        self.shared.counters.origin_call();
        let value = match self.shared.run_compute(compute.start()).await? {
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

    /// Drop the entry for `key` from this process and, with Redis, from Redis.
    pub fn invalidate(&self, key: &CacheKey) {
        self.shared.invalidate(key);
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

    /// Longest a caller waits for another caller's computation (default: the
    /// origin timeout plus 5 s, so a slow but healthy computation never
    /// releases its waiters). After that it computes on its own, uncached,
    /// under the fallback cap; with the cap full it keeps waiting on the
    /// flight, at most one more origin timeout.
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
    /// the fallback cap; a background refresh is skipped.
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
    /// ran out, or past the leader limit (default 64).
    #[must_use]
    pub fn fallback_limit(mut self, limit: usize) -> Self {
        self.config.fallback_limit = limit;
        self
    }

    /// Refresh-ahead (default 0.25; 0 turns it off): a hit in the last
    /// `fraction` of a value's freshness starts one background computation,
    /// so a hot value is replaced before it expires. See
    /// [`CacheLayerBuilder::refresh_ahead`](crate::CacheLayerBuilder::refresh_ahead).
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

    /// Build the cache.
    ///
    /// # Errors
    /// [`BuildError`] for an invalid Redis URL or namespace. Nothing connects
    /// here: an unreachable Redis only makes the cache fall back to memory.
    pub fn build(self) -> Result<Cache<V>, BuildError> {
        Ok(Cache {
            shared: Arc::new(Shared::new(self.config)?),
        })
    }
}
