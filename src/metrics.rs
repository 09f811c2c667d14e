//! Metric names and recording, through the `metrics` facade, plus the plain
//! counters behind [`Stats`].
//!
//! With no recorder installed the facade calls are a few atomic loads.

use std::sync::atomic::{AtomicU64, Ordering};

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
    describe_histogram!(
        names::LEASE_REMAINING,
        Unit::Seconds,
        "Lease time left when the leader released it: how close work came to the lease end."
    );
    describe_counter!(
        "herdguard_redis_errors_total",
        "Redis calls that failed, by operation."
    );
    describe_gauge!(
        "herdguard_redis_available",
        "1 while Redis is used, 0 while the circuit is open."
    );
    describe_counter!(
        crate::lock::names::ACQUIRE,
        "Lease acquisitions by result: acquired, contended, expired_mid_work."
    );
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
        "Readers cut off for falling behind a streamed fill's window."
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

#[derive(Debug, Default)]
pub(crate) struct Counters {
    hits: AtomicU64,
    stale: AtomicU64,
    misses: AtomicU64,
    coalesced: AtomicU64,
    bypasses: AtomicU64,
    origin_calls: AtomicU64,
    errors: AtomicU64,
    fenced_rejections: AtomicU64,
}

impl Counters {
    pub(crate) fn record(&self, source: Source) {
        let c = match source {
            Source::Hit => &self.hits,
            Source::Stale => &self.stale,
            Source::Miss => &self.misses,
            Source::Coalesced => &self.coalesced,
            Source::Bypass => &self.bypasses,
        };
        c.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(names::REQUESTS, "outcome" => source.as_str()).increment(1);
        tracing::Span::current().record("outcome", source.as_str());
    }

    pub(crate) fn record_error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(names::REQUESTS, "outcome" => "error").increment(1);
        tracing::Span::current().record("outcome", "error");
    }

    pub(crate) fn origin_call(&self) {
        self.origin_calls.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(names::ORIGIN_CALLS).increment(1);
    }

    pub(crate) fn fenced_rejection(&self) {
        self.fenced_rejections.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(names::FENCED_REJECTED).increment(1);
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

pub(crate) fn record_wait(seconds: f64) {
    metrics::histogram!(names::WAIT_SECONDS).record(seconds);
}

pub(crate) fn record_lease_remaining(seconds: f64) {
    metrics::histogram!(names::LEASE_REMAINING).record(seconds);
}

/// Streaming fills (see `stream.rs`): kept apart so other metric edits merge.
pub(crate) mod stream_names {
    pub(crate) const WAITER_TTFB: &str = "herdguard_stream_waiter_ttfb_seconds";
    pub(crate) const CUT_OFF: &str = "herdguard_stream_readers_cut_off_total";
}

/// A coalesced waiter's time from its request to the first streamed byte.
pub(crate) fn record_waiter_ttfb(elapsed: std::time::Duration) {
    metrics::histogram!(stream_names::WAITER_TTFB).record(elapsed.as_secs_f64());
}

/// A reader fell behind a stream's window and was cut off.
pub(crate) fn record_stream_cut_off() {
    metrics::counter!(stream_names::CUT_OFF).increment(1);
}

pub(crate) fn record_entry_bytes(bytes: usize) {
    metrics::histogram!(names::ENTRY_BYTES).record(bytes as f64);
}
