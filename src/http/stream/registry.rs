//! The registry: the running streams of one layer, by flight key, that
//! waiters attach to, and the writer's guard that ends a body early.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use http::StatusCode;
use tokio::sync::watch;

use super::window::SharedBody;
use crate::http::response::CachedResponse;
use crate::key::CacheKey;
use crate::store::memory::Stored;

/// Registration channels, by the key's first byte (keys are hashes).
const SHARDS: usize = 64;

/// A fill whose response head has arrived and whose body is streaming:
/// what a waiter needs to answer from it.
#[derive(Debug)]
pub(crate) struct Stream {
    /// Status, headers, Vary values and rules of the response, with an
    /// empty body: checked against each waiter like a stored entry.
    pub(crate) head: Arc<Stored<CachedResponse>>,
    pub(crate) body: Arc<SharedBody>,
}

impl Stream {
    pub(crate) fn status(&self) -> StatusCode {
        self.head.value.status
    }
}

/// The running streams of one layer, by flight key.
#[derive(Debug)]
pub(crate) struct Streams {
    map: Mutex<HashMap<CacheKey, (u64, Arc<Stream>)>>,
    /// Bumped on every registration so waiters re-check the map, one
    /// channel per [`shard`](Self::shard) of keys: a registration wakes the
    /// waiters of its own key and of the few others in its shard (who look
    /// once and sleep again), not every waiting request of every key.
    registered: [watch::Sender<u64>; SHARDS],
    next_id: AtomicU64,
}

impl Streams {
    pub(crate) fn new() -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            registered: std::array::from_fn(|_| watch::Sender::new(0)),
            next_id: AtomicU64::new(1),
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<CacheKey, (u64, Arc<Stream>)>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Offer `stream` to the waiters of the flight for `key` until the
    /// returned guard is dropped (when the fill ends).
    pub(crate) fn register(self: &Arc<Self>, key: CacheKey, stream: Arc<Stream>) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.map().insert(key, (id, stream));
        self.registered[Self::shard(&key)].send_modify(|n| *n = n.wrapping_add(1));
        Registration {
            streams: Arc::clone(self),
            key,
            id,
        }
    }

    /// Wait until a stream for `key` that `usable` accepts is registered.
    /// Never resolves otherwise: the caller selects it against the flight.
    /// (An async block: it uses its captures in place, where an async fn's
    /// arguments take room twice in every waiting request's future.)
    #[allow(
        clippy::manual_async_fn,
        reason = "an async block uses its captures in place; an async fn's arguments take room twice in the future"
    )]
    pub(crate) fn wait<'a>(
        &'a self,
        key: CacheKey,
        usable: impl Fn(&Stream) -> bool + 'a,
    ) -> impl Future<Output = Arc<Stream>> + 'a {
        async move {
            let mut rx = self.registered[Self::shard(&key)].subscribe();
            loop {
                if let Some(s) = self.usable(&key, &usable) {
                    return s;
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// The stream registered for `key`, if `usable` accepts it.
    fn usable(&self, key: &CacheKey, usable: impl Fn(&Stream) -> bool) -> Option<Arc<Stream>> {
        let found = self.map().get(key).map(|(_, s)| Arc::clone(s));
        found.filter(|s| usable(s))
    }

    /// Which registration channel `key`'s waiters listen on.
    pub(super) fn shard(key: &CacheKey) -> usize {
        usize::from(key.as_bytes()[0]) % SHARDS
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.map().len()
    }
}

/// Keeps a stream offered; dropping it withdraws the offer (only its own).
#[derive(Debug)]
pub(crate) struct Registration {
    streams: Arc<Streams>,
    key: CacheKey,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut map = self.streams.map();
        if map.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            map.remove(&self.key);
        }
    }
}

/// The writer's side: ends the body with an error if the fill stops before
/// finishing it (origin error, origin timeout, panic, abort).
#[derive(Debug)]
pub(crate) struct Writer {
    pub(crate) body: Arc<SharedBody>,
    /// Withdrawn together with the writer.
    pub(crate) _offer: Option<Registration>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.body.fail("origin body ended early");
    }
}
