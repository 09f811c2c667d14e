//! Stores and purges outside any flight, for the HTTP layer and
//! [`Cache::invalidate`](super::Cache::invalidate): memory here, and the
//! Redis fan-out (in the background) when there is a shared store.

use std::sync::Arc;
use std::time::Duration;

use super::cache::Freshness;
use super::compute::Fill;
use super::flight::Outcome;
use super::purge_log::key_name;
use super::resolve::{spawn_detached, Engine};
use super::value::Value;
use crate::key::CacheKey;
use crate::store::memory::Stored;

impl<V: Value> Engine<V> {
    /// Store a value outside any flight: a client's `no-cache` refresh, or a
    /// response filed under a second key (a Vary variant learned at fill time).
    pub(crate) fn store_outside_flight(
        &self,
        key: CacheKey,
        value: V,
        freshness: Freshness,
    ) -> Option<Arc<Stored<V>>> {
        if let Some(remote) = &self.remote {
            self.write_outside_flight(remote, key, &value, freshness);
        }
        let fill = Fill::Store {
            value,
            fresh_for: freshness.fresh_for,
            stale_for: freshness.stale_for,
        };
        match self.fill_memory(key, fill, 0, Duration::ZERO) {
            Outcome::Value { entry, .. } => Some(entry),
            Outcome::Pass(_) | Outcome::Failed(_) => None,
        }
    }

    /// Write a value to the shared store only (not to memory), outside any
    /// flight: a copy for instances that look a key up without knowing more.
    pub(crate) fn store_remote_only(&self, key: CacheKey, value: &V, freshness: Freshness) {
        if let Some(remote) = &self.remote {
            if remote.available() {
                self.write_outside_flight(remote, key, value, freshness);
            }
        }
    }

    /// Drop an entry here and, with Redis, there too (in the background,
    /// bounded by the Redis timeouts).
    pub(crate) fn invalidate(&self, key: &CacheKey) {
        self.flights.purges.record([key_name(key)]);
        self.memory.remove(key);
        if let Some(remote) = &self.remote {
            let remote = Arc::clone(remote);
            let key = *key;
            spawn_detached("purge", async move {
                let notice = format!("k:{}", key.to_hex());
                if let Err(e) = remote.purge(&key).await {
                    tracing::warn!(key = %key.short(), error = %e, "purge in redis failed");
                }
                let _ = remote.publish_purge(notice.as_bytes()).await;
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
        self.memory.purge_where(matches);
    }

    /// Note a purge of `names` (see [`purge_log`](super::purge_log)) before its
    /// removals, so fills running now do not store over it.
    pub(crate) fn record_purge(&self, names: impl IntoIterator<Item = String>) {
        self.flights.purges.record(names);
    }
}
