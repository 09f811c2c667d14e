//! Leading and waiting across instances: one Redis lookup-or-lease, the
//! fenced write under the watchdog, waits for another instance's fill, and
//! the purge index. Redis only (the memory-only build has `no_redis`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use tokio::time::Instant;

use super::compute::Work;
use super::flight::{FlightHandle, Outcome};
use super::gate::Priority;
use super::quorum_lease::RedlockTry;
use super::resolve::Engine;
use crate::entry::envelope::{decode_entry, EntryMeta, MAGIC, VERSION};
use crate::entry::{FenceToken, LeaseToken};
use crate::entry::{Value, ValueMeta};
use crate::hot::Measure;
use crate::key::CacheKey;
use crate::lock::watchdog::HeldLease;
use crate::metrics::Source;
use crate::store::memory::{Probe, Stored};
use crate::store::redis::{FillSubscription, RedisStore, RemoteLookup, Woken};

mod lead;
mod stale;

use stale::full_as_stale;

/// One flight's state across its Redis lookups ([`Engine::drive_remote`]).
struct Drive<'a, V> {
    remote: &'a Arc<RedisStore>,
    handle: &'a FlightHandle<V>,
    key: CacheKey,
    /// The end of the flight's bounded wait.
    deadline: Instant,
    /// Look past the entry Redis holds (corrupt, or no longer indexed).
    skip_entry: bool,
    subscription: Option<FillSubscription>,
    /// A forced refresh refuses the entry Redis holds when it first looks
    /// (by its fence) and any entry no newer; it then looks past it for the
    /// lease, and after each wait reads again to pick up a newer fill.
    refresh: bool,
    refused: Option<u64>,
    read_entry: bool,
}

impl<'a, V> Drive<'a, V> {
    fn new(remote: &'a Arc<RedisStore>, handle: &'a FlightHandle<V>, deadline: Instant) -> Self {
        Self {
            remote,
            handle,
            key: handle.key(),
            deadline,
            skip_entry: false,
            subscription: None,
            refresh: handle.is_refresh(),
            refused: None,
            read_entry: true,
        }
    }
}

/// What one lookup found out.
enum Looked {
    /// Redis answered (and whether it is full).
    Reply(RemoteLookup, bool),
    /// Redis did nothing: compute here, memory only.
    Down,
    /// The reply was lost: the lease may or may not be ours.
    ReplyLost,
}

/// What one lookup's reply came to.
enum Next<V> {
    Done(Outcome<V>),
    /// Look again, with the computation not yet run.
    Again(Work<V>),
}

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
        mut fut: Work<V>,
        ahead: Option<&Arc<Stored<V>>>,
    ) -> Outcome<V> {
        let mut d = Drive::new(remote, handle, Instant::now() + self.config.max_wait());
        let mut ahead = ahead;
        let mut first = true;
        loop {
            let token = LeaseToken::random();
            // Before the lease is asked for (here or on Redlock below): a
            // purge of the fill's groups after this moment beats the fill.
            let asked = Instant::now();
            // Only the first lookup: a later one follows an ordinary path.
            let current = ahead.take();
            let key = d.key;
            let (found, full) = match self.look(&d, &token, current).await {
                Looked::Reply(found, full) => (found, full),
                Looked::Down => return self.compute_locally(key, fut).await,
                Looked::ReplyLost => {
                    return self
                        .compute_after_lost_reply(remote, key, token, asked, fut)
                        .await
                }
            };
            let next = match found {
                RemoteLookup::Fresh {
                    bytes,
                    fresh_left,
                    hard_left,
                } => {
                    let lefts = (fresh_left, hard_left);
                    match self.fresh_reply(&mut d, bytes, lefts, first, current).await {
                        Some(outcome) => Next::Done(outcome),
                        None => Next::Again(fut),
                    }
                }
                RemoteLookup::Stale {
                    bytes,
                    hard_left,
                    fence,
                    holder,
                } => {
                    let decoded = self.read_stale(remote, key, bytes, hard_left).await;
                    let reply = (hard_left, fence, holder);
                    self.stale_reply(&mut d, decoded, reply, full, (token, asked), fut)
                        .await
                }
                RemoteLookup::Leased { fence } => {
                    let lease = HeldLease::Single(token);
                    Next::Done(
                        self.lead_remote(remote, key, lease, fence, asked, fut)
                            .await,
                    )
                }
                RemoteLookup::Miss => self.miss_reply(&mut d, asked, fut).await,
                // Turned into a stale reply or answered above.
                RemoteLookup::Full { .. } => Next::Done(self.compute_locally(key, fut).await),
                RemoteLookup::Pass { left } => {
                    self.memory.insert_pass(key, left.min(self.config.pass_ttl));
                    Next::Done(Outcome::Pass(None))
                }
                RemoteLookup::Held { lease_left, holder } => {
                    self.counters.lock_acquire("contended");
                    d.read_entry = true;
                    self.wait_then(&mut d, (lease_left, &holder), None, fut)
                        .await
                }
            };
            first = false;
            match next {
                Next::Done(outcome) => return outcome,
                Next::Again(back) => fut = back,
            }
        }
    }

    /// One lookup-or-lease for the flight's key (past the entry when `d`
    /// says so). A full server's entry comes back as a stale reply, with
    /// `true`.
    async fn look(
        &self,
        d: &Drive<'_, V>,
        token: &LeaseToken,
        current: Option<&Arc<Stored<V>>>,
    ) -> Looked {
        let key = d.key;
        let skip = d.skip_entry || !d.read_entry;
        // Lease a fresh entry if it has at most the refresh-ahead lead
        // left (plus slack for the clocks): the hit that started this
        // saw it within that lead by its own clock.
        let lead = current.map_or(Duration::ZERO, |c| {
            c.meta.fresh_for.saturating_sub(c.age()) + Duration::from_millis(50)
        });
        let found = match d
            .remote
            .lookup_or_lease_ahead(&key, token, skip, lead)
            .await
        {
            Ok(found) => found,
            Err(e) if e.did_nothing() => {
                tracing::debug!(key = %key.short(), error = %e, "redis lookup failed; computing locally");
                return Looked::Down;
            }
            Err(e) => {
                tracing::debug!(key = %key.short(), error = %e, "redis lookup's reply lost; computing here, then storing in redis");
                return Looked::ReplyLost;
            }
        };
        // A full server (noeviction at maxmemory) takes no lease: serve
        // the stale copy it holds where allowed, and refresh here, one
        // origin call per instance, as when Redis is down.
        match full_as_stale(found) {
            Some((found, full)) => Looked::Reply(found, full),
            None => {
                tracing::debug!(key = %key.short(), "redis is full: no lease; computing locally");
                Looked::Down
            }
        }
    }

    /// A fresh entry in Redis: the answer, or `None` to look again (past
    /// it when it is corrupt or no longer indexed; for a forced refresh,
    /// past the copy it refuses, kept aside to revalidate).
    async fn fresh_reply(
        &self,
        d: &mut Drive<'_, V>,
        bytes: Bytes,
        (fresh_left, hard_left): (Duration, Duration),
        first: bool,
        current: Option<&Arc<Stored<V>>>,
    ) -> Option<Outcome<V>> {
        let key = d.key;
        match decode_entry::<V>(bytes) {
            Ok((_, value)) if !d.remote.anchored(&key, &value.purge_groups()).await => {
                // No index lists it (evicted): a purge may have missed
                // it. Look past it for the lease and fill anew.
                tracing::debug!(key = %key.short(), "entry no longer indexed; refilled");
                d.skip_entry = true;
                None
            }
            Ok((meta, value))
                if d.refresh && (first || d.refused.is_some_and(|r| meta.fence <= r)) =>
            {
                // The refresh's origin call revalidates this copy, and
                // an origin error does not replace it.
                self.keep_aside(key, &value, meta, hard_left, None);
                d.refused = Some(d.refused.map_or(meta.fence, |r| r.max(meta.fence)));
                d.read_entry = false;
                None
            }
            Ok((meta, value)) => {
                let entry = self.fill_l1(key, value, meta, fresh_left, hard_left, Duration::ZERO);
                if current.is_some_and(|c| c.same_write(&meta)) {
                    // Someone else holds the refresh: this copy of the
                    // same write must not start another one.
                    entry.mark_refresh_claimed();
                }
                // A refresh found a newer fill: another instance's
                // refresh, which this one shares.
                let source = filled_source(d.refresh);
                Some(Outcome::Value { entry, source })
            }
            Err(e) => {
                crate::entry::envelope::report_corrupt(&key, &e);
                self.counters.corrupt_entry();
                d.skip_entry = true;
                None
            }
        }
    }

    /// A stale entry in Redis, decoded by [`read_stale`](Self::read_stale):
    /// lead its refresh if the lookup leased (serving it stale meanwhile
    /// where allowed), else try Redlock, else wait for the refresh.
    async fn stale_reply(
        &self,
        d: &mut Drive<'_, V>,
        decoded: Option<(EntryMeta, V, bool, Option<Duration>)>,
        (hard_left, fence, holder): (Duration, Option<FenceToken>, Bytes),
        full: bool,
        (token, asked): (LeaseToken, Instant),
        fut: Work<V>,
    ) -> Next<V> {
        let (remote, key) = (d.remote, d.key);
        if full {
            if let Some((meta, value, true, soft)) = decoded {
                let entry = self.fill_l1_stale(key, value, meta, hard_left, soft);
                d.handle.publish_stale(entry);
            }
            return Next::Done(self.compute_locally(key, fut).await);
        }
        match (decoded, fence) {
            (Some((meta, value, servable, soft)), Some(fence)) => {
                if servable {
                    let entry = self.fill_l1_stale(key, value, meta, hard_left, soft);
                    d.handle.publish_stale(entry);
                }
                let lease = HeldLease::Single(token);
                Next::Done(
                    self.lead_remote(remote, key, lease, fence, asked, fut)
                        .await,
                )
            }
            (Some((meta, value, servable, soft)), None) => {
                let entry = servable.then(|| self.fill_l1_stale(key, value, meta, hard_left, soft));
                // With Redlock the lookup never leases: try for the
                // refresh lease there, serve stale either way.
                if let RedlockTry::Won(lease, fence) = self.redlock_lease(remote, key, None).await {
                    if let Some(entry) = entry {
                        d.handle.publish_stale(entry);
                    }
                    return Next::Done(
                        self.lead_remote(remote, key, lease, fence, asked, fut)
                            .await,
                    );
                }
                // Someone else refreshes it. Everyone waiting here
                // takes the stale copy now; this flight stays open
                // until the fill lands (bounded), so stale answers
                // meanwhile do not each look Redis up again.
                if let Some(entry) = &entry {
                    d.handle.publish_stale(Arc::clone(entry));
                }
                let stale = entry.filter(|_| !d.refresh);
                d.read_entry = true;
                let poll = remote.options.poll_interval;
                self.wait_then(d, (poll, &holder), stale, fut).await
            }
            (None, Some(fence)) => {
                let lease = HeldLease::Single(token);
                Next::Done(
                    self.lead_remote(remote, key, lease, fence, asked, fut)
                        .await,
                )
            }
            (None, None) => {
                d.skip_entry = true;
                Next::Again(fut)
            }
        }
    }

    /// No entry and no lease (a Redlock lookup): try Redlock for the lease,
    /// else wait for whoever holds it.
    async fn miss_reply(&self, d: &mut Drive<'_, V>, asked: Instant, fut: Work<V>) -> Next<V> {
        let (remote, key) = (d.remote, d.key);
        let newer_than = if d.refresh { d.refused } else { None };
        match self.redlock_lease(remote, key, newer_than).await {
            RedlockTry::Won(lease, fence) => {
                return Next::Done(
                    self.lead_remote(remote, key, lease, fence, asked, fut)
                        .await,
                )
            }
            RedlockTry::FilledMeanwhile => {
                d.read_entry = true;
                return Next::Again(fut);
            }
            RedlockTry::Contended => {}
        }
        d.read_entry = true;
        if self.redlock.is_none() {
            // Only a Redlock lookup says Miss; be safe if not.
            return Next::Done(self.compute_locally(key, fut).await);
        }
        let poll = remote.options.poll_interval;
        self.wait_then(d, (poll, &Bytes::new()), None, fut).await
    }

    /// Wait (bounded) for another instance's fill, then what came of it:
    /// the answer, or look again.
    async fn wait_then(
        &self,
        d: &mut Drive<'_, V>,
        holder: (Duration, &Bytes),
        stale: Option<Arc<Stored<V>>>,
        fut: Work<V>,
    ) -> Next<V> {
        let newer_than = if d.refresh { d.refused } else { None };
        let waited = self
            .wait_for_fill(
                d.remote,
                d.key,
                &mut d.subscription,
                holder,
                d.deadline,
                newer_than,
            )
            .await;
        match self.after_wait(waited, d, stale, fut).await {
            Ok(outcome) => Next::Done(outcome),
            Err(back) => Next::Again(back),
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
        d: &Drive<'_, V>,
        stale: Option<Arc<Stored<V>>>,
        fut: Work<V>,
    ) -> Result<Outcome<V>, Work<V>> {
        let refresh = d.refresh;
        match waited {
            Waited::Over => Ok(match stale {
                Some(entry) => Outcome::Value {
                    entry,
                    source: Source::Stale,
                },
                None => self.compute_unshared(d.key, fut).await,
            }),
            Waited::Filled(entry) => {
                // Another instance's call answered this flight: its requests
                // here are that call's followers, though answered as hits
                // (a forced refresh's are counted as coalesced).
                if !refresh {
                    let waits = fut.priority == Priority::Waited;
                    let followers = self.flights.filled_elsewhere(&d.key, waits);
                    self.hot_known(Measure::Waiters, &d.key, followers as u64);
                }
                Ok(Outcome::Value {
                    entry,
                    source: filled_source(refresh),
                })
            }
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
