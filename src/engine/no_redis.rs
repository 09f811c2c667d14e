//! Without the `redis` feature no [`RedisStore`] value exists, so these
//! never run; they keep the engine's call sites free of `cfg`.

use std::sync::Arc;

use std::time::Duration;

use tokio::time::Instant;

use super::compute::{Fill, Work};
use super::flight::{FlightHandle, Outcome};
use super::resolve::Engine;
use crate::entry::Value;
use crate::key::CacheKey;
use crate::store::memory::Stored;
use crate::store::redis::RedisStore;

impl<V: Value> Engine<V> {
    pub(super) async fn drive_remote(
        &self,
        remote: &Arc<RedisStore>,
        _handle: &FlightHandle<V>,
        _fut: Work<V>,
        _ahead: Option<&Arc<Stored<V>>>,
    ) -> Outcome<V> {
        match **remote {}
    }

    pub(super) fn write_outside_flight(
        &self,
        remote: &Arc<RedisStore>,
        _key: CacheKey,
        _fill: Fill<V>,
        _asked: Instant,
    ) {
        match **remote {}
    }

    pub(super) fn remote_l1(&self) -> Option<Duration> {
        match self.remote.as_deref() {
            Some(remote) => match *remote {},
            None => None,
        }
    }
}
