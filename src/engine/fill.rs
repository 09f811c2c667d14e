//! Putting what a computation produced into memory (L1), unless a purge
//! beat it. Never talks to Redis: callers write there first.

use std::sync::Arc;
use std::time::Duration;

use super::compute::{AlsoStored, Fill};
use super::flight::Outcome;
use super::purge_log::key_name;
use super::resolve::Engine;
use crate::entry::envelope::EntryMeta;
use crate::entry::{Value, ValueMeta};
use crate::key::CacheKey;
use crate::metrics::Source;
use crate::store::memory::{Probe, Stored};

impl<V: Value> Engine<V> {
    /// Put a fill into memory and say what waiters get. Without Redis it
    /// stays its whole lifetime. With Redis configured it was made outside
    /// Redis (unreachable, or its fenced write failed), where no purge sent
    /// through another instance can reach it: it stays at most the L1
    /// lifetime, then the next request asks Redis again.
    ///
    /// `since`: the purge-log generation an origin call outside any flight
    /// started at (a flight's own start is looked up instead).
    pub(super) fn fill_memory(
        &self,
        key: CacheKey,
        fill: Fill<V>,
        fence: u64,
        origin_time: Duration,
        since: Option<u64>,
    ) -> Outcome<V> {
        match fill {
            Fill::Store {
                value,
                fresh_for,
                stale_for,
                copies,
            } => {
                let mut usable = fresh_for.saturating_add(stale_for);
                let mut fresh = fresh_for;
                if let Some(l1) = self.remote_l1() {
                    fresh = fresh.min(l1);
                    usable = usable.min(l1);
                }
                self.counters.entry_bytes(value.weight());
                let meta = EntryMeta::now(fresh_for, stale_for, fence);
                let entry = Arc::new(
                    Stored::new(value, meta, fresh, usable, Duration::ZERO)
                        .refresh_after(self.refresh_age(fresh_for, origin_time)),
                );
                if !usable.is_zero() {
                    self.insert_checked(key, &entry, &copies, since);
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
                self.insert_pass_unless_usable(key);
                Outcome::Pass(value.map(Box::new))
            }
            Fill::Private(value) => Outcome::Pass(Some(Box::new(value))),
        }
    }

    /// Mark `key` hit-for-pass, unless an entry other requests may still be
    /// served (fresh, or stale within its grace) is here: a pass marker never
    /// replaces a usable entry.
    pub(super) fn insert_pass_unless_usable(&self, key: CacheKey) {
        match self.memory.probe(&key) {
            Probe::Fresh(_) | Probe::Stale(_) => {}
            Probe::Pass | Probe::Miss => self.memory.insert_pass(key, self.config.pass_ttl),
        }
    }

    /// Put an entry read from (or written to) Redis into memory for at most
    /// the L1 lifetime (fresh answers) or its stale grace (stale answers),
    /// and never as fresh beyond its freshness.
    #[cfg(feature = "redis")]
    pub(super) fn fill_l1(
        &self,
        key: CacheKey,
        value: V,
        meta: EntryMeta,
        fresh_left: Duration,
        hard_left: Duration,
        origin_time: Duration,
    ) -> Arc<Stored<V>> {
        self.fill_l1_marked(key, value, meta, (fresh_left, hard_left), origin_time, None)
    }

    /// [`fill_l1`](Self::fill_l1) for an entry Redis holds stale; `soft`:
    /// soft-purged that long ago (the copy is marked so before anyone can
    /// read it).
    #[cfg(feature = "redis")]
    pub(super) fn fill_l1_stale(
        &self,
        key: CacheKey,
        value: V,
        meta: EntryMeta,
        hard_left: Duration,
        soft: Option<Duration>,
    ) -> Arc<Stored<V>> {
        let left = (Duration::ZERO, hard_left);
        self.fill_l1_marked(key, value, meta, left, Duration::ZERO, soft)
    }

    #[cfg(feature = "redis")]
    fn fill_l1_marked(
        &self,
        key: CacheKey,
        value: V,
        meta: EntryMeta,
        (fresh_left, hard_left): (Duration, Duration),
        origin_time: Duration,
        soft: Option<Duration>,
    ) -> Arc<Stored<V>> {
        let l1 = self.remote.as_ref().map_or(hard_left, |r| r.options.l1_ttl);
        // Fresh here for at most the L1 lifetime: after that, a request that
        // needs a fresh copy asks Redis again. The copy stays (as stale) for
        // the rest of its grace, so a stale-while-revalidate answer never
        // waits for a Redis round trip; the refresh it starts asks Redis.
        // An L1 lifetime of zero keeps nothing here.
        // Kept in Redis past its stale grace for stale-if-error, an entry
        // is still only served within it.
        let usable = if l1.is_zero() {
            Duration::ZERO
        } else {
            let grace_end = meta.fresh_for.saturating_add(meta.stale_for);
            hard_left.min(grace_end.saturating_sub(meta.elapsed()))
        };
        // Redis's clock (the entry's PTTL past its stale window) is the
        // cluster's one clock for freshness. That TTL starts when the write lands, after the entry was stamped, so by
        // the stamp alone a copy Redis calls fresh can be past its freshness:
        // the HTTP layer would then refuse it and call the origin outside the
        // flight. The age of a fresh copy is the one Redis implies.
        let age = if fresh_left.is_zero() {
            meta.elapsed()
        } else {
            meta.elapsed()
                .min(meta.fresh_for.saturating_sub(fresh_left))
        };
        let mut stored = Stored::new(value, meta, fresh_left.min(l1), usable, age)
            .refresh_after(self.refresh_age(meta.fresh_for, origin_time));
        if let Some(since) = soft {
            stored = stored.soft_purged_before(since);
        }
        let entry = Arc::new(stored);
        if !usable.is_zero() {
            self.insert_checked(key, &entry, &[], None);
        }
        // A copy this process kept from an older fill of its own (for
        // revalidation) gives way to the newer one Redis holds: with no L1
        // copy in front of it, it would otherwise answer stale over it.
        if let Some(retained) = &self.retained {
            retained.replace_older(key, &entry, hard_left);
        }
        entry
    }

    /// A fill that started before a purge of its key, URL or tag is still
    /// the answer for the requests waiting on it, but it is not stored.
    pub(super) fn unless_purged(&self, key: CacheKey, fill: Fill<V>) -> Fill<V> {
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

    /// [`unless_purged`](Self::unless_purged) for a fill about to be
    /// written to Redis, where the fences and purge stamps date it against
    /// every soft purge that reached Redis, exactly (the local log only
    /// knows when a soft purge's notice arrived here, which may be after a
    /// refresh that leased once the entry was stale: refusing that refresh
    /// ran a second one). Hard purges still count here: one that reached
    /// only this process's memory holds against the fills running here.
    #[cfg(feature = "redis")]
    pub(super) fn unless_hard_purged(&self, key: CacheKey, fill: Fill<V>) -> Fill<V> {
        match fill {
            Fill::Store { value, .. }
                if self
                    .flights
                    .hard_purged_during(&key, || value.purge_groups()) =>
            {
                tracing::debug!(key = %key.short(), "purged while filling: shared, not stored");
                Fill::Share(value)
            }
            other => other,
        }
    }

    /// Insert into memory (under `key` and the copies kept in memory), then
    /// look at the purge log again: a purge that recorded itself between
    /// our check and our insert may have removed the key before we
    /// inserted it. `since` as for [`fill_memory`](Self::fill_memory).
    pub(super) fn insert_checked(
        &self,
        key: CacheKey,
        entry: &Arc<Stored<V>>,
        copies: &[AlsoStored],
        since: Option<u64>,
    ) {
        let kept = || copies.iter().filter(|c| c.memory).map(|c| c.key);
        self.memory.insert(key, Arc::clone(entry));
        for k in kept() {
            self.memory.insert(k, Arc::clone(entry));
        }
        let names = || {
            let mut names = entry.value.purge_groups();
            names.extend(kept().map(|k| key_name(&k)));
            names
        };
        let purged = match since {
            Some(generation) => self.flights.purges.purged_since(generation, || {
                let mut n = names();
                n.push(key_name(&key));
                n
            }),
            None => self.flights.purged_during(&key, names),
        };
        if purged {
            self.memory.remove(&key);
            for k in kept() {
                self.memory.remove(&k);
            }
            // A copy kept aside from before is older still: were it left,
            // the next request here would find no entry but that copy, and
            // be answered it (stale after a soft purge) while a newer entry
            // waits in Redis.
            if let Some(retained) = &self.retained {
                retained.remove(&key);
                for k in kept() {
                    retained.remove(&k);
                }
            }
        }
    }
}

/// A value handed to the requests waiting now, with no lifetime in memory.
pub(super) fn unstored<V>(value: V) -> Arc<Stored<V>> {
    Arc::new(Stored::new(
        value,
        EntryMeta::now(Duration::ZERO, Duration::ZERO, 0),
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
    ))
}
