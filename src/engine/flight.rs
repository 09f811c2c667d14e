//! In-process single flight: at most one leader per key per process.
//!
//! The map holds a `watch::Receiver` per running flight; the leader's task
//! owns the `Sender` inside a [`FlightHandle`]. Waiters subscribe and wait for
//! the state to leave `Running`. The handle's `Drop` covers a leader task that
//! ends without an outcome (runtime shutdown): the flight is removed and
//! waiters are told it was aborted, so the next call elects a new leader.

#![allow(
    dead_code,
    reason = "the shared-store parts are wired in by the Redis store"
)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::purge_log::{key_name, PurgeLog};
use crate::error::Error;
use crate::key::CacheKey;
#[cfg(feature = "redis")]
use crate::lock::watchdog::LeaseClock;
use crate::metrics::{FollowerCount, Source};
use crate::store::memory::Stored;

/// The observable state of one flight.
#[derive(Debug)]
pub(crate) enum FlightState<V> {
    Running,
    /// A stale copy may be served while the leader keeps refreshing.
    Stale(Arc<Stored<V>>),
    /// A refresh ahead of expiry runs; its copy answers waiters while it is
    /// still fresh by its own freshness. Past that they wait for the outcome.
    Fresh(Arc<Stored<V>>),
    Done(Outcome<V>),
}

/// How a flight ended; cloned out to every waiter.
/// Not [`Resolved`](super::resolve::Resolved): this one is shared by every
/// waiter (so `Clone`, and `Pass` still holds the leader's value), that one
/// is one caller's result (a permit it alone holds, `Pass` kept only for the
/// initiator, and the waits that never reach a flight).
#[derive(Debug)]
pub(crate) enum Outcome<V> {
    /// A value everyone may use. `source` is how the leader got it (a
    /// computed value is `Miss` for the leader, `Coalesced` for waiters).
    Value {
        entry: Arc<Stored<V>>,
        source: Source,
    },
    /// Not shareable: only the initiating request may use the value, every
    /// other waiter goes to the origin on its own. Boxed: the rare value
    /// would otherwise make every waiter's future as large as itself.
    Pass(Option<Box<V>>),
    Failed(Error),
}

impl<V: Clone> Clone for Outcome<V> {
    fn clone(&self) -> Self {
        match self {
            Outcome::Value { entry, source } => Outcome::Value {
                entry: Arc::clone(entry),
                source: *source,
            },
            Outcome::Pass(v) => Outcome::Pass(v.clone()),
            Outcome::Failed(e) => Outcome::Failed(e.clone()),
        }
    }
}

/// The running flights of one cache.
///
/// A std `Mutex` is right here: it is held only for a map operation, never
/// across an `.await`, and never while notifying waiters.
#[derive(Debug)]
pub(crate) struct Flights<V> {
    map: Mutex<HashMap<CacheKey, Running<V>>>,
    next_id: AtomicU64,
    /// Purges seen here: a flight that started before one of its key's
    /// purges shares its value but does not store it.
    pub(crate) purges: PurgeLog,
    /// Counts the requests of flights another instance's call filled.
    followers: FollowerCount,
}

/// One running flight, as the map holds it.
#[derive(Debug)]
struct Running<V> {
    /// Its id, so a finished leader never removes its successor.
    id: u64,
    /// The receiver new waiters clone.
    rx: watch::Receiver<FlightState<V>>,
    /// A forced refresh: its outcome is always a new origin answer, never
    /// the stored entry.
    forced: bool,
    /// The purge generation it started at.
    generation: u64,
    /// When it started.
    started: Instant,
    /// Requests that joined it so far (its leader not counted).
    joined: usize,
    /// Another instance's call filled it: whoever joins from now on is
    /// counted a follower as it joins.
    filled_elsewhere: bool,
    /// The Redis lease its leader holds, once taken.
    #[cfg(feature = "redis")]
    lease: Option<LeaseClock>,
}

/// A flight running now: what [`CacheLayer::flights`](crate::CacheLayer::flights)
/// and [`Cache::flights`](crate::Cache::flights) list.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Flight {
    /// The key being filled.
    pub key: CacheKey,
    /// How long its origin call (or lease wait) has run.
    pub age: Duration,
    /// Requests on this instance that joined it so far, its leader not
    /// counted (one that gave up waiting still counts).
    pub waiters: usize,
    /// Time left on the Redis lease this instance's leader holds for it;
    /// `None` in memory, and while the leader has no lease (yet, or
    /// because another instance holds it and this flight waits for its
    /// fill).
    pub lease_left: Option<Duration>,
    /// A refresh of a stored copy (stale, ahead of expiry, or asked for by
    /// a client), not a miss.
    pub refresh: bool,
}

/// A running flight a caller joined ([`Flights::follow`]), to wait on.
#[derive(Debug)]
pub(crate) struct Joined<V>(pub(super) watch::Receiver<FlightState<V>>);

impl<V> Joined<V> {
    /// Whether the flight has ended (it has left the map by then).
    pub(crate) fn ended(&self) -> bool {
        matches!(*self.0.borrow(), FlightState::Done(_))
    }
}

/// Whether the caller leads a new flight or follows a running one.
#[derive(Debug)]
pub(crate) enum Role<V> {
    Leader(FlightHandle<V>),
    Follower(watch::Receiver<FlightState<V>>),
    /// No flight runs for the key and the leader cap is full.
    Overloaded,
}

impl<V> Flights<V> {
    pub(crate) fn new(followers: FollowerCount) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            purges: PurgeLog::default(),
            followers,
        }
    }

    /// Another instance's origin call filled `key`'s flight: its requests
    /// here are that call's followers (the one leading it here too, when a
    /// request waits on it), and so is whoever joins before it ends.
    /// Returns how many it counted now.
    pub(crate) fn filled_elsewhere(&self, key: &CacheKey, leader_waits: bool) -> usize {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get_mut(key) {
            Some(running) if !running.filled_elsewhere => {
                running.filled_elsewhere = true;
                let n = running.joined + usize::from(leader_waits);
                self.followers.add(n);
                n
            }
            _ => 0,
        }
    }

    /// One more request joined `running`.
    fn joined(&self, running: &mut Running<V>) {
        running.joined += 1;
        if running.filled_elsewhere {
            self.followers.add(1);
        }
    }

    /// Follow the flight running for `key`, or lead a new one if a leader
    /// permit is free. `refresh` marks a new flight as a forced refresh.
    /// Returns whether a followed flight is one.
    pub(crate) fn join_or_lead(
        self: &Arc<Self>,
        key: CacheKey,
        leaders: &Arc<Semaphore>,
        refresh: bool,
    ) -> (Role<V>, bool) {
        // A poisoned map only means a panic elsewhere mid-insert; the map
        // itself is still consistent, so keep using it.
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(running) = map.get_mut(&key) {
            self.joined(running);
            return (Role::Follower(running.rx.clone()), running.forced);
        }
        // Taken under the map lock (never waits), so a key never has a
        // flight that lost its permit race.
        let Ok(permit) = Arc::clone(leaders).try_acquire_owned() else {
            return (Role::Overloaded, false);
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(FlightState::Running);
        let running = Running {
            id,
            rx,
            forced: refresh,
            generation: self.purges.generation(),
            started: Instant::now(),
            joined: 0,
            filled_elsewhere: false,
            #[cfg(feature = "redis")]
            lease: None,
        };
        map.insert(key, running);
        drop(map);
        let handle = FlightHandle {
            flights: Arc::clone(self),
            key,
            id,
            tx: Some(tx),
            refresh,
            _permit: permit,
        };
        (Role::Leader(handle), refresh)
    }

    /// The flight running for `key`, if one runs, joined without electing
    /// anyone: what [`Self::join_or_lead`] gives a follower.
    pub(crate) fn follow(&self, key: &CacheKey) -> Option<Joined<V>> {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.get_mut(key).map(|running| {
            self.joined(running);
            Joined(running.rx.clone())
        })
    }

    /// Whether a flight for `key` is running.
    pub(crate) fn is_running(&self, key: &CacheKey) -> bool {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(key)
    }

    /// Whether the running flight of `key` started before a purge of `key`
    /// or of one of `groups` (its value's purge groups). False when no
    /// flight runs for `key`.
    pub(crate) fn purged_during(
        &self,
        key: &CacheKey,
        groups: impl FnOnce() -> Vec<String>,
    ) -> bool {
        self.purged_during_as(key, groups, false)
    }

    /// [`purged_during`](Self::purged_during), counting hard purges only.
    #[cfg(feature = "redis")]
    pub(crate) fn hard_purged_during(
        &self,
        key: &CacheKey,
        groups: impl FnOnce() -> Vec<String>,
    ) -> bool {
        self.purged_during_as(key, groups, true)
    }

    fn purged_during_as(
        &self,
        key: &CacheKey,
        groups: impl FnOnce() -> Vec<String>,
        hard_only: bool,
    ) -> bool {
        let started = self
            .map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .map(|running| running.generation);
        started.is_some_and(|since| {
            let names = || {
                let mut names = groups();
                names.push(key_name(key));
                names
            };
            if hard_only {
                self.purges.hard_purged_since(since, names)
            } else {
                self.purges.purged_since(since, names)
            }
        })
    }

    /// Mark purged every copy a running flight published (a stale copy, or
    /// the fresh one a refresh ahead of expiry started from) for which
    /// `matches` holds: a request that joins the flight after a hard purge
    /// then waits for its outcome instead of taking the purged copy.
    pub(crate) fn purge_published(&self, matches: impl Fn(&CacheKey, &V) -> bool) {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        for (key, running) in map.iter() {
            if let FlightState::Stale(e) | FlightState::Fresh(e) = &*running.rx.borrow() {
                if matches(key, &e.value) {
                    e.mark_purged();
                }
            }
        }
    }

    /// The flights running now, oldest first, at most `limit` of them.
    /// One pass over the map under its lock (bounded by the leader cap).
    pub(crate) fn now_running(&self, limit: usize) -> Vec<Flight> {
        let now = Instant::now();
        let mut all: Vec<Flight> = {
            let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
            map.iter()
                .map(|(key, running)| Flight {
                    key: *key,
                    age: now.saturating_duration_since(running.started),
                    waiters: running.joined,
                    #[cfg(feature = "redis")]
                    lease_left: running.lease.as_ref().map(LeaseClock::left),
                    #[cfg(not(feature = "redis"))]
                    lease_left: None,
                    refresh: running.forced
                        || !matches!(*running.rx.borrow(), FlightState::Running),
                })
                .collect()
        };
        all.sort_by_key(|f| std::cmp::Reverse(f.age));
        all.truncate(limit);
        all
    }

    /// The lease the leader of `key`'s flight now holds.
    #[cfg(feature = "redis")]
    pub(crate) fn note_lease(&self, key: &CacheKey, clock: LeaseClock) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(running) = map.get_mut(key) {
            running.lease = Some(clock);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn remove(&self, key: &CacheKey, id: u64) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if map.get(key).is_some_and(|running| running.id == id) {
            map.remove(key);
        }
    }
}

/// Held by the leader of one flight.
#[derive(Debug)]
pub(crate) struct FlightHandle<V> {
    flights: Arc<Flights<V>>,
    key: CacheKey,
    id: u64,
    tx: Option<watch::Sender<FlightState<V>>>,
    /// A forced refresh: the stored entry must not be taken back as fresh.
    refresh: bool,
    /// One of the leader cap's permits, held for the flight's whole life
    /// (also when its caller went away).
    _permit: OwnedSemaphorePermit,
}

impl<V> FlightHandle<V> {
    pub(crate) fn is_refresh(&self) -> bool {
        self.refresh
    }

    pub(crate) fn subscribe(&self) -> Option<watch::Receiver<FlightState<V>>> {
        self.tx.as_ref().map(watch::Sender::subscribe)
    }

    pub(crate) fn key(&self) -> CacheKey {
        self.key
    }

    /// Let waiters take a stale copy now while the refresh goes on.
    pub(crate) fn publish_stale(&self, entry: Arc<Stored<V>>) {
        if let Some(tx) = &self.tx {
            tx.send_replace(FlightState::Stale(entry));
        }
    }

    /// Let waiters take a still-fresh copy while a refresh ahead of expiry runs.
    pub(crate) fn publish_fresh(&self, entry: Arc<Stored<V>>) {
        if let Some(tx) = &self.tx {
            tx.send_replace(FlightState::Fresh(entry));
        }
    }

    /// End the flight. The caller must have filled the memory tier first:
    /// a request arriving after removal looks there before leading anew.
    pub(crate) fn complete(mut self, outcome: Outcome<V>) {
        self.finish(outcome);
    }

    fn finish(&mut self, outcome: Outcome<V>) {
        if let Some(tx) = self.tx.take() {
            self.flights.remove(&self.key, self.id);
            tx.send_replace(FlightState::Done(outcome));
        }
    }
}

impl<V> Drop for FlightHandle<V> {
    fn drop(&mut self) {
        self.finish(Outcome::Failed(Error::Aborted));
    }
}
