//! One measure's approximate top-K: Space-Saving (Metwally, Agrawal,
//! El Abbadi, 2005) in K slots, over a window of two half-window epochs.
//!
//! Owns the counting only; names arrive already bounded ([`NameBuf`]).
//! Imports nothing of the crate but the key.

use std::time::Duration;

use tokio::time::Instant;

#[cfg(test)]
use super::NAME_MAX;
use super::{HotKey, NameBuf};
use crate::key::CacheKey;

/// An index cell with no slot.
const EMPTY: u16 = u16::MAX;

/// One counted key. Its name's buffer is kept when the slot is reused, so
/// a table that has filled once allocates nothing more.
#[derive(Debug)]
struct Slot {
    key: CacheKey,
    count: u64,
    overcount: u64,
    name: String,
}

/// Space-Saving over one epoch: at most `k` slots and an open-addressing
/// index (linear probing, at most half full) from key to slot, so a key
/// already counted costs one probe and an add. A new key takes a free slot
/// or the smallest one's (found by a scan of the K counts: only keys not
/// in the table pay it).
#[derive(Debug)]
pub(super) struct SpaceSaving {
    slots: Vec<Slot>,
    /// Slots in use; the rest of `slots` are kept for their name buffers.
    used: usize,
    k: usize,
    index: Box<[u16]>,
    mask: usize,
}

/// Where a key's digest puts it in the index: the digest is already
/// uniform, so its first bytes are the hash.
fn home(key: &CacheKey, mask: usize) -> usize {
    let b = key.as_bytes();
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as usize & mask
}

impl SpaceSaving {
    /// `k` slots, 1 ..= [`super::MAX_K`].
    pub(super) fn new(k: usize) -> Self {
        let cells = (2 * k).next_power_of_two().max(2);
        Self {
            slots: Vec::with_capacity(k),
            used: 0,
            k,
            index: vec![EMPTY; cells].into_boxed_slice(),
            mask: cells - 1,
        }
    }

    /// Bytes held, names' buffers included: at most
    /// [`Self::max_memory_bytes`] whatever was counted.
    #[cfg(test)]
    pub(super) fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.slots.iter().map(|s| s.name.capacity()).sum::<usize>()
            + self.index.len() * std::mem::size_of::<u16>()
    }

    /// The most [`Self::memory_bytes`] can be for `k` slots.
    #[cfg(test)]
    pub(super) fn max_memory_bytes(k: usize) -> usize {
        let cells = (2 * k).next_power_of_two().max(2);
        std::mem::size_of::<Self>()
            + k * (std::mem::size_of::<Slot>() + NAME_MAX)
            + cells * std::mem::size_of::<u16>()
    }

    /// The index cell holding `key`, or the empty cell where it would go.
    #[inline]
    fn find(&self, key: &CacheKey) -> (usize, bool) {
        let mut i = home(key, self.mask);
        loop {
            match self.index[i] {
                EMPTY => return (i, false),
                s if self.slots[s as usize].key == *key => return (i, true),
                _ => i = (i + 1) & self.mask,
            }
        }
    }

    /// Add `amount` to `key`, naming it with `name` if it takes a slot.
    /// Inlined: a key already counted is the hit path's case.
    #[inline]
    pub(super) fn add(&mut self, key: &CacheKey, amount: u64, name: impl FnOnce(&mut NameBuf<'_>)) {
        let (cell, found) = self.find(key);
        if found {
            let slot = &mut self.slots[self.index[cell] as usize];
            slot.count = slot.count.saturating_add(amount);
            return;
        }
        self.insert(cell, key, amount, name);
    }

    /// Give `key`, found at no slot (`cell` the empty index cell where it
    /// would go), a free slot or the smallest one's.
    #[inline(never)]
    fn insert(
        &mut self,
        cell: usize,
        key: &CacheKey,
        amount: u64,
        name: impl FnOnce(&mut NameBuf<'_>),
    ) {
        let (s, floor) = if self.used < self.k {
            let s = self.used;
            if s == self.slots.len() {
                self.slots.push(Slot {
                    key: *key,
                    count: 0,
                    overcount: 0,
                    name: String::new(),
                });
            }
            self.used += 1;
            self.index[cell] = s as u16;
            (s, 0)
        } else {
            // The smallest count: the newcomer may have had up to that many
            // before (Space-Saving's overestimate), and takes its slot.
            let (s, floor) = self.slots[..self.used]
                .iter()
                .enumerate()
                .map(|(i, slot)| (i, slot.count))
                .min_by_key(|&(_, c)| c)
                .unwrap_or((0, 0));
            let (old, _) = self.find(&self.slots[s].key);
            self.unlink(old);
            let (cell, _) = self.find(key);
            self.index[cell] = s as u16;
            (s, floor)
        };
        let slot = &mut self.slots[s];
        slot.key = *key;
        slot.count = floor.saturating_add(amount);
        slot.overcount = floor;
        slot.name.clear();
        name(&mut NameBuf::new(&mut slot.name));
    }

    /// Empty the index cell `i`, shifting later cells of its probe run back
    /// so every key stays reachable from its home (no tombstones).
    fn unlink(&mut self, mut i: usize) {
        let mut j = i;
        loop {
            j = (j + 1) & self.mask;
            let s = self.index[j];
            if s == EMPTY {
                self.index[i] = EMPTY;
                return;
            }
            let h = home(&self.slots[s as usize].key, self.mask);
            // The entry at j may move to i unless its home lies in (i, j].
            let stays = if i <= j {
                i < h && h <= j
            } else {
                i < h || h <= j
            };
            if !stays {
                self.index[i] = s;
                i = j;
            }
        }
    }

    fn clear(&mut self) {
        self.used = 0;
        self.index.fill(EMPTY);
    }

    /// The count of `key`, if it holds a slot: `(count, overcount)`.
    fn get(&self, key: &CacheKey) -> Option<(u64, u64)> {
        match self.find(key) {
            (cell, true) => {
                let slot = &self.slots[self.index[cell] as usize];
                Some((slot.count, slot.overcount))
            }
            _ => None,
        }
    }

    /// The name `key` is counted under, if it holds a slot.
    pub(super) fn name(&self, key: &CacheKey) -> Option<&str> {
        match self.find(key) {
            (cell, true) => Some(&self.slots[self.index[cell] as usize].name),
            _ => None,
        }
    }

    /// What a key without a slot may have had: the smallest count once the
    /// table is full (Space-Saving's bound), else 0.
    fn floor(&self) -> u64 {
        if self.used < self.k {
            0
        } else {
            self.slots[..self.used]
                .iter()
                .map(|s| s.count)
                .min()
                .unwrap_or(0)
        }
    }

    fn in_use(&self) -> &[Slot] {
        &self.slots[..self.used]
    }
}

/// A measure over a sliding window: the current epoch and the one before,
/// each half the window long, rotated when a record or a report finds the
/// current one over (no timer, no clock read of its own).
#[derive(Debug)]
pub(super) struct Window {
    epochs: [SpaceSaving; 2],
    /// Which of `epochs` is current.
    current: usize,
    /// When the current epoch ends.
    ends: Instant,
    half: Duration,
}

impl Window {
    pub(super) fn new(k: usize, window: Duration, now: Instant) -> Self {
        let half = (window / 2).max(Duration::from_millis(1));
        Self {
            epochs: [SpaceSaving::new(k), SpaceSaving::new(k)],
            current: 0,
            ends: now + half,
            half,
        }
    }

    /// Start a new epoch if the current one is over; a whole window
    /// without records leaves nothing. Out of line: the records that find
    /// the epoch over are one per half window.
    #[cold]
    #[inline(never)]
    fn rotate(&mut self, now: Instant) {
        if now < self.ends {
            return;
        }
        if now >= self.ends + self.half {
            self.epochs[0].clear();
            self.epochs[1].clear();
            self.ends = now + self.half;
        } else {
            self.current ^= 1;
            self.epochs[self.current].clear();
            self.ends += self.half;
        }
    }

    #[inline]
    pub(super) fn add(
        &mut self,
        key: &CacheKey,
        amount: u64,
        now: Instant,
        name: impl FnOnce(&mut NameBuf<'_>),
    ) {
        if now >= self.ends {
            self.rotate(now);
        }
        self.epochs[self.current & 1].add(key, amount, name);
    }

    /// The name `key` is counted under in either epoch.
    pub(super) fn name(&self, key: &CacheKey) -> Option<&str> {
        let [a, b] = self.ordered();
        a.name(key).or_else(|| b.name(key))
    }

    /// Current epoch first.
    fn ordered(&self) -> [&SpaceSaving; 2] {
        [&self.epochs[self.current], &self.epochs[self.current ^ 1]]
    }

    /// The top `k` over both epochs, count descending. A key one epoch
    /// does not hold gets that epoch's floor added to its count and its
    /// overcount: `count` stays an upper bound of the true count, and
    /// `count - overcount` a lower one.
    pub(super) fn top(&mut self, k: usize, now: Instant) -> Vec<HotKey> {
        self.rotate(now);
        let [cur, prev] = self.ordered();
        let (cur_floor, prev_floor) = (cur.floor(), prev.floor());
        let mut rows: Vec<HotKey> = Vec::with_capacity(cur.used + prev.used);
        for slot in cur.in_use() {
            let (c, o) = prev.get(&slot.key).unwrap_or((prev_floor, prev_floor));
            rows.push(HotKey::new(
                &slot.name,
                &slot.key,
                slot.count.saturating_add(c),
                slot.overcount.saturating_add(o),
            ));
        }
        for slot in prev.in_use() {
            if cur.get(&slot.key).is_none() {
                rows.push(HotKey::new(
                    &slot.name,
                    &slot.key,
                    slot.count.saturating_add(cur_floor),
                    slot.overcount.saturating_add(cur_floor),
                ));
            }
        }
        rows.sort_unstable_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        rows.truncate(k);
        rows
    }

    #[cfg(test)]
    pub(super) fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>() - 2 * std::mem::size_of::<SpaceSaving>()
            + self
                .epochs
                .iter()
                .map(SpaceSaving::memory_bytes)
                .sum::<usize>()
    }

    #[cfg(test)]
    pub(super) fn max_memory_bytes(k: usize) -> usize {
        std::mem::size_of::<Self>() - 2 * std::mem::size_of::<SpaceSaving>()
            + 2 * SpaceSaving::max_memory_bytes(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> CacheKey {
        CacheKey::new(i.to_le_bytes())
    }

    fn named(i: u64) -> impl FnOnce(&mut NameBuf<'_>) {
        move |b: &mut NameBuf<'_>| b.push_str(&format!("/item/{i}"))
    }

    /// A million distinct keys leave the table's memory where the first
    /// thousand put it, under its fixed bound; a key seen more than N/K
    /// times is still in it, its count within the overcount of the truth.
    #[test]
    fn memory_stays_fixed_and_a_heavy_key_stays() {
        let (k, n) = (64usize, 1_000_000u64);
        let mut table = SpaceSaving::new(k);
        let heavy = key(u64::MAX);
        // Above N/K: every 50th record is the heavy key.
        let mut true_heavy = 0;
        let mut after_warmup = 0;
        for i in 0..n {
            if i % 50 == 0 {
                table.add(&heavy, 1, named(u64::MAX));
                true_heavy += 1;
            }
            table.add(&key(i), 1, named(i));
            if i == 1_000 {
                after_warmup = table.memory_bytes();
            }
        }
        let total = n + true_heavy;
        assert!(true_heavy > total / k as u64, "the heavy key is above N/K");
        assert_eq!(
            table.memory_bytes(),
            after_warmup,
            "no growth after warm-up"
        );
        assert!(table.memory_bytes() <= SpaceSaving::max_memory_bytes(k));
        assert_eq!(table.slots.capacity(), k);
        let (count, over) = table.get(&heavy).expect("a key above N/K keeps its slot");
        assert!(
            count >= true_heavy && count - over <= true_heavy,
            "{count} {over}"
        );
        assert_eq!(table.name(&heavy), Some("/item/18446744073709551615"));
    }

    /// The index finds every key after many evictions (backward shift
    /// keeps probe runs whole): every slot's key is found at its own slot.
    #[test]
    fn index_stays_consistent_through_evictions() {
        let mut table = SpaceSaving::new(8);
        for i in 0..10_000 {
            table.add(&key(i % 37), 1 + i % 3, |_| {});
        }
        for (s, slot) in table.in_use().iter().enumerate() {
            let (cell, found) = table.find(&slot.key);
            assert!(found);
            assert_eq!(table.index[cell] as usize, s);
        }
        let cells = table.index.iter().filter(|&&c| c != EMPTY).count();
        assert_eq!(cells, table.used);
    }

    /// Counts fall out of the window a whole window after they were made:
    /// half a window later they are still reported, a window later gone.
    #[test]
    fn counts_leave_with_the_window() {
        let t0 = Instant::now();
        let mut w = Window::new(4, Duration::from_secs(60), t0);
        w.add(&key(1), 5, t0, named(1));
        assert_eq!(w.top(4, t0 + Duration::from_secs(31))[0].count, 5);
        w.add(&key(1), 1, t0 + Duration::from_secs(31), named(1));
        assert_eq!(w.top(4, t0 + Duration::from_secs(59))[0].count, 6);
        // The first epoch (0–30 s) has gone; the 31 s record remains.
        assert_eq!(w.top(4, t0 + Duration::from_secs(61))[0].count, 1);
        assert!(w.top(4, t0 + Duration::from_secs(200)).is_empty());
    }
}
