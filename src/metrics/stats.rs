//! [`Stats`], the snapshot of one cache's counts, and the [`Counters`]
//! methods that build the counters, count each outcome into the tally
//! behind it and record it under the cache's metric keys (both defined in
//! `mod.rs`; the origin gate's and the own calls' counts are in their files).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{count, names, observe, Counters, Keys, LeaseLost, NotStoredLabel, Source};

/// A snapshot of one cache's counters since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Answers from a fresh stored entry.
    pub hits: u64,
    /// Answers from a stale entry.
    pub stale: u64,
    /// Answers that led a computation.
    pub misses: u64,
    /// Answers that shared another caller's computation.
    pub coalesced: u64,
    /// Answers that bypassed the cache.
    pub bypasses: u64,
    /// Computations (origin calls) started by the cache, leaders and fallbacks alike.
    pub origin_calls: u64,
    /// Answers that were an error (shared computation error, panic, timeout).
    pub errors: u64,
    /// Writes refused by the fence because a newer write had already landed.
    pub fenced_rejections: u64,
    /// Origin calls refused before reaching the origin: the budget's queue
    /// was full or its wait ran out, or the breaker was open.
    pub origin_refused: u64,
    /// Background refreshes not started (budget, breaker, the key's backoff).
    pub refreshes_skipped: u64,
    /// Probes sent to an origin whose breaker was open.
    pub probes: u64,
    /// Requests that called the origin on their own, outside any flight
    /// (an unsafe method, their own directives, a `Vary` variant not
    /// stored, an answer not storable, a wait that ran out, …): the
    /// coalescing the cache could not do. [`coalesced`](Self::coalesced)
    /// counts the requests it did here, [`followers`](Self::followers) all
    /// of them.
    pub own_calls: u64,
    /// Requests answered by another request's origin call, on this instance
    /// ([`coalesced`](Self::coalesced)) or on another one on the same Redis
    /// (a request that waited for that instance's fill, answered as a
    /// hit); the request that made the call is not counted.
    pub followers: u64,
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counters")
            .field("cache", &self.keys.cache)
            .field("stats", &self.snapshot())
            .finish()
    }
}

impl Counters {
    /// Counters whose metrics carry `cache="{cache}"`, registered at 0
    /// with the installed recorder (the Redis-path ones when `redis`).
    pub(crate) fn new(cache: &str, redis: bool) -> Self {
        let keys = Keys::new(cache);
        keys.register(redis, true);
        Self {
            tally: Arc::default(),
            keys,
        }
    }

    /// Counters on the same tally whose metrics carry `cache="{cache}"`:
    /// a route's own label on a shared engine. Registers the request
    /// metrics under the new label.
    pub(crate) fn relabel(&self, cache: &str) -> Self {
        let keys = Keys::new(cache);
        keys.register(false, false);
        Self {
            tally: Arc::clone(&self.tally),
            keys,
        }
    }

    /// Count `source` and write it into the current span's `outcome`.
    pub(crate) fn record(&self, source: Source) {
        self.count(source);
        tracing::Span::current().record("outcome", source.as_str());
    }

    /// Count `source` only: for a caller that records it into the span it
    /// holds (looking up the current span costs more than the count).
    pub(crate) fn count(&self, source: Source) {
        let (c, i) = match source {
            Source::Hit => (&self.tally.hits, 0),
            Source::Stale => (&self.tally.stale, 1),
            Source::Miss => (&self.tally.misses, 2),
            Source::Coalesced => (&self.tally.coalesced, 3),
            Source::Bypass => (&self.tally.bypasses, 4),
        };
        c.fetch_add(1, Ordering::Relaxed);
        count(&self.keys.requests[i]);
        if source == Source::Coalesced {
            self.follower();
        }
    }

    pub(crate) fn record_error(&self) {
        self.tally.errors.fetch_add(1, Ordering::Relaxed);
        count(&self.keys.requests[5]);
        tracing::Span::current().record("outcome", "error");
    }

    pub(crate) fn origin_call(&self) {
        self.tally.origin_calls.fetch_add(1, Ordering::Relaxed);
        count(&self.keys.origin_calls);
    }

    #[cfg(feature = "redis")]
    pub(crate) fn fenced_rejection(&self) {
        self.tally.fenced_rejections.fetch_add(1, Ordering::Relaxed);
        count(&self.keys.fenced_rejected);
    }

    /// An entry in the shared store that did not decode (read as a miss).
    #[cfg(feature = "redis")]
    pub(crate) fn corrupt_entry(&self) {
        count(&self.keys.corrupt_entries);
    }

    /// The `cache` label's value.
    pub(crate) fn cache_name(&self) -> &str {
        &self.keys.cache
    }

    /// An origin answer that was not stored, under its reason's label.
    pub(crate) fn not_stored(&self, label: NotStoredLabel) {
        count(&self.keys.not_stored[label as usize]);
    }

    pub(crate) fn wait(&self, seconds: f64) {
        observe(&self.keys.wait, seconds);
    }

    pub(crate) fn lease_remaining(&self, seconds: f64) {
        observe(&self.keys.lease_remaining, seconds);
    }

    pub(crate) fn entry_bytes(&self, bytes: usize) {
        observe(&self.keys.entry_bytes, bytes as f64);
    }

    /// A lease election of this cache's own lease: `acquired`, `contended`
    /// or `expired_mid_work`.
    pub(crate) fn lock_acquire(&self, result: &'static str) {
        match result {
            "acquired" => count(&self.keys.lock_acquire[0]),
            "contended" => count(&self.keys.lock_acquire[1]),
            "expired_mid_work" => count(&self.keys.lock_acquire[2]),
            // Any other result: no handle kept for it, labelled as it is.
            other => ::metrics::counter!(names::LOCK_ACQUIRE, "result" => other).increment(1),
        }
    }

    /// What the lease watchdog counts a lost lease with: a task of its own
    /// that outlives any borrow of these counters, so it takes the key.
    pub(crate) fn lease_lost(&self) -> LeaseLost {
        LeaseLost(self.keys.lock_acquire[2].clone())
    }

    pub(crate) fn lock_held(&self, seconds: f64) {
        observe(&self.keys.lock_held, seconds);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            hits: l(&self.tally.hits),
            stale: l(&self.tally.stale),
            misses: l(&self.tally.misses),
            coalesced: l(&self.tally.coalesced),
            bypasses: l(&self.tally.bypasses),
            origin_calls: l(&self.tally.origin_calls),
            errors: l(&self.tally.errors),
            fenced_rejections: l(&self.tally.fenced_rejections),
            origin_refused: l(&self.tally.origin_refused),
            refreshes_skipped: l(&self.tally.refreshes_skipped),
            probes: l(&self.tally.probes),
            own_calls: l(&self.tally.own_calls),
            followers: l(&self.tally.followers),
        }
    }
}
