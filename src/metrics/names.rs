//! The name of every metric herdguard records, kept stable: dashboards
//! depend on them. The recording code uses these constants, and every
//! metric of a layer or [`Cache`](crate::Cache) is registered at 0 when it
//! is built (see [`describe_metrics`](crate::metrics::describe_metrics) for the help texts), so `/metrics`
//! shows each name before the first request.
//!
//! Every metric of a layer carries the label `cache` (its
//! [`cache_name`](crate::CacheLayerBuilder::cache_name)).
//!
//! ```
//! use herdguard::metrics::names;
//! assert_eq!(names::REQUESTS, "herdguard_requests_total");
//! ```

/// Answers, by `outcome`: hit, stale, miss, coalesced, bypass, error.
pub const REQUESTS: &str = "herdguard_requests_total";
/// Origin calls (computations) made by the cache.
pub const ORIGIN_CALLS: &str = "herdguard_origin_calls_total";
/// Requests answered by another request's origin call, on this instance
/// or another one on the same Redis (the request that made the call not
/// counted): the coalescing. Beside `outcome="coalesced"` of [`REQUESTS`],
/// it counts a request that waited for another instance's fill, which is
/// answered as a hit.
pub const FOLLOWERS: &str = "herdguard_followers_total";
/// Requests that called the origin on their own, outside any flight, by
/// `reason`: method, request, request-body, unkeyed, too-large,
/// hit-for-pass, wait-timeout, stream-window-passed, overloaded,
/// error-not-shared, uncacheable, vary-miss: the coalescing the cache could
/// not do, beside [`FOLLOWERS`], the coalescing it did.
pub const OWN_CALLS: &str = "herdguard_own_calls_total";
/// Histogram: how long a waiter waited for another request's origin call.
pub const WAIT_SECONDS: &str = "herdguard_wait_seconds";
/// Histogram: size of the entries stored, in bytes.
pub const ENTRY_BYTES: &str = "herdguard_entry_bytes";
/// Writes refused by the fence (Redis only).
pub const FENCED_REJECTED: &str = "herdguard_fenced_writes_rejected_total";
/// Histogram: lease time left when the leader released it (Redis only).
pub const LEASE_REMAINING: &str = "herdguard_lease_remaining_at_release_seconds";
/// Origin answers not stored, by `reason`: set-cookie, private,
/// no-store, no-freshness, too-large, vary-star, authorization, status,
/// other.
pub const NOT_STORED: &str = "herdguard_not_stored_total";
/// Failed Redis calls, by `op` and `class` (Redis only). The zero series
/// registered at start carries only `cache`.
pub const REDIS_ERRORS: &str = "herdguard_redis_errors_total";
/// Gauge: 1 while Redis is used, 0 while its circuit is open (Redis only).
pub const REDIS_AVAILABLE: &str = "herdguard_redis_available";
/// Entries in Redis that failed their checksum or did not decode (Redis only).
pub const CORRUPT_ENTRIES: &str = "herdguard_corrupt_entries_total";
/// Lease elections, by `result`: acquired, contended, expired_mid_work
/// (Redis only; also recorded by [`Redlock`](crate::redlock::Redlock), without `cache`).
pub const LOCK_ACQUIRE: &str = "redis_lock_acquire_total";
/// Histogram: how long a lease was held before release (Redis only).
pub const LOCK_HELD_SECONDS: &str = "redis_lock_held_seconds";
/// Histogram: a coalesced waiter's time to its first streamed body byte.
pub const STREAM_WAITER_TTFB: &str = "herdguard_stream_waiter_ttfb_seconds";
/// Readers of a body too large to store cut off for holding its fill back.
pub const STREAM_READERS_CUT_OFF: &str = "herdguard_stream_readers_cut_off_total";
/// Gauge: the origin budget's permits (this instance).
pub const ORIGIN_BUDGET_LIMIT: &str = "herdguard_origin_budget_limit";
/// Gauge: origin budget permits in use (this instance).
pub const ORIGIN_BUDGET_IN_USE: &str = "herdguard_origin_budget_in_use";
/// Gauge: the cluster-wide origin budget's permits (Redis only).
pub const CLUSTER_BUDGET_LIMIT: &str = "herdguard_cluster_origin_budget_limit";
/// Gauge: cluster-wide permits in use, as last seen (Redis only).
pub const CLUSTER_BUDGET_IN_USE: &str = "herdguard_cluster_origin_budget_in_use";
/// Gauge: origin calls queued for a budget permit.
pub const ORIGIN_QUEUE: &str = "herdguard_origin_queue_length";
/// Histogram: how long a call queued for a budget permit.
pub const ORIGIN_QUEUE_SECONDS: &str = "herdguard_origin_queue_seconds";
/// Origin calls refused before reaching the origin, by `reason`:
/// busy (the budget's queue was full or its wait ran out), down (the
/// breaker is open).
pub const ORIGIN_REFUSED: &str = "herdguard_origin_refused_total";
/// Background refreshes not started, by `reason`: budget, breaker,
/// backoff (the key's last fill failed moments ago).
pub const REFRESHES_SKIPPED: &str = "herdguard_refreshes_skipped_total";
/// Gauge: 1 while the origin's breaker is open (or probing), else 0.
pub const BREAKER_OPEN: &str = "herdguard_origin_breaker_open";
/// The breaker's transitions, by `to`: open, closed.
pub const BREAKER_TRANSITIONS: &str = "herdguard_origin_breaker_transitions_total";
/// Probes sent to an origin whose breaker is open.
pub const BREAKER_PROBES: &str = "herdguard_origin_probes_total";
