//! Hot keys: which keys a cache's traffic, origin calls, waits, stale
//! answers and passes went to over the last minute, in fixed memory.
//!
//! Owns the public report ([`HotKeys`], [`HotKey`]) and the recorder every
//! cache keeps ([`HotKeyTable`]: six [`space_saving::Window`]s). It knows
//! keys and names, nothing of HTTP (the layer redacts URLs before they
//! get here) or of the engine; it imports only [`crate::key`].

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::key::CacheKey;

mod space_saving;

use space_saving::Window;

/// The longest name kept, in bytes: longer ones are cut at a character
/// boundary at or below it, so each slot's memory is fixed.
pub(crate) const NAME_MAX: usize = 96;

/// The largest `k` a cache takes (its index holds slot numbers in a `u16`).
pub(crate) const MAX_K: usize = 4096;

/// The default number of keys kept per measure.
pub(crate) const DEFAULT_K: usize = 64;

/// The default window.
pub(crate) const DEFAULT_WINDOW: Duration = Duration::from_secs(60);

/// The keys that stood out in one cache over its recent window: one list
/// per measure, each sorted by count, largest first, at most K long.
///
/// Counts are Space-Saving's: for every key listed, the true count in the
/// window lies in `count - overcount ..= count`; every key whose true count
/// exceeds the measure's total divided by K is listed. The window is two
/// half-window epochs, so a report covers between half the window and all
/// of it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use herdguard::CacheLayer;
/// use herdguard::status::HotKeys;
/// let cache = CacheLayer::builder().hot_keys(16).build().unwrap();
/// let hot: HotKeys = cache.hot_keys();
/// assert_eq!(hot.k, 16);
/// assert!(hot.requests.is_empty());
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct HotKeys {
    /// The window the counts cover (the last one to half of it).
    pub window: Duration,
    /// How many keys each list holds at most; 0 when hot keys are off.
    pub k: usize,
    /// Requests the cache keyed (answered from any path).
    pub requests: Vec<HotKey>,
    /// Origin calls the cache made for the key: flights' leaders,
    /// refreshes, and calls outside a flight.
    pub origin_calls: Vec<HotKey>,
    /// Followers that shared another request's origin call (a flight's
    /// waiters), counted as each is answered.
    pub waiters: Vec<HotKey>,
    /// Milliseconds spent waiting on another request's call, summed over
    /// the waiting requests.
    pub waited_ms: Vec<HotKey>,
    /// Answers served stale.
    pub stale: Vec<HotKey>,
    /// Requests the cache stood aside for after keying them: under a
    /// hit-for-pass marker (hit-for-miss), and other answers that bypassed
    /// the cache.
    pub passes: Vec<HotKey>,
}

/// One key of a [`HotKeys`] list.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HotKey {
    /// What the key is known as, at most 96 bytes: for a layer the route
    /// (axum's `MatchedPath`) or the redacted URL (path, and `?…` for a
    /// query; the whole URL only with
    /// [`hot_key_full_urls`](crate::CacheLayerBuilder::hot_key_full_urls));
    /// for a [`Cache`](crate::Cache), the key's hex digest.
    pub name: String,
    /// The key's digest, 32 lowercase hex digits ([`CacheKey::to_hex`]).
    pub key: String,
    /// Upper bound of the key's count in the window.
    pub count: u64,
    /// How much of `count` may be other keys' (Space-Saving's error bound):
    /// the true count is at least `count - overcount`.
    pub overcount: u64,
}

impl HotKey {
    fn new(name: &str, key: &CacheKey, count: u64, overcount: u64) -> Self {
        Self {
            name: name.to_owned(),
            key: key.to_hex(),
            count,
            overcount,
        }
    }
}

/// A slot's name as it is written: appends stop at [`NAME_MAX`] bytes, at
/// a character boundary, whatever they are given.
#[derive(Debug)]
pub(crate) struct NameBuf<'a>(&'a mut String);

impl<'a> NameBuf<'a> {
    fn new(name: &'a mut String) -> Self {
        name.reserve_exact(NAME_MAX);
        Self(name)
    }

    /// Append as much of `s` as fits.
    pub(crate) fn push_str(&mut self, s: &str) {
        let room = NAME_MAX - self.0.len();
        let mut end = s.len().min(room);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.0.push_str(&s[..end]);
    }

    /// Append the key's hex digest.
    pub(crate) fn push_hex(&mut self, key: &CacheKey) {
        if NAME_MAX - self.0.len() >= 32 {
            key.push_hex(self.0);
        }
    }
}

/// What is counted; one list of [`HotKeys`] each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Measure {
    Requests,
    OriginCalls,
    Waiters,
    WaitedMs,
    Stale,
    Passes,
}

/// One cache's hot-key recorder, shared by its clones and routes.
///
/// A std `Mutex` per measure: each is held for one probe of a small index
/// and an add (a report copies K rows out), never across an `.await`; a
/// hit takes only the `requests` one.
#[derive(Debug)]
pub(crate) struct HotKeyTable {
    k: usize,
    window: Duration,
    measures: [Mutex<Window>; 6],
}

impl HotKeyTable {
    /// A recorder of the top `k` (1 ..= [`MAX_K`]) per measure over `window`.
    pub(crate) fn new(k: usize, window: Duration) -> Self {
        let k = k.clamp(1, MAX_K);
        let now = Instant::now();
        Self {
            k,
            window,
            measures: std::array::from_fn(|_| Mutex::new(Window::new(k, window, now))),
        }
    }

    #[inline]
    fn measure(&self, m: Measure) -> std::sync::MutexGuard<'_, Window> {
        // A poisoned lock means a panic mid-add elsewhere; the counts are
        // still plain numbers, so keep using them.
        self.measures[m as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Count `amount` for `key` at `now`; `name` writes its name if the
    /// key takes a slot (a key already counted allocates nothing and never
    /// calls it).
    #[inline]
    pub(crate) fn record(
        &self,
        m: Measure,
        key: &CacheKey,
        amount: u64,
        now: Instant,
        name: impl FnOnce(&mut NameBuf<'_>),
    ) {
        self.measure(m).add(key, amount, now, name);
    }

    /// Count `amount` for `key` under the name its requests are counted
    /// under (the hex digest once it has left that list): for the engine,
    /// which knows keys, not names.
    pub(crate) fn record_known(&self, m: Measure, key: &CacheKey, amount: u64) {
        debug_assert!(m != Measure::Requests, "requests are always named");
        // Lock order: a measure, then requests; never the other way.
        self.measure(m).add(key, amount, Instant::now(), |buf| {
            match self.measure(Measure::Requests).name(key) {
                Some(name) => buf.push_str(name),
                None => buf.push_hex(key),
            }
        });
    }

    /// The lists now.
    pub(crate) fn report(&self) -> HotKeys {
        let now = Instant::now();
        let top = |m| self.measure(m).top(self.k, now);
        HotKeys {
            window: self.window,
            k: self.k,
            requests: top(Measure::Requests),
            origin_calls: top(Measure::OriginCalls),
            waiters: top(Measure::Waiters),
            waited_ms: top(Measure::WaitedMs),
            stale: top(Measure::Stale),
            passes: top(Measure::Passes),
        }
    }

    /// Bytes held now, names included.
    #[cfg(test)]
    pub(crate) fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self
                .measures
                .iter()
                .map(|m| {
                    m.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .memory_bytes()
                })
                .sum::<usize>()
    }

    /// The most [`Self::memory_bytes`] can reach for `k`, whatever is
    /// recorded.
    #[cfg(test)]
    pub(crate) fn max_memory_bytes(k: usize) -> usize {
        std::mem::size_of::<Self>() + 6 * Window::max_memory_bytes(k.clamp(1, MAX_K))
    }
}

impl HotKeys {
    /// The report of a cache that keeps no hot keys.
    pub(crate) fn off(window: Duration) -> Self {
        Self {
            window,
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A million distinct keys through every measure leave the recorder
    /// at the size the first few thousand gave it, under its fixed bound.
    #[test]
    fn hot_keys_memory_is_fixed() {
        let table = HotKeyTable::new(DEFAULT_K, DEFAULT_WINDOW);
        let mut warm = 0;
        // One instant for all: a slow run must not cross into the next
        // half-window, whose fresh epoch is another size.
        let now = Instant::now();
        let long = "/x".repeat(200);
        for i in 0u64..1_000_000 {
            let key = CacheKey::new(i.to_le_bytes());
            table.record(Measure::Requests, &key, 1, now, |b| b.push_str(&long));
            if i % 8 == 0 {
                table.record(Measure::WaitedMs, &key, 5, now, |b| b.push_hex(&key));
            }
            if i == 5_000 {
                warm = table.memory_bytes();
            }
        }
        assert_eq!(table.memory_bytes(), warm);
        assert!(warm <= HotKeyTable::max_memory_bytes(DEFAULT_K), "{warm}");
        // What the docs quote: about 120 KiB at the default K.
        let bound = HotKeyTable::max_memory_bytes(DEFAULT_K);
        assert!((110 << 10..=125 << 10).contains(&bound), "{bound}");
        let report = table.report();
        assert_eq!(report.requests.len(), DEFAULT_K);
        assert!(report.requests.iter().all(|r| r.name.len() <= NAME_MAX));
    }

    /// Hostile names never panic the recorder: a multi-byte character
    /// across the bound is cut before it, at every offset.
    #[test]
    fn names_are_cut_on_a_char_boundary() {
        let mut s = String::new();
        let mut buf = NameBuf::new(&mut s);
        buf.push_str(&"a".repeat(NAME_MAX - 1));
        buf.push_str("é€😀");
        assert_eq!(s.len(), NAME_MAX - 1);
        for n in 0..NAME_MAX + 8 {
            let mut s = String::new();
            let mut buf = NameBuf::new(&mut s);
            buf.push_str(&"x".repeat(n));
            buf.push_str("€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€");
            assert!(s.len() <= NAME_MAX);
        }
    }
}
