//! One entry as held in memory: its value, its deadlines on the local
//! clock, and what holders of the same copy share (purge marks, the
//! refresh-ahead claim, the last failed fill).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::entry::envelope::EntryMeta;

/// One entry as held in memory, with its deadlines on the local clock.
#[derive(Debug)]
pub(crate) struct Stored<V> {
    pub(crate) value: V,
    pub(crate) meta: EntryMeta,
    loaded_at: Instant,
    age_at_load: Duration,
    pub(crate) fresh_until: Instant,
    /// The end of use from this tier: the stale grace, cut short by the L1
    /// bound when a shared store is the source of truth.
    pub(crate) usable_until: Instant,
    /// Age (since the store) from which a hit starts one refresh ahead of
    /// expiry; `Duration::MAX` for never.
    refresh_after: Duration,
    /// Taken by the hit that starts that refresh: one per copy.
    refresh_claimed: AtomicBool,
    /// When a soft purge ended this copy's freshness, in nanoseconds from
    /// `loaded_at` (negative: before it was loaded, for a copy Redis already
    /// held soft-purged); [`NOT_SOFT_PURGED`] until then. Set in place, so
    /// every holder of the copy (memory, retained copies, a flight that
    /// published it) sees it at once.
    soft_purged: AtomicI64,
    /// Set by a hard purge: the copy is neither fresh nor usable for anyone
    /// who still holds it (a running flight that published it).
    purged: AtomicBool,
    /// When the last fill of this copy's key failed, in nanoseconds from
    /// `loaded_at`; [`NOT_SOFT_PURGED`] (never) until one does. Only the
    /// fact: no error page is kept.
    failed_fill: AtomicI64,
    /// The age of the last hit in the refresh-ahead window, in nanoseconds,
    /// [`NO_WINDOW_HIT`] before one: the next hit there tells whether the key
    /// is asked often enough to refresh ahead.
    window_hit: AtomicU64,
}

const NO_WINDOW_HIT: u64 = u64::MAX;

const NOT_SOFT_PURGED: i64 = i64::MIN;

/// A duration rounded up to whole seconds: HTTP ages count in whole seconds,
/// so a copy made stale by a soft purge is past its response's own lifetime
/// too, not only past the engine's (sub-second) freshness.
fn ceil_secs(d: Duration) -> Duration {
    let whole = Duration::from_secs(d.as_secs());
    if whole == d {
        d
    } else {
        whole.saturating_add(Duration::from_secs(1))
    }
}

impl<V> Stored<V> {
    /// `fresh_left` and `usable_left` are measured from now.
    pub(crate) fn new(
        value: V,
        meta: EntryMeta,
        fresh_left: Duration,
        usable_left: Duration,
        age_at_load: Duration,
    ) -> Self {
        let now = Instant::now();
        let usable_until = now + usable_left;
        Self {
            value,
            meta,
            loaded_at: now,
            age_at_load,
            fresh_until: (now + fresh_left).min(usable_until),
            usable_until,
            refresh_after: Duration::MAX,
            refresh_claimed: AtomicBool::new(false),
            soft_purged: AtomicI64::new(NOT_SOFT_PURGED),
            purged: AtomicBool::new(false),
            failed_fill: AtomicI64::new(NOT_SOFT_PURGED),
            window_hit: AtomicU64::new(NO_WINDOW_HIT),
        }
    }

    /// A copy Redis holds soft-purged `since` ago: stale from then on (see
    /// [`mark_soft_purged`](Self::mark_soft_purged)).
    #[cfg(feature = "redis")]
    #[must_use]
    pub(crate) fn soft_purged_before(self, since: Duration) -> Self {
        let nanos = since.as_nanos().min(i64::MAX as u128) as i64;
        self.soft_purged.store(-nanos, Ordering::Relaxed);
        self
    }

    /// A soft purge: the copy stops being fresh now and counts as stale
    /// from now on, its age at least its freshness (rounded up to whole
    /// seconds) plus the time since. It may still be served stale within
    /// its stale window from now, never past the end it already had. A
    /// second mark keeps the first.
    pub(crate) fn mark_soft_purged(&self) {
        let at = self.loaded_at.elapsed().as_nanos().min(i64::MAX as u128) as i64;
        let _ = self.soft_purged.compare_exchange(
            NOT_SOFT_PURGED,
            at,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Time since a soft purge made this copy stale, if one did.
    pub(crate) fn soft_purged_for(&self) -> Option<Duration> {
        let at = self.soft_purged.load(Ordering::Acquire);
        if at == NOT_SOFT_PURGED {
            return None;
        }
        let now = self.loaded_at.elapsed().as_nanos().min(i64::MAX as u128) as i64;
        let since = now.saturating_sub(at).max(0);
        Some(Duration::from_nanos(since as u64))
    }

    /// A hard purge: no holder of this copy serves it from now on.
    pub(crate) fn mark_purged(&self) {
        self.purged.store(true, Ordering::Release);
    }

    /// Whether a hard purge marked this copy.
    pub(crate) fn is_purged(&self) -> bool {
        self.purged.load(Ordering::Acquire)
    }

    /// Fresh at `now`: before its deadline and not purged, soft or hard.
    pub(crate) fn is_fresh(&self, now: Instant) -> bool {
        now < self.fresh_until && self.soft_purged_for().is_none() && !self.is_purged()
    }

    /// Usable (fresh or stale within its grace) at `now`. A soft-purged copy
    /// is usable for its stale window from the purge, and never past the
    /// end it already had.
    pub(crate) fn is_usable(&self, now: Instant) -> bool {
        now < self.usable_until
            && !self.is_purged()
            && self
                .soft_purged_for()
                .is_none_or(|since| since < self.meta.stale_for)
    }

    /// Start refreshing ahead of expiry once the entry is `age` old.
    #[must_use]
    pub(crate) fn refresh_after(mut self, age: Duration) -> Self {
        self.refresh_after = age;
        self
    }

    /// Whether this hit, at `age`, is the one that starts the refresh ahead
    /// of expiry: true at most once per copy, and only for a key that is
    /// hot. In the last part of the freshness (from `refresh_after` on) each
    /// hit notes its age; a hit that follows the one before it by less than
    /// the freshness left predicts another hit before expiry, so the
    /// refresh is worth its origin call. A key touched once there is left
    /// to expire. Hits before that part only read: the hit path writes no
    /// shared cache line on most requests.
    pub(crate) fn claim_refresh(&self, age: Duration) -> bool {
        if age < self.refresh_after || self.refresh_claimed.load(Ordering::Relaxed) {
            return false;
        }
        let now = age.as_nanos().min(u128::from(NO_WINDOW_HIT - 1)) as u64;
        let before = self.window_hit.swap(now, Ordering::AcqRel);
        if before == NO_WINDOW_HIT || before > now {
            return false;
        }
        let gap = Duration::from_nanos(now - before);
        let left = self.meta.fresh_for.saturating_sub(age);
        gap < left && !self.refresh_claimed.swap(true, Ordering::AcqRel)
    }

    /// The refresh this copy's hit claimed was skipped (no budget to
    /// spare, the breaker open): a later hit may claim it again.
    pub(crate) fn release_refresh_claim(&self) {
        self.refresh_claimed.store(false, Ordering::Release);
    }

    /// A fill of this copy's key failed just now.
    pub(crate) fn note_failed_fill(&self) {
        let at = self.loaded_at.elapsed().as_nanos().min(i64::MAX as u128) as i64;
        self.failed_fill.store(at, Ordering::Release);
    }

    /// Time since a fill of this copy's key last failed, if one did.
    pub(crate) fn failed_fill_for(&self) -> Option<Duration> {
        let at = self.failed_fill.load(Ordering::Acquire);
        if at == NOT_SOFT_PURGED {
            return None;
        }
        let now = self.loaded_at.elapsed().as_nanos().min(i64::MAX as u128) as i64;
        Some(Duration::from_nanos(now.saturating_sub(at).max(0) as u64))
    }

    /// Mark the refresh as started elsewhere: this copy starts none.
    #[cfg(feature = "redis")]
    pub(crate) fn mark_refresh_claimed(&self) {
        self.refresh_claimed.store(true, Ordering::Relaxed);
    }

    /// Whether `other` is the same stored write as this (same fence, same
    /// store time), so a copy of it need not start another refresh.
    #[cfg(feature = "redis")]
    pub(crate) fn same_write(&self, other: &EntryMeta) -> bool {
        self.meta.fence == other.fence && self.meta.stored_at_ms == other.stored_at_ms
    }

    /// Whether the entry is still within its own freshness (whatever this
    /// tier's bound on it).
    pub(crate) fn fresh_by_meta(&self) -> bool {
        self.age() < self.meta.fresh_for
    }

    /// The entry's age now: its age when loaded plus local time since. A
    /// soft-purged copy is at least its freshness (in whole seconds) plus
    /// the time since the purge old: stale by every clock that reads it,
    /// its `Age` included, so no cache downstream takes it for fresh.
    pub(crate) fn age(&self) -> Duration {
        self.age_at(Instant::now())
    }

    /// [`Self::age`] at `now`, for a hit that read the clock once.
    pub(crate) fn age_at(&self, now: Instant) -> Duration {
        let age = self.age_at_load + now.saturating_duration_since(self.loaded_at);
        match self.soft_purged_for() {
            Some(since) => age.max(ceil_secs(self.meta.fresh_for).saturating_add(since)),
            None => age,
        }
    }
}
