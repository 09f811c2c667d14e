//! Leases when the `redis` feature is off: there are none. `Redlock` exists
//! but has no values, so the engine's `Option<Arc<Redlock>>` is always `None`.

pub(crate) mod redlock {
    /// Never built without the feature.
    #[derive(Debug)]
    pub(crate) enum Redlock {}
}

#[allow(dead_code, reason = "only the Redis paths elect leases")]
pub(crate) fn record_acquire(result: &'static str) {
    metrics::counter!(crate::metrics::names::LOCK_ACQUIRE, "result" => result).increment(1);
}
