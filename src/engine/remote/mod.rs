//! Leading and waiting across instances: one Redis lookup-or-lease, the
//! fenced write under the watchdog, waits for another instance's fill, and
//! the purge index. Redis only (the memory-only build has `no_redis`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use tokio::time::Instant;

use futures_util::future::join_all;

use super::compute::{ComputeFuture, Copy, Fill};
use super::envelope::{decode_entry, encode_kept, kept_of, EntryMeta, MAGIC, VERSION};
use super::fill::unstored;
use super::flight::{FlightHandle, Outcome};
use super::quorum_lease::RedlockTry;
use super::resolve::Engine;
use super::value::{Value, ValueMeta};
use crate::key::CacheKey;
use crate::lock::watchdog::{HeldLease, Watchdog};
use crate::lock::{FenceToken, LeaseToken};
use crate::metrics::Source;
use crate::store::memory::{Probe, Stored};
use crate::store::redis::{
    FillSubscription, GroupIndex, RedisStore, RemoteLookup, StoreError, Woken, WriteMode,
    WriteOutcome,
};

/// What a wait for another instance's fill came to.
enum Waited<V> {
    /// The overall wait is over.
    Over,
    /// The fill's notice carried its entry, now in L1.
    Filled(Arc<Stored<V>>),
    /// Look in Redis again.
    Look,
}

impl<V: Value> Engine<V> {
    /// `ahead`: the copy a refresh-ahead started from. The first lookup then
    /// takes the lease while the entry is still fresh (near its end), and a
    /// copy of that same write found instead starts no further refresh.
    pub(super) async fn drive_remote(
        &self,
        remote: &Arc<RedisStore>,
        handle: &FlightHandle<V>,
        mut fut: ComputeFuture<V>,
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
            // Before the lease is asked for (here or on Redlock below): a
            // purge of the fill's groups after this moment beats the fill.
            let asked = Instant::now();
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
                Err(e) if e.did_nothing() => {
                    tracing::debug!(key = %key.short(), error = %e, "redis lookup failed; computing locally");
                    return self.compute_locally(key, fut).await;
                }
                Err(e) => {
                    tracing::debug!(key = %key.short(), error = %e, "redis lookup's reply lost; computing here, then storing in redis");
                    return self
                        .compute_after_lost_reply(remote, key, token, asked, fut)
                        .await;
                }
            };
            // A full server (noeviction at maxmemory) takes no lease: serve
            // the stale copy it holds where allowed, and refresh here, one
            // origin call per instance, as when Redis is down.
            let Some((found, full)) = full_as_stale(found) else {
                tracing::debug!(key = %key.short(), "redis is full: no lease; computing locally");
                return self.compute_locally(key, fut).await;
            };
            match found {
                RemoteLookup::Fresh {
                    bytes,
                    fresh_left,
                    hard_left,
                } => match decode_entry::<V>(bytes) {
                    Ok((_, value)) if !remote.anchored(&key, &value.purge_groups()).await => {
                        // No index lists it (evicted): a purge may have missed
                        // it. Look past it for the lease and fill anew.
                        tracing::debug!(key = %key.short(), "entry no longer indexed; refilled");
                        skip_entry = true;
                    }
                    Ok((meta, value))
                        if refresh && (first || refused.is_some_and(|r| meta.fence <= r)) =>
                    {
                        // The refresh's origin call revalidates this copy, and
                        // an origin error does not replace it.
                        self.keep_aside(key, &value, meta, hard_left, None);
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
                        super::envelope::report_corrupt(&key, &e);
                        self.counters.corrupt_entry();
                        skip_entry = true;
                    }
                },
                RemoteLookup::Stale {
                    bytes,
                    hard_left,
                    fence,
                    holder,
                } => {
                    let decoded = self.read_stale(remote, key, bytes, hard_left).await;
                    if full {
                        if let Some((meta, value, true, soft)) = decoded {
                            let entry = self.fill_l1_stale(key, value, meta, hard_left, soft);
                            handle.publish_stale(entry);
                        }
                        return self.compute_locally(key, fut).await;
                    }
                    match (decoded, fence) {
                        (Some((meta, value, servable, soft)), Some(fence)) => {
                            if servable {
                                let entry = self.fill_l1_stale(key, value, meta, hard_left, soft);
                                handle.publish_stale(entry);
                            }
                            let lease = HeldLease::Single(token);
                            return self
                                .lead_remote(remote, key, lease, fence, asked, fut)
                                .await;
                        }
                        (Some((meta, value, servable, soft)), None) => {
                            let entry = servable
                                .then(|| self.fill_l1_stale(key, value, meta, hard_left, soft));
                            // With Redlock the lookup never leases: try for the
                            // refresh lease there, serve stale either way.
                            if let RedlockTry::Won(lease, fence) =
                                self.redlock_lease(remote, key, None).await
                            {
                                if let Some(entry) = entry {
                                    handle.publish_stale(entry);
                                }
                                return self
                                    .lead_remote(remote, key, lease, fence, asked, fut)
                                    .await;
                            }
                            // Someone else refreshes it. Everyone waiting here
                            // takes the stale copy now; this flight stays open
                            // until the fill lands (bounded), so stale answers
                            // meanwhile do not each look Redis up again.
                            if let Some(entry) = &entry {
                                handle.publish_stale(Arc::clone(entry));
                            }
                            let poll = remote.options.poll_interval;
                            let waited = self
                                .wait_for_fill(
                                    remote,
                                    key,
                                    &mut subscription,
                                    (poll, &holder),
                                    deadline,
                                    refresh.then_some(refused).flatten(),
                                )
                                .await;
                            let stale = entry.filter(|_| !refresh);
                            match self.after_wait(waited, refresh, stale, fut).await {
                                Ok(outcome) => return outcome,
                                Err(back) => fut = back,
                            }
                            read_entry = true;
                        }
                        (None, Some(fence)) => {
                            let lease = HeldLease::Single(token);
                            return self
                                .lead_remote(remote, key, lease, fence, asked, fut)
                                .await;
                        }
                        (None, None) => skip_entry = true,
                    }
                }
                RemoteLookup::Leased { fence } => {
                    let lease = HeldLease::Single(token);
                    return self
                        .lead_remote(remote, key, lease, fence, asked, fut)
                        .await;
                }
                RemoteLookup::Miss => {
                    let newer_than = if refresh { refused } else { None };
                    match self.redlock_lease(remote, key, newer_than).await {
                        RedlockTry::Won(lease, fence) => {
                            return self
                                .lead_remote(remote, key, lease, fence, asked, fut)
                                .await
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
                    let waited = self
                        .wait_for_fill(
                            remote,
                            key,
                            &mut subscription,
                            (remote.options.poll_interval, &Bytes::new()),
                            deadline,
                            newer_than,
                        )
                        .await;
                    match self.after_wait(waited, refresh, None, fut).await {
                        Ok(outcome) => return outcome,
                        Err(back) => fut = back,
                    }
                }
                // Turned into a stale reply or answered above.
                RemoteLookup::Full { .. } => return self.compute_locally(key, fut).await,
                RemoteLookup::Pass { left } => {
                    self.memory.insert_pass(key, left.min(self.config.pass_ttl));
                    return Outcome::Pass(None);
                }
                RemoteLookup::Held { lease_left, holder } => {
                    self.counters.lock_acquire("contended");
                    read_entry = true;
                    let newer_than = if refresh { refused } else { None };
                    let waited = self
                        .wait_for_fill(
                            remote,
                            key,
                            &mut subscription,
                            (lease_left, &holder),
                            deadline,
                            newer_than,
                        )
                        .await;
                    match self.after_wait(waited, refresh, None, fut).await {
                        Ok(outcome) => return outcome,
                        Err(back) => fut = back,
                    }
                }
            }
        }
    }

    /// Someone else holds the lease (`holder`, when known, with at most
    /// `lease_left` to run): wait for its fill, bounded.
    ///
    /// The first time, subscribe to the key's fill notices and, once that is
    /// in place, check that the same lease still runs (one GET): a fill that
    /// landed between the lookup and the subscription is then not missed.
    /// Without a known holder, look again instead. A notice that carries the
    /// entry answers at once (see [`take_notice`](Self::take_notice)). Each
    /// poll (a lost notice) is the same one GET while the lease runs.
    /// `newer_than`: a forced refresh takes only a fill newer than that fence.
    async fn wait_for_fill(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        subscription: &mut Option<FillSubscription>,
        (lease_left, holder): (Duration, &Bytes),
        deadline: Instant,
        newer_than: Option<u64>,
    ) -> Waited<V> {
        let bound = |now: Instant| {
            let poll = if remote.notifications_live() {
                remote.options.poll_interval
            } else {
                remote
                    .options
                    .fallback_poll_interval
                    .min(remote.options.poll_interval)
            };
            poll.min(lease_left + Duration::from_millis(5))
                .min(deadline.saturating_duration_since(now))
        };
        if Instant::now() >= deadline {
            return Waited::Over;
        }
        let sub = match subscription {
            Some(sub) => sub,
            None => {
                let sub = subscription.insert(remote.subscribe_fills(key));
                match sub.wait(bound(Instant::now())).await {
                    Woken::Fill(notice) => return self.take_notice(key, &notice, newer_than),
                    Woken::TimedOut => return Waited::Look,
                    Woken::Changed => {}
                }
                if holder.is_empty()
                    || !matches!(remote.lease_held_by(&key, holder).await, Ok(true))
                {
                    return Waited::Look;
                }
                sub
            }
        };
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Waited::Over;
            }
            match sub.wait(bound(now)).await {
                Woken::Fill(notice) => return self.take_notice(key, &notice, newer_than),
                Woken::Changed => return Waited::Look,
                // The poll, in case a notice was lost: while the same lease
                // runs, no fill has landed; one GET says so, where a lookup
                // would cost the script and its reads.
                Woken::TimedOut => {
                    if holder.is_empty()
                        || !matches!(remote.lease_held_by(&key, holder).await, Ok(true))
                    {
                        return Waited::Look;
                    }
                }
            }
        }
    }

    /// What a wait for another instance's fill leaves this request with:
    /// its outcome, or its computation back to look in Redis again. Past the
    /// overall wait it is the stale copy it holds, else one uncached call for
    /// this whole process, shared with its waiters.
    async fn after_wait(
        &self,
        waited: Waited<V>,
        refresh: bool,
        stale: Option<Arc<Stored<V>>>,
        fut: ComputeFuture<V>,
    ) -> Result<Outcome<V>, ComputeFuture<V>> {
        match waited {
            Waited::Over => Ok(match stale {
                Some(entry) => Outcome::Value {
                    entry,
                    source: Source::Stale,
                },
                None => self.compute_unshared(fut).await,
            }),
            Waited::Filled(entry) => Ok(Outcome::Value {
                entry,
                source: filled_source(refresh),
            }),
            Waited::Look => Err(fut),
        }
    }

    /// A fill notice's payload: the entry itself (into L1), unless it is
    /// not one (a wake-up: look it up), does not decode, is no newer than
    /// `newer_than`, or is older than the copy this instance already holds
    /// (a notice is never trusted over the fence).
    fn take_notice(&self, key: CacheKey, notice: &Bytes, newer_than: Option<u64>) -> Waited<V> {
        if notice.get(..3) != Some(&[MAGIC[0], MAGIC[1], VERSION][..]) {
            return Waited::Look;
        }
        let (meta, value) = match decode_entry::<V>(notice.clone()) {
            Ok(decoded) => decoded,
            Err(e) => {
                tracing::debug!(key = %key.short(), error = %e, "fill notice does not decode; reading the entry");
                return Waited::Look;
            }
        };
        let held = match self.memory.probe(&key) {
            Probe::Fresh(e) | Probe::Stale(e) => Some(e.meta.fence),
            _ => None,
        };
        if held.is_some_and(|h| meta.fence < h) || newer_than.is_some_and(|r| meta.fence <= r) {
            tracing::debug!(key = %key.short(), fence = meta.fence, "fill notice older than the copy held; ignored");
            return Waited::Look;
        }
        // Published as the entry was stored: all of its lifetime is left.
        let hard = meta.fresh_for.saturating_add(meta.stale_for);
        let entry = self.fill_l1(key, value, meta, meta.fresh_for, hard, Duration::ZERO);
        Waited::Filled(entry)
    }

    /// Holding the lease: compute under the watchdog, index the fill's keys
    /// under its purge groups (refusing to store if one was purged since
    /// `asked`), then the fenced write, then its copies under the same token.
    async fn lead_remote(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        lease: HeldLease,
        fence: FenceToken,
        asked: Instant,
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
            // Soft purges are dated by Redis (see `unless_hard_purged`); one
            // heard here still counts if the answer ends up in memory only.
            Ok(fill) => self.unless_hard_purged(key, fill),
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
        let (fill, written) = self
            .write_lead(remote, key, &token, fence, asked, fill)
            .await;
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
                let fill = self.unless_purged(key, fill);
                self.fill_memory(key, fill, fence.0, took, None)
            }
            Ok((w, meta)) => {
                if single && !w.released && !lost {
                    self.counters.lock_acquire("expired_mid_work");
                }
                if w.purged {
                    tracing::debug!(key = %key.short(), "purged in redis while filling: shared, not stored");
                } else if !w.accepted
                    && !w.kept
                    && !matches!(fill, Fill::Share(_) | Fill::Private(_) | Fill::Unbuffered)
                {
                    self.counters.fenced_rejection();
                    tracing::warn!(key = %key.short(), fence = fence.0, "fenced write rejected: a newer write already landed");
                }
                match (fill, meta) {
                    (Fill::Store { value, copies, .. }, Some(meta)) if w.accepted => {
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
                    // Rejected: our value is still a correct answer for the
                    // requests that waited on it, but it is not stored.
                    (Fill::Store { value, .. }, _) | (Fill::Share(value), _) => Outcome::Value {
                        entry: unstored(value),
                        source: Source::Miss,
                    },
                    // Redis kept a fresh entry rather than mark the key.
                    (Fill::Pass(value), _) if w.kept => Outcome::Pass(value),
                    (Fill::Pass(value), _) => {
                        self.insert_pass_unless_usable(key);
                        Outcome::Pass(value)
                    }
                    (Fill::Private(value), _) => Outcome::Pass(Some(value)),
                    (Fill::Unbuffered, _) => Outcome::Pass(None),
                }
            }
        }
    }

    /// Write a leader's fill under its lease: record it in its purge groups
    /// (inside the write on a single server, first on a cluster), store it,
    /// a pass marker or nothing, and release the lease. Returns the fill (a
    /// purge seen while indexing first makes it shared, unstored) and what
    /// the write did, with the stored entry's meta.
    async fn write_lead(
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

    /// Before a fill is written: record its keys (its own and its copies')
    /// under its purge groups (URL, tags), and turn it into a shared,
    /// unstored answer if one of those groups was purged since `asked`.
    /// The order matters: a purge either finds these keys in the index (and
    /// raises their fences) or stamped the group before we looked (and we
    /// store nothing), so it holds without its notice reaching us.
    /// `leased`: the lease's fence token, when it was issued after `asked`
    /// and before the computation (it dates the fill exactly on a single
    /// server; see [`RedisStore::index_before_write`]).
    async fn index_before_write(
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
    async fn write_copies(
        remote: &Arc<RedisStore>,
        fence: FenceToken,
        meta: &EntryMeta,
        value: &V,
        copies: Vec<Copy>,
    ) -> Vec<Copy> {
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
    async fn compute_after_lost_reply(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        token: LeaseToken,
        asked: Instant,
        fut: ComputeFuture<V>,
    ) -> Outcome<V> {
        self.counters.origin_call();
        let started = Instant::now();
        let fill = match self.run_compute(fut).await {
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
    fn write_then_release(
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
    pub(super) fn write_outside_flight(
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
    async fn write_unfenced_fill(
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

    /// The L1 lifetime, when Redis is configured.
    pub(super) fn remote_l1(&self) -> Option<Duration> {
        self.remote.as_ref().map(|r| r.options.l1_ttl)
    }
}

/// How long the shared store keeps an entry: its freshness and stale grace,
/// or its `stale-if-error` window past freshness when that is longer (capped
/// by the value), so an instance with no copy of its own can still answer an
/// origin error with it.
pub(super) fn shared_lifetime<V: Value>(
    value: &V,
    fresh_for: Duration,
    stale_for: Duration,
) -> Duration {
    fresh_for.saturating_add(stale_for.max(value.error_grace()))
}

impl<V: Value> Engine<V> {
    /// Read a stale reply: the entry, whether it may be served stale, and
    /// how long ago a soft purge made it stale (see [`cut_short`]); `None`
    /// when it is corrupt or no purge index lists it any more. One that may
    /// not be served is kept aside for the origin call to revalidate.
    async fn read_stale(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        bytes: Bytes,
        hard_left: Duration,
    ) -> Option<(EntryMeta, V, bool, Option<Duration>)> {
        // How long Redis has held it stale: its keep time past
        // freshness less what is left. A soft purge cut its
        // freshness short, so this counts from the purge.
        let stale_since = kept_of(&bytes).saturating_sub(hard_left);
        let decoded = decode_entry::<V>(bytes);
        if let Err(e) = &decoded {
            super::envelope::report_corrupt(&key, e);
            self.counters.corrupt_entry();
        }
        // As for a fresh entry no index lists: neither served
        // nor kept aside, as if it were not there.
        let listed = match &decoded {
            Ok((_, value)) => remote.anchored(&key, &value.purge_groups()).await,
            Err(_) => true,
        };
        if !listed {
            tracing::debug!(key = %key.short(), "stale entry no longer indexed; refilled");
        }
        let decoded = decoded.ok().filter(|_| listed);
        // An entry stored without a stale window is never handed
        // out stale: Redis reports one so only in the last
        // millisecond of its freshness (PTTL rounds down to 0
        // while the key still exists). Handing it out sent every
        // request that then refused it to the origin on its own.
        // Past its stale grace, an entry kept only for
        // stale-if-error is not served either; it is kept aside
        // for this instance's origin call to revalidate, or to
        // stand in for an error. The grace counts from the end of
        // freshness by Redis's clock as well as by the entry's
        // own: after a soft purge, from the purge.
        decoded.map(|(meta, value)| {
            let soft = cut_short(&meta, stale_since);
            let servable = !meta.stale_for.is_zero()
                && meta.elapsed() < meta.fresh_for.saturating_add(meta.stale_for)
                && stale_since < meta.stale_for;
            if !servable {
                self.keep_aside(key, &value, meta, hard_left, soft);
            }
            (meta, value, servable, soft)
        })
    }

    /// Keep an entry read from Redis that may not be served as it is aside
    /// (its user's retained copies), with its age: the origin call that
    /// follows revalidates it, and it stands in for an origin error where
    /// `stale-if-error` allows.
    ///
    /// `soft`: Redis holds it soft-purged, that long ago (see [`cut_short`]).
    fn keep_aside(
        &self,
        key: CacheKey,
        value: &V,
        meta: EntryMeta,
        hard_left: Duration,
        soft: Option<Duration>,
    ) {
        // A copy read before a purge that landed since is not kept.
        if self.flights.purged_during(&key, || value.purge_groups()) {
            return;
        }
        if let Some(retained) = &self.retained {
            let mut entry = Stored::new(
                value.clone(),
                meta,
                Duration::ZERO,
                hard_left,
                meta.elapsed(),
            );
            if let Some(since) = soft {
                entry = entry.soft_purged_before(since);
            }
            retained.keep(key, Arc::new(entry), hard_left);
        }
    }
}

/// Whether Redis ended `meta`'s freshness before the entry's own end (a
/// soft purge cut its PTTL), and if so how long ago: `stale_since`, by
/// Redis's clock. A copy of it then counts as soft-purged that long ago,
/// so it is stale by its response's own lifetime too. (A reader whose
/// clock lags the writer's by a few milliseconds may count an entry that
/// just expired so too; its stale window then counts from Redis's end of
/// freshness, which it does anyway.)
fn cut_short(meta: &EntryMeta, stale_since: Duration) -> Option<Duration> {
    (meta.elapsed() < meta.fresh_for).then_some(stale_since)
}

/// A full server's reply as the stale reply it stands for (no lease was
/// taken, so it carries no fence), and whether it was one; `None` for a full
/// server holding nothing. Any other reply as it is.
fn full_as_stale(found: RemoteLookup) -> Option<(RemoteLookup, bool)> {
    match found {
        RemoteLookup::Full { bytes, hard_left } if !bytes.is_empty() => {
            let stale = RemoteLookup::Stale {
                bytes,
                hard_left,
                fence: None,
                holder: Bytes::new(),
            };
            Some((stale, true))
        }
        RemoteLookup::Full { .. } => None,
        found => Some((found, false)),
    }
}

/// The source of an answer a fill notice brought: a hit, or for a forced
/// refresh the refresh another instance ran, shared.
fn filled_source(refresh: bool) -> Source {
    if refresh {
        Source::Coalesced
    } else {
        Source::Hit
    }
}
