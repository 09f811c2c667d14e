//! The way to Redis: kept multiplexed connections (or one cluster
//! connection), their reconnects, and the breaker and error handling every
//! command goes through. Knows no entry, key or script.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_redis::redis::{
    self, aio::MultiplexedConnection, cluster_async::ClusterConnection, AsyncConnectionConfig,
    IntoConnectionInfo, Value as RedisValue,
};
use deadpool_redis::{Manager, Pool, Runtime};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::breaker::Breaker;
use super::cluster::ClusterLink;
use super::error::{describe, redact_error, ErrorClass, StoreError};
use super::fills::FillSource;
use super::options::{redact, RedisOptions};
use super::sentinel::SentinelMaster;
use super::slots::{Connector, Kept, Slot};
use super::tls;
use crate::error::BuildError;

/// How commands reach Redis.
enum Link {
    Standalone {
        connector: Connector,
        /// Multiplexed connections kept checked out, used in turn.
        slots: Vec<Arc<Slot>>,
        next: AtomicUsize,
        /// The id of the next connect, in the order connects start.
        ids: Arc<AtomicU64>,
        /// Connections with a smaller id are not used any more: a call on
        /// one of them timed out (see [`Connection::drop_silent`]).
        fresh_from: AtomicU64,
        /// Behind Sentinel: the switches of the primary followed so far.
        switches_seen: AtomicU64,
        /// A connection for commands that block the connection they run on
        /// (`WAIT`), so they hold up nobody else's commands.
        apart: Arc<Slot>,
    },
    Cluster(Box<ClusterLink>),
}

/// The connection a call went out on.
#[derive(Debug, Clone, Copy)]
struct Used {
    slot: usize,
    id: u64,
}

/// Per-key reply errors are logged at most this often, so one bad key or a
/// full server does not write a line per request.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// A connection of either kind; both multiplex, so a clone per call is cheap.
#[derive(Clone)]
enum Multiplexed {
    Standalone(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Multiplexed {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, RedisValue> {
        match self {
            Multiplexed::Standalone(c) => c.req_packed_command(cmd),
            Multiplexed::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<RedisValue>> {
        match self {
            Multiplexed::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Multiplexed::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Multiplexed::Standalone(c) => c.get_db(),
            Multiplexed::Cluster(c) => c.get_db(),
        }
    }
}

/// The way to Redis of one store. Every command goes through
/// [`invoke`](Self::invoke) or [`query`](Self::query): breaker first, then a
/// kept connection, then the reply under the response timeout.
pub(super) struct Connection {
    link: Link,
    breaker: Breaker,
    /// Bound on every reply.
    response_timeout: Duration,
    /// Bound on getting a connection: pool wait plus connect.
    connect_bound: Duration,
    /// Shortest time between two replacements of every connection (the
    /// breaker's first back-off).
    renew_gap: Duration,
    /// Tells the subscriber connections (fills, purges) to reconnect after
    /// the server turned out to be no master: they may be pinned to it too.
    renew: Arc<Notify>,
    /// Last warning about a per-key reply error (see [`WARN_EVERY`]).
    last_warn: Mutex<Option<Instant>>,
    /// Last time every connection was replaced (see `drop_all_connections`).
    last_renew: Mutex<Option<Instant>>,
}

impl Connection {
    /// The connection of a store with `options` (nothing is opened yet), and
    /// where its fill subscriber connects.
    pub(super) fn new(options: &RedisOptions) -> Result<(Self, FillSource), BuildError> {
        let (link, fill_source) = if let Some(name) = &options.sentinel_master {
            Self::sentinel(options, name)?
        } else if options.cluster {
            (
                Link::Cluster(Box::new(ClusterLink::new(options)?)),
                FillSource::Cluster(Box::new(options.clone())),
            )
        } else {
            Self::standalone(options)?
        };
        let connection = Self {
            link,
            breaker: Breaker::new(options),
            response_timeout: options.response_timeout,
            connect_bound: options.pool_wait_timeout + options.connect_timeout,
            renew_gap: options.breaker_min_backoff,
            renew: Arc::default(),
            last_warn: Mutex::new(None),
            last_renew: Mutex::new(None),
        };
        Ok((connection, fill_source))
    }

    /// Whether calls go to Redis now (the breaker is closed, or due a probe).
    /// Does not use up the probe: the call itself does.
    pub(super) fn available(&self) -> bool {
        self.breaker.would_allow()
    }

    /// Whether the breaker is closed (Redis answered the last call).
    pub(super) fn is_closed(&self) -> bool {
        self.breaker.is_closed()
    }

    /// Notified when every connection is replaced: subscriber connections
    /// then reconnect too.
    pub(super) fn renew_signal(&self) -> Arc<Notify> {
        Arc::clone(&self.renew)
    }

    fn standalone(options: &RedisOptions) -> Result<(Link, FillSource), BuildError> {
        let url = options.urls.first().map(String::as_str).unwrap_or_default();
        let invalid = |e: redis::RedisError| {
            BuildError::redis(
                format!("invalid redis url {}", redact(url)),
                redact_error(&e),
            )
        };
        let info = url.into_connection_info().map_err(invalid)?;
        #[cfg(feature = "tls")]
        let root_cert = options.tls_root_cert.as_deref();
        #[cfg(not(feature = "tls"))]
        let root_cert = None;
        // The client carries the TLS settings (and the private CA) into the
        // connection info that the pool and the subscriber both use.
        let info = tls::client(info, root_cert)
            .map_err(invalid)?
            .get_connection_info()
            .clone();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout));
        let manager = Manager::new_with_config(info.clone(), config).map_err(invalid)?;
        let n = options.connections.max(1);
        let pool = Pool::builder(manager)
            .max_size(n * 2)
            .wait_timeout(Some(options.pool_wait_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.response_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| BuildError::redis("cannot build the redis pool", e.to_string()))?;
        // Pushes (sharded messages) need RESP3 on the subscriber connection.
        let resp3 = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let subscriber = redis::Client::open(info.set_redis_settings(resp3)).map_err(invalid)?;
        Ok((
            Self::kept(Connector::Pool(pool), n),
            FillSource::Standalone(Box::new(subscriber)),
        ))
    }

    /// Behind Sentinel: no pool, each connect asks the sentinels first.
    fn sentinel(options: &RedisOptions, name: &str) -> Result<(Link, FillSource), BuildError> {
        let master = Arc::new(SentinelMaster::new(options, name)?);
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout));
        Ok((
            Self::kept(
                Connector::Sentinel(Arc::clone(&master), config),
                options.connections.max(1),
            ),
            FillSource::Sentinel(master),
        ))
    }

    fn kept(connector: Connector, n: usize) -> Link {
        Link::Standalone {
            connector,
            slots: (0..n).map(|_| Arc::default()).collect(),
            next: AtomicUsize::new(0),
            ids: Arc::default(),
            fresh_from: AtomicU64::new(0),
            switches_seen: AtomicU64::new(0),
            apart: Arc::default(),
        }
    }

    /// The connection kept apart for commands that block their connection
    /// (`WAIT`), connected if need be within the connect bound; none on a
    /// cluster. What fails on it leaves the breaker alone: the command
    /// waited, the server may be fine.
    pub(super) async fn apart(&self) -> Option<Kept> {
        let Link::Standalone {
            connector,
            apart,
            ids,
            fresh_from,
            ..
        } = &self.link
        else {
            return None;
        };
        if let Some(kept) = apart.current(fresh_from.load(Ordering::SeqCst)) {
            return Some(kept);
        }
        let pending = apart.connect(connector, self.connect_bound, ids);
        tokio::time::timeout(self.connect_bound, pending)
            .await
            .ok()?
            .ok()
    }

    /// Forget connection `id` of [`apart`](Self::apart) after it failed.
    pub(super) fn drop_apart(&self, id: u64) {
        if let Link::Standalone { apart, .. } = &self.link {
            apart.clear(id);
        }
    }

    /// The sentinels' view of the primary, for a store behind Sentinel.
    pub(super) fn sentinel_master(&self) -> Option<Arc<SentinelMaster>> {
        match &self.link {
            Link::Standalone {
                connector: Connector::Sentinel(master, _),
                ..
            } => Some(Arc::clone(master)),
            _ => None,
        }
    }

    /// Behind Sentinel, after the sentinels announced a new primary: replace
    /// every kept connection on its next use, and let the next call probe at
    /// once rather than wait out the breaker's back-off.
    fn follow_switch(&self) {
        let Link::Standalone {
            connector: Connector::Sentinel(master, _),
            slots,
            ids,
            fresh_from,
            switches_seen,
            ..
        } = &self.link
        else {
            return;
        };
        let now = master.switches();
        if switches_seen.load(Ordering::Acquire) == now
            || switches_seen.swap(now, Ordering::AcqRel) == now
        {
            return;
        }
        let from = ids.load(Ordering::SeqCst);
        fresh_from.fetch_max(from, Ordering::SeqCst);
        slots.iter().for_each(|s| s.clear_older(from));
        self.breaker.probe_now();
    }

    /// A script call under the store's timeouts and breaker.
    pub(super) async fn invoke<T: redis::FromRedisValue>(
        &self,
        op: &'static str,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        self.follow_switch();
        if !self.breaker.allow() {
            return Err(StoreError::Unavailable);
        }
        let (used, mut conn) = self.connection(op).await?;
        let result = tokio::time::timeout(self.response_timeout, inv.invoke_async(&mut conn)).await;
        self.settle(op, used, result)
    }

    /// A command under the store's timeouts and breaker.
    pub(super) async fn query<T: redis::FromRedisValue>(
        &self,
        op: &'static str,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        self.follow_switch();
        if !self.breaker.allow() {
            return Err(StoreError::Unavailable);
        }
        let (used, mut conn) = self.connection(op).await?;
        let result = tokio::time::timeout(self.response_timeout, cmd.query_async(&mut conn)).await;
        self.settle(op, used, result)
    }

    fn settle<T>(
        &self,
        op: &'static str,
        used: Used,
        result: Result<Result<T, redis::RedisError>, tokio::time::error::Elapsed>,
    ) -> Result<T, StoreError> {
        match result {
            Ok(Ok(v)) => {
                self.breaker.success();
                Ok(v)
            }
            Ok(Err(e)) => {
                let class = ErrorClass::of(&e);
                match class {
                    ErrorClass::Connection => {
                        self.drop_connection(used, &e);
                        self.failure(op, class, &describe(&e));
                    }
                    ErrorClass::Role => {
                        self.failure(op, class, &describe(&e));
                        self.drop_all_connections();
                    }
                    ErrorClass::Timeout => {
                        self.failure(op, class, &describe(&e));
                        self.drop_silent(used);
                    }
                    // A reply error about one key, or a full server that
                    // still reads, says nothing about Redis being down: no
                    // breaker trip, and the caller serves from memory.
                    ErrorClass::Oom | ErrorClass::Foreign | ErrorClass::Other => {
                        self.record_error(op, class);
                        self.warn_throttled(op, class, &describe(&e));
                    }
                }
                Err(StoreError::Redis(e))
            }
            Err(_) => {
                self.failure(op, ErrorClass::Timeout, "timed out");
                self.drop_silent(used);
                Err(StoreError::Timeout)
            }
        }
    }

    fn record_error(&self, op: &'static str, class: ErrorClass) {
        crate::metrics::redis_error(self.breaker.cache.as_deref(), op, class.label());
    }

    fn failure(&self, op: &'static str, class: ErrorClass, why: &str) {
        self.record_error(op, class);
        if self.breaker.failure() {
            tracing::warn!(
                op,
                class = class.label(),
                why,
                "redis unavailable; serving from memory until it answers again"
            );
        } else {
            tracing::debug!(op, class = class.label(), why, "redis call failed");
        }
    }

    fn warn_throttled(&self, op: &'static str, class: ErrorClass, why: &str) {
        let now = Instant::now();
        let due = {
            let mut last = self
                .last_warn
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let due = last.is_none_or(|t| now.duration_since(t) >= WARN_EVERY);
            if due {
                *last = Some(now);
            }
            due
        };
        let what = match class {
            ErrorClass::Oom => "redis is out of memory; not storing, serving from memory",
            ErrorClass::Foreign => {
                "a foreign value at a cache key; treated as a miss and overwritten by the next fill"
            }
            _ => "redis command failed",
        };
        if due {
            tracing::warn!(op, class = class.label(), error = why, "{what}");
        } else {
            tracing::debug!(op, class = class.label(), error = why, "{what}");
        }
    }

    async fn connection(&self, op: &'static str) -> Result<(Used, Multiplexed), StoreError> {
        let connect_bound = self.connect_bound;
        match &self.link {
            Link::Standalone {
                connector,
                slots,
                next,
                ids,
                fresh_from,
                ..
            } => {
                let fresh_from = fresh_from.load(Ordering::SeqCst);
                let kept = |slot: usize, (id, conn): Kept| {
                    (Used { slot, id }, Multiplexed::Standalone(conn))
                };
                let i = next.fetch_add(1, Ordering::Relaxed) % slots.len();
                if let Some(k) = slots[i].current(fresh_from) {
                    return Ok(kept(i, k));
                }
                let pending = slots[i].connect(connector, connect_bound, ids);
                // Another kept connection serves meanwhile: nobody waits for
                // a reconnect while one connection is up.
                if let Some((j, k)) = slots
                    .iter()
                    .enumerate()
                    .find_map(|(j, s)| s.current(fresh_from).map(|k| (j, k)))
                {
                    return Ok(kept(j, k));
                }
                // None is up. A probe of an open breaker waits no longer than
                // a reply would; the connect goes on in its task regardless.
                let wait = if self.breaker.is_closed() {
                    connect_bound
                } else {
                    self.response_timeout
                };
                match tokio::time::timeout(wait, pending).await {
                    Ok(Ok(k)) => Ok(kept(i, k)),
                    Ok(Err(why)) => {
                        self.failure(op, ErrorClass::Connection, &why);
                        Err(StoreError::Unavailable)
                    }
                    Err(_) => {
                        self.failure(op, ErrorClass::Timeout, "connect timed out");
                        Err(StoreError::Timeout)
                    }
                }
            }
            Link::Cluster(link) => {
                // The connect is bounded by the connection timeout; waiting
                // behind another caller's connect, by the pool wait.
                match tokio::time::timeout(connect_bound, link.get()).await {
                    Ok(Ok((id, conn))) => Ok((Used { slot: 0, id }, Multiplexed::Cluster(conn))),
                    Ok(Err(e)) => {
                        self.failure(op, ErrorClass::Connection, &describe(&e));
                        Err(StoreError::Unavailable)
                    }
                    Err(_) => {
                        self.failure(op, ErrorClass::Timeout, "connect timed out");
                        Err(StoreError::Timeout)
                    }
                }
            }
        }
    }

    fn drop_connection(&self, used: Used, e: &redis::RedisError) {
        match &self.link {
            Link::Standalone { slots, .. } => slots[used.slot].clear(used.id),
            // A cluster connection reconnects to nodes and refreshes slots by
            // itself; only an error it cannot get past calls for a new one.
            Link::Cluster(link) => {
                if e.is_unrecoverable_error() {
                    link.reset(used.id);
                }
            }
        }
    }

    /// A call got no reply in time: replace every connection kept so far,
    /// each on its next use. A server that went silent leaves all of them
    /// silent (its path blackholed after a failover, a frozen process), and
    /// a kept one would time out for ever, while a new connection follows
    /// a moved DNS name or virtual IP. Only a call on a current connection
    /// does this, so the calls that time out together on the old ones
    /// replace them once; and the breaker, open from this timeout on, lets
    /// one probe at a time through, so reconnects follow its back-off.
    fn drop_silent(&self, used: Used) {
        match &self.link {
            Link::Standalone {
                slots,
                ids,
                fresh_from,
                ..
            } => {
                if used.id < fresh_from.load(Ordering::SeqCst) {
                    return;
                }
                let from = ids.load(Ordering::SeqCst);
                fresh_from.fetch_max(from, Ordering::SeqCst);
                slots.iter().for_each(|s| s.clear_older(from));
            }
            // The cluster connection keeps one connection per node and
            // reconnects only when one breaks, not when one goes silent.
            Link::Cluster(link) => link.reset(used.id),
        }
    }

    /// Replace every kept connection (and the subscribers'): the server they
    /// lead to is no master any more. At most once per shortest breaker
    /// back-off: a burst of calls failing on the old server must not turn
    /// into a burst of reconnects.
    fn drop_all_connections(&self) {
        let now = Instant::now();
        {
            let mut last = self
                .last_renew
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|t| now.duration_since(t) < self.renew_gap) {
                return;
            }
            *last = Some(now);
        }
        match &self.link {
            Link::Standalone {
                slots,
                ids,
                fresh_from,
                ..
            } => {
                let from = ids.load(Ordering::SeqCst);
                fresh_from.fetch_max(from, Ordering::SeqCst);
                slots.iter().for_each(|s| s.clear_older(from));
            }
            // The cluster client follows READONLY to the new master by
            // itself; one that still surfaces means its view is stale.
            Link::Cluster(link) => link.reset_any(),
        }
        self.renew.notify_waiters();
    }
}
