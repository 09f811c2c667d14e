//! Fill notifications over sharded pub/sub (Redis 7: SPUBLISH / SSUBSCRIBE):
//! the waiters' registry and its one subscriber connection. Publishes nothing
//! (the fenced write does) and reads no entry.
//!
//! A notice's payload is the stored entry itself (its encoding, checksummed
//! as stored) when it is at most [`RedisOptions::notice_entry_limit`], else a
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

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use deadpool_redis::redis::{
    self, aio::MultiplexedConnection, cluster_async::ClusterConnection, AsyncConnectionConfig,
    PushInfo, PushKind,
};
use futures_util::future::join_all;
use tokio::sync::{mpsc, watch};

use super::options::RedisOptions;
use super::sentinel::SentinelMaster;
use crate::key::CacheKey;

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

/// Where the subscriber connects.
#[derive(Debug)]
pub(crate) enum FillSource {
    /// A standalone Redis; the client speaks RESP3.
    Standalone(Box<redis::Client>),
    /// A cluster; a RESP3 client is built per connect, with its push channel.
    Cluster(Box<RedisOptions>),
    /// The primary the sentinels name at each connect, over RESP3.
    Sentinel(Arc<SentinelMaster>),
}

#[derive(Clone)]
enum Subscriber {
    Standalone(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Subscriber {
    async fn connect(
        source: &FillSource,
        connect_timeout: Duration,
        response_timeout: Duration,
        push: mpsc::UnboundedSender<PushInfo>,
    ) -> redis::RedisResult<Self> {
        let config = || {
            AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(response_timeout))
        };
        match source {
            FillSource::Standalone(client) => {
                let config = config().set_push_sender(push);
                let conn = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(Self::Standalone(conn))
            }
            FillSource::Sentinel(master) => {
                let config = config().set_push_sender(push);
                let (_, conn) = master
                    .connect(&config, true)
                    .await
                    .map_err(|why| std::io::Error::other(why.to_string()))?;
                Ok(Self::Standalone(conn))
            }
            FillSource::Cluster(options) => {
                let client = super::cluster::client(options, Some(push)).map_err(|e| {
                    redis::RedisError::from((
                        redis::ErrorKind::InvalidClientConfig,
                        "cluster client",
                        e.to_string(),
                    ))
                })?;
                Ok(Self::Cluster(client.get_async_connection().await?))
            }
        }
    }

    async fn ssubscribe(mut self, channel: String) -> redis::RedisResult<()> {
        match &mut self {
            Self::Standalone(c) => redis::cmd("SSUBSCRIBE")
                .arg(channel)
                .exec_async(c)
                .await
                .map(drop),
            Self::Cluster(c) => c.ssubscribe(channel).await,
        }
    }

    async fn sunsubscribe(mut self, channel: String) -> redis::RedisResult<()> {
        match &mut self {
            Self::Standalone(c) => redis::cmd("SUNSUBSCRIBE")
                .arg(channel)
                .exec_async(c)
                .await
                .map(drop),
            Self::Cluster(c) => c.sunsubscribe(channel).await,
        }
    }

    /// A liveness check for a standalone connection, which may hang without
    /// ever reporting a disconnection (a frozen server). A cluster
    /// connection watches its nodes itself.
    async fn ping(&mut self) -> bool {
        match self {
            Self::Standalone(c) => redis::cmd("PING").exec_async(c).await.is_ok(),
            Self::Cluster(_) => true,
        }
    }
}

/// How often an idle standalone subscriber checks its connection.
const PING_EVERY: Duration = Duration::from_secs(5);

/// One subscriber connection per store: reconnects with back-off, exits when
/// the store is dropped.
pub(crate) async fn run_subscriber(
    fills: Weak<Fills>,
    source: FillSource,
    changes: mpsc::UnboundedReceiver<CacheKey>,
    connect_timeout: Duration,
    response_timeout: Duration,
    shutdown: watch::Receiver<bool>,
    renew: Arc<tokio::sync::Notify>,
) {
    let mut listener = Listener {
        fills,
        changes,
        response_timeout,
        shutdown,
        renew,
    };
    let mut backoff = Duration::from_millis(100);
    loop {
        let (push_tx, pushes) = mpsc::unbounded_channel();
        let connected = tokio::time::timeout(
            connect_timeout,
            Subscriber::connect(&source, connect_timeout, response_timeout, push_tx),
        )
        .await;
        if let Ok(Ok(conn)) = connected {
            let ended = listener.serve(conn, pushes, &mut backoff).await;
            if matches!(ended, Ended::Stop) {
                return;
            }
            match listener.fills.upgrade() {
                Some(f) => {
                    f.connected.store(false, Ordering::SeqCst);
                    f.set_all_unready();
                }
                None => return,
            }
            tracing::debug!("fill notification connection lost; reconnecting");
            if matches!(ended, Ended::Renewed) {
                // Asked to move, not failed: reconnect at once.
                continue;
            }
        }
        if listener.fills.strong_count() == 0 {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            // Redis moved (a new primary): try it now.
            _ = listener.renew.notified() => {}
            _ = listener.shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// What the subscriber task keeps across its connections.
struct Listener {
    fills: Weak<Fills>,
    /// Keys whose waiting changed: subscribe or unsubscribe their channels.
    changes: mpsc::UnboundedReceiver<CacheKey>,
    response_timeout: Duration,
    shutdown: watch::Receiver<bool>,
    /// The data connections found the server demoted.
    renew: Arc<tokio::sync::Notify>,
}

/// How one connection's service ended.
enum Ended {
    /// The connection failed: reconnect after the back-off.
    Lost,
    /// Asked to reconnect (a failover behind one name): at once.
    Renewed,
    /// The layer is gone or shutting down.
    Stop,
}

impl Listener {
    /// Keep the subscriptions of the keys waited on in step on `conn`, and
    /// hand every notification to the fills, until the connection ends.
    async fn serve(
        &mut self,
        mut conn: Subscriber,
        mut pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
        backoff: &mut Duration,
    ) -> Ended {
        let Some(f) = self.fills.upgrade() else {
            return Ended::Stop;
        };
        f.connected.store(true, Ordering::SeqCst);
        // Whatever was subscribed before is gone with the old connection.
        let mut subscribed = HashSet::new();
        let mut dirty = f.waiting_keys();
        drop(f);
        let mut ping = tokio::time::interval(PING_EVERY);
        ping.reset();
        loop {
            if !dirty.is_empty() {
                let Some(f) = self.fills.upgrade() else {
                    return Ended::Stop;
                };
                let keys = std::mem::take(&mut dirty);
                if !reconcile(&f, &conn, &mut subscribed, keys, self.response_timeout).await {
                    return Ended::Lost;
                }
                *backoff = Duration::from_millis(100);
            }
            tokio::select! {
                change = self.changes.recv() => match change {
                    Some(key) => {
                        dirty.insert(key);
                        while let Ok(key) = self.changes.try_recv() {
                            dirty.insert(key);
                        }
                    }
                    None => return Ended::Stop,
                },
                push = pushes.recv() => match push {
                    Some(p) => {
                        if !self.on_push(p, &conn, &mut subscribed, &mut dirty) {
                            return Ended::Lost;
                        }
                    }
                    None => return Ended::Lost,
                },
                _ = ping.tick() => {
                    let alive = tokio::time::timeout(self.response_timeout, conn.ping()).await;
                    if !matches!(alive, Ok(true)) {
                        return Ended::Lost;
                    }
                }
                // The data connections found the server demoted: this
                // connection may lead to it too (a failover behind one name).
                _ = self.renew.notified() => return Ended::Renewed,
                _ = self.shutdown.changed() => return Ended::Stop,
            }
        }
    }

    /// One push from the server; whether the connection is still usable.
    fn on_push(
        &self,
        p: redis::PushInfo,
        conn: &Subscriber,
        subscribed: &mut HashSet<CacheKey>,
        dirty: &mut HashSet<CacheKey>,
    ) -> bool {
        match p.kind {
            PushKind::SMessage | PushKind::Message => {
                if let (Some(msg), Some(f)) = (redis::Msg::from_push_info(p), self.fills.upgrade())
                {
                    f.notify(
                        msg.get_channel_name().as_bytes(),
                        msg.get_payload_bytes().to_vec(),
                    );
                }
            }
            // The server dropped a subscription we did not
            // give up (its slot moved): subscribe again.
            PushKind::SUnsubscribe => {
                if let Some(key) = p
                    .data
                    .first()
                    .and_then(channel_bytes)
                    .and_then(key_of_channel)
                {
                    subscribed.remove(&key);
                    dirty.insert(key);
                }
            }
            PushKind::Disconnection if matches!(conn, Subscriber::Standalone(_)) => return false,
            _ => {}
        }
        true
    }
}

fn channel_bytes(v: &redis::Value) -> Option<&[u8]> {
    match v {
        redis::Value::BulkString(b) => Some(b),
        redis::Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// Bring the server's subscriptions in line with the waiting keys among
/// `keys`. Returns false when the connection looks unusable.
async fn reconcile(
    fills: &Fills,
    conn: &Subscriber,
    subscribed: &mut HashSet<CacheKey>,
    keys: HashSet<CacheKey>,
    response_timeout: Duration,
) -> bool {
    let (mut add, mut remove) = (Vec::new(), Vec::new());
    {
        let map = fills.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        for key in keys {
            match (map.contains_key(&key), subscribed.contains(&key)) {
                (true, false) => add.push(key),
                (false, true) => remove.push(key),
                (true, true) => {
                    if let Some(tx) = map.get(&key) {
                        tx.send_if_modified(|s| !std::mem::replace(&mut s.ready, true));
                    }
                }
                (false, false) => {}
            }
        }
    }
    let (added, removed) = futures_util::future::join(
        join_all(
            add.iter()
                .map(|k| bounded(response_timeout, conn.clone().ssubscribe(fills.channel(k)))),
        ),
        join_all(remove.iter().map(|k| {
            bounded(
                response_timeout,
                conn.clone().sunsubscribe(fills.channel(k)),
            )
        })),
    )
    .await;
    let mut healthy = true;
    for (key, ok) in add.iter().zip(added) {
        if ok {
            subscribed.insert(*key);
            fills.set_ready(key, true);
        } else {
            healthy = false;
        }
    }
    for (key, ok) in remove.iter().zip(removed) {
        // Even on failure: a stray subscription only delivers a message
        // nobody waits for, and the next waiter subscribes again.
        subscribed.remove(key);
        healthy &= ok;
    }
    if !healthy {
        tracing::debug!("fill notification subscribe failed; reconnecting");
    }
    healthy
}

async fn bounded(
    limit: Duration,
    call: impl std::future::Future<Output = redis::RedisResult<()>>,
) -> bool {
    matches!(tokio::time::timeout(limit, call).await, Ok(Ok(())))
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
