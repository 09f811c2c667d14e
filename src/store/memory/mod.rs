//! In-process store: the embedded default, and the L1 tier in front of
//! Redis. Never talks to Redis and never waits: every call returns at once.
//!
//! Its map ([`clock::ClockMap`]) is synchronous: a hit is answered inside
//! `Service::call` with a ready future and no boxed state machine. The map
//! only evicts (by weight, and entries a second past their end); whether an
//! entry is fresh or stale is decided here from tokio `Instant`s, so tests
//! can pause time.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use clock::{ClockMap, Resident};

use crate::entry::Value;
use crate::key::CacheKey;

mod clock;
mod stored;

pub(crate) use stored::Stored;

#[derive(Debug)]
pub(crate) enum Slot<V> {
    Entry(Arc<Stored<V>>),
    /// Hit-for-pass: the origin said this is uncacheable; do not queue behind it.
    Pass {
        until: Instant,
    },
}

impl<V> Clone for Slot<V> {
    fn clone(&self) -> Self {
        match self {
            Slot::Entry(e) => Slot::Entry(Arc::clone(e)),
            Slot::Pass { until } => Slot::Pass { until: *until },
        }
    }
}

impl<V> Slot<V> {
    fn until(&self) -> Instant {
        match self {
            Slot::Entry(e) => e.usable_until,
            Slot::Pass { until } => *until,
        }
    }
}

/// What the memory tier knows about a key right now.
#[derive(Debug)]
pub(crate) enum Probe<V> {
    Fresh(Arc<Stored<V>>),
    Stale(Arc<Stored<V>>),
    Pass,
    Miss,
}

/// What an entry takes in memory beyond its value's own weight: the
/// `Stored` around it with its `Arc` counts, and its slot in a map.
pub(crate) fn entry_overhead<V>() -> usize {
    std::mem::size_of::<Stored<V>>() + 16 + 64
}

/// How long past its end a slot stays in the map: paused test clocks and
/// scheduling jitter never see an entry that is still usable go.
const EVICTION_SLACK: Duration = Duration::from_secs(1);

impl<V: Value> Resident for Slot<V> {
    fn weight(&self) -> u64 {
        match self {
            Slot::Entry(e) => e.value.weight().saturating_add(entry_overhead::<V>()) as u64,
            Slot::Pass { .. } => 64,
        }
    }

    fn is_over(&self, now: Instant) -> bool {
        now >= self.until() + EVICTION_SLACK
    }
}

/// The L1 map's hasher. Its keys are BLAKE3 digests, already uniform, so
/// one keyed folded multiply of their two halves spreads them as well as
/// SipHash does, for a tenth of its instructions. Keyed with secrets drawn
/// per store: a request can choose which digests it sends, not where
/// they land in the map or its frequency sketch.
#[derive(Clone, Copy)]
pub(crate) struct DigestState {
    k0: u64,
    k1: u64,
    k2: u64,
}

impl DigestState {
    fn new() -> Self {
        // std's RandomState is seeded from the OS; each one hashes apart.
        let secret = || std::collections::hash_map::RandomState::new().hash_one(0u8);
        Self {
            k0: secret(),
            k1: secret(),
            k2: secret() | 1,
        }
    }
}

impl BuildHasher for DigestState {
    type Hasher = DigestHasher;
    fn build_hasher(&self) -> DigestHasher {
        DigestHasher {
            keys: *self,
            acc: self.k0,
        }
    }
}

/// See [`DigestState`].
pub(crate) struct DigestHasher {
    keys: DigestState,
    acc: u64,
}

/// The high and low halves of the 128-bit product, folded.
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

impl Hasher for DigestHasher {
    /// A `CacheKey` hashes as this one call.
    fn write_u128(&mut self, v: u128) {
        let (lo, hi) = (v as u64, (v >> 64) as u64);
        self.acc = fold(lo ^ self.acc, hi ^ self.keys.k1);
    }

    /// Anything else, 8 bytes at a time (nothing else is hashed here).
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            let w = u64::from_le_bytes(word) ^ chunk.len() as u64;
            self.acc = fold(w ^ self.acc, self.keys.k1);
        }
    }

    fn finish(&self) -> u64 {
        fold(self.acc, self.keys.k2)
    }
}

/// The byte-bounded in-process store.
#[derive(Clone)]
pub(crate) struct MemoryStore<V: Value> {
    map: Arc<ClockMap<Slot<V>>>,
}

impl<V: Value> std::fmt::Debug for MemoryStore<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("weighted_bytes", &self.map.weight())
            .finish()
    }
}

impl<V: Value> MemoryStore<V> {
    pub(crate) fn new(capacity_bytes: u64) -> Self {
        let map = ClockMap::new(capacity_bytes, DigestState::new());
        Self { map: Arc::new(map) }
    }

    pub(crate) fn probe(&self, key: &CacheKey) -> Probe<V> {
        self.probe_at(key, Instant::now())
    }

    /// [`Self::probe`] at `now`, for a hit that read the clock once.
    #[inline]
    pub(crate) fn probe_at(&self, key: &CacheKey, now: Instant) -> Probe<V> {
        let Some(slot) = self.map.get(key) else {
            return Probe::Miss;
        };
        match slot {
            Slot::Entry(e) if e.is_fresh(now) => Probe::Fresh(e),
            Slot::Entry(e) if e.is_usable(now) => Probe::Stale(e),
            Slot::Pass { until } if now < until => Probe::Pass,
            _ => Probe::Miss,
        }
    }

    pub(crate) fn insert(&self, key: CacheKey, stored: Arc<Stored<V>>) {
        self.map.insert(key, Slot::Entry(stored), Instant::now());
    }

    pub(crate) fn insert_pass(&self, key: CacheKey, ttl: Duration) {
        if !ttl.is_zero() {
            let now = Instant::now();
            self.map.insert(key, Slot::Pass { until: now + ttl }, now);
        }
    }

    pub(crate) fn remove(&self, key: &CacheKey) {
        self.map.remove(key);
    }

    /// Remove `key`'s entry for a purge: marked purged first (see
    /// [`Stored::mark_purged`]), so a copy someone still holds is not
    /// served either.
    pub(crate) fn purge(&self, key: &CacheKey) {
        if let Some(Slot::Entry(e)) = self.map.remove(key) {
            e.mark_purged();
        }
    }

    /// Entries held, once those past their end are dropped.
    pub(crate) fn entry_count(&self) -> u64 {
        self.map.sweep_all(Instant::now());
        self.map.len()
    }

    /// Weighted bytes held, once entries past their end are dropped.
    pub(crate) fn weighted_bytes(&self) -> u64 {
        self.map.sweep_all(Instant::now());
        self.map.weight()
    }

    /// Soft-purge every entry for which `matches` holds, now: each copy is
    /// marked in place (see [`Stored::mark_soft_purged`]) and kept.
    pub(crate) fn soft_purge_where(&self, matches: impl Fn(&CacheKey, &V) -> bool) {
        self.map.for_each(|key, slot| {
            if let Slot::Entry(e) = slot {
                if matches(key, &e.value) {
                    e.mark_soft_purged();
                }
            }
        });
    }

    /// Drop every entry for which `matches` holds, now, each marked purged
    /// first. A walk under each shard's lock: an entry read just before the
    /// purge is gone for every read after it.
    pub(crate) fn purge_where(&self, matches: impl Fn(&CacheKey, &V) -> bool) {
        self.map.retain(|key, slot| match slot {
            Slot::Entry(e) if matches(key, &e.value) => {
                e.mark_purged();
                false
            }
            _ => true,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::envelope::EntryMeta;
    use bytes::Bytes;

    fn stored(fresh: u64, usable: u64) -> Arc<Stored<Bytes>> {
        let meta = EntryMeta::now(Duration::from_secs(fresh), Duration::ZERO, 0);
        Arc::new(Stored::new(
            Bytes::from_static(b"v"),
            meta,
            Duration::from_secs(fresh),
            Duration::from_secs(usable),
            Duration::ZERO,
        ))
    }

    /// The L1 map's hash of a key depends on a secret per store.
    #[test]
    fn digest_hashes_are_keyed_per_store() {
        let key = CacheKey::new("k");
        let (a, b) = (DigestState::new(), DigestState::new());
        assert_ne!(a.hash_one(key), b.hash_one(key));
        assert_eq!(a.hash_one(key), a.hash_one(key));
    }

    /// An entry counts its `Stored` record, not only its value: a
    /// one-byte value still weighs more than the record around it.
    #[test]
    fn an_entry_weighs_its_record() {
        let store = MemoryStore::new(1 << 20);
        store.insert(CacheKey::new("k"), stored(60, 60));
        let record = std::mem::size_of::<Stored<Bytes>>() as u64;
        assert!(
            store.weighted_bytes() > record,
            "{} counted for a {record}-byte record",
            store.weighted_bytes()
        );
    }

    /// An entry is fresh, then stale, then gone, by the paused tokio clock.
    #[tokio::test(start_paused = true)]
    async fn fresh_then_stale_then_miss() {
        let store = MemoryStore::new(1 << 20);
        let key = CacheKey::new("k");
        store.insert(key, stored(5, 10));
        assert!(matches!(store.probe(&key), Probe::Fresh(_)));
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(matches!(store.probe(&key), Probe::Stale(_)));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(matches!(store.probe(&key), Probe::Miss));
    }

    /// A soft-purged copy is stale at once, as old as its freshness (whole seconds) plus the time since, and usable for its stale window from the purge only.
    #[tokio::test(start_paused = true)]
    async fn a_soft_purge_makes_a_copy_stale_for_its_stale_window() {
        let store = MemoryStore::new(1 << 20);
        let key = CacheKey::new("k");
        let meta = EntryMeta::now(Duration::from_millis(1_500), Duration::from_secs(2), 0);
        let e = Arc::new(Stored::new(
            Bytes::from_static(b"v"),
            meta,
            Duration::from_millis(1_500),
            Duration::from_millis(3_500),
            Duration::ZERO,
        ));
        store.insert(key, Arc::clone(&e));
        store.soft_purge_where(|_, _| true);
        assert!(matches!(store.probe(&key), Probe::Stale(_)));
        assert!(!e.fresh_by_meta());
        assert_eq!(e.age(), Duration::from_secs(2));
        tokio::time::advance(Duration::from_millis(1_900)).await;
        assert!(matches!(store.probe(&key), Probe::Stale(_)));
        assert_eq!(e.soft_purged_for(), Some(Duration::from_millis(1_900)));
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(matches!(store.probe(&key), Probe::Miss), "past the window");
    }

    /// A soft purge never lengthens a copy's life, and a copy with no stale window is not usable after one.
    #[tokio::test(start_paused = true)]
    async fn a_soft_purge_never_lengthens_a_copy_s_life() {
        let store = MemoryStore::new(1 << 20);
        let (a, b) = (CacheKey::new("a"), CacheKey::new("b"));
        store.insert(a, stored(5, 5));
        let meta = EntryMeta::now(Duration::from_secs(5), Duration::from_secs(10), 0);
        let s = Stored::new(
            Bytes::from_static(b"v"),
            meta,
            Duration::from_secs(5),
            Duration::from_secs(6),
            Duration::ZERO,
        );
        store.insert(b, Arc::new(s));
        store.soft_purge_where(|_, _| true);
        assert!(matches!(store.probe(&a), Probe::Miss), "no stale window");
        assert!(matches!(store.probe(&b), Probe::Stale(_)));
        tokio::time::advance(Duration::from_millis(6_100)).await;
        assert!(matches!(store.probe(&b), Probe::Miss), "its own end holds");
    }

    /// An entry read just before a purge by predicate is not returned after it.
    #[test]
    fn purge_where_hides_an_entry_read_just_before() {
        let store = MemoryStore::new(1 << 20);
        let key = CacheKey::new("k");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            for _ in 0..200 {
                store.insert(key, stored(60, 60));
                std::thread::sleep(std::time::Duration::from_millis(2));
                assert!(matches!(store.probe(&key), Probe::Fresh(_)));
                store.purge_where(|_, _| true);
                assert!(
                    matches!(store.probe(&key), Probe::Miss),
                    "purged entry returned"
                );
            }
        });
    }

    /// The byte bound evicts: far more bytes than the capacity never stay resident.
    #[tokio::test]
    async fn byte_bound_is_enforced() {
        let store: MemoryStore<Bytes> = MemoryStore::new(64 * 1024);
        for i in 0..200u32 {
            let meta = EntryMeta::now(Duration::from_secs(60), Duration::ZERO, 0);
            let v = Bytes::from(vec![0u8; 4096]);
            let s = Stored::new(
                v,
                meta,
                Duration::from_secs(60),
                Duration::from_secs(60),
                Duration::ZERO,
            );
            store.insert(CacheKey::new(i.to_le_bytes()), Arc::new(s));
        }
        assert!(store.weighted_bytes() <= 64 * 1024);
        assert!(store.entry_count() < 200);
    }
}
