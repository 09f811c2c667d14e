//! The [`CacheLayerBuilder`] settings of the layer's origin calls: how
//! long a waiter waits and a call may take, the caps on flights, fill bytes
//! and calls outside a flight, the hit-for-miss marker, the origin budget
//! and breaker, the failure backoff and refresh-ahead. Their bounds are
//! checked in `builder.rs`, where the builder is.

use std::time::Duration;

use crate::engine::OriginBreaker;
use crate::http::builder::CacheLayerBuilder;

impl CacheLayerBuilder {
    /// Longest a request waits for another request's origin call (default:
    /// [`origin_timeout`](Self::origin_timeout) plus 5 s, so a slow but
    /// healthy origin never releases the waiters). After that it goes to the
    /// origin itself, uncached, under the fallback cap; with the cap full it
    /// keeps waiting on the flight, at most one more origin timeout.
    ///
    /// At least `origin_timeout`: `build()` refuses a shorter wait, which
    /// would send waiters of a slow but healthy call to the origin too.
    #[must_use]
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.engine.max_wait = Some(wait);
        self
    }

    /// Longest an origin call may take (default 60 s): a flight's call
    /// (response and body), after which its waiters get 504, and every call
    /// outside a flight (until the response head arrives).
    #[must_use]
    pub fn origin_timeout(mut self, timeout: Duration) -> Self {
        self.engine.origin_timeout = timeout;
        self
    }

    /// Most flights (leader tasks) running at once (default 1024). A leader
    /// task runs on when its client goes away, so this bounds abandoned work
    /// too. Past it, a miss with no flight to join goes to the origin
    /// uncached, under the fallback cap (`Cache-Status: …; detail=overloaded`).
    /// At least 1: `build()` refuses 0.
    #[must_use]
    pub fn leader_limit(mut self, limit: usize) -> Self {
        self.engine.max_leaders = limit;
        self
    }

    /// Most response bytes buffered for fills at once, over all flights
    /// (default 64 MiB). A fill that would pass it streams to the request
    /// that started it, is not stored, and its waiters go to the origin
    /// themselves under the fallback cap.
    #[must_use]
    pub fn fill_buffer_bytes(mut self, bytes: usize) -> Self {
        self.engine.max_fill_bytes = bytes;
        self
    }

    /// How long an uncacheable verdict sends requests straight to the origin
    /// instead of queueing them (default 5 s). Only an answer uncacheable for
    /// every request of the URL (`no-store`, `private`, no freshness, `Vary:
    /// *`, with a 2xx or 3xx status) sets the marker, and never while a
    /// usable entry is stored; an error status never sets it. A GET under
    /// the marker still asks the origin for itself (hit-for-miss, under a
    /// free [`fallback_limit`](Self::fallback_limit) permit), never
    /// coalesced: a storable answer is stored and ends the marker, since
    /// the uncacheable one may have been made for one request alone (a
    /// `private` page for its cookie). With Redis, such a GET first looks
    /// the key up there (one lookup): an entry another instance stored over
    /// the marker is a hit.
    #[must_use]
    pub fn pass_ttl(mut self, ttl: Duration) -> Self {
        self.engine.pass_ttl = ttl;
        self
    }

    /// Most concurrent origin calls outside any flight (default 64): waiters
    /// whose wait ran out, waiters of an answer they may not share, misses
    /// past the leader limit, and
    /// [`ReloadMode::Honor`](crate::ReloadMode::Honor) reloads. At least 1:
    /// `build()` refuses 0.
    #[must_use]
    pub fn fallback_limit(mut self, limit: usize) -> Self {
        self.engine.fallback_limit = limit;
        self
    }

    /// Most origin calls this layer makes at once, of every kind (default
    /// 64): a flight's call, a revalidation, a background or refresh-ahead
    /// refresh, a call outside any flight. Requests that pass the cache
    /// untouched (a POST, a request with a body) are the client's own and
    /// take none. A call somebody waits for queues for a permit, first come
    /// first served, at most [`max_wait`](Self::max_wait), then gets `503`
    /// with `Retry-After` (`Cache-Status: …; detail=origin-busy`, or the
    /// stale copy where `stale-if-error` allows it). A background refresh
    /// never queues: a stale refresh is deferred while more than three
    /// quarters of the budget are in use (the stale copy is served and the
    /// next request tries again), a refresh ahead of expiry is skipped while
    /// more than half are. See the crate docs, "The origin as a whole".
    /// At least 1: `build()` refuses 0.
    #[must_use]
    pub fn origin_budget(mut self, permits: usize) -> Self {
        self.engine.origin_budget = permits;
        self
    }

    /// The origin's breaker (default [`OriginBreaker::default`]: open after
    /// 5 failed calls in a row, probe after 1 s doubling to 30 s). With
    /// Redis the probe is elected for every instance
    /// ([`RedisOptions::share_origin_breaker`](crate::RedisOptions::share_origin_breaker)).
    #[must_use]
    pub fn origin_breaker(mut self, breaker: OriginBreaker) -> Self {
        self.engine.breaker = breaker;
        self
    }

    /// After a key's fill failed, how long requests that `stale-if-error`
    /// lets take its stale copy get it at once, with no new attempt
    /// (default 1 s; `Cache-Status: …; detail=origin-backoff`). Only the
    /// fact of the failure is kept, never the error page.
    #[must_use]
    pub fn failure_backoff(mut self, backoff: Duration) -> Self {
        self.engine.failure_backoff = backoff;
        self
    }

    /// Refresh-ahead (default 0.25; 0 turns it off): a hit in the last
    /// `fraction` of an entry's freshness starts one background refresh, so
    /// a hot entry is replaced before it expires and no request waits for the
    /// origin. The lead is at least twice the origin time this instance last
    /// measured for the entry. See the crate docs, "Refresh-ahead".
    /// `build()` refuses a fraction outside 0 ≤ f < 1, or NaN.
    #[must_use]
    pub fn refresh_ahead(mut self, fraction: f64) -> Self {
        self.engine.refresh_ahead = fraction;
        self
    }
}
