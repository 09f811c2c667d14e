//! Redis Sentinel: which server is the primary now, asked of the sentinels
//! on every connect, and the `+switch-master` watch that moves every
//! connection when they promote another. Sends no cache command.
//!
//! A connect asks the sentinels in turn (`SENTINEL GET-MASTER-ADDR-BY-NAME`)
//! and checks the server named with `INFO replication` on the connection it
//! will use: a sentinel that has not heard of a failover yet names the old
//! primary, which is down or (back as a replica) says `role:slave`, and the
//! next sentinel is asked. So nothing is written to a server that is not the
//! primary, and while no primary is known every connect fails and the store
//! fails open through its breaker.
//!
//! The watch subscribes to `+switch-master` on every sentinel. A switch of
//! this master bumps [`SentinelMaster::switches`]: the data connections are
//! replaced on their next use and the subscribers (fills, purges) are told to
//! reconnect at once. `READONLY` or a broken connection, seen first, move
//! them as well (see `connection.rs`); the watch only makes it quicker.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use deadpool_redis::redis::{
    self, aio::MultiplexedConnection, AsyncConnectionConfig, IntoConnectionInfo,
};
use futures_util::StreamExt;
use tokio::sync::{watch, Notify};

use super::error::{describe, redact_error};
use super::options::{redact, RedisOptions};
use super::tls;
use crate::error::BuildError;

/// How often the watch checks a sentinel connection that has been quiet.
const PING_EVERY: Duration = Duration::from_secs(5);

/// The primary of one monitored master, as the sentinels say.
pub(crate) struct SentinelMaster {
    master_name: String,
    /// One client per sentinel, with its TLS settings and credentials.
    sentinels: Vec<redis::Client>,
    /// The data nodes' URL: scheme, credentials and database; host and port
    /// are replaced by the primary's.
    node_url: String,
    #[cfg(feature = "tls")]
    root_cert: Option<Arc<[u8]>>,
    connect_timeout: Duration,
    response_timeout: Duration,
    /// The sentinel that named the primary last: asked first next time.
    preferred: AtomicUsize,
    /// `+switch-master` announcements of this master heard so far.
    switches: AtomicU64,
    /// The address of the last switch heard, so the same switch announced by
    /// every sentinel counts once. A std `Mutex`, never held across `.await`.
    last_switch: Mutex<Option<String>>,
}

impl std::fmt::Debug for SentinelMaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelMaster")
            .field("master_name", &self.master_name)
            .field("sentinels", &self.sentinels.len())
            .finish_non_exhaustive()
    }
}

impl SentinelMaster {
    /// The sentinels of `options`; `master_name` is what they monitor.
    pub(crate) fn new(options: &RedisOptions, master_name: &str) -> Result<Self, BuildError> {
        #[cfg(feature = "tls")]
        let root_cert = options.tls_root_cert.clone();
        #[cfg(not(feature = "tls"))]
        let root_cert: Option<std::sync::Arc<[u8]>> = None;
        let sentinels = options
            .urls
            .iter()
            .map(|url| {
                url.as_str()
                    .into_connection_info()
                    .and_then(|info| tls::client(info, root_cert.as_deref()))
                    .map_err(|e| {
                        BuildError::redis(
                            format!("invalid sentinel url {}", redact(url)),
                            redact_error(&e),
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let master = Self {
            master_name: master_name.to_owned(),
            sentinels,
            node_url: options.node_url.clone(),
            #[cfg(feature = "tls")]
            root_cert,
            connect_timeout: options.connect_timeout,
            response_timeout: options.response_timeout,
            preferred: AtomicUsize::new(0),
            switches: AtomicU64::new(0),
            last_switch: Mutex::new(None),
        };
        // A node URL that cannot name a node is refused now, not per connect.
        master.node_client("127.0.0.1", 6379, false).map_err(|e| {
            BuildError::redis(
                format!("invalid sentinel node url {}", redact(&master.node_url)),
                redact_error(&e),
            )
        })?;
        Ok(master)
    }

    /// `+switch-master` announcements of this master so far.
    pub(crate) fn switches(&self) -> u64 {
        self.switches.load(Ordering::Acquire)
    }

    /// A client for the data node at `host:port`, as the node URL says.
    fn node_client(&self, host: &str, port: u16, resp3: bool) -> redis::RedisResult<redis::Client> {
        let invalid = || {
            redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "invalid sentinel node url",
            ))
        };
        let mut url = redis::parse_redis_url(&self.node_url).ok_or_else(invalid)?;
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        url.set_host(Some(&host)).map_err(|_| invalid())?;
        url.set_port(Some(port)).map_err(|()| invalid())?;
        let mut info = url.as_str().into_connection_info()?;
        if resp3 {
            let settings = info
                .redis_settings()
                .clone()
                .set_protocol(redis::ProtocolVersion::RESP3);
            info = info.set_redis_settings(settings);
        }
        #[cfg(feature = "tls")]
        let root_cert = self.root_cert.as_deref();
        #[cfg(not(feature = "tls"))]
        let root_cert = None;
        tls::client(info, root_cert)
    }

    /// The primary's address as sentinel `i` names it, bounded.
    async fn ask(&self, i: usize) -> Result<(String, u16), String> {
        let client = &self.sentinels[i];
        let conn = tokio::time::timeout(
            self.connect_timeout,
            client.get_multiplexed_async_connection(),
        )
        .await;
        let mut conn = match conn {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(format!("sentinel {i}: {}", describe(&e))),
            Err(_) => return Err(format!("sentinel {i}: connect timed out")),
        };
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(&self.master_name);
        let reply = tokio::time::timeout(self.response_timeout, cmd.query_async(&mut conn)).await;
        match reply {
            Ok(Ok(Some(addr))) => Ok(addr),
            Ok(Ok(None)) => Err(format!("sentinel {i} knows no master of that name")),
            Ok(Err(e)) => Err(format!("sentinel {i}: {}", describe(&e))),
            Err(_) => Err(format!("sentinel {i}: no reply in time")),
        }
    }

    /// A connection to the primary, made with `config` (RESP3 if `resp3`):
    /// each sentinel in turn names one, and the first named server that says
    /// it is a master on that very connection is it. Every step is bounded;
    /// the caller bounds the whole.
    pub(crate) async fn connect(
        &self,
        config: &AsyncConnectionConfig,
        resp3: bool,
    ) -> Result<(redis::Client, MultiplexedConnection), Arc<str>> {
        let n = self.sentinels.len();
        let first = self.preferred.load(Ordering::Relaxed);
        let mut why = String::from("no sentinel configured");
        // Sentinels that agree name one node: it is tried once.
        let mut tried: Vec<(String, u16)> = Vec::new();
        for i in (0..n).map(|k| (first + k) % n) {
            let (host, port) = match self.ask(i).await {
                Ok(addr) if !tried.contains(&addr) => addr,
                Ok(_) => continue,
                Err(e) => {
                    why = e;
                    continue;
                }
            };
            tried.push((host.clone(), port));
            let client = self
                .node_client(&host, port, resp3)
                .map_err(|e| describe(&e))?;
            let made = tokio::time::timeout(
                self.connect_timeout,
                client.get_multiplexed_async_connection_with_config(config),
            )
            .await;
            let mut conn = match made {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    why = format!(
                        "primary {host}:{port} named by sentinel {i}: {}",
                        describe(&e)
                    );
                    continue;
                }
                Err(_) => {
                    why = format!("primary {host}:{port} named by sentinel {i}: connect timed out");
                    continue;
                }
            };
            if self.is_master(&mut conn).await {
                self.preferred.store(i, Ordering::Relaxed);
                return Ok((client, conn));
            }
            why = format!("{host}:{port} named by sentinel {i} is not a master (any more)");
        }
        Err(Arc::from(why))
    }

    /// A client for the primary, checked once as by [`connect`](Self::connect).
    pub(crate) async fn client(&self) -> Result<redis::Client, Arc<str>> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout));
        self.connect(&config, false).await.map(|(client, _)| client)
    }

    /// Whether the server on `conn` says `role:master`, bounded.
    async fn is_master(&self, conn: &mut MultiplexedConnection) -> bool {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("replication");
        let info = tokio::time::timeout(self.response_timeout, cmd.query_async::<String>(conn));
        match info.await {
            Ok(Ok(text)) => text.lines().any(|l| l.trim() == "role:master"),
            _ => false,
        }
    }

    /// A `+switch-master` message; whether it is news about this master.
    fn switched(&self, payload: &str) -> bool {
        let mut words = payload.split_whitespace();
        if words.next() != Some(self.master_name.as_str()) {
            return false;
        }
        let new: Vec<&str> = words.skip(2).take(2).collect();
        let new = new.join(":");
        let mut last = self
            .last_switch
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if last.as_deref() == Some(new.as_str()) {
            return false;
        }
        *last = Some(new);
        drop(last);
        self.switches.fetch_add(1, Ordering::AcqRel);
        true
    }
}

/// Watch every sentinel for `+switch-master` until the store is gone: one
/// task per sentinel, each reconnecting with back-off.
pub(crate) fn watch_switches(
    master: &Arc<SentinelMaster>,
    renew: &Arc<Notify>,
    shutdown: &watch::Receiver<bool>,
) {
    for i in 0..master.sentinels.len() {
        tokio::spawn(watch_one(
            Arc::downgrade(master),
            i,
            Arc::clone(renew),
            shutdown.clone(),
        ));
    }
}

async fn watch_one(
    master: Weak<SentinelMaster>,
    i: usize,
    renew: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(m) = master.upgrade() else { return };
        let client = m.sentinels[i].clone();
        let bounds = (m.connect_timeout, m.response_timeout);
        drop(m);
        if let Some(pubsub) = subscribe(&client, bounds.0).await {
            backoff = Duration::from_millis(100);
            if hear(&master, pubsub, bounds.1, &renew, &mut shutdown).await {
                return;
            }
        }
        if master.strong_count() == 0 {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Hear switches on one subscribed sentinel connection until it is lost
/// (false) or the store is gone (true).
async fn hear(
    master: &Weak<SentinelMaster>,
    pubsub: redis::aio::PubSub,
    reply_bound: Duration,
    renew: &Notify,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.reset();
    let (mut sink, mut messages) = pubsub.split();
    loop {
        tokio::select! {
            msg = messages.next() => {
                let Some(msg) = msg else { return false };
                let Some(m) = master.upgrade() else { return true };
                let payload = String::from_utf8_lossy(msg.get_payload_bytes());
                if m.switched(&payload) {
                    tracing::info!(
                        master = %m.master_name,
                        to = %payload,
                        "sentinel switched the redis primary; reconnecting"
                    );
                    renew.notify_waiters();
                }
            }
            _ = ping.tick() => {
                if master.strong_count() == 0 {
                    return true;
                }
                let alive = tokio::time::timeout(reply_bound, sink.ping::<redis::Value>()).await;
                if !matches!(alive, Ok(Ok(_))) {
                    return false;
                }
            }
            _ = shutdown.changed() => return true,
        }
    }
}

/// A connection subscribed to `+switch-master`, both steps bounded.
async fn subscribe(client: &redis::Client, bound: Duration) -> Option<redis::aio::PubSub> {
    let mut pubsub = tokio::time::timeout(bound, client.get_async_pubsub())
        .await
        .ok()?
        .ok()?;
    tokio::time::timeout(bound, pubsub.subscribe("+switch-master"))
        .await
        .ok()?
        .ok()?;
    Some(pubsub)
}
