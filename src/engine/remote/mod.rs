//! Leading and waiting across instances: one Redis lookup-or-lease, the
//! fenced write under the watchdog, waits for another instance's fill, and
//! the purge index. Redis only (the memory-only build has `no_redis`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use tokio::time::Instant;

use super::compute::ComputeFuture;
use super::envelope::{decode_entry, MAGIC, VERSION};
use super::flight::{FlightHandle, Outcome};
use super::quorum_lease::RedlockTry;
use super::resolve::Engine;
use super::value::{Value, ValueMeta};
use crate::key::CacheKey;
use crate::lock::watchdog::HeldLease;
use crate::lock::LeaseToken;
use crate::metrics::Source;
use crate::store::memory::{Probe, Stored};
use crate::store::redis::{FillSubscription, RedisStore, RemoteLookup, Woken};

mod lead;
mod stale;

use stale::full_as_stale;

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

    /// The L1 lifetime, when Redis is configured.
    pub(super) fn remote_l1(&self) -> Option<Duration> {
        self.remote.as_ref().map(|r| r.options.l1_ttl)
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
