//! Copies kept past their stale grace, for whoever can still use them: the
//! HTTP layer revalidates them with a conditional request, or serves them
//! for `stale-if-error`. Generic over the [`Value`]; reads no HTTP.
//!
//! The engine drops an entry once its stale grace is over: that is its
//! contract ("stale" means "may be served at once"). A value that can be
//! revalidated is still worth something after that (a 304 instead of a full
//! body), so its user keeps its own reference here, bounded by bytes and by a
//! keep time. The value is shared with the engine's copy, not duplicated.

use std::sync::Arc;
use std::time::Duration;

use moka::sync::Cache as MokaCache;
use moka::Expiry;
use tokio::time::Instant;

use crate::entry::envelope::EntryMeta;
use crate::entry::Value;
use crate::key::CacheKey;
use crate::store::memory::Stored;

#[derive(Debug, Clone)]
struct Retained<V> {
    entry: Arc<Stored<V>>,
    until: Instant,
}

struct RetainedExpiry;

impl<V> Expiry<CacheKey, Retained<V>> for RetainedExpiry {
    fn expire_after_create(
        &self,
        _key: &CacheKey,
        value: &Retained<V>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        // A second past the logical end, so a paused test clock never evicts early.
        Some(value.until.saturating_duration_since(Instant::now()) + Duration::from_secs(1))
    }

    fn expire_after_update(
        &self,
        key: &CacheKey,
        value: &Retained<V>,
        updated_at: std::time::Instant,
        _left: Option<Duration>,
    ) -> Option<Duration> {
        self.expire_after_create(key, value, updated_at)
    }
}

/// Values kept for revalidation and stale-if-error.
#[derive(Clone)]
pub(crate) struct RetainedStore<V: Value> {
    cache: MokaCache<CacheKey, Retained<V>>,
}

impl<V: Value> std::fmt::Debug for RetainedStore<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetainedStore")
            .field("entries", &self.cache.entry_count())
            .finish()
    }
}

impl<V: Value> RetainedStore<V> {
    pub(crate) fn new(capacity_bytes: u64) -> Self {
        let cache = MokaCache::builder()
            .max_capacity(capacity_bytes)
            .weigher(|_k: &CacheKey, r: &Retained<V>| -> u32 {
                // Moka's own node per entry: about 256 bytes more.
                let overhead = crate::store::memory::entry_overhead::<V>() + 256;
                (r.entry.value.weight() + overhead).min(u32::MAX as usize) as u32
            })
            .expire_after(RetainedExpiry)
            .build();
        Self { cache }
    }

    /// Keep `value` for `fresh_for + keep_for` from now.
    pub(crate) fn insert(&self, key: CacheKey, value: V, fresh_for: Duration, keep_for: Duration) {
        let total = fresh_for.saturating_add(keep_for);
        if total.is_zero() {
            self.cache.invalidate(&key);
            return;
        }
        let meta = EntryMeta::now(fresh_for, keep_for, 0);
        let entry = Arc::new(Stored::new(value, meta, fresh_for, total, Duration::ZERO));
        let until = Instant::now() + total;
        self.cache.insert(key, Retained { entry, until });
    }

    /// Keep an entry as it is (its age included) for `left` from now.
    #[cfg(feature = "redis")]
    pub(crate) fn keep(&self, key: CacheKey, entry: Arc<Stored<V>>, left: Duration) {
        if left.is_zero() {
            return;
        }
        let until = Instant::now() + left;
        self.cache.insert(key, Retained { entry, until });
    }

    /// Replace the copy kept for `key`, if there is one and it was stored
    /// no later than `entry` (a newer write read from the shared store), so
    /// an older copy never answers stale over it. Kept for `left` from now.
    #[cfg(feature = "redis")]
    pub(crate) fn replace_older(&self, key: CacheKey, entry: &Arc<Stored<V>>, left: Duration) {
        let Some(r) = self.cache.get(&key) else {
            return;
        };
        if Arc::ptr_eq(&r.entry, entry) || r.entry.meta.stored_at_ms > entry.meta.stored_at_ms {
            return;
        }
        if left.is_zero() {
            self.cache.invalidate(&key);
            return;
        }
        let until = Instant::now() + left;
        self.cache.insert(
            key,
            Retained {
                entry: Arc::clone(entry),
                until,
            },
        );
    }

    pub(crate) fn get(&self, key: &CacheKey) -> Option<Arc<Stored<V>>> {
        let r = self.cache.get(key)?;
        (Instant::now() < r.until).then_some(r.entry)
    }

    /// Weighted bytes held, after pending evictions run.
    pub(crate) fn weighted_bytes(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.weighted_size()
    }

    pub(crate) fn remove(&self, key: &CacheKey) {
        self.cache.invalidate(key);
    }

    /// Mark every copy for which `matches` holds soft-purged, in place
    /// (see [`Stored::mark_soft_purged`]): kept for revalidation and
    /// `stale-if-error`, counted as stale from now.
    pub(crate) fn soft_purge_where(&self, matches: impl Fn(&CacheKey, &V) -> bool) {
        for (key, r) in self.cache.iter() {
            if matches(&key, &r.entry.value) {
                r.entry.mark_soft_purged();
            }
        }
    }

    pub(crate) fn purge_where(
        &self,
        matches: impl Fn(&CacheKey, &V) -> bool + Send + Sync + 'static,
    ) {
        // A walk, not moka's lazy closures (see `MemoryStore::purge_where`).
        for (key, r) in self.cache.iter() {
            if matches(&key, &r.entry.value) {
                self.cache.invalidate(&*key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// A retained copy counts its `Stored` record and the store's node, not
    /// only its value: a one-byte value weighs more than the record.
    #[test]
    fn a_retained_copy_weighs_its_record_and_node() {
        let store = RetainedStore::new(1 << 20);
        let hour = Duration::from_secs(3600);
        store.insert(CacheKey::new("k"), Bytes::from_static(b"v"), hour, hour);
        let record = std::mem::size_of::<Stored<Bytes>>() as u64;
        let held = store.weighted_bytes();
        assert!(
            held > record + 256,
            "{held} counted for a {record}-byte record"
        );
    }
}
