//! Leading across instances: the leader's computation under its lease and
//! watchdog, the purge index recorded before the write, the fenced write
//! and its copies, and the fills that write without a lease.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use futures_util::future::join_all;

use crate::engine::compute::{AlsoStored, Fill, Work};
use crate::engine::fill::unstored;
use crate::engine::flight::Outcome;
use crate::engine::resolve::Engine;
use crate::entry::envelope::{encode_kept, EntryMeta};
use crate::entry::{FenceToken, LeaseToken};
use crate::entry::{Value, ValueMeta};
use crate::key::CacheKey;
use crate::lock::redlock::{Redlock, RedlockLease};
use crate::lock::watchdog::{HeldLease, Watchdog};
use crate::metrics::Source;
use crate::store::redis::{GroupIndex, RedisStore, StoreError, WriteMode, WriteOutcome};

impl<V: Value> Engine<V> {
    /// Holding the lease: compute under the watchdog, index the fill's keys
    /// under its purge groups (refusing to store if one was purged since
    /// `asked`), then the fenced write, then its copies under the same token.
    pub(super) async fn lead_remote(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        lease: HeldLease,
        fence: FenceToken,
        asked: Instant,
        fut: Work<V>,
    ) -> Outcome<V> {
        let single = matches!(lease, HeldLease::Single(_));
        let held_since = Instant::now();
        let (watchdog, token) = self.watch_lease(remote, key, lease, fence);
        self.flights.note_lease(&key, watchdog.clock());
        let started = Instant::now();
        let result = self.run_compute(key, fut).await;
        let took = started.elapsed();
        let stopped = watchdog.stop().await;
        let lost = stopped.lost;
        self.counters
            .lease_remaining(stopped.remaining.as_secs_f64());
        // A lease that lives elsewhere is released after the write, so no one
        // can take it between our compute and our fill.
        let redlock = stopped.redlock;
        let fill = match result {
            // Soft purges are dated by Redis (see `unless_hard_purged`); one
            // heard here still counts if the answer ends up in memory only.
            Ok(fill) => self.unless_hard_purged(key, fill),
            Err(error) => {
                tracing::debug!(key = %key.short(), %error, "computation failed");
                // Release and wake waiters: the next request elects a new leader.
                let _ = remote
                    .write_and_release(&key, &token, fence, WriteMode::Release)
                    .await;
                self.release_quorum(redlock, single, held_since).await;
                return Outcome::Failed(error);
            }
        };
        let (fill, written) = self
            .write_lead(remote, key, &token, fence, asked, fill)
            .await;
        self.release_quorum(redlock, single, held_since).await;
        match written {
            Err(e) => {
                // Redis went away mid-flight: memory carries the entry.
                tracing::debug!(key = %key.short(), error = %e, "fenced write failed; keeping the value in memory");
                let fill = self.unless_purged(key, fill);
                self.fill_memory(key, fill, fence.0, took, None)
            }
            Ok((w, meta)) => {
                if single && !w.released && !lost {
                    self.counters.lock_acquire("expired_mid_work");
                }
                self.note_rejection(key, fence, &w, &fill);
                match (fill, meta) {
                    (Fill::Store { value, copies, .. }, Some(meta)) if w.accepted => {
                        self.land(remote, key, fence, took, (value, copies), meta)
                            .await
                    }
                    // Rejected: our value is still a correct answer for the
                    // requests that waited on it, but it is not stored.
                    (Fill::Store { value, .. }, _) | (Fill::Share(value), _) => Outcome::Value {
                        entry: unstored(value),
                        source: Source::Miss,
                    },
                    // Redis kept a fresh entry rather than mark the key.
                    (Fill::Pass(value), _) if w.kept => Outcome::Pass(value.map(Box::new)),
                    (Fill::Pass(value), _) => {
                        self.insert_pass_unless_usable(key);
                        Outcome::Pass(value.map(Box::new))
                    }
                    (Fill::Private(value), _) => Outcome::Pass(Some(Box::new(value))),
                    (Fill::Unbuffered, _) => Outcome::Pass(None),
                }
            }
        }
    }

    /// Keep `lease` alive while the leader computes (its watchdog), with
    /// the lease and fence on the request's span.
    fn watch_lease(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        lease: HeldLease,
        fence: FenceToken,
    ) -> (Watchdog, LeaseToken) {
        let ttl = match &lease {
            HeldLease::Single(_) => {
                self.counters.lock_acquire("acquired");
                remote.options.lease_ttl
            }
            HeldLease::Redlock(lock, _) => lock.ttl(),
        };
        let (watchdog, token) = Watchdog::watch(
            remote,
            key,
            lease,
            ttl,
            remote.options.watchdog,
            self.counters.lease_lost(),
        );
        let span = tracing::Span::current();
        span.record("lease", token.prefix());
        span.record("fence", fence.0);
        (watchdog, token)
    }

    /// Release a lease that lives on the Redlock quorum (a single lease is
    /// released by the write), and count how long a single one was held.
    async fn release_quorum(
        &self,
        redlock: Option<(Arc<Redlock>, RedlockLease)>,
        single: bool,
        held_since: Instant,
    ) {
        if let Some((lock, lease)) = redlock {
            lock.release(lease).await;
        }
        if single {
            self.counters.lock_held(held_since.elapsed().as_secs_f64());
        }
    }

    /// Say why a leader's write stored nothing, when Redis refused it.
    fn note_rejection(&self, key: CacheKey, fence: FenceToken, w: &WriteOutcome, fill: &Fill<V>) {
        if w.purged {
            tracing::debug!(key = %key.short(), "purged in redis while filling: shared, not stored");
        } else if !w.accepted
            && !w.kept
            && !matches!(fill, Fill::Share(_) | Fill::Private(_) | Fill::Unbuffered)
        {
            self.counters.fenced_rejection();
            tracing::warn!(key = %key.short(), fence = fence.0, "fenced write rejected: a newer write already landed");
        }
    }

    /// A leader's accepted write: its copies under the same fence, then the
    /// entry in L1, aged from when Redis stored it.
    async fn land(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        fence: FenceToken,
        took: Duration,
        (value, copies): (V, Vec<AlsoStored>),
        meta: EntryMeta,
    ) -> Outcome<V> {
        self.counters.entry_bytes(value.weight());
        let hard = shared_lifetime(&value, meta.fresh_for, meta.stale_for);
        let wanted = copies.len();
        let copies = Self::write_copies(remote, fence, &meta, &value, copies).await;
        if copies.len() < wanted {
            self.counters.fenced_rejection();
        }
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
        if !copies.is_empty() && !remote.options.l1_ttl.is_zero() {
            self.insert_checked(key, &entry, &copies, None);
        }
        Outcome::Value {
            entry,
            source: Source::Miss,
        }
    }

    /// Write a leader's fill under its lease: record it in its purge groups
    /// (inside the write on a single server, first on a cluster), store it,
    /// a pass marker or nothing, and release the lease. Returns the fill (a
    /// purge seen while indexing first makes it shared, unstored) and what
    /// the write did, with the stored entry's meta.
    pub(super) async fn write_lead(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        token: &LeaseToken,
        fence: FenceToken,
        asked: Instant,
        fill: Fill<V>,
    ) -> (
        Fill<V>,
        Result<(WriteOutcome, Option<EntryMeta>), StoreError>,
    ) {
        // On a single server the groups are indexed inside the write.
        let fold = remote.folds_index();
        let (fill, checked) = if fold {
            (fill, Ok(()))
        } else {
            Self::index_before_write(remote, key, fill, asked, Some(fence)).await
        };
        let written = match (&fill, checked) {
            (_, Err(e)) => {
                let _ = remote
                    .write_and_release(&key, token, fence, WriteMode::Release)
                    .await;
                Err(e)
            }
            (
                Fill::Store {
                    value,
                    fresh_for,
                    stale_for,
                    copies,
                },
                Ok(()),
            ) => {
                let meta = EntryMeta::now(*fresh_for, *stale_for, fence.0);
                let hard = shared_lifetime(value, *fresh_for, *stale_for);
                let bytes = encode_kept(&meta, value, hard.saturating_sub(*fresh_for));
                let mode = WriteMode::Store {
                    bytes: &bytes,
                    fresh: *fresh_for,
                    hard,
                };
                let groups = if fold {
                    value.purge_groups()
                } else {
                    Vec::new()
                };
                let members: Vec<CacheKey> = std::iter::once(key)
                    .chain(copies.iter().map(|c| c.key))
                    .collect();
                let index = GroupIndex {
                    members: &members,
                    groups: &groups,
                    ttl: hard,
                    asked,
                };
                remote
                    .write_indexed_and_release(&key, token, fence, mode, &index)
                    .await
                    .map(|w| (w, Some(meta)))
            }
            (Fill::Share(_) | Fill::Private(_) | Fill::Unbuffered, Ok(())) => remote
                .write_and_release(&key, token, fence, WriteMode::Release)
                .await
                .map(|w| (w, None)),
            (Fill::Pass(_), Ok(())) => {
                let mode = WriteMode::Pass {
                    ttl: self.config.pass_ttl,
                };
                remote
                    .write_and_release(&key, token, fence, mode)
                    .await
                    .map(|w| (w, None))
            }
        };
        (fill, written)
    }

    /// The remote wait ran out: compute once for this process, store nothing.
    pub(super) async fn compute_unshared(&self, key: CacheKey, fut: Work<V>) -> Outcome<V> {
        match self.run_compute(key, fut).await {
            Err(e) => Outcome::Failed(e),
            Ok(Fill::Store { value, .. }) | Ok(Fill::Share(value)) => Outcome::Value {
                entry: unstored(value),
                source: Source::Miss,
            },
            Ok(Fill::Pass(v)) => Outcome::Pass(v.map(Box::new)),
            Ok(Fill::Private(v)) => Outcome::Pass(Some(Box::new(v))),
            Ok(Fill::Unbuffered) => Outcome::Pass(None),
        }
    }

    /// Before a fill is written: record its keys (its own and its copies')
    /// under its purge groups (URL, tags), and turn it into a shared,
    /// unstored answer if one of those groups was purged since `asked`.
    /// The order matters: a purge either finds these keys in the index (and
    /// raises their fences) or stamped the group before we looked (and we
    /// store nothing), so it holds without its notice reaching us.
    /// `leased`: the lease's fence token, when it was issued after `asked`
    /// and before the computation (it dates the fill exactly on a single
    /// server; see [`RedisStore::index_before_write`]).
    pub(super) async fn index_before_write(
        remote: &Arc<RedisStore>,
        key: CacheKey,
        fill: Fill<V>,
        asked: Instant,
        leased: Option<FenceToken>,
    ) -> (Fill<V>, Result<(), StoreError>) {
        let Fill::Store {
            value,
            fresh_for,
            stale_for,
            copies,
        } = fill
        else {
            return (fill, Ok(()));
        };
        let groups = value.purge_groups();
        if groups.is_empty() {
            let fill = Fill::Store {
                value,
                fresh_for,
                stale_for,
                copies,
            };
            return (fill, Ok(()));
        }
        let members: Vec<CacheKey> = std::iter::once(key)
            .chain(copies.iter().map(|c| c.key))
            .collect();
        let hard = shared_lifetime(&value, fresh_for, stale_for);
        match remote
            .index_before_write(&members, &groups, hard, asked, leased)
            .await
        {
            Ok(true) => {
                tracing::debug!(key = %key.short(), "purged in redis while filling: shared, not stored");
                (Fill::Share(value), Ok(()))
            }
            Ok(false) => {
                let fill = Fill::Store {
                    value,
                    fresh_for,
                    stale_for,
                    copies,
                };
                (fill, Ok(()))
            }
            Err(e) => {
                let fill = Fill::Store {
                    value,
                    fresh_for,
                    stale_for,
                    copies,
                };
                (fill, Err(e))
            }
        }
    }

    /// File an accepted fill's answer under its copies' keys in Redis, with
    /// the fill's own fence token: a purge that raised a copy's fence, or a
    /// newer fill's copy already there, refuses it. Returns the copies that
    /// landed (only those may be kept in memory).
    pub(super) async fn write_copies(
        remote: &Arc<RedisStore>,
        fence: FenceToken,
        meta: &EntryMeta,
        value: &V,
        copies: Vec<AlsoStored>,
    ) -> Vec<AlsoStored> {
        if copies.is_empty() {
            return copies;
        }
        let hard = shared_lifetime(value, meta.fresh_for, meta.stale_for);
        let bytes = encode_kept(meta, value, hard.saturating_sub(meta.fresh_for));
        let writes = copies.iter().map(|c| {
            let mode = WriteMode::Store {
                bytes: &bytes,
                fresh: meta.fresh_for,
                hard,
            };
            let key = c.key;
            async move { remote.write_unleased(&key, fence, mode).await }
        });
        let results = join_all(writes).await;
        copies
            .into_iter()
            .zip(results)
            .filter_map(|(c, r)| r.is_ok_and(|w| w.accepted).then_some(c))
            .collect()
    }

    /// After a lookup whose reply was lost (a timeout: it may have run and
    /// taken the lease for `token`): compute here, as when Redis is down,
    /// and also store a storable answer in Redis outside the flight (fenced,
    /// indexed and checked against purges since `asked`; its notice wakes
    /// other instances' waiters), then give back the lease it may hold.
    /// Otherwise every other instance waits on that lease until its TTL and
    /// then leads a second fill: the first flight after a slow start split.
    pub(super) async fn compute_after_lost_reply(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        token: LeaseToken,
        asked: Instant,
        fut: Work<V>,
    ) -> Outcome<V> {
        let started = Instant::now();
        let fill = match self.run_compute(key, fut).await {
            Ok(fill) => self.unless_purged(key, fill),
            Err(error) => {
                tracing::debug!(key = %key.short(), %error, "computation failed");
                self.write_then_release(remote, key, None, asked, token);
                return Outcome::Failed(error);
            }
        };
        let shared = match &fill {
            Fill::Store {
                value,
                fresh_for,
                stale_for,
                copies,
            } => Some(Fill::Store {
                value: value.clone(),
                fresh_for: *fresh_for,
                stale_for: *stale_for,
                copies: copies.clone(),
            }),
            _ => None,
        };
        self.write_then_release(remote, key, shared, asked, token);
        self.fill_memory(key, fill, 0, started.elapsed(), None)
    }

    /// In the background: [`write_outside_flight`](Self::write_outside_flight)'s
    /// work for `fill` (if any), then release `token`'s lease, in that order,
    /// so no other instance takes the lease before the answer is there.
    pub(super) fn write_then_release(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        fill: Option<Fill<V>>,
        asked: Instant,
        token: LeaseToken,
    ) {
        let remote = Arc::clone(remote);
        tokio::spawn(async move {
            if let Some(fill) = fill {
                Self::write_unfenced_fill(&remote, key, fill, asked).await;
            }
            let _ = remote.release(&key, &token).await;
        });
    }

    /// The Redis half of [`store_outside_flight`](Self::store_outside_flight),
    /// in the background: a fence token, the purge index and its check
    /// against `asked` (when the origin call started), the fenced write (no
    /// lease is held, so nothing to release), then the copies under the
    /// same token.
    pub(in crate::engine) fn write_outside_flight(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        fill: Fill<V>,
        asked: Instant,
    ) {
        if !matches!(fill, Fill::Store { .. }) {
            return;
        }
        let remote = Arc::clone(remote);
        tokio::spawn(async move { Self::write_unfenced_fill(&remote, key, fill, asked).await });
    }

    /// A fill written under no lease: a fence token of its own, the purge
    /// index and its check against `asked`, the fenced write, its copies.
    pub(super) async fn write_unfenced_fill(
        remote: &Arc<RedisStore>,
        key: CacheKey,
        fill: Fill<V>,
        asked: Instant,
    ) {
        if let Fill::Store {
            fresh_for,
            stale_for,
            ..
        } = &fill
        {
            if fresh_for.saturating_add(*stale_for).is_zero() {
                return;
            }
        }
        {
            // Taken before the index: a purge that finds the keys there
            // raises their fences above it.
            let Ok(fence) = remote.next_fence(&key).await else {
                return;
            };
            // Taken after the origin call, so it says nothing of when
            // that started: the time rule alone decides.
            let (fill, checked) = Self::index_before_write(remote, key, fill, asked, None).await;
            let Fill::Store {
                value,
                fresh_for,
                stale_for,
                copies,
            } = fill
            else {
                return;
            };
            if checked.is_err() {
                return;
            }
            let meta = EntryMeta::now(fresh_for, stale_for, fence.0);
            let hard = shared_lifetime(&value, fresh_for, stale_for);
            let bytes = encode_kept(&meta, &value, hard.saturating_sub(fresh_for));
            let mode = WriteMode::Store {
                bytes: &bytes,
                fresh: fresh_for,
                hard,
            };
            if let Ok(w) = remote.write_unleased(&key, fence, mode).await {
                if w.accepted {
                    Self::write_copies(remote, fence, &meta, &value, copies).await;
                }
            }
        }
    }
}

/// How long the shared store keeps an entry: its freshness and stale grace,
/// or its `stale-if-error` window past freshness when that is longer (capped
/// by the value), so an instance with no copy of its own can still answer an
/// origin error with it.
fn shared_lifetime<V: Value>(value: &V, fresh_for: Duration, stale_for: Duration) -> Duration {
    fresh_for.saturating_add(stale_for.max(value.error_grace()))
}
