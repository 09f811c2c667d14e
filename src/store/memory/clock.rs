//! The memory tier's map: a concurrent hash map bounded by weight, evicting
//! by CLOCK (second chance), with entries past their end swept away as
//! inserts come.
//!
//! Why not moka, which this tier used before: a hit is one map lookup, and
//! moka's costs about 1,000 instructions (its read log, clock reads and
//! housekeeping) where this map's is a shard's read lock, one probe and a
//! flag. What CLOCK gives up against moka's TinyLFU is admission by
//! frequency; what it keeps is the bound on bytes and a second chance for
//! every entry read since the hand last passed it.
//!
//! The map is split in [`SHARDS`] shards, each a `RwLock` held only for a
//! probe or a short walk, never across an `.await`. The weight bound is
//! global (one entry may be larger than a shard's share): an insert that
//! takes the total past it walks the shards in turn, from where the last
//! eviction stopped, until the total is back under the bound.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;
use tokio::time::Instant;

use super::DigestState;
use crate::key::CacheKey;

/// Shards; a power of two.
const SHARDS: usize = 64;

/// Buckets an insert looks at for entries past their end, besides what
/// eviction needs: the sweep that keeps such entries from lingering until
/// the bound pushes them out.
const SWEEP: usize = 4;

/// Buckets one eviction visit walks in a shard before it moves on to the
/// next, so no one shard is emptied while the others keep everything.
const VISIT: usize = 32;

/// What the map needs to know of a value it holds.
pub(crate) trait Resident: Clone {
    /// Bytes counted against the bound.
    fn weight(&self) -> u64;
    /// Whether it is past its end at `now`: swept without a second chance.
    fn is_over(&self, now: Instant) -> bool;
}

struct Node<T> {
    key: CacheKey,
    value: T,
    weight: u64,
    /// Read since the hand last passed: spared once.
    referenced: AtomicBool,
}

struct Shard<T> {
    table: HashTable<Node<T>>,
    /// The next bucket the hand looks at.
    hand: usize,
}

/// See the module docs.
pub(crate) struct ClockMap<T> {
    shards: Box<[RwLock<Shard<T>>]>,
    hasher: DigestState,
    capacity: u64,
    weight: AtomicU64,
    /// The shard the next eviction starts in.
    next_victim: AtomicUsize,
}

impl<T: Resident> ClockMap<T> {
    pub(crate) fn new(capacity: u64, hasher: DigestState) -> Self {
        let shards = (0..SHARDS)
            .map(|_| {
                RwLock::new(Shard {
                    table: HashTable::new(),
                    hand: 0,
                })
            })
            .collect();
        Self {
            shards,
            hasher,
            capacity,
            weight: AtomicU64::new(0),
            next_victim: AtomicUsize::new(0),
        }
    }

    fn hash(&self, key: &CacheKey) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard for `hash`: bits the table itself uses neither for its
    /// bucket index (the low ones) nor for its tags (the top seven).
    fn shard_of(&self, hash: u64) -> usize {
        (hash >> 40) as usize & (SHARDS - 1)
    }

    fn read(&self, i: usize) -> RwLockReadGuard<'_, Shard<T>> {
        // A panic while a guard was held left the table consistent: every
        // change under the lock is a single table call.
        self.shards[i]
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self, i: usize) -> RwLockWriteGuard<'_, Shard<T>> {
        self.shards[i]
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The value for `key`, marked as read.
    #[inline]
    pub(crate) fn get(&self, key: &CacheKey) -> Option<T> {
        let hash = self.hash(key);
        let shard = self.read(self.shard_of(hash));
        let node = shard.table.find(hash, |n| n.key == *key)?;
        // A load first: a hot entry's cache line is not written on every read.
        if !node.referenced.load(Ordering::Relaxed) {
            node.referenced.store(true, Ordering::Relaxed);
        }
        Some(node.value.clone())
    }

    /// Insert or replace `key`'s value, then evict while over the bound. A
    /// value heavier than the whole bound is not kept, and neither is the
    /// value it would have replaced.
    pub(crate) fn insert(&self, key: CacheKey, value: T, now: Instant) {
        let weight = value.weight();
        if weight > self.capacity {
            self.remove(&key);
            return;
        }
        let hash = self.hash(&key);
        let i = self.shard_of(hash);
        let mut shard = self.write(i);
        self.weight.fetch_add(weight, Ordering::Relaxed);
        let replaced = match shard.table.find_mut(hash, |n| n.key == key) {
            Some(node) => {
                self.weight.fetch_sub(node.weight, Ordering::Relaxed);
                node.weight = weight;
                Some(std::mem::replace(&mut node.value, value))
            }
            None => {
                // Just filled means just asked for: one pass of the hand
                // spares it.
                let node = Node {
                    key,
                    value,
                    weight,
                    referenced: AtomicBool::new(true),
                };
                let hasher = self.hasher;
                shard
                    .table
                    .insert_unique(hash, node, move |n| hasher.hash_one(n.key));
                None
            }
        };
        let (swept, _) = self.walk(&mut shard, SWEEP, now, Walk::Expired);
        drop(shard);
        // Values are dropped outside the lock: a body's last reference may
        // free megabytes.
        drop((replaced, swept));
        self.evict_over_bound(now);
    }

    /// Remove `key`, returning its value.
    pub(crate) fn remove(&self, key: &CacheKey) -> Option<T> {
        let hash = self.hash(key);
        let mut shard = self.write(self.shard_of(hash));
        let (node, _) = shard
            .table
            .find_entry(hash, |n| n.key == *key)
            .ok()?
            .remove();
        drop(shard);
        self.weight.fetch_sub(node.weight, Ordering::Relaxed);
        Some(node.value)
    }

    /// Call `f` on every entry, one shard at a time under its read lock.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&CacheKey, &T)) {
        for i in 0..SHARDS {
            for n in self.read(i).table.iter() {
                f(&n.key, &n.value);
            }
        }
    }

    /// Keep only the entries for which `keep` holds.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&CacheKey, &T) -> bool) {
        for i in 0..SHARDS {
            let mut freed = 0;
            self.write(i).table.retain(|n| {
                let kept = keep(&n.key, &n.value);
                if !kept {
                    freed += n.weight;
                }
                kept
            });
            self.weight.fetch_sub(freed, Ordering::Relaxed);
        }
    }

    /// Drop every entry past its end now.
    pub(crate) fn sweep_all(&self, now: Instant) {
        self.retain(|_, v| !v.is_over(now));
    }

    /// Entries held.
    pub(crate) fn len(&self) -> u64 {
        (0..SHARDS).map(|i| self.read(i).table.len() as u64).sum()
    }

    /// Weight held.
    pub(crate) fn weight(&self) -> u64 {
        self.weight.load(Ordering::Relaxed)
    }

    /// Walk the shards in turn, evicting, until the weight is within the
    /// bound. The walk looks at every bucket about twice at most (once to
    /// take its second chance, once to evict it), so it ends.
    fn evict_over_bound(&self, now: Instant) {
        if self.weight() <= self.capacity {
            return;
        }
        let mut budget = 2 * self.buckets();
        while self.weight() > self.capacity && budget > 0 {
            let i = self.next_victim.fetch_add(1, Ordering::Relaxed) % SHARDS;
            let (evicted, walked) = self.walk(&mut self.write(i), VISIT, now, Walk::Evict);
            drop(evicted);
            // At least one, so an empty shard still uses up the budget.
            budget = budget.saturating_sub(walked.max(1));
        }
    }

    /// Buckets of all shards (each read under its lock in turn).
    fn buckets(&self) -> usize {
        (0..SHARDS).map(|i| self.read(i).table.num_buckets()).sum()
    }

    /// Move `shard`'s hand over up to `buckets` buckets (never round the
    /// whole table twice), removing what `walk` says to. The removed values
    /// are returned, to be dropped unlocked, with the buckets walked.
    fn walk(
        &self,
        shard: &mut Shard<T>,
        buckets: usize,
        now: Instant,
        walk: Walk,
    ) -> (Vec<T>, usize) {
        let mut removed = Vec::new();
        let n = shard.table.num_buckets();
        let mut walked = 0;
        while walked < buckets.min(n) {
            if walk == Walk::Evict && self.weight.load(Ordering::Relaxed) <= self.capacity {
                break;
            }
            walked += 1;
            let at = shard.hand % n;
            shard.hand = at + 1;
            let Some(node) = shard.table.get_bucket(at) else {
                continue;
            };
            let spare = !node.value.is_over(now)
                && (walk == Walk::Expired || node.referenced.swap(false, Ordering::Relaxed));
            if spare {
                continue;
            }
            if let Ok(entry) = shard.table.get_bucket_entry(at) {
                let (node, _) = entry.remove();
                self.weight.fetch_sub(node.weight, Ordering::Relaxed);
                removed.push(node.value);
            }
        }
        (removed, walked)
    }
}

/// What a walk of the hand removes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// Only entries past their end.
    Expired,
    /// Those too, and entries not read since the hand last passed (CLOCK),
    /// while the weight is over the bound.
    Evict,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// A value of a given weight that is over at `end`.
    #[derive(Clone, Debug, PartialEq)]
    struct W(u64, Instant);

    impl Resident for W {
        fn weight(&self) -> u64 {
            self.0
        }
        fn is_over(&self, now: Instant) -> bool {
            now >= self.1
        }
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    fn key(i: u32) -> CacheKey {
        CacheKey::new(i.to_le_bytes())
    }

    /// The weight the map counts is the sum of what it holds.
    fn counted_right(map: &ClockMap<W>) -> bool {
        let mut sum = 0;
        map.for_each(|_, v| sum += v.0);
        sum == map.weight()
    }

    /// Inserts far past the bound leave the weight within it, and the count right.
    #[tokio::test]
    async fn the_bound_holds() {
        let map = ClockMap::new(1_000, DigestState::new());
        for i in 0..500 {
            map.insert(key(i), W(10, far()), Instant::now());
            assert!(map.weight() <= 1_000, "over the bound after insert {i}");
        }
        assert!(map.len() >= 90, "kept {} of room for 100", map.len());
        assert!(counted_right(&map));
    }

    /// An entry read since the hand last passed survives evictions that take unread ones.
    #[tokio::test]
    async fn a_read_entry_gets_a_second_chance() {
        let map = ClockMap::new(1_000, DigestState::new());
        for i in 0..100 {
            map.insert(key(i), W(10, far()), Instant::now());
        }
        // Reading 7 before each insert keeps it through twenty turnovers
        // of the whole map, while every unread key goes.
        for i in 100..2_100 {
            assert!(map.get(&key(7)).is_some(), "evicted at insert {i}");
            map.insert(key(i), W(10, far()), Instant::now());
        }
        assert!(map.get(&key(8)).is_none(), "an unread entry stayed");
    }

    /// A value heavier than the whole bound is not kept, nor the one it would replace.
    #[tokio::test]
    async fn too_heavy_is_not_kept() {
        let map = ClockMap::new(100, DigestState::new());
        map.insert(key(1), W(10, far()), Instant::now());
        map.insert(key(1), W(101, far()), Instant::now());
        assert_eq!(map.get(&key(1)), None);
        assert_eq!(map.weight(), 0);
    }

    /// Replacing a value counts its new weight only.
    #[tokio::test]
    async fn replacing_counts_the_new_weight() {
        let map = ClockMap::new(100, DigestState::new());
        map.insert(key(1), W(10, far()), Instant::now());
        map.insert(key(1), W(30, far()), Instant::now());
        assert_eq!(map.weight(), 30);
        assert_eq!(map.len(), 1);
        assert_eq!(map.remove(&key(1)).map(|w| w.0), Some(30));
        assert_eq!(map.weight(), 0);
    }

    /// Entries past their end get no second chance: read or not, they go before any live entry that was read.
    #[tokio::test(start_paused = true)]
    async fn entries_past_their_end_get_no_second_chance() {
        let map = ClockMap::new(1_000, DigestState::new());
        let soon = Instant::now() + Duration::from_secs(1);
        for i in 0..100 {
            let end = if i < 50 { soon } else { far() };
            map.insert(key(i), W(10, end), Instant::now());
            let _ = map.get(&key(i));
        }
        tokio::time::advance(Duration::from_secs(2)).await;
        for i in 100..110 {
            map.insert(key(i), W(10, far()), Instant::now());
        }
        assert!(map.weight() <= 1_000);
        for i in 50..110 {
            assert!(map.get(&key(i)).is_some(), "live entry {i} evicted");
        }
        map.sweep_all(Instant::now());
        assert_eq!(map.len(), 60, "a sweep leaves only live entries");
        assert!(counted_right(&map));
    }

    /// Threads inserting, reading and removing at once end with the bound held and the weight counted right.
    #[test]
    fn concurrent_use_keeps_the_count() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let map = Arc::new(ClockMap::new(5_000, DigestState::new()));
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let map = Arc::clone(&map);
                let handle = rt.handle().clone();
                std::thread::spawn(move || {
                    let _guard = handle.enter();
                    for i in 0..5_000u32 {
                        let k = key(i % 700 + t * 1_000);
                        match i % 5 {
                            0 => {
                                map.remove(&k);
                            }
                            1 | 2 => {
                                let _ = map.get(&k);
                            }
                            _ => map.insert(k, W(u64::from(i % 40) + 1, far()), Instant::now()),
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(map.weight() <= 5_000);
        assert!(counted_right(&map));
    }
}
