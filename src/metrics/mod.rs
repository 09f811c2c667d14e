//! What the cache counts: [`Stats`] (plain counters of one layer or
//! [`Cache`](crate::Cache)), the [`names`] of every metric it records
//! through the `metrics` facade (install any recorder; with none the
//! calls are a few atomic loads), [`describe_metrics`] for their help
//! text, and [`Source`], how a request was answered. What the cache is
//! doing right now is in [`status`](crate::status).
// Files: stats.rs the counting of outcomes into Stats, origin.rs the origin
// gate's counts, own_call.rs own calls and followers.
// The Redis and lease metrics are recorded only on the Redis paths.
#![cfg_attr(not(feature = "redis"), allow(dead_code))]

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use metrics::{Key, Label, Level, Metadata};

pub(crate) use origin::Skipped;
pub(crate) use own_call::{FollowerCount, OwnCall};
pub use stats::Stats;

mod origin;
mod own_call;
mod stats;

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

pub mod names;

/// The label every metric of a layer carries: its `cache_name`.
pub(crate) const CACHE_LABEL: &str = "cache";

/// The stable `reason` labels of [`names::NOT_STORED`], in the order of
/// [`Keys::not_stored`]. A new reason of the policy maps to one of these
/// (or `Other`) where it is defined, so dashboards never see an unplanned
/// label value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotStoredLabel {
    SetCookie,
    Private,
    NoStore,
    NoFreshness,
    TooLarge,
    VaryStar,
    Authorization,
    Status,
    Other,
}

impl NotStoredLabel {
    /// Every label, in the order of [`Keys::not_stored`].
    const ALL: [Self; 9] = [
        Self::SetCookie,
        Self::Private,
        Self::NoStore,
        Self::NoFreshness,
        Self::TooLarge,
        Self::VaryStar,
        Self::Authorization,
        Self::Status,
        Self::Other,
    ];

    /// The label value on the wire.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::SetCookie => "set-cookie",
            Self::Private => "private",
            Self::NoStore => "no-store",
            Self::NoFreshness => "no-freshness",
            Self::TooLarge => "too-large",
            Self::VaryStar => "vary-star",
            Self::Authorization => "authorization",
            Self::Status => "status",
            Self::Other => "other",
        }
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
    describe_counter!(
        names::LOCK_ACQUIRE,
        "Lease acquisitions by result: acquired, contended, expired_mid_work."
    );
    describe_histogram!(
        names::LOCK_HELD_SECONDS,
        Unit::Seconds,
        "How long a lease was held before release."
    );
    describe_stream_metrics();
    origin::describe();
    own_call::describe();
}

fn describe_stream_metrics() {
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_histogram!(
        names::STREAM_WAITER_TTFB,
        Unit::Seconds,
        "Time from a coalesced waiter's request to its first streamed body byte."
    );
    describe_counter!(
        names::STREAM_READERS_CUT_OFF,
        "Readers of a body too large to store cut off for holding its fill back."
    );
}

/// One cache's counters and metric keys. Route layers with their own label
/// ([`relabel`](Self::relabel)) share the tally, so [`Stats`] still counts
/// every route.
pub(crate) struct Counters {
    tally: Arc<Tally>,
    keys: Keys,
}

/// The numbers behind [`Stats`].
#[derive(Debug, Default)]
struct Tally {
    hits: AtomicU64,
    stale: AtomicU64,
    misses: AtomicU64,
    coalesced: AtomicU64,
    bypasses: AtomicU64,
    origin_calls: AtomicU64,
    errors: AtomicU64,
    fenced_rejections: AtomicU64,
    origin_refused: AtomicU64,
    refreshes_skipped: AtomicU64,
    probes: AtomicU64,
    own_calls: AtomicU64,
    followers: AtomicU64,
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
    /// In the order of [`NotStoredLabel::ALL`].
    not_stored: [Key; 9],
    corrupt_entries: Key,
    followers: Key,
    /// In the order of [`OwnCall::ALL`].
    own_calls: [Key; 12],
    /// The origin gate's (budget, breaker).
    origin: origin::OriginKeys,
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
        let acquire = |r| key(names::LOCK_ACQUIRE, Some(("result", r)));
        let (followers, own_calls) = own_call::keys(&key);
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
            lock_held: key(names::LOCK_HELD_SECONDS, None),
            not_stored: NotStoredLabel::ALL
                .map(|r| key(names::NOT_STORED, Some(("reason", r.as_str())))),
            corrupt_entries: key(names::CORRUPT_ENTRIES, None),
            followers,
            own_calls,
            origin: origin::OriginKeys::new(&key),
        }
    }

    /// Register every metric of this cache with the installed recorder, so
    /// exporters show each at 0 before anything happens; the Redis-path
    /// ones only when `redis` is used, the origin gate's only for the engine
    /// itself (a route's own label shares its gate).
    fn register(&self, redis: bool, origin: bool) {
        let (ttfb, cut_off) = (
            cache_key(names::STREAM_WAITER_TTFB, &self.cache),
            cache_key(names::STREAM_READERS_CUT_OFF, &self.cache),
        );
        let redis_errors = cache_key(names::REDIS_ERRORS, &self.cache);
        let mut counters: Vec<&Key> = self
            .requests
            .iter()
            .chain(&self.not_stored)
            .chain(&self.own_calls)
            .chain([&self.followers])
            .collect();
        counters.extend([&self.origin_calls, &cut_off]);
        let mut histograms = vec![&self.wait, &self.entry_bytes, &ttfb];
        let mut gauges = Vec::new();
        if origin {
            counters.extend(self.origin.counters());
            histograms.push(&self.origin.queue_seconds);
            gauges = self.origin.gauges();
        }
        if redis {
            counters.extend(&self.lock_acquire);
            counters.extend([&self.fenced_rejected, &self.corrupt_entries, &redis_errors]);
            histograms.extend([&self.lease_remaining, &self.lock_held]);
        }
        // The handles are dropped: the recorder keeps what it registered.
        metrics::with_recorder(|r| {
            for key in counters {
                let _ = r.register_counter(key, &METADATA);
            }
            for key in histograms {
                let _ = r.register_histogram(key, &METADATA);
            }
            for key in gauges {
                r.register_gauge(key, &METADATA).set(0.0);
            }
        });
    }
}

fn count(key: &Key) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
}

fn gauge(key: &Key, value: f64) {
    metrics::with_recorder(|r| r.register_gauge(key, &METADATA).set(value));
}

fn observe(key: &Key, value: f64) {
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA).record(value));
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

fn cache_key(name: &'static str, cache: &str) -> Key {
    Key::from_parts(name, vec![Label::new(CACHE_LABEL, cache.to_owned())])
}

/// A coalesced waiter's time from its request to the first streamed byte.
pub(crate) fn record_waiter_ttfb(cache: &str, elapsed: std::time::Duration) {
    observe(
        &cache_key(names::STREAM_WAITER_TTFB, cache),
        elapsed.as_secs_f64(),
    );
}

/// A reader held a stream's fill back and was cut off.
pub(crate) fn record_stream_cut_off(cache: &str) {
    count(&cache_key(names::STREAM_READERS_CUT_OFF, cache));
}

#[cfg(test)]
mod tests {
    use super::NotStoredLabel;

    /// The labels are the documented set, and each one's key is found at
    /// its own index (the counter is picked by discriminant).
    #[test]
    fn not_stored_labels_are_the_documented_set() {
        let wire = NotStoredLabel::ALL.map(NotStoredLabel::as_str);
        assert_eq!(
            wire,
            [
                "set-cookie",
                "private",
                "no-store",
                "no-freshness",
                "too-large",
                "vary-star",
                "authorization",
                "status",
                "other",
            ]
        );
        for (i, label) in NotStoredLabel::ALL.into_iter().enumerate() {
            assert_eq!(label as usize, i, "{label:?}");
        }
    }
}
