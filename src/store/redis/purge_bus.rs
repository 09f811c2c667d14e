//! The purge bus: the one subscriber connection per store that hears purge
//! notices from every instance and hands each to the installed handler.
//! Deletes nothing in Redis; that is the purge's own work.
//!
//! A purge deletes the entries from Redis, then publishes a notice; every
//! instance (the sender too) applies it to its own memory. A fill running
//! there when the purge came does not need the notice: Redis refuses it
//! (group stamp, raised fence; see `purge.rs`).
//!
//! A notice sent while the listener is not subscribed is lost. So the
//! listener checks its connection (a PING every [`PING_EVERY`], answered
//! within the reply timeout) and, each time it subscribes again after a
//! loss, hands the handler [`MISSED`]: drop every copy of this process. A
//! copy stored before that may be one a lost notice named; one stored after
//! was read when notices flowed again. A connection that went silent (its
//! path blackholed after a failover) is found by the PING, not by the
//! kernel, which may wait many minutes.
//!
//! On Redis Cluster a `PUBLISH` reaches every node, so the listener may
//! subscribe on any of them: it tries the seed URLs in turn, moving on when
//! one fails or its connection is lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use deadpool_redis::redis;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::watch;

/// Applies a purge notice (raw payload) to this process.
pub(crate) type PurgeHandler = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// What the handler is given when notices may have been missed: drop every
/// copy of this process. Never taken from the channel, so nobody can send it.
pub(crate) const MISSED: &[u8] = b"*";

/// How often the listener checks its subscribed connection.
const PING_EVERY: Duration = Duration::from_secs(5);

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

/// Where and how the purge listener subscribes.
pub(super) struct Listener {
    /// One client per seed URL (one for a standalone Redis), tried in turn.
    pub(super) clients: Vec<redis::Client>,
    pub(super) channel: String,
    pub(super) connect_timeout: Duration,
    /// Bound on the reply to a liveness PING.
    pub(super) response_timeout: Duration,
}

/// The purge listener: one subscriber connection, reconnecting with back-off
/// (to the next seed, on a cluster), ending when the store is dropped.
pub(super) async fn listen(
    bus: Weak<PurgeBus>,
    listener: Listener,
    mut shutdown: watch::Receiver<bool>,
    renew: Arc<tokio::sync::Notify>,
) {
    let Listener {
        clients,
        channel,
        connect_timeout,
        response_timeout,
    } = listener;
    if clients.is_empty() {
        return;
    }
    let mut backoff = Duration::from_millis(100);
    let mut seed = 0;
    // Notices may have gone by unheard: not subscribed yet since a loss.
    let mut deaf = false;
    // Asked to move (see `renew`), the old subscription is kept until the
    // new one is in place, so the move loses nothing.
    let mut previous: Option<Subscribed> = None;
    loop {
        let mut renewed = false;
        let client = &clients[seed];
        let subscribed = subscribe(client, &channel, connect_timeout).await;
        if let Some((_, old)) = previous.take() {
            if subscribed.is_none() {
                deaf = true;
            }
            // What came on the old one while the new one subscribed.
            drain(old, &bus);
        }
        match subscribed {
            Some((mut sink, mut messages)) => {
                backoff = Duration::from_millis(100);
                if std::mem::take(&mut deaf) {
                    match bus.upgrade() {
                        Some(b) => b.apply(MISSED),
                        None => return,
                    }
                }
                let mut ping = tokio::time::interval(PING_EVERY);
                ping.reset();
                loop {
                    tokio::select! {
                        msg = messages.next() => match (msg, bus.upgrade()) {
                            (Some(m), Some(b)) => {
                                let payload = m.get_payload_bytes();
                                if payload != MISSED {
                                    b.apply(payload);
                                }
                            }
                            (Some(_), None) => return,
                            (None, _) => break,
                        },
                        _ = ping.tick() => {
                            let alive = tokio::time::timeout(
                                response_timeout,
                                sink.ping::<redis::Value>(),
                            )
                            .await;
                            if !matches!(alive, Ok(Ok(_))) {
                                break;
                            }
                        }
                        // The server was found demoted: reconnect, perhaps elsewhere.
                        _ = renew.notified() => {
                            renewed = true;
                            break;
                        }
                        _ = shutdown.changed() => return,
                    }
                }
                if renewed {
                    previous = Some((sink, messages));
                } else {
                    tracing::debug!("purge listener lost its connection; reconnecting");
                    deaf = true;
                }
            }
            None => {
                tracing::debug!("purge listener cannot subscribe; trying again");
                deaf = true;
            }
        }
        // Any node of a cluster carries the notices: the next one may be up.
        seed = (seed + 1) % clients.len();
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

/// A subscribed connection: the sink (for PING) and the messages.
type Subscribed = (redis::aio::PubSubSink, redis::aio::PubSubStream);

/// Apply the messages `old` received so far, then close it.
fn drain(mut old: redis::aio::PubSubStream, bus: &Weak<PurgeBus>) {
    let Some(b) = bus.upgrade() else { return };
    while let Some(Some(m)) = old.next().now_or_never() {
        let payload = m.get_payload_bytes();
        if payload != MISSED {
            b.apply(payload);
        }
    }
}

/// A connection subscribed to `channel`, both steps bounded.
async fn subscribe(
    client: &redis::Client,
    channel: &str,
    connect_timeout: Duration,
) -> Option<Subscribed> {
    let pubsub = tokio::time::timeout(connect_timeout, client.get_async_pubsub())
        .await
        .ok()?
        .ok()?;
    let (mut sink, stream) = pubsub.split();
    tokio::time::timeout(connect_timeout, sink.subscribe(channel))
        .await
        .ok()?
        .ok()?;
    Some((sink, stream))
}
