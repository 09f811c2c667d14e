//! The Redis store when the `redis` feature is off: its types exist but have
//! no values. Holds no behaviour; it must mirror only the signatures that
//! code compiled either way calls.
//!
//! An `Option<Arc<RedisStore>>` is then always `None`, so the engine keeps
//! one code path and its Redis branches are dead code the compiler can see
//! is unreachable (each method here is a `match` on an empty enum). Only the
//! methods called from code that is compiled either way live here; the
//! engine's Redis-only functions are `cfg`-gated instead.

use std::fmt;
use std::sync::Arc;

use crate::error::BuildError;
use crate::key::CacheKey;

/// Never built: nothing public makes one without the feature. (Not an
/// empty enum, so the engine's `opts.clone()` is not flagged unreachable.)
#[derive(Debug, Clone)]
pub(crate) struct RedisOptions(());

/// No Redis store can exist without the feature.
#[derive(Debug)]
pub(crate) enum RedisStore {}

/// No Redis call is made, so none fails.
#[derive(Debug)]
pub(crate) enum StoreError {}

impl fmt::Display for StoreError {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {}
    }
}

/// Applies a purge notice; as in the real store's purge bus.
pub(crate) type PurgeHandler = Arc<dyn Fn(&[u8]) + Send + Sync>;

pub(crate) fn redact_error(e: &dyn fmt::Display) -> String {
    e.to_string()
}

impl RedisOptions {
    pub(crate) fn metrics_name(self, _name: &str) -> Self {
        self
    }

    pub(crate) fn fills_last(self, _longest: std::time::Duration) -> Self {
        self
    }
}

impl StoreError {
    pub(crate) fn did_nothing(&self) -> bool {
        match *self {}
    }
}

impl RedisStore {
    pub(crate) fn new(_options: RedisOptions) -> Result<Self, BuildError> {
        Err(BuildError::missing_feature("redis", "a redis store"))
    }

    pub(crate) fn set_lease_elsewhere(&mut self) {
        match *self {}
    }

    pub(crate) fn available(&self) -> bool {
        match *self {}
    }

    pub(crate) fn set_purge_handler(&self, _handler: PurgeHandler) {
        match *self {}
    }

    pub(crate) async fn purge(&self, _key: &CacheKey) -> Result<(), StoreError> {
        match *self {}
    }

    pub(crate) async fn purge_group(&self, _group: &str) -> Result<(), (StoreError, bool)> {
        match *self {}
    }

    pub(crate) async fn soft_purge_group(
        &self,
        _group: &str,
        _first: Option<&CacheKey>,
    ) -> Result<(), (StoreError, bool)> {
        match *self {}
    }

    pub(crate) async fn publish_purge(&self, _payload: &[u8]) -> Result<bool, StoreError> {
        match *self {}
    }
}

impl From<&StoreError> for crate::error::StoreFailure {
    fn from(e: &StoreError) -> Self {
        match *e {}
    }
}
