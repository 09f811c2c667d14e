//! Fill notifications over sharded pub/sub (Redis 7: SPUBLISH / SSUBSCRIBE):
//! the waiters' registry and its one subscriber connection. Publishes nothing
//! (the fenced write does) and reads no entry.
//!
//! A notice's payload is the stored entry itself (its encoding, checksummed
//! as stored) when it is at most [`RedisOptions::notice_entry_limit`](super::RedisOptions::notice_entry_limit), else a
//! short wake-up: waiters then read the entry. Payloads over this instance's
//! own limit are kept as a wake-up only, so what a waiting key holds here is
//! bounded. The payload is handed to the waiters as it came; the engine
//! decodes it and checks its fence.
//!
//! The fenced write publishes on `{ns}:{H}:fill`, a channel under the entry's
//! own hash tag: on a cluster it lives in the entry's slot, so the script may
//! publish it and only the shard that owns the entry carries it (classic
//! PUBLISH would be broadcast to every node). The same code runs on a
//! standalone Redis.
//!
//! Each store has one subscriber connection (RESP3, pushes delivered to a
//! channel) and subscribes only to the keys its waiters wait for: a waiter
//! registers here, the subscriber task SSUBSCRIBEs its channel, and
//! SUNSUBSCRIBEs when the last waiter of that key is gone. A missed
//! notification costs at most one poll interval: waiters also poll.
//!
//! ```text
//! mod.rs         the waiters' registry: Fills, FillSubscription, channel names
//! subscriber.rs  the subscriber connection: connect, reconcile, hear notices
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use crate::key::CacheKey;

mod subscriber;

pub(crate) use self::subscriber::{run_subscriber, FillSource};

/// What a waiter sees of its key.
#[derive(Debug, Clone, Default)]
struct FillState {
    /// Fills announced since the key got its first waiter.
    fills: u64,
    /// The key's channel is subscribed on the server: from now on a fill is
    /// announced, so a lookup made after this cannot miss one.
    ready: bool,
    /// The payload of the latest notice (empty when over the limit).
    last: Bytes,
}

/// Why a [`FillSubscription::wait`] returned.
#[derive(Debug)]
pub(crate) enum Woken {
    /// A fill was announced; its notice's payload (an encoded entry, or a
    /// wake-up to read it).
    Fill(Bytes),
    /// The subscription is in place (first wait), or the notification
    /// connection changed: look again.
    Changed,
    /// The bound ran out.
    TimedOut,
}

/// Local registry of waiters for fill notifications.
#[derive(Debug)]
pub(crate) struct Fills {
    /// A std `Mutex`: held only for a map operation, never across `.await`.
    waiting: Mutex<HashMap<CacheKey, watch::Sender<FillState>>>,
    /// Keys whose interest changed, for the subscriber task to reconcile.
    changes: mpsc::UnboundedSender<CacheKey>,
    pub(crate) connected: AtomicBool,
    pub(crate) started: AtomicBool,
    /// Channel name prefix, `{ns}:`.
    namespace: String,
    /// Payloads up to this long are kept for the waiters.
    payload_limit: usize,
}

impl Fills {
    pub(crate) fn new(
        namespace: &str,
        payload_limit: usize,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<CacheKey>) {
        let (changes, rx) = mpsc::unbounded_channel();
        let fills = Arc::new(Self {
            waiting: Mutex::new(HashMap::new()),
            changes,
            connected: AtomicBool::new(false),
            started: AtomicBool::new(false),
            namespace: namespace.to_owned(),
            payload_limit,
        });
        (fills, rx)
    }

    /// The sharded channel of `key`: same hash tag as its entry.
    pub(crate) fn channel(&self, key: &CacheKey) -> String {
        channel(&self.namespace, key)
    }

    pub(crate) fn subscribe(self: &Arc<Self>, key: CacheKey) -> FillSubscription {
        let mut map = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let mut added = false;
        let rx = map
            .entry(key)
            .or_insert_with(|| {
                added = true;
                watch::channel(FillState::default()).0
            })
            .subscribe();
        drop(map);
        if added {
            let _ = self.changes.send(key);
        }
        let seen = rx.borrow().fills;
        FillSubscription {
            seen,
            rx,
            key,
            fills: Arc::clone(self),
            armed: false,
        }
    }

    /// A notice on `channel`: wake its key's waiters with the payload.
    fn notify(&self, channel: &[u8], payload: Vec<u8>) {
        let Some(key) = key_of_channel(channel) else {
            return;
        };
        let last = if payload.len() <= self.payload_limit {
            Bytes::from(payload)
        } else {
            Bytes::new()
        };
        let map = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = map.get(&key) {
            tx.send_modify(|s| {
                s.fills += 1;
                s.last = last;
            });
        }
    }

    fn waiting_keys(&self) -> HashSet<CacheKey> {
        let map = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        map.keys().copied().collect()
    }

    fn set_ready(&self, key: &CacheKey, ready: bool) {
        let map = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = map.get(key) {
            tx.send_if_modified(|s| std::mem::replace(&mut s.ready, ready) != ready);
        }
    }

    fn set_all_unready(&self) {
        let map = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        for tx in map.values() {
            tx.send_if_modified(|s| std::mem::replace(&mut s.ready, false));
        }
    }
}

fn channel(namespace: &str, key: &CacheKey) -> String {
    format!("{namespace}:{{{}}}:fill", key.to_hex())
}

/// The key of a channel named by [`channel`].
fn key_of_channel(name: &[u8]) -> Option<CacheKey> {
    let open = name.iter().position(|&b| b == b'{')?;
    let close = open + name[open..].iter().position(|&b| b == b'}')?;
    CacheKey::from_hex(&name[open + 1..close])
}

/// Interest in the next fill of one key. Created before the re-check that
/// precedes a wait, so a fill published in between is not missed.
#[derive(Debug)]
pub(crate) struct FillSubscription {
    rx: watch::Receiver<FillState>,
    /// Fills announced before this waiter last looked.
    seen: u64,
    key: CacheKey,
    fills: Arc<Fills>,
    /// The first wait only waits for the subscription to be in place.
    armed: bool,
}

impl FillSubscription {
    /// Wait for a fill notification, at most `bound`.
    ///
    /// The first call returns as soon as the key's channel is subscribed
    /// (or a fill arrives): the caller then checks again, and that check
    /// happens after notifications flow, so no fill falls in between.
    pub(crate) async fn wait(&mut self, bound: Duration) -> Woken {
        let seen = self.seen;
        let woke = if !self.armed {
            self.armed = true;
            tokio::time::timeout(bound, self.rx.wait_for(|s| s.ready || s.fills != seen))
                .await
                .is_ok_and(|r| r.is_ok())
        } else {
            tokio::time::timeout(bound, self.rx.changed())
                .await
                .is_ok_and(|r| r.is_ok())
        };
        let state = self.rx.borrow_and_update();
        if state.fills != seen {
            self.seen = state.fills;
            return Woken::Fill(state.last.clone());
        }
        if woke {
            Woken::Changed
        } else {
            Woken::TimedOut
        }
    }
}

impl Drop for FillSubscription {
    fn drop(&mut self) {
        let mut map = self
            .fills
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Ours is the last receiver: nobody else waits for this key.
        if map
            .get(&self.key)
            .is_some_and(|tx| tx.receiver_count() <= 1)
        {
            map.remove(&self.key);
            drop(map);
            let _ = self.fills.changes.send(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key survives the trip through its channel name.
    #[test]
    fn channel_names_the_key() {
        let key = CacheKey::new("/a");
        let name = channel("ns", &key);
        assert!(name.starts_with("ns:{") && name.ends_with("}:fill"));
        assert_eq!(key_of_channel(name.as_bytes()), Some(key));
        assert_eq!(key_of_channel(b"ns:{zz}:fill"), None);
        assert_eq!(key_of_channel(b"no braces"), None);
    }
}
