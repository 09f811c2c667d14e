//! The fill notifications' one subscriber connection per store: connects
//! (standalone, cluster or the Sentinel primary, over RESP3), keeps its
//! sharded subscriptions in step with the keys waited on, and hands every
//! notice to the registry in `mod.rs`. Reconnects with back-off.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use deadpool_redis::redis::{
    self, aio::MultiplexedConnection, cluster_async::ClusterConnection, AsyncConnectionConfig,
    PushInfo, PushKind,
};
use futures_util::future::join_all;
use tokio::sync::{mpsc, watch};

use super::super::options::RedisOptions;
use super::super::sentinel::SentinelMaster;
use super::{key_of_channel, Fills};
use crate::key::CacheKey;

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
                let client = super::super::cluster::client(options, Some(push)).map_err(|e| {
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
