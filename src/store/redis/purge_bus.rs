//! The purge bus: the one subscriber connection per store that hears purge
//! notices from every instance and hands each to the installed handler.
//! Deletes nothing in Redis; that is the purge's own work.
//!
//! A purge deletes the entries from Redis, then publishes a notice; every
//! instance (the sender too) applies it to its own memory. An instance that
//! misses the notice (its listener was reconnecting) answers fresh from its
//! copy for at most the L1 lifetime (1 s by default): that is the bound on
//! the delay. A stale answer from the copy starts a refresh, which finds the
//! entry gone in Redis and replaces the copy. A fill running there when the
//! purge came does not need the notice: Redis refuses it (group stamp,
//! raised fence; see `purge.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use deadpool_redis::redis;
use futures_util::StreamExt;
use tokio::sync::watch;

/// Applies a purge notice (raw payload) to this process.
pub(crate) type PurgeHandler = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// The listening side, shared with its background task.
#[derive(Default)]
pub(crate) struct PurgeBus {
    /// A std `Mutex`: only cloned out or replaced, never held across `.await`.
    handler: Mutex<Option<PurgeHandler>>,
    pub(super) started: AtomicBool,
}

impl std::fmt::Debug for PurgeBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PurgeBus")
            .field("started", &self.started.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl PurgeBus {
    pub(crate) fn set_handler(&self, handler: PurgeHandler) {
        *self.handler.lock().unwrap_or_else(PoisonError::into_inner) = Some(handler);
    }

    fn apply(&self, payload: &[u8]) {
        let handler = self
            .handler
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(h) = handler {
            h(payload);
        }
    }
}

/// The purge listener: one subscriber connection, reconnecting with back-off,
/// ending when the store is dropped.
pub(super) async fn listen(
    bus: Weak<PurgeBus>,
    client: redis::Client,
    channel: String,
    connect_timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
    renew: Arc<tokio::sync::Notify>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut renewed = false;
        if let Ok(Ok(mut pubsub)) =
            tokio::time::timeout(connect_timeout, client.get_async_pubsub()).await
        {
            if let Ok(Ok(())) =
                tokio::time::timeout(connect_timeout, pubsub.subscribe(&channel)).await
            {
                backoff = Duration::from_millis(100);
                let mut messages = pubsub.into_on_message();
                loop {
                    tokio::select! {
                        msg = messages.next() => match (msg, bus.upgrade()) {
                            (Some(m), Some(b)) => b.apply(m.get_payload_bytes()),
                            (Some(_), None) => return,
                            (None, _) => break,
                        },
                        // The server was found demoted: reconnect, perhaps elsewhere.
                        _ = renew.notified() => {
                            renewed = true;
                            break;
                        }
                        _ = shutdown.changed() => return,
                    }
                }
            }
        }
        if bus.strong_count() == 0 {
            return;
        }
        if renewed {
            // Asked to move, not failed: reconnect at once.
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
