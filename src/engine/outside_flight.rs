//! Stores and purges outside any flight, for the HTTP layer and
//! [`Cache::invalidate`](super::Cache::invalidate): memory here, and the
//! Redis fan-out (in the background) when there is a shared store.

use std::sync::Arc;
use std::time::Duration;

use super::cache::Freshness;
use tokio::time::Instant;

use super::compute::{AlsoStored, Fill};
use super::flight::Outcome;
use super::purge_log::key_name;
use super::resolve::Engine;
use super::spawn::spawn_detached;
use crate::entry::Value;
use crate::key::CacheKey;
use crate::store::memory::Stored;
use crate::store::notice::{Notice, PurgeMode};

/// When an origin call outside any flight started: what it stores is
/// checked against the purges that came after.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutsideStart {
    at: Instant,
    generation: u64,
}

impl<V: Value> Engine<V> {
    /// Note the start of an origin call outside any flight (before it is made).
    pub(crate) fn outside_start(&self) -> OutsideStart {
        OutsideStart {
            at: Instant::now(),
            generation: self.flights.purges.generation(),
        }
    }

    /// Store a value outside any flight (a client's `no-cache` refresh),
    /// with the copies its answer is also filed under. Nothing is stored
    /// where a purge came after `started`: here by the purge log, in Redis
    /// by the group stamps and the fence.
    pub(crate) fn store_outside_flight(
        &self,
        key: CacheKey,
        value: V,
        freshness: Freshness,
        copies: Vec<AlsoStored>,
        started: OutsideStart,
    ) -> Option<Arc<Stored<V>>> {
        let fill = Fill::Store {
            value,
            fresh_for: freshness.fresh_for,
            stale_for: freshness.stale_for,
            copies,
        };
        let local = match (&self.remote, &fill) {
            (Some(remote), Fill::Store { value, copies, .. }) => {
                let local = Fill::Store {
                    value: value.clone(),
                    fresh_for: freshness.fresh_for,
                    stale_for: freshness.stale_for,
                    copies: copies.clone(),
                };
                self.write_outside_flight(remote, key, fill, started.at);
                local
            }
            _ => fill,
        };
        match self.fill_memory(key, local, 0, Duration::ZERO, Some(started.generation)) {
            Outcome::Value { entry, .. } => Some(entry),
            Outcome::Pass(_) | Outcome::Failed(_) => None,
        }
    }

    /// Drop an entry here and, with Redis, there too (in the background,
    /// bounded by the Redis timeouts).
    pub(crate) fn invalidate(&self, key: &CacheKey) {
        self.flights.purges.record([key_name(key)]);
        self.flights.purge_published(|k, _| k == key);
        self.memory.purge(key);
        if let Some(remote) = &self.remote {
            let remote = Arc::clone(remote);
            let key = *key;
            spawn_detached("purge", async move {
                let notice = Notice::Key(key, PurgeMode::Hard).encode();
                if let Err(e) = remote.purge(&key).await {
                    tracing::warn!(key = %key.short(), error = %e, "purge in redis failed");
                }
                let _ = remote.publish_purge(&notice).await;
            });
        }
    }

    /// Drop every entry of this process for which `matches` holds (purge by
    /// URL or tag). A shared store should also delete its copies and publish
    /// the purge so every instance runs it on its L1.
    pub(crate) fn purge_where(
        &self,
        matches: impl Fn(&CacheKey, &V) -> bool + Send + Sync + 'static,
    ) {
        self.flights.purge_published(&matches);
        self.memory.purge_where(matches);
    }

    /// Note a purge of `names` (see [`purge_log`](super::purge_log)) before its
    /// removals, so fills running now do not store over it.
    pub(crate) fn record_purge(&self, names: impl IntoIterator<Item = String>) {
        self.flights.purges.record(names);
    }

    /// [`record_purge`](Self::record_purge) for a soft purge.
    pub(crate) fn record_soft_purge(&self, names: impl IntoIterator<Item = String>) {
        self.flights.purges.record_soft(names);
    }
}
