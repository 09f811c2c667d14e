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
//!
//! Acknowledged purges: a notice is framed with an id (`@<16 hex>|notice`).
//! Each listener applies it, then publishes the id on the ack channel
//! (`{channel}:ack`, which every listener also hears). The purging instance
//! counts the acks for its id until it has one per receiver `PUBLISH`
//! reported, within a bound: then every listening instance has dropped its
//! copies before the purge answers. On a cluster `PUBLISH` counts only the
//! receivers on the node it ran on, so there the count is a lower bound.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use deadpool_redis::redis;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::{watch, Notify};

use super::sentinel::SentinelMaster;

/// Applies a purge notice (raw payload) to this process.
pub(crate) type PurgeHandler = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// What the handler is given when notices may have been missed: drop every
/// copy of this process. Never taken from the channel, so nobody can send it.
pub(crate) use crate::store::notice::MISSED;

/// How often the listener checks its subscribed connection.
const PING_EVERY: Duration = Duration::from_secs(5);

/// The listening side, shared with its background task.
#[derive(Default)]
pub(crate) struct PurgeBus {
    /// A std `Mutex`: only cloned out or replaced, never held across `.await`.
    handler: Mutex<Option<PurgeHandler>>,
    pub(super) started: AtomicBool,
    /// This process's purges waiting for acknowledgements, by id. Entries
    /// live only while their purge waits (bounded), so the map holds at most
    /// the purges running now. A std `Mutex`, never held across `.await`.
    pending: Mutex<HashMap<u64, Arc<Acks>>>,
}

/// The acknowledgements one purge has received.
#[derive(Debug, Default)]
pub(crate) struct Acks {
    count: AtomicUsize,
    arrived: Notify,
}

impl Acks {
    /// Wait until `want` acks arrived, at most `bound`: whether they did.
    pub(crate) async fn wait(&self, want: usize, bound: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let arrived = self.arrived.notified();
            if self.count.load(Ordering::Acquire) >= want {
                return true;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return self.count.load(Ordering::Acquire) >= want;
            }
        }
    }
}

/// A notice framed with the id its acks carry: `@<16 hex>|payload`.
pub(crate) fn frame(id: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = format!("@{id:016x}|").into_bytes();
    out.extend_from_slice(payload);
    out
}

/// The id and the notice of a framed payload; an unframed one (an older
/// instance's) has no id.
fn unframe(payload: &[u8]) -> (Option<u64>, &[u8]) {
    match payload {
        [b'@', rest @ ..] if rest.len() >= 17 && rest[16] == b'|' => {
            match std::str::from_utf8(&rest[..16])
                .ok()
                .and_then(|h| u64::from_str_radix(h, 16).ok())
            {
                Some(id) => (Some(id), &rest[17..]),
                None => (None, payload),
            }
        }
        _ => (None, payload),
    }
}

/// The ack channel of a purge channel.
pub(crate) fn ack_channel(channel: &str) -> String {
    format!("{channel}:ack")
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

    /// Start counting the acks for purge `id` (until [`forget`](Self::forget)).
    pub(crate) fn expect_acks(&self, id: u64) -> Arc<Acks> {
        let acks = Arc::new(Acks::default());
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Arc::clone(&acks));
        acks
    }

    pub(crate) fn forget(&self, id: u64) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// An ack heard on the ack channel (any instance's, for any purge).
    fn acked(&self, payload: &[u8]) {
        let Some(id) = std::str::from_utf8(payload)
            .ok()
            .and_then(|h| u64::from_str_radix(h, 16).ok())
        else {
            return;
        };
        let acks = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .cloned();
        if let Some(a) = acks {
            a.count.fetch_add(1, Ordering::AcqRel);
            a.arrived.notify_waiters();
        }
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

/// Where the purge listener subscribes.
pub(super) enum Subscribe {
    /// One client per seed URL (one for a standalone Redis), tried in turn.
    To(Vec<redis::Client>),
    /// The primary the sentinels name at each (re)subscribe.
    Primary(Arc<SentinelMaster>),
}

impl Subscribe {
    /// The client of attempt `seed`; `None` when no primary is known.
    async fn client(&self, seed: usize) -> Option<redis::Client> {
        match self {
            Subscribe::To(clients) => clients.get(seed % clients.len().max(1)).cloned(),
            Subscribe::Primary(master) => master.client().await.ok(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Subscribe::To(clients) => clients.len(),
            Subscribe::Primary(_) => 1,
        }
    }
}

/// Where and how the purge listener subscribes.
pub(super) struct Listener {
    pub(super) source: Subscribe,
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
        source,
        channel,
        connect_timeout,
        response_timeout,
    } = listener;
    if source.len() == 0 {
        return;
    }
    let acks = ack_channel(&channel);
    let mut backoff = Duration::from_millis(100);
    let mut seed = 0;
    // Notices may have gone by unheard: not subscribed yet since a loss.
    let mut deaf = false;
    // Asked to move (see `renew`), the old subscription is kept until the
    // new one is in place, so the move loses nothing.
    let mut previous: Option<Subscribed> = None;
    loop {
        let mut renewed = false;
        let subscribed = subscribe_via(&source, seed, [&channel, &acks], connect_timeout).await;
        if let Some((_, old)) = previous.take() {
            if subscribed.is_none() {
                deaf = true;
            }
            // What came on the old one while the new one subscribed.
            drain(old, &bus, &acks);
        }
        match subscribed {
            Some((client, (mut sink, mut messages))) => {
                backoff = Duration::from_millis(100);
                if std::mem::take(&mut deaf) {
                    match bus.upgrade() {
                        Some(b) => b.apply(MISSED),
                        None => return,
                    }
                }
                let link = (&client, acks.as_str(), (connect_timeout, response_timeout));
                match serve(&bus, &mut sink, &mut messages, link, &renew, &mut shutdown).await {
                    Served::Ended => return,
                    Served::Lost => {}
                    Served::Renew => renewed = true,
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
        seed = (seed + 1) % source.len();
        if bus.strong_count() == 0 {
            return;
        }
        if renewed {
            // Asked to move, not failed: reconnect at once.
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            // Redis moved (a new primary): try it now.
            _ = renew.notified() => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Why [`serve`] returned.
enum Served {
    /// The store is gone or shutting down: stop listening.
    Ended,
    /// The connection closed or did not answer its PING.
    Lost,
    /// Asked to move (the server was found demoted).
    Renew,
}

/// Hear notices and acks on one subscribed connection, acknowledging each
/// notice applied and PINGing it every [`PING_EVERY`], until it is lost,
/// a move is asked for, or the listener must end. `link`: the client (for
/// the ack connection), the ack channel, and the connect and reply bounds.
async fn serve(
    bus: &Weak<PurgeBus>,
    sink: &mut redis::aio::PubSubSink,
    messages: &mut redis::aio::PubSubStream,
    (client, acks, timeouts): (&redis::Client, &str, (Duration, Duration)),
    renew: &Notify,
    shutdown: &mut watch::Receiver<bool>,
) -> Served {
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.reset();
    let mut acker: Option<redis::aio::MultiplexedConnection> = None;
    loop {
        tokio::select! {
            msg = messages.next() => match (msg, bus.upgrade()) {
                (Some(m), Some(b)) => {
                    if let Some(id) = handle(&b, &m, acks) {
                        drop(b);
                        ack(client, &mut acker, acks, id, timeouts).await;
                    }
                }
                (Some(_), None) => return Served::Ended,
                (None, _) => return Served::Lost,
            },
            _ = ping.tick() => {
                let alive = tokio::time::timeout(timeouts.1, sink.ping::<redis::Value>()).await;
                if !matches!(alive, Ok(Ok(_))) {
                    return Served::Lost;
                }
            }
            // The server was found demoted: reconnect, perhaps elsewhere.
            _ = renew.notified() => return Served::Renew,
            _ = shutdown.changed() => return Served::Ended,
        }
    }
}

/// A subscribed connection: the sink (for PING) and the messages.
type Subscribed = (redis::aio::PubSubSink, redis::aio::PubSubStream);

/// Apply one message: a notice (whose id is returned, to acknowledge once
/// applied) or an ack for a purge of this process.
fn handle(bus: &PurgeBus, m: &redis::Msg, ack_channel: &str) -> Option<u64> {
    let payload = m.get_payload_bytes();
    if m.get_channel_name() == ack_channel {
        bus.acked(payload);
        return None;
    }
    let (id, notice) = unframe(payload);
    if notice != MISSED {
        bus.apply(notice);
    }
    id
}

/// Acknowledge notice `id` on the ack channel, on a connection of its own
/// (kept; dropped when a publish fails), every step bounded. A lost ack
/// only makes the purging instance wait out its bound.
async fn ack(
    client: &redis::Client,
    conn: &mut Option<redis::aio::MultiplexedConnection>,
    channel: &str,
    id: u64,
    (connect_timeout, response_timeout): (Duration, Duration),
) {
    if conn.is_none() {
        let made =
            tokio::time::timeout(connect_timeout, client.get_multiplexed_async_connection()).await;
        *conn = made.ok().and_then(Result::ok);
    }
    let Some(c) = conn.as_mut() else { return };
    let mut cmd = redis::cmd("PUBLISH");
    cmd.arg(channel).arg(format!("{id:016x}"));
    let sent = tokio::time::timeout(response_timeout, cmd.query_async::<i64>(c)).await;
    if !matches!(sent, Ok(Ok(_))) {
        *conn = None;
    }
}

/// Apply the messages `old` received so far, then close it. Notices taken
/// here are not acknowledged (a move is rare; their purges wait out the
/// bound).
fn drain(mut old: redis::aio::PubSubStream, bus: &Weak<PurgeBus>, ack_channel: &str) {
    let Some(b) = bus.upgrade() else { return };
    while let Some(Some(m)) = old.next().now_or_never() {
        handle(&b, &m, ack_channel);
    }
}

/// The client of attempt `seed` (the primary's, behind Sentinel) and a
/// connection through it subscribed to `channels`, every step bounded.
async fn subscribe_via(
    source: &Subscribe,
    seed: usize,
    channels: [&str; 2],
    connect_timeout: Duration,
) -> Option<(redis::Client, Subscribed)> {
    let client = tokio::time::timeout(connect_timeout * 2, source.client(seed))
        .await
        .ok()??;
    let subscribed = subscribe(&client, channels, connect_timeout).await?;
    Some((client, subscribed))
}

/// A connection subscribed to `channels`, both steps bounded.
async fn subscribe(
    client: &redis::Client,
    channels: [&str; 2],
    connect_timeout: Duration,
) -> Option<Subscribed> {
    let pubsub = tokio::time::timeout(connect_timeout, client.get_async_pubsub())
        .await
        .ok()?
        .ok()?;
    let (mut sink, stream) = pubsub.split();
    tokio::time::timeout(connect_timeout, sink.subscribe(&channels[..]))
        .await
        .ok()?
        .ok()?;
    Some((sink, stream))
}
