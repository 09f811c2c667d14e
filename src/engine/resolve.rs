//! The engine's shared state and the miss path, readable top to bottom:
//! elect a local leader, drive its computation in a spawned task, wait
//! (bounded) for the outcome. Cross-instance work lives in `remote`.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::compute::{Compute, Fill, Work};
use super::config::{origin_gate, EngineConfig, WAIT_MARGIN};
use super::flight::{FlightHandle, FlightState, Flights, Joined, Outcome, Role};
use super::gate::{OriginGate, Priority};
use super::purge_log::key_name;
use super::retained::RetainedStore;
use super::spawn::spawn_detached;
use crate::entry::Value;
use crate::error::{BuildError, Error};
use crate::hot::{HotKeyTable, Measure};
use crate::key::CacheKey;
use crate::lock::redlock::Redlock;
use crate::metrics::{Counters, Source};
use crate::store::memory::{MemoryStore, Probe, Stored};
use crate::store::notice::{Notice, PurgeMode};
use crate::store::redis::RedisStore;

/// The result of the miss path, for the caller to turn into an answer.
/// Not [`Outcome`]: that is a flight's end as every waiter shares it; this
/// is one caller's, with what only it may hold (a fallback permit, the
/// private value of the request it led) and the ends outside any flight.
#[derive(Debug)]
pub(crate) enum Resolved<V> {
    Value {
        entry: Arc<Stored<V>>,
        source: Source,
    },
    /// Not shareable: `Some` only for the caller that led the computation.
    /// Boxed, as in [`Outcome::Pass`].
    Pass(Option<Box<V>>),
    Failed(Error),
    /// The bounded wait ran out; the caller may go to the origin uncached,
    /// under the fallback permit it was given.
    WaitTimedOut(OwnedSemaphorePermit),
    /// No flight runs for the key and the leader cap is full: the caller goes
    /// to the origin uncached, under the fallback cap.
    Overloaded,
}

impl<V> Resolved<V> {
    /// A copy a hard purge has marked since it was handed out.
    fn is_purged_copy(&self) -> bool {
        matches!(self, Resolved::Value { entry, .. } if entry.is_purged())
    }
}

/// The engine: state shared by every clone of a cache (and every route of
/// a layer), and the miss path over it.
#[derive(Debug)]
pub(crate) struct Engine<V: Value> {
    pub(crate) memory: MemoryStore<V>,
    pub(crate) flights: Arc<Flights<V>>,
    pub(crate) config: EngineConfig,
    /// Caps origin calls outside any flight (waits that ran out, answers
    /// that could not be shared, requests past the leader cap), so nothing
    /// reaches the origin uncapped.
    fallback: Arc<Semaphore>,
    /// Caps running flights (leader tasks): each holds one permit for its
    /// whole life, also after its caller went away.
    pub(super) leaders: Arc<Semaphore>,
    /// Bytes of response bodies buffered for fills right now, in permits of
    /// one byte: past it a fill streams to its own request and stores nothing.
    pub(crate) fill_bytes: Arc<Semaphore>,
    pub(crate) counters: Counters,
    /// The shared store; `None` runs on memory alone (the embedded default).
    pub(crate) remote: Option<Arc<RedisStore>>,
    /// Where entries read from Redis that may not be served are kept aside
    /// for their user (the HTTP layer's retained copies); `None` keeps none.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) retained: Option<RetainedStore<V>>,
    /// The lease backend when leases live on Redlock nodes.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(super) redlock: Option<Arc<Redlock>>,
    /// Every origin call's budget and the origin's breaker.
    pub(crate) gate: OriginGate,
    /// The hot keys (`None` when off): origin calls and waits are counted
    /// here, where they happen; requests by the cache's front (layer or
    /// `Cache`), which knows their names.
    pub(crate) hot: Option<HotKeyTable>,
}

impl<V: Value> Engine<V> {
    pub(crate) fn new(config: EngineConfig) -> Result<Self, BuildError> {
        config.validate()?;
        let remote = match &config.redis {
            Some(opts) => {
                // Fence marks and purge stamps outlive any fill that leased
                // before them: it writes within the origin timeout.
                let opts = opts
                    .clone()
                    .metrics_name(&config.metrics_name)
                    .fills_last(config.origin_timeout.saturating_add(config.max_wait()));
                let mut store = RedisStore::new(opts)?;
                if config.redlock.is_some() {
                    store.set_lease_elsewhere();
                }
                Some(Arc::new(store))
            }
            None if config.redlock.is_some() => return Err(BuildError::invalid(
                "redlock",
                "a redlock lease needs the redis main store too: values and the fence live there",
            )),
            None => None,
        };
        let redlock = config.redlock.clone();
        let memory = MemoryStore::new(config.capacity_bytes);
        let counters = Counters::new(&config.metrics_name, remote.is_some());
        let flights = Arc::new(Flights::new(counters.follower_count()));

        if let Some(remote) = &remote {
            // Other instances' purges clear this process's copy too, and beat
            // this process's fills of the key. (The HTTP layer installs a
            // richer handler for URL and tag purges.)
            let (mem, fl) = (memory.clone(), Arc::clone(&flights));
            remote.set_purge_handler(Arc::new(move |payload: &[u8]| {
                match Notice::parse(payload) {
                    // Purges may have gone by unheard: keep no copy from before.
                    Some(Notice::Missed) => mem.purge_where(|_, _| true),
                    Some(Notice::Key(key, PurgeMode::Hard)) => {
                        fl.purges.record([key_name(&key)]);
                        fl.purge_published(|k, _| *k == key);
                        mem.purge(&key);
                    }
                    _ => {}
                }
            }));
        }

        let gate = origin_gate(&config, remote.as_ref(), &counters);
        let hot =
            (config.hot_keys > 0).then(|| HotKeyTable::new(config.hot_keys, config.hot_key_window));
        Ok(Self {
            hot,
            memory,
            flights,
            gate,
            fallback: Arc::new(Semaphore::new(config.fallback_limit.max(1))),
            leaders: Arc::new(Semaphore::new(config.max_leaders.max(1))),
            fill_bytes: Arc::new(Semaphore::new(
                config.max_fill_bytes.min(Semaphore::MAX_PERMITS),
            )),
            counters,
            config,
            remote,
            retained: None,
            redlock,
        })
    }

    pub(crate) fn probe(&self, key: &CacheKey) -> Probe<V> {
        self.memory.probe(key)
    }

    /// [`Self::probe`] at `now`, for a hit that reads the clock once.
    pub(crate) fn probe_at(&self, key: &CacheKey, now: tokio::time::Instant) -> Probe<V> {
        self.memory.probe_at(key, now)
    }

    /// Whether a flight's lookup goes to Redis now (configured, breaker
    /// not open): what memory holds may then be behind it.
    pub(crate) fn shared_store_available(&self) -> bool {
        self.remote.as_ref().is_some_and(|r| r.available())
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
        // A follower woken with a copy a purge marked after its flight
        // ended goes round once more (leads or follows anew): the purge has
        // answered "purged", and this caller was not answered before it.
        let mut rounds = 0;
        loop {
            rounds += 1;
            match self.flights.join_or_lead(key, &self.leaders, false) {
                (Role::Follower(rx), _) => {
                    let resolved = self.wait(key, rx, false, true).await;
                    if rounds > 1 || !resolved.is_purged_copy() {
                        return resolved;
                    }
                }
                (Role::Leader(handle), _) => return self.lead(handle, compute).await,
                (Role::Overloaded, _) => return Resolved::Overloaded,
            }
        }
    }

    /// The flight running for `key`, if one runs: a caller that finds one
    /// may [`follow`](Self::follow) it without a computation of its own.
    pub(crate) fn running(&self, key: &CacheKey) -> Option<Joined<V>> {
        self.flights.follow(key)
    }

    /// Wait for a flight found [`running`](Self::running): what
    /// [`Self::resolve`] does for a follower.
    pub(crate) fn follow(
        &self,
        key: CacheKey,
        joined: Joined<V>,
    ) -> impl Future<Output = Resolved<V>> + '_ {
        self.wait(key, joined.0, false, true)
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
                    let resolved = self.wait(key, rx, false, false).await;
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
            // With Redis reachable, a marker here may be older than what
            // Redis holds (another instance's hit-for-miss stored the entry
            // over it): the flight looks there, one lookup, and Redis's
            // marker or entry decides.
            Probe::Pass if !self.shared_store_available() => {
                handle.complete(Outcome::Pass(None));
                return Resolved::Pass(None);
            }
            Probe::Fresh(_) | Probe::Stale(_) | Probe::Pass | Probe::Miss => {}
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
        self.spawn_drive(handle, Work::waited(compute.start()));
        self.wait(key, rx, true, !refresh).await
    }

    pub(super) fn spawn_drive(self: &Arc<Self>, handle: FlightHandle<V>, fut: Work<V>) {
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
    async fn drive(self: Arc<Self>, handle: FlightHandle<V>, fut: Work<V>) {
        let key = handle.key();
        let background = fut.priority != Priority::Waited;
        let outcome = match &self.remote {
            Some(remote) if remote.available() => {
                self.drive_remote(remote, &handle, fut, None).await
            }
            _ => self.compute_locally(key, fut).await,
        };
        handle.complete(unrun(outcome, background));
    }

    /// Memory alone: the embedded default, and the fail-open path when Redis
    /// is down (memory then keeps entries for their whole lifetime).
    pub(super) async fn compute_locally(&self, key: CacheKey, fut: Work<V>) -> Outcome<V> {
        let started = Instant::now();
        match self.run_compute(key, fut).await {
            Err(error) => {
                tracing::debug!(key = %key.short(), %error, "computation failed");
                Outcome::Failed(error)
            }
            Ok(fill) => self.fill_memory(
                key,
                self.unless_purged(key, fill),
                0,
                started.elapsed(),
                None,
            ),
        }
    }

    /// Run a computation for `key` through the origin gate (its budget,
    /// the breaker), with the origin timeout, turning a panic into an
    /// error; its health goes back to the breaker, and a failure to the
    /// key's stored copy (its backoff).
    pub(crate) async fn run_compute(&self, key: CacheKey, work: Work<V>) -> Result<Fill<V>, Error> {
        let Work {
            fut,
            priority,
            ticket,
        } = work;
        let pass = match self.gate.admit(priority, ticket, &self.counters).await {
            Ok(pass) => pass,
            Err(refusal) => return Err(self.refused(refusal, priority)),
        };
        self.counters.origin_call();
        self.hot_known(Measure::OriginCalls, &key, 1);
        let result = match tokio::time::timeout(
            self.config.origin_timeout,
            AssertUnwindSafe(fut).catch_unwind(),
        )
        .await
        {
            Err(_) => Err(Error::OriginTimeout),
            Ok(Err(_panic)) => Err(Error::Panicked),
            Ok(Ok(Err(e))) => Err(Error::Compute(Arc::from(e))),
            Ok(Ok(Ok(fill))) => Ok(fill),
        };
        let healthy = self.health(&result);
        pass.finish(healthy);
        if Self::fill_failed(healthy, &result) {
            self.note_failed_fill(&key);
        }
        result
    }

    /// Wait for the flight behind `rx`. `take_stale`: a stale copy the
    /// leader publishes is an answer (not for a caller that refuses it).
    /// An async block, not an async fn: it uses its captures in place (an
    /// async fn's arguments take room twice in every waiter's future).
    #[allow(
        clippy::manual_async_fn,
        reason = "an async block uses its captures in place; an async fn's arguments take room twice in the future"
    )]
    fn wait(
        &self,
        key: CacheKey,
        mut rx: watch::Receiver<FlightState<V>>,
        initiator: bool,
        take_stale: bool,
    ) -> impl Future<Output = Resolved<V>> + '_ {
        async move {
            let started = Instant::now();
            // The leader's own caller always gets an outcome: its task waits
            // for another instance's fill at most `max_wait`, then for an
            // origin permit at most `max_wait`, then computes within the
            // origin timeout (Redis calls have their own bounds, well below
            // the margin). Followers give up after `max_wait`.
            let max_wait = self.config.max_wait();
            let bound = if initiator {
                max_wait * 2 + self.config.origin_timeout + WAIT_MARGIN
            } else {
                max_wait
            };
            // One timer for the whole wait, reset rather than replaced if it
            // goes on, and one clock read at each end.
            let deadline = tokio::time::sleep_until(started + bound);
            tokio::pin!(deadline);
            let mut permit = None;
            let waited = match settle_by(&mut rx, take_stale, deadline.as_mut()).await {
                Err(()) if !initiator => {
                    permit = self.try_fallback_permit();
                    if permit.is_some() {
                        Err(())
                    } else {
                        // Past the fallback cap, calling the origin would
                        // mean queueing for a permit; the flight's own call
                        // ends within the origin timeout, so wait for it
                        // instead of making up an error.
                        let until = Instant::now() + self.config.origin_timeout;
                        deadline.as_mut().reset(until);
                        settle_by(&mut rx, take_stale, deadline.as_mut()).await
                    }
                }
                waited => waited,
            };
            let waited_for = started.elapsed();
            if !initiator {
                self.counters.wait(waited_for.as_secs_f64());
                self.hot_known(Measure::WaitedMs, &key, waited_for.as_millis() as u64);
            }
            tracing::Span::current().record("wait_ms", waited_for.as_millis() as u64);
            let resolved = resolved(waited, permit, initiator);
            if matches!(
                resolved,
                Resolved::Value {
                    source: Source::Coalesced,
                    ..
                }
            ) {
                // A follower that shared the flight's call.
                self.hot_known(Measure::Waiters, &key, 1);
            }
            resolved
        }
    }

    /// Count `amount` for `key` in the hot keys, named as its requests are.
    pub(crate) fn hot_known(&self, measure: Measure, key: &CacheKey, amount: u64) {
        if let Some(hot) = &self.hot {
            hot.record_known(measure, key, amount);
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
}

/// A background refresh the origin gate refused never ran: those who
/// joined it are not answered with the refusal, which was a background
/// call's, but released (`Pass(None)`) to make a call they wait for.
pub(super) fn unrun<V>(outcome: Outcome<V>, background: bool) -> Outcome<V> {
    match outcome {
        Outcome::Failed(Error::OriginBusy | Error::OriginDown { .. }) if background => {
            Outcome::Pass(None)
        }
        other => other,
    }
}

/// A flight's state once settled ([`settle`]): its outcome, or a stale
/// copy (`Err`), or the error that ended the wait.
type Settled<V> = Result<Result<Outcome<V>, Arc<Stored<V>>>, Error>;

/// One caller's result from what its wait came to (`Err`: the deadline
/// came first; `permit`: the fallback permit it took then).
fn resolved<V: Value>(
    waited: Result<Settled<V>, ()>,
    permit: Option<OwnedSemaphorePermit>,
    initiator: bool,
) -> Resolved<V> {
    let shared_source = if initiator {
        Source::Miss
    } else {
        Source::Coalesced
    };
    match waited {
        Err(()) => match permit {
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

/// What [`settle`] came to before `deadline`; `Err` when the deadline came first.
async fn settle_by<V: Value>(
    rx: &mut watch::Receiver<FlightState<V>>,
    take_stale: bool,
    deadline: std::pin::Pin<&mut tokio::time::Sleep>,
) -> Result<Settled<V>, ()> {
    tokio::select! {
        biased;
        settled = settle(rx, take_stale) => Ok(settled),
        () = deadline => Err(()),
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
        FlightState::Fresh(e) => take_stale && e.fresh_by_meta() && !e.is_purged(),
        FlightState::Stale(e) => take_stale && !e.is_purged(),
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
