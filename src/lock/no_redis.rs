//! Leases when the `redis` feature is off: there are none. `Redlock` exists
//! but has no values, so the engine's `Option<Arc<Redlock>>` is always `None`.

pub(crate) mod redlock {
    /// Never built without the feature.
    #[derive(Debug)]
    pub(crate) enum Redlock {}
}

/// The lock metric names, as in the real module: the metrics tables name
/// them in every build.
pub(crate) mod names {
    pub(crate) const ACQUIRE: &str = "redis_lock_acquire_total";
    pub(crate) const HELD_SECONDS: &str = "redis_lock_held_seconds";
}

#[allow(dead_code, reason = "only the Redis paths elect leases")]
pub(crate) fn record_acquire(result: &'static str) {
    metrics::counter!(names::ACQUIRE, "result" => result).increment(1);
}
