//! Leases and fencing tokens.
//!
//! A Redis lock is a lease, not a mutex: it can expire under a worker that is
//! still running. The lease elects one leader per key cheaply; the fence token
//! issued with it makes a late write from a lapsed leader harmless, because
//! the store rejects any write older than the newest accepted one.
//!
//! Owns Redlock across N masters (`redlock/`, its builder in
//! `redlock/builder.rs`), the lease watchdog (`watchdog`) and the lease
//! metrics (this file). The lease and fence token types are `entry`'s, below the store, which compares them too.
//! Must not import `inspect`, `http` or `engine`, which stand above it
//! (see `.ci/layers.sh`).

pub(crate) mod redlock;
pub(crate) mod watchdog;

use crate::metrics::names;

pub(crate) fn record_acquire(result: &'static str) {
    metrics::counter!(names::LOCK_ACQUIRE, "result" => result).increment(1);
}

/// Register the lease metrics a [`Redlock`](redlock::Redlock) records
/// (without a `cache` label) at 0, so exporters show them before the first
/// election.
pub(crate) fn register_metrics() {
    for result in ["acquired", "contended", "expired_mid_work"] {
        metrics::counter!(names::LOCK_ACQUIRE, "result" => result).increment(0);
    }
    // The handle is dropped: the recorder keeps what it registered.
    let _ = metrics::histogram!(names::LOCK_HELD_SECONDS);
}

pub(crate) fn record_held(seconds: f64) {
    metrics::histogram!(names::LOCK_HELD_SECONDS).record(seconds);
}
