//! Purges seen by this process, so a fill that started before a purge of its
//! key, URL or tag is shared with the requests waiting on it but not stored:
//! otherwise it would land after the purge and undo it.
//!
//! Every purge is one generation. A flight notes the generation it started
//! at; before (and just after) it stores, it asks whether any of its names
//! was purged since. Names are `key:<hex>` for a key and the value's purge
//! groups (`url:<hex>`, `tag:<tag>`). The log is bounded: when it has
//! forgotten purges newer than a flight's start, that flight counts as
//! purged (it stores nothing; the next request fills again).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use crate::key::CacheKey;

/// Names remembered; far more than the purges that can land during one
/// fill, which is what matters (a flight lasts at most the origin timeout).
const KEEP: usize = 4096;

/// The name of a key in the log.
pub(crate) fn key_name(key: &CacheKey) -> String {
    format!("key:{}", key.to_hex())
}

/// A std `Mutex`: held for a few map operations, never across an `.await`.
#[derive(Debug, Default)]
pub(crate) struct PurgeLog {
    state: Mutex<LogState>,
}

#[derive(Debug, Default)]
struct LogState {
    /// Purges recorded so far.
    generation: u64,
    /// Each name's last purge, and its last hard one (0: none remembered).
    by_name: HashMap<Box<str>, (u64, u64)>,
    /// Oldest first, to forget in order.
    order: VecDeque<(u64, Box<str>)>,
    /// The newest generation forgotten.
    forgotten: u64,
}

impl PurgeLog {
    pub(crate) fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// One purge of everything `names` names.
    pub(crate) fn record(&self, names: impl IntoIterator<Item = String>) {
        self.record_as(names, true);
    }

    /// One soft purge of everything `names` names: it counts for
    /// [`purged_since`](Self::purged_since), not for
    /// [`hard_purged_since`](Self::hard_purged_since).
    pub(crate) fn record_soft(&self, names: impl IntoIterator<Item = String>) {
        self.record_as(names, false);
    }

    fn record_as(&self, names: impl IntoIterator<Item = String>, hard: bool) {
        let mut s = self.lock();
        s.generation += 1;
        let g = s.generation;
        for name in names {
            let name: Box<str> = name.into();
            let last = s.by_name.entry(name.clone()).or_default();
            *last = (g, if hard { g } else { last.1 });
            s.order.push_back((g, name));
        }
        while s.order.len() > KEEP {
            let Some((old, name)) = s.order.pop_front() else {
                break;
            };
            if s.by_name.get(&name).is_some_and(|&(last, _)| last == old) {
                s.by_name.remove(&name);
            }
            s.forgotten = s.forgotten.max(old);
        }
    }

    /// Whether a purge after generation `since` named any of `names` (asked
    /// for only when some purge happened since).
    pub(crate) fn purged_since(&self, since: u64, names: impl FnOnce() -> Vec<String>) -> bool {
        self.purged_since_as(since, names, false)
    }

    /// [`purged_since`](Self::purged_since), counting hard purges only
    /// (and, as there, every purge the log has forgotten).
    pub(crate) fn hard_purged_since(
        &self,
        since: u64,
        names: impl FnOnce() -> Vec<String>,
    ) -> bool {
        self.purged_since_as(since, names, true)
    }

    fn purged_since_as(
        &self,
        since: u64,
        names: impl FnOnce() -> Vec<String>,
        hard_only: bool,
    ) -> bool {
        {
            let s = self.lock();
            if s.generation == since {
                return false;
            }
            if since < s.forgotten {
                return true;
            }
        }
        let names = names();
        let s = self.lock();
        since < s.forgotten
            || names.iter().any(|n| {
                s.by_name
                    .get(n.as_str())
                    .is_some_and(|&(last, hard)| (if hard_only { hard } else { last }) > since)
            })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        // A poisoned log only means a panic mid-record; the worst left
        // behind is a name missing, so keep using it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A purge counts only for names it named and flights started before it.
    #[test]
    fn purges_count_for_their_names_and_earlier_starts() {
        let log = PurgeLog::default();
        let start = log.generation();
        log.record(["url:a".to_owned()]);
        assert!(log.purged_since(start, || vec!["key:x".into(), "url:a".into()]));
        assert!(!log.purged_since(start, || vec!["key:x".into(), "url:b".into()]));
        assert!(!log.purged_since(log.generation(), || vec!["url:a".into()]));
    }

    /// A soft purge counts for every flight's question but the hard-only
    /// one; a hard purge after it counts for both.
    #[test]
    fn soft_purges_count_only_when_asked_for() {
        let log = PurgeLog::default();
        let start = log.generation();
        log.record_soft(["url:a".to_owned()]);
        let names = || vec!["url:a".into()];
        assert!(log.purged_since(start, names));
        assert!(!log.hard_purged_since(start, names));
        let later = log.generation();
        log.record(["url:a".to_owned()]);
        log.record_soft(["url:a".to_owned()]);
        assert!(log.hard_purged_since(start, names));
        assert!(log.hard_purged_since(later, names));
        assert!(!log.hard_purged_since(log.generation() - 1, names));
    }

    /// A flight older than what the log still remembers counts as purged.
    #[test]
    fn forgotten_purges_count_as_purged() {
        let log = PurgeLog::default();
        let start = log.generation();
        for i in 0..=KEEP {
            log.record([format!("key:{i}")]);
        }
        assert!(log.purged_since(start, || vec!["key:unrelated".into()]));
        let later = log.generation();
        log.record(["key:other".to_owned()]);
        assert!(!log.purged_since(later, || vec!["key:unrelated".into()]));
    }
}
