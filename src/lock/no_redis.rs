//! Leases when the `redis` feature is off: there are none. `Redlock` exists
//! but has no values, so the engine's `Option<Arc<Redlock>>` is always `None`.

pub(crate) mod redlock {
    /// Never built without the feature.
    #[derive(Debug)]
    pub(crate) enum Redlock {}
}
