//! Whether the Redis server may evict keys, read from `INFO memory` now and
//! then. An evicting server can drop a purge index while the entries it
//! lists are still read, so a purge would miss them; entries are then served
//! only while their index still lists them (see
//! [`RedisStore::anchored`](super::RedisStore::anchored)). A server that
//! cannot evict (`noeviction`, or no `maxmemory`) is spared that check.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use deadpool_redis::redis;
use tokio::time::Instant;

/// How often the server's policy is read again (it can be changed at run
/// time with `CONFIG SET`).
const RECHECK: Duration = Duration::from_secs(10);

const UNKNOWN: u8 = 0;
const KEEPS_KEYS: u8 = 1;
const EVICTS: u8 = 2;

/// The last reading of the server's eviction policy.
#[derive(Debug)]
pub(super) struct EvictionWatch {
    state: AtomicU8,
    /// When the policy is next due a reading, in ms after `epoch`.
    due_ms: AtomicU64,
    reading: AtomicBool,
    epoch: Instant,
}

impl Default for EvictionWatch {
    fn default() -> Self {
        Self {
            state: AtomicU8::new(UNKNOWN),
            due_ms: AtomicU64::new(0),
            reading: AtomicBool::new(false),
            epoch: Instant::now(),
        }
    }
}

impl EvictionWatch {
    /// Whether keys may be evicted, as far as is known: unknown counts as
    /// yes (the check it guards is then made, which is always safe).
    pub(super) fn may_evict(&self) -> bool {
        self.state.load(Ordering::Acquire) != KEEPS_KEYS
    }

    /// Whether a reading is due now; true for one caller at a time, which
    /// must then call [`record`](Self::record).
    pub(super) fn claim_reading(&self) -> bool {
        let now = self.now_ms();
        now >= self.due_ms.load(Ordering::Acquire) && !self.reading.swap(true, Ordering::AcqRel)
    }

    /// Record what `INFO memory` said (`None`: it could not be read, so
    /// eviction is assumed), and when to read it again.
    pub(super) fn record(&self, info: Option<&redis::Value>) {
        let mut texts = Vec::new();
        if let Some(v) = info {
            texts_of(v, &mut texts);
        }
        // Every node must be one that cannot evict (a cluster answers for each).
        let evicts = texts.is_empty() || texts.iter().any(|t| may_evict(t));
        self.state
            .store(if evicts { EVICTS } else { KEEPS_KEYS }, Ordering::Release);
        let next = self.now_ms().saturating_add(RECHECK.as_millis() as u64);
        self.due_ms.store(next, Ordering::Release);
        self.reading.store(false, Ordering::Release);
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis().min(u64::MAX as u128) as u64
    }
}

/// The texts in an `INFO` reply: one for a server, one per node from a
/// cluster (a map or an array of them).
fn texts_of(v: &redis::Value, out: &mut Vec<String>) {
    match v {
        redis::Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => out.push(s.clone()),
        redis::Value::VerbatimString { text, .. } => out.push(text.clone()),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.iter().for_each(|i| texts_of(i, out));
        }
        redis::Value::Map(pairs) => pairs.iter().for_each(|(_, i)| texts_of(i, out)),
        _ => {}
    }
}

/// Whether the server whose `INFO memory` this is may evict keys: it has a
/// `maxmemory` and a policy other than `noeviction`. Fields it lacks (a
/// server or proxy that hides them) count as evicting.
fn may_evict(info: &str) -> bool {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    !matches!(
        (field("maxmemory"), field("maxmemory_policy")),
        (Some("0"), Some(_)) | (Some(_), Some("noeviction"))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_server_that_cannot_evict_is_spared() {
        assert!(!may_evict(
            "# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:allkeys-lru\r\n"
        ));
        assert!(!may_evict(
            "maxmemory:1000000\r\nmaxmemory_policy:noeviction\r\n"
        ));
        assert!(may_evict(
            "maxmemory:1000000\r\nmaxmemory_policy:volatile-ttl\r\n"
        ));
        assert!(may_evict(
            "maxmemory:1000000\r\nmaxmemory_policy:allkeys-lru\r\n"
        ));
        // Hidden fields: assume the worst.
        assert!(may_evict("used_memory:100\r\n"));
        assert!(may_evict("maxmemory:0\r\n"));
    }

    #[test]
    fn unknown_until_read_then_kept_until_due() {
        let w = EvictionWatch::default();
        assert!(w.may_evict());
        assert!(w.claim_reading());
        assert!(!w.claim_reading(), "one reader at a time");
        let text = |t: &str| redis::Value::BulkString(t.as_bytes().to_vec());
        w.record(Some(&text(
            "maxmemory:0\r\nmaxmemory_policy:noeviction\r\n",
        )));
        assert!(!w.may_evict());
        assert!(!w.claim_reading(), "not due again yet");
        let w = EvictionWatch::default();
        assert!(w.claim_reading());
        w.record(None);
        assert!(w.may_evict());
        // A cluster: one node that may evict is enough.
        let w = EvictionWatch::default();
        assert!(w.claim_reading());
        w.record(Some(&redis::Value::Map(vec![
            (
                text("a"),
                text("maxmemory:0\r\nmaxmemory_policy:noeviction\r\n"),
            ),
            (
                text("b"),
                text("maxmemory:9\r\nmaxmemory_policy:allkeys-lru\r\n"),
            ),
        ])));
        assert!(w.may_evict());
    }
}
