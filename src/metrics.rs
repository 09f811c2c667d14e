//! Metric names and recording, through the `metrics` facade, plus the plain
//! counters behind [`Stats`].
//!
//! With no recorder installed the facade calls are a few atomic loads.
// The Redis and lease metrics are recorded only on the Redis paths.
#![cfg_attr(not(feature = "redis"), allow(dead_code))]

use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{Key, Label, Level, Metadata};

/// How a request or lookup was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// A fresh stored entry.
    Hit,
    /// A stale entry, served at once while one refresh runs in the background.
    Stale,
    /// Nothing usable was stored; this caller led the computation.
    Miss,
    /// Another caller's computation was shared with this one.
    Coalesced,
    /// The cache stood aside: the origin was called directly and nothing was
    /// stored for this caller (uncacheable request or response, a wait that
    /// ran out, or a response that must not be shared).
    Bypass,
}

impl Source {
    /// The label used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Hit => "hit",
            Source::Stale => "stale",
            Source::Miss => "miss",
            Source::Coalesced => "coalesced",
            Source::Bypass => "bypass",
        }
    }
}

/// Metric names, kept stable: dashboards depend on them.
pub(crate) mod names {
    pub(crate) const REQUESTS: &str = "herdguard_requests_total";
    pub(crate) const ORIGIN_CALLS: &str = "herdguard_origin_calls_total";
    pub(crate) const WAIT_SECONDS: &str = "herdguard_wait_seconds";
    pub(crate) const ENTRY_BYTES: &str = "herdguard_entry_bytes";
    pub(crate) const FENCED_REJECTED: &str = "herdguard_fenced_writes_rejected_total";
    pub(crate) const LEASE_REMAINING: &str = "herdguard_lease_remaining_at_release_seconds";
    pub(crate) const NOT_STORED: &str = "herdguard_not_stored_total";
    pub(crate) const REDIS_ERRORS: &str = "herdguard_redis_errors_total";
    pub(crate) const REDIS_AVAILABLE: &str = "herdguard_redis_available";
    pub(crate) const CORRUPT_ENTRIES: &str = "herdguard_corrupt_entries_total";
}

/// The label every metric of a layer carries: its `cache_name`.
pub(crate) const CACHE_LABEL: &str = "cache";

/// The stable `reason` labels of [`names::NOT_STORED`], from the policy's
/// own reasons. Anything the policy may add later is `other` until it is
/// given a name here, so dashboards never see an unplanned label value.
fn not_stored_reason(policy_reason: &str) -> &'static str {
    match policy_reason {
        "set-cookie" => "set-cookie",
        "private" => "private",
        "no-store" => "no-store",
        "no-freshness" => "no-freshness",
        "too-large" => "too-large",
        "vary-star" => "vary-star",
        "authorization" => "authorization",
        // 206, 304, 1xx, and must-understand with a status we do not know.
        "status" | "must-understand" => "status",
        _ => "other",
    }
}

/// Describe every metric herdguard emits (help text and units) to the
/// installed recorder. Call it once after installing your recorder; the
/// metrics work without it, but exporters then have no help lines.
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        names::REQUESTS,
        "Requests answered by the cache layer, by outcome."
    );
    describe_counter!(
        names::ORIGIN_CALLS,
        "Origin calls (computations) made by the cache."
    );
    describe_histogram!(
        names::WAIT_SECONDS,
        Unit::Seconds,
        "How long a waiter waited for another request's origin call."
    );
    describe_histogram!(names::ENTRY_BYTES, Unit::Bytes, "Size of entries stored.");
    describe_counter!(
        names::FENCED_REJECTED,
        "Writes refused by the fence: a newer write had already landed."
    );
    describe_counter!(
        names::CORRUPT_ENTRIES,
        "Entries in Redis that failed their checksum or did not decode: each is a miss and is overwritten."
    );
    describe_histogram!(
        names::LEASE_REMAINING,
        Unit::Seconds,
        "Lease time left when the leader released it: how close work came to the lease end."
    );
    describe_counter!(
        names::NOT_STORED,
        "Origin answers that were not stored, by reason (set-cookie, private, no-store, no-freshness, too-large, vary-star, authorization, status)."
    );
    describe_counter!(
        names::REDIS_ERRORS,
        "Redis calls that failed, by operation and class (connection, timeout, role, oom, foreign, other)."
    );
    describe_gauge!(
        names::REDIS_AVAILABLE,
        "1 while Redis is used, 0 while the circuit is open."
    );
    #[cfg(feature = "redis")]
    describe_counter!(
        crate::lock::names::ACQUIRE,
        "Lease acquisitions by result: acquired, contended, expired_mid_work."
    );
    #[cfg(feature = "redis")]
    describe_histogram!(
        crate::lock::names::HELD_SECONDS,
        Unit::Seconds,
        "How long a lease was held before release."
    );
    describe_stream_metrics();
}

fn describe_stream_metrics() {
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_histogram!(
        stream_names::WAITER_TTFB,
        Unit::Seconds,
        "Time from a coalesced waiter's request to its first streamed body byte."
    );
    describe_counter!(
        stream_names::CUT_OFF,
        "Readers of a body too large to store cut off for holding its fill back."
    );
}

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
}

pub(crate) struct Counters {
    hits: AtomicU64,
    stale: AtomicU64,
    misses: AtomicU64,
    coalesced: AtomicU64,
    bypasses: AtomicU64,
    origin_calls: AtomicU64,
    errors: AtomicU64,
    fenced_rejections: AtomicU64,
    keys: Keys,
}

/// Every metric key of one cache, labelled with its name and built once:
/// recording on the hit path then allocates nothing.
#[derive(Debug)]
struct Keys {
    cache: String,
    /// hit, stale, miss, coalesced, bypass, error.
    requests: [Key; 6],
    origin_calls: Key,
    fenced_rejected: Key,
    wait: Key,
    entry_bytes: Key,
    lease_remaining: Key,
    /// acquired, contended, expired_mid_work.
    lock_acquire: [Key; 3],
    lock_held: Key,
}

/// `expired_mid_work` of one cache, recorded from the watchdog's task.
#[derive(Debug, Clone)]
pub(crate) struct LeaseLost(Key);

impl LeaseLost {
    pub(crate) fn record(&self) {
        count(&self.0);
    }
}

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

impl Keys {
    fn new(cache: &str) -> Self {
        let key = |name: &'static str, extra: Option<(&'static str, &'static str)>| {
            let mut labels = vec![Label::new(CACHE_LABEL, cache.to_owned())];
            if let Some((k, v)) = extra {
                labels.push(Label::from_static_parts(k, v));
            }
            Key::from_parts(name, labels)
        };
        let outcome = |o| key(names::REQUESTS, Some(("outcome", o)));
        let acquire = |r| key(crate::lock::names::ACQUIRE, Some(("result", r)));
        Self {
            cache: cache.to_owned(),
            requests: [
                outcome("hit"),
                outcome("stale"),
                outcome("miss"),
                outcome("coalesced"),
                outcome("bypass"),
                outcome("error"),
            ],
            origin_calls: key(names::ORIGIN_CALLS, None),
            fenced_rejected: key(names::FENCED_REJECTED, None),
            wait: key(names::WAIT_SECONDS, None),
            entry_bytes: key(names::ENTRY_BYTES, None),
            lease_remaining: key(names::LEASE_REMAINING, None),
            lock_acquire: [
                acquire("acquired"),
                acquire("contended"),
                acquire("expired_mid_work"),
            ],
            lock_held: key(crate::lock::names::HELD_SECONDS, None),
        }
    }
}

fn count(key: &Key) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
}

fn observe(key: &Key, value: f64) {
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA).record(value));
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counters")
            .field("cache", &self.keys.cache)
            .field("stats", &self.snapshot())
            .finish()
    }
}

impl Default for Counters {
    fn default() -> Self {
        Self::new("herdguard")
    }
}

impl Counters {
    /// Counters whose metrics carry `cache="{cache}"`.
    pub(crate) fn new(cache: &str) -> Self {
        Self {
            hits: AtomicU64::new(0),
            stale: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            coalesced: AtomicU64::new(0),
            bypasses: AtomicU64::new(0),
            origin_calls: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            fenced_rejections: AtomicU64::new(0),
            keys: Keys::new(cache),
        }
    }

    pub(crate) fn record(&self, source: Source) {
        let (c, i) = match source {
            Source::Hit => (&self.hits, 0),
            Source::Stale => (&self.stale, 1),
            Source::Miss => (&self.misses, 2),
            Source::Coalesced => (&self.coalesced, 3),
            Source::Bypass => (&self.bypasses, 4),
        };
        c.fetch_add(1, Ordering::Relaxed);
        count(&self.keys.requests[i]);
        tracing::Span::current().record("outcome", source.as_str());
    }

    pub(crate) fn record_error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        count(&self.keys.requests[5]);
        tracing::Span::current().record("outcome", "error");
    }

    pub(crate) fn origin_call(&self) {
        self.origin_calls.fetch_add(1, Ordering::Relaxed);
        count(&self.keys.origin_calls);
    }

    #[cfg(feature = "redis")]
    pub(crate) fn fenced_rejection(&self) {
        self.fenced_rejections.fetch_add(1, Ordering::Relaxed);
        count(&self.keys.fenced_rejected);
    }

    /// An entry in the shared store that did not decode (read as a miss).
    #[cfg(feature = "redis")]
    pub(crate) fn corrupt_entry(&self) {
        count(&cache_key(names::CORRUPT_ENTRIES, &self.keys.cache));
    }

    /// The `cache` label's value.
    pub(crate) fn cache_name(&self) -> &str {
        &self.keys.cache
    }

    /// An origin answer that was not stored; `reason` is the policy's word.
    pub(crate) fn not_stored(&self, reason: &str) {
        let reason = not_stored_reason(reason);
        let labels = vec![
            Label::new(CACHE_LABEL, self.keys.cache.clone()),
            Label::from_static_parts("reason", reason),
        ];
        count(&Key::from_parts(names::NOT_STORED, labels));
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
            other => crate::lock::record_acquire(other),
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
            hits: l(&self.hits),
            stale: l(&self.stale),
            misses: l(&self.misses),
            coalesced: l(&self.coalesced),
            bypasses: l(&self.bypasses),
            origin_calls: l(&self.origin_calls),
            errors: l(&self.errors),
            fenced_rejections: l(&self.fenced_rejections),
        }
    }
}

/// A failed Redis call; `cache` is the layer's name when the store serves one.
pub(crate) fn redis_error(cache: Option<&str>, op: &'static str, class: &'static str) {
    let mut labels = vec![
        Label::from_static_parts("op", op),
        Label::from_static_parts("class", class),
    ];
    if let Some(c) = cache {
        labels.insert(0, Label::new(CACHE_LABEL, c.to_owned()));
    }
    count(&Key::from_parts(names::REDIS_ERRORS, labels));
}

/// Whether the store uses Redis now (1) or serves from memory alone (0).
pub(crate) fn redis_available(cache: Option<&str>, up: bool) {
    let labels: Vec<Label> = cache
        .map(|c| Label::new(CACHE_LABEL, c.to_owned()))
        .into_iter()
        .collect();
    let key = Key::from_parts(names::REDIS_AVAILABLE, labels);
    metrics::with_recorder(|r| {
        r.register_gauge(&key, &METADATA)
            .set(if up { 1.0 } else { 0.0 })
    });
}

/// Streaming fills (see `stream.rs`): kept apart so other metric edits merge.
pub(crate) mod stream_names {
    pub(crate) const WAITER_TTFB: &str = "herdguard_stream_waiter_ttfb_seconds";
    pub(crate) const CUT_OFF: &str = "herdguard_stream_readers_cut_off_total";
}

fn cache_key(name: &'static str, cache: &str) -> Key {
    Key::from_parts(name, vec![Label::new(CACHE_LABEL, cache.to_owned())])
}

/// A coalesced waiter's time from its request to the first streamed byte.
pub(crate) fn record_waiter_ttfb(cache: &str, elapsed: std::time::Duration) {
    observe(
        &cache_key(stream_names::WAITER_TTFB, cache),
        elapsed.as_secs_f64(),
    );
}

/// A reader held a stream's fill back and was cut off.
pub(crate) fn record_stream_cut_off(cache: &str) {
    count(&cache_key(stream_names::CUT_OFF, cache));
}

#[cfg(test)]
mod tests {
    use super::not_stored_reason;

    /// Every policy reason maps to one of the documented labels, unknown ones to `other`.
    #[test]
    fn not_stored_reasons_are_the_documented_set() {
        for (policy, label) in [
            ("set-cookie", "set-cookie"),
            ("private", "private"),
            ("no-store", "no-store"),
            ("no-freshness", "no-freshness"),
            ("too-large", "too-large"),
            ("vary-star", "vary-star"),
            ("authorization", "authorization"),
            ("must-understand", "status"),
            ("status", "status"),
            ("something-new", "other"),
        ] {
            assert_eq!(not_stored_reason(policy), label, "{policy}");
        }
    }
}
