//! The shared store on Redis: entries, the lease, the fence, and fill
//! notifications, each entry's keys under one hash tag so a single Lua script
//! can touch all of them (also on Redis Cluster).
//!
//! ```text
//! {ns}:{H}:v      entry (versioned encoding), PX = hard expiry
//! {ns}:{H}:fresh  present while fresh, PX = freshness left
//! {ns}:{H}:lock   lease token, SET NX PX
//! {ns}:{H}:fence  hash: `next` (last token issued) and `hw` (highest accepted write or purge)
//! {ns}:{H}:pass   hit-for-pass marker
//! ```
//!
//! Connections to a standalone Redis: deadpool builds them (with connect and
//! response timeouts), and we keep a few multiplexed connections checked out
//! for good. A multiplexed connection already pipelines concurrent commands,
//! and a pool checkout costs an UNWATCH+PING round trip, which would triple
//! the commands of a Redis hit. On Redis Cluster one cluster connection does
//! the same job (see [`super::cluster`]).
//!
//! Fill notifications use sharded pub/sub on a per-entry channel
//! `{ns}:{H}:fill` (see [`super::fills`]), on a cluster and standalone alike.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use deadpool_redis::redis::{
    self, aio::MultiplexedConnection, cluster_async::ClusterConnection, AsyncConnectionConfig,
    IntoConnectionInfo, Script, Value as RedisValue,
};
use deadpool_redis::{Manager, Pool, Runtime};
use futures_util::future::{BoxFuture, FutureExt, Shared};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

use super::cluster::ClusterLink;
pub(crate) use super::fills::FillSubscription;
use super::fills::{run_subscriber, FillSource, Fills};
use super::tls;

use crate::entry::{FENCE_OFFSET, MAGIC, VERSION};
use crate::error::BuildError;
use crate::key::CacheKey;
use crate::lock::{FenceToken, LeaseToken};

/// How to reach Redis and how to use it. Every timeout has a default.
///
/// ```
/// use std::time::Duration;
/// use herdguard::RedisOptions;
/// let opts = RedisOptions::new("redis://127.0.0.1:6379")
///     .namespace("shop")
///     .lease_ttl(Duration::from_secs(5))
///     .l1_ttl(Duration::from_millis(500));
/// # let _ = opts;
/// ```
///
/// # Redis Cluster
///
/// [`RedisOptions::cluster`] takes the URLs of some nodes (any subset is
/// enough to discover the rest). Every key of one entry shares a hash tag,
/// so each script touches one slot and runs on a cluster unchanged; entries
/// of different keys spread over the slots. MOVED and ASK redirects are
/// followed by the client, and fill notifications go out on sharded pub/sub
/// (`SPUBLISH` on a channel in the entry's own slot), so they do not
/// broadcast to every node. Redis 7 or newer is needed for the notifications;
/// on an older server waiters fall back to polling.
///
/// ```
/// use herdguard::RedisOptions;
/// let opts = RedisOptions::cluster([
///     "redis://10.0.0.1:6379",
///     "redis://10.0.0.2:6379",
///     "redis://10.0.0.3:6379",
/// ]);
/// # let _ = opts;
/// ```
///
/// # Failures
///
/// Every call is bounded by the response timeout, and Redis trouble is never
/// an error response: the layer serves from memory and coalesces within the
/// process. What happens next depends on the error:
///
/// - a broken connection or a timeout opens the circuit breaker, which
///   probes again after [`breaker_backoff`](Self::breaker_backoff); a
///   broken connection is replaced (a timed-out one is kept: a frozen server
///   answers on it once it thaws);
/// - `READONLY`, `LOADING` or `MASTERDOWN` (a failover demoted the server)
///   open the breaker and replace every connection, the subscribers' too, so
///   a failover behind a DNS name or a virtual IP heals without a restart;
/// - `OOM` skips the write (the lease is still given back) and the answer is
///   kept in memory; reads keep using Redis;
/// - a foreign value at an entry key (another type, or bytes this version
///   cannot read) is a miss, and the next fill overwrites it.
///
/// Errors are counted in `herdguard_redis_errors_total{op, class}` (class:
/// `connection`, `timeout`, `role`, `oom`, `foreign`, `other`); per-key ones
/// are logged at most every 10 s.
///
/// # TLS and credentials
///
/// `rediss://` URLs connect over TLS (rustls) when the crate's `tls` feature
/// is on; without it, building the layer fails with an error that says so.
/// The server certificate is checked against the system's root store, or
/// against your own CA with `tls_root_cert_pem`. Credentials go in the URL:
/// `rediss://user:password@host:6380` for an ACL user, `rediss://:password@host`
/// for `requirepass`. They are sent with `HELLO`/`AUTH` and never appear in
/// logs, errors, `Debug` output or metric labels. A wrong password is logged
/// as an authentication failure and the layer serves from memory meanwhile.
#[derive(Clone)]
pub struct RedisOptions {
    /// Standalone: one URL. Cluster: the seed nodes.
    pub(crate) urls: Vec<String>,
    pub(crate) cluster: bool,
    #[cfg(feature = "tls")]
    pub(crate) tls_root_cert: Option<Arc<[u8]>>,
    pub(crate) namespace: String,
    pub(crate) connections: usize,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) pool_wait_timeout: Duration,
    pub(crate) lease_ttl: Duration,
    pub(crate) l1_ttl: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) fallback_poll_interval: Duration,
    pub(crate) watchdog: bool,
    pub(crate) breaker_min_backoff: Duration,
    pub(crate) breaker_max_backoff: Duration,
    pub(crate) fence_retention: Duration,
    /// The `cache` label of this store's metrics: the layer's name, or none
    /// for a store outside a layer.
    pub(crate) metrics_name: Option<String>,
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|u| redact(u)).collect();
        let mut d = f.debug_struct("RedisOptions");
        d.field("urls", &urls)
            .field("cluster", &self.cluster)
            .field("namespace", &self.namespace)
            .field("lease_ttl", &self.lease_ttl)
            .field("l1_ttl", &self.l1_ttl);
        #[cfg(feature = "tls")]
        d.field(
            "tls_root_cert",
            &self.tls_root_cert.as_ref().map(|_| "<pem>"),
        );
        d.finish_non_exhaustive()
    }
}

/// The URL without credentials, for logs and Debug output.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

impl RedisOptions {
    /// Options for the Redis at `url` (`redis://[user:pass@]host:port[/db]`), with defaults:
    /// namespace `herdguard`, 4 connections, connect timeout 1 s, response
    /// timeout 250 ms, pool wait 250 ms, lease 5 s (extended every lease/3
    /// while the origin works), L1 1 s, waiter poll 200 ms (50 ms while fill
    /// notifications are down).
    pub fn new(url: impl Into<String>) -> Self {
        Self::with_urls(vec![url.into()], false)
    }

    /// Options for the Redis Cluster reached through `urls` (seed nodes, at
    /// least one; the client discovers the rest and follows the cluster as
    /// slots move). Same defaults as [`RedisOptions::new`], except that one
    /// multiplexed cluster connection is used whatever
    /// [`connections`](Self::connections) says, and no pool is involved.
    pub fn cluster<I, U>(urls: I) -> Self
    where
        I: IntoIterator<Item = U>,
        U: Into<String>,
    {
        Self::with_urls(urls.into_iter().map(Into::into).collect(), true)
    }

    fn with_urls(urls: Vec<String>, cluster: bool) -> Self {
        Self {
            urls,
            cluster,
            #[cfg(feature = "tls")]
            tls_root_cert: None,
            namespace: "herdguard".to_owned(),
            connections: 4,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_millis(250),
            pool_wait_timeout: Duration::from_millis(250),
            lease_ttl: Duration::from_secs(5),
            l1_ttl: Duration::from_secs(1),
            poll_interval: Duration::from_millis(200),
            fallback_poll_interval: Duration::from_millis(50),
            watchdog: true,
            breaker_min_backoff: Duration::from_millis(250),
            breaker_max_backoff: Duration::from_secs(5),
            fence_retention: Duration::from_secs(24 * 3600),
            metrics_name: None,
        }
    }

    /// Label this store's metrics with the layer's name.
    pub(crate) fn metrics_name(mut self, name: &str) -> Self {
        self.metrics_name = Some(name.to_owned());
        self
    }

    /// Prefix of every key (default `herdguard`): letters, digits, `_ - . :`.
    #[must_use]
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = ns.into();
        self
    }

    /// Multiplexed connections kept open (default 4). On a cluster, one
    /// cluster connection (one multiplexed connection per node) is used.
    #[must_use]
    pub fn connections(mut self, n: usize) -> Self {
        self.connections = n;
        self
    }

    /// Bound on opening a connection, TLS and AUTH included (default 1 s).
    #[must_use]
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// Bound on every command's reply (default 250 ms).
    #[must_use]
    pub fn response_timeout(mut self, t: Duration) -> Self {
        self.response_timeout = t;
        self
    }

    /// Bound on waiting for a pooled connection (default 250 ms); on a
    /// cluster, on waiting behind another caller's connect.
    #[must_use]
    pub fn pool_wait_timeout(mut self, t: Duration) -> Self {
        self.pool_wait_timeout = t;
        self
    }

    /// Lease lifetime (default 5 s). A dead leader blocks a key at most this long.
    #[must_use]
    pub fn lease_ttl(mut self, t: Duration) -> Self {
        self.lease_ttl = t;
        self
    }

    /// How long this process answers *fresh* from its in-memory copy before
    /// asking Redis again (default 1 s; never longer than the entry stays
    /// fresh). Past that, the copy may still answer *stale* within the
    /// entry's stale grace, while a background refresh asks Redis. Zero keeps
    /// no copy at all: every answer asks Redis.
    #[must_use]
    pub fn l1_ttl(mut self, t: Duration) -> Self {
        self.l1_ttl = t;
        self
    }

    /// Poll interval of a waiter in case a fill notification is lost (default 200 ms).
    ///
    /// Waiters are woken by the fill notification; this poll is only the
    /// fallback. A waiter never sleeps past the lease it waits on, so a
    /// leader that dies is noticed when its lease ends, whatever the poll.
    #[must_use]
    pub fn poll_interval(mut self, t: Duration) -> Self {
        self.poll_interval = t;
        self
    }

    /// Poll interval of a waiter while the notification connection is down,
    /// or on a server without sharded pub/sub (before Redis 7): default
    /// 50 ms, never longer than [`poll_interval`](Self::poll_interval).
    #[must_use]
    pub fn fallback_poll_interval(mut self, t: Duration) -> Self {
        self.fallback_poll_interval = t;
        self
    }

    /// Whether to extend the lease while the origin works (default on).
    #[must_use]
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// Back-off of the circuit breaker after Redis fails: first and longest wait
    /// before probing again (defaults 250 ms and 5 s, doubling in between).
    #[must_use]
    pub fn breaker_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.breaker_min_backoff = first;
        self.breaker_max_backoff = max.max(first);
        self
    }

    /// Trust only this CA (PEM, one or more certificates) for `rediss://`,
    /// instead of the system's root store: for a private CA or a self-signed
    /// server certificate. Needs the `tls` feature.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    #[must_use]
    pub fn tls_root_cert_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_cert = Some(pem.into().into());
        self
    }

    /// Whether these options name a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    fn validate(&self) -> Result<(), BuildError> {
        if self.urls.is_empty() || self.urls.iter().any(|u| u.trim().is_empty()) {
            return Err(BuildError::new("redis needs at least one non-empty url"));
        }
        if !self.cluster && self.urls.len() > 1 {
            return Err(BuildError::new(
                "several redis urls need RedisOptions::cluster",
            ));
        }
        tls::check_available(&self.urls)?;
        let ns = &self.namespace;
        let ok = !ns.is_empty()
            && ns.len() <= 64
            && ns
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b));
        if !ok {
            return Err(BuildError::new(format!(
                "redis namespace {ns:?} must be 1-64 characters of letters, digits, '_', '-', '.', ':'"
            )));
        }
        if self.lease_ttl < Duration::from_millis(30) {
            return Err(BuildError::new("lease ttl must be at least 30 ms"));
        }
        for (name, d) in [
            ("connect timeout", self.connect_timeout),
            ("response timeout", self.response_timeout),
            ("pool wait timeout", self.pool_wait_timeout),
            ("poll interval", self.poll_interval),
            ("fallback poll interval", self.fallback_poll_interval),
        ] {
            if d.is_zero() {
                return Err(BuildError::new(format!("{name} must be above zero")));
            }
        }
        Ok(())
    }
}

/// What one lookup-or-lease round trip found.
#[derive(Debug)]
pub(crate) enum RemoteLookup {
    Fresh {
        bytes: Bytes,
        fresh_left: Duration,
        hard_left: Duration,
    },
    /// Stale; `fence` is `Some` when this caller also won the lease to refresh it.
    Stale {
        bytes: Bytes,
        hard_left: Duration,
        fence: Option<FenceToken>,
    },
    Leased {
        fence: FenceToken,
    },
    Held {
        lease_left: Duration,
    },
    /// No entry, and the lease is not taken here (it lives on Redlock nodes).
    Miss,
    Pass {
        left: Duration,
    },
}

/// What a fenced write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WriteOutcome {
    /// The entry (or pass marker) was stored: its fence was not older than
    /// the newest accepted write.
    pub(crate) accepted: bool,
    /// Our lease was still ours and is now released.
    pub(crate) released: bool,
}

/// What a fenced write stores.
#[derive(Debug)]
pub(crate) enum WriteMode<'a> {
    Store {
        bytes: &'a [u8],
        fresh: Duration,
        hard: Duration,
    },
    Pass {
        ttl: Duration,
    },
    /// Store nothing; release the lease and wake waiters to compete again.
    Release,
}

/// Why a Redis call did not produce an answer. Callers fail open on any of these.
#[derive(Debug)]
pub(crate) enum StoreError {
    /// The circuit breaker is open: Redis failed recently.
    Unavailable,
    Timeout,
    Redis(redis::RedisError),
    /// The reply did not have the shape our script returns.
    Protocol,
}

impl StoreError {
    /// Redis refused a write for lack of memory (reads still work).
    pub(crate) fn is_oom(&self) -> bool {
        matches!(self, StoreError::Redis(e) if ErrorClass::of(e) == ErrorClass::Oom)
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Unavailable => f.write_str("redis unavailable (circuit open)"),
            StoreError::Timeout => f.write_str("redis call timed out"),
            StoreError::Redis(e) => write!(f, "redis error: {e}"),
            StoreError::Protocol => f.write_str("unexpected reply from redis"),
        }
    }
}

static LOOKUP_OR_LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("fence.lua"),
        include_str!("lookup_or_lease.lua")
    ))
});

static FENCED_WRITE_AND_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("fence.lua"),
        include_str!("fenced_write.lua")
    ))
});

static PURGE_ENTRY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("fence.lua"),
        include_str!("purge_entry.lua")
    ))
});

static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
",
    )
});

#[allow(
    dead_code,
    reason = "the guarded-work API and Redlock release through it"
)]
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
",
    )
});

/// The Redis key names of one entry.
#[derive(Debug)]
pub(crate) struct EntryKeys {
    pub(crate) value: String,
    pub(crate) fresh: String,
    pub(crate) lock: String,
    pub(crate) fence: String,
    pub(crate) pass: String,
}

/// The Redis store of one cache.
pub(crate) struct RedisStore {
    pub(crate) options: RedisOptions,
    link: Link,
    breaker: Breaker,
    fills: Arc<Fills>,
    /// Taken by the subscriber task when the first waiter subscribes.
    fill_source: Mutex<Option<(FillSource, mpsc::UnboundedReceiver<CacheKey>)>>,
    entry_prefix: Vec<u8>,
    shutdown: watch::Sender<bool>,
    /// The lease is taken on Redlock nodes, so lookups never lease here.
    lease_elsewhere: bool,
    pub(crate) purge_bus: Arc<crate::store::purge_bus::PurgeBus>,
    /// Tells the subscriber connections (fills, purges) to reconnect after
    /// the server turned out to be no master: they may be pinned to it too.
    pub(crate) renew: Arc<Notify>,
    /// Last warning about a per-key reply error (see [`WARN_EVERY`]).
    last_warn: Mutex<Option<Instant>>,
    /// Last time every connection was replaced (see `drop_all_connections`).
    last_renew: Mutex<Option<Instant>>,
}

/// How commands reach Redis.
enum Link {
    Standalone {
        pool: Pool,
        /// Multiplexed connections kept checked out, used in turn.
        slots: Vec<Arc<Slot>>,
        next: AtomicUsize,
    },
    Cluster(Box<ClusterLink>),
}

/// A connect that runs in its own task, shared by everyone waiting for it.
type PendingConnect = Shared<BoxFuture<'static, Result<MultiplexedConnection, Arc<str>>>>;

/// One kept connection and its (re)connect.
#[derive(Default)]
struct Slot {
    /// A std `Mutex`: only held to clone or replace a handle, never across `.await`.
    conn: Mutex<Option<MultiplexedConnection>>,
    /// The connect under way. Its own task drives it, so a caller that stops
    /// waiting (its bound ran out) does not cancel it: a later call finds the
    /// connection ready instead of starting over against a slow server.
    connecting: Mutex<Option<PendingConnect>>,
}

impl Slot {
    fn current(&self) -> Option<MultiplexedConnection> {
        self.conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn clear(&self) {
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// The connect of this slot, started now unless one is under way.
    fn connect(self: &Arc<Self>, pool: &Pool, bound: Duration) -> PendingConnect {
        let mut pending = self
            .connecting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = pending.as_ref() {
            return p.clone();
        }
        let (slot, pool) = (Arc::clone(self), pool.clone());
        let task = tokio::spawn(async move {
            let result = match tokio::time::timeout(bound, pool.get()).await {
                Ok(Ok(pooled)) => {
                    let conn = deadpool_redis::Connection::take(pooled);
                    *slot.conn.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
                    Ok(conn)
                }
                Ok(Err(deadpool_redis::PoolError::Backend(e))) => Err(Arc::from(describe(&e))),
                Ok(Err(other)) => Err(Arc::from(redact_error(&other))),
                Err(_) => Err(Arc::from("connect timed out")),
            };
            *slot
                .connecting
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = None;
            result
        });
        let shared = async move {
            task.await
                .unwrap_or_else(|_| Err(Arc::from("connect task ended early")))
        }
        .boxed()
        .shared();
        *pending = Some(shared.clone());
        shared
    }
}

/// What a failed call says about Redis; it decides what the store does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ErrorClass {
    /// The connection is broken (reset, I/O, unrecoverable): replace it,
    /// open the breaker.
    Connection,
    /// No reply in time. The connection is kept (a frozen or slow server
    /// answers on it later; a new one would make callers wait for a
    /// connect); the breaker opens.
    Timeout,
    /// The server answers but is no writable master: READONLY (demoted by a
    /// failover), LOADING, MASTERDOWN. Every kept connection leads to that
    /// server, so all are replaced: behind a DNS name or a virtual IP the new
    /// connections reach the new master. The breaker opens.
    Role,
    /// Out of memory: writes are refused, reads still work. No breaker trip;
    /// the caller serves from memory.
    Oom,
    /// A value of another type at one of our keys (WRONGTYPE).
    Foreign,
    /// Any other error about one command.
    Other,
}

impl ErrorClass {
    fn of(e: &redis::RedisError) -> Self {
        match e.code() {
            Some("READONLY" | "LOADING" | "MASTERDOWN") => return Self::Role,
            Some("OOM") => return Self::Oom,
            Some("WRONGTYPE") => return Self::Foreign,
            _ => {}
        }
        if e.is_timeout() {
            Self::Timeout
        } else if e.is_connection_dropped()
            || e.is_unrecoverable_error()
            || e.is_io_error()
            || e.is_cluster_error()
        {
            Self::Connection
        } else {
            Self::Other
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::Timeout => "timeout",
            Self::Role => "role",
            Self::Oom => "oom",
            Self::Foreign => "foreign",
            Self::Other => "other",
        }
    }
}

/// Per-key reply errors are logged at most this often, so one bad key or a
/// full server does not write a line per request.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// A connection of either kind; both multiplex, so a clone per call is cheap.
#[derive(Clone)]
enum Conn {
    Standalone(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, RedisValue> {
        match self {
            Conn::Standalone(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<RedisValue>> {
        match self {
            Conn::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Standalone(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("options", &self.options)
            .field("available", &self.breaker.is_closed())
            .finish_non_exhaustive()
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

impl RedisStore {
    pub(crate) fn new(options: RedisOptions) -> Result<Self, BuildError> {
        options.validate()?;
        let (link, fill_source) = if options.cluster {
            (
                Link::Cluster(Box::new(ClusterLink::new(&options)?)),
                FillSource::Cluster(Box::new(options.clone())),
            )
        } else {
            Self::standalone(&options)?
        };
        let (fills, changes) = Fills::new(&options.namespace);
        let mut entry_prefix = MAGIC.to_vec();
        entry_prefix.push(VERSION);
        Ok(Self {
            link,
            breaker: Breaker::new(&options),
            fills,
            fill_source: Mutex::new(Some((fill_source, changes))),
            entry_prefix,
            shutdown: watch::channel(false).0,
            lease_elsewhere: false,
            purge_bus: Arc::default(),
            renew: Arc::default(),
            last_warn: Mutex::new(None),
            last_renew: Mutex::new(None),
            options,
        })
    }

    fn standalone(options: &RedisOptions) -> Result<(Link, FillSource), BuildError> {
        let url = options.urls.first().map(String::as_str).unwrap_or_default();
        let invalid = |e: redis::RedisError| {
            BuildError::with_source(
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
            .map_err(|e| BuildError::with_source("cannot build the redis pool", e.to_string()))?;
        // Pushes (sharded messages) need RESP3 on the subscriber connection.
        let resp3 = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let subscriber = redis::Client::open(info.set_redis_settings(resp3)).map_err(invalid)?;
        Ok((
            Link::Standalone {
                pool,
                slots: (0..n).map(|_| Arc::default()).collect(),
                next: AtomicUsize::new(0),
            },
            FillSource::Standalone(Box::new(subscriber)),
        ))
    }

    pub(crate) fn keys(&self, key: &CacheKey) -> EntryKeys {
        let ns = &self.options.namespace;
        let h = key.to_hex();
        EntryKeys {
            value: format!("{ns}:{{{h}}}:v"),
            fresh: format!("{ns}:{{{h}}}:fresh"),
            lock: format!("{ns}:{{{h}}}:lock"),
            fence: format!("{ns}:{{{h}}}:fence"),
            pass: format!("{ns}:{{{h}}}:pass"),
        }
    }

    /// Whether calls go to Redis now (the breaker is closed, or due a probe).
    /// Does not use up the probe: the call itself does.
    pub(crate) fn available(&self) -> bool {
        self.breaker.would_allow()
    }

    /// One round trip: the entry and its freshness, or the lease and a fence token.
    pub(crate) async fn lookup_or_lease(
        &self,
        key: &CacheKey,
        token: &LeaseToken,
        skip_entry: bool,
    ) -> Result<RemoteLookup, StoreError> {
        self.lookup_or_lease_ahead(key, token, skip_entry, Duration::ZERO)
            .await
    }

    /// [`lookup_or_lease`](Self::lookup_or_lease) that also takes the lease
    /// of a fresh entry with at most `ahead` left (refresh-ahead): then the
    /// reply is `Leased`.
    pub(crate) async fn lookup_or_lease_ahead(
        &self,
        key: &CacheKey,
        token: &LeaseToken,
        skip_entry: bool,
        ahead: Duration,
    ) -> Result<RemoteLookup, StoreError> {
        self.ensure_purge_listener();
        let k = self.keys(key);
        let mut inv = LOOKUP_OR_LEASE.prepare_invoke();
        inv.key(&k.value)
            .key(&k.fresh)
            .key(&k.lock)
            .key(&k.fence)
            .key(&k.pass)
            .arg(token.as_str())
            .arg(millis(self.options.lease_ttl))
            .arg(if skip_entry { "1" } else { "0" })
            .arg(millis(self.options.fence_retention))
            .arg(&self.entry_prefix[..])
            .arg(if self.lease_elsewhere { "1" } else { "0" })
            .arg(millis(ahead));
        let reply: RedisValue = self.invoke("lookup_or_lease", &inv).await?;
        parse_lookup(reply).ok_or(StoreError::Protocol)
    }

    /// Store (or mark pass, or nothing) only if `fence` is not older than the
    /// newest accepted write; release the lease if it is still ours; wake waiters.
    pub(crate) async fn write_and_release(
        &self,
        key: &CacheKey,
        token: &LeaseToken,
        fence: FenceToken,
        mode: WriteMode<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let k = self.keys(key);
        let (mode_name, value, fresh, hard, pass): (&str, &[u8], u64, u64, u64) = match mode {
            WriteMode::Store { bytes, fresh, hard } => {
                ("store", bytes, millis(fresh), millis(hard).max(1), 0)
            }
            WriteMode::Pass { ttl } => ("pass", &[], 0, 0, millis(ttl).max(1)),
            WriteMode::Release => ("release", &[], 0, 0, 0),
        };
        let mut inv = FENCED_WRITE_AND_RELEASE.prepare_invoke();
        inv.key(&k.value)
            .key(&k.fresh)
            .key(&k.lock)
            .key(&k.fence)
            .key(&k.pass)
            .arg(token.as_str())
            .arg(fence.0)
            .arg(mode_name)
            .arg(value)
            .arg(fresh)
            .arg(hard)
            .arg(self.fills.channel(key))
            .arg(key.to_hex())
            .arg(millis(self.options.fence_retention))
            .arg(pass)
            .arg(&self.entry_prefix[..])
            .arg(FENCE_OFFSET);
        let (accepted, released): (i64, i64) = match self.invoke("write_and_release", &inv).await {
            Ok(reply) => reply,
            Err(e) => {
                if e.is_oom() {
                    // Nothing was stored, but a full server still deletes:
                    // give the lease back so other instances need not wait
                    // it out (they serve from their own memory meanwhile).
                    let _ = self.release(key, token).await;
                }
                return Err(e);
            }
        };
        Ok(WriteOutcome {
            accepted: accepted == 1,
            released: released == 1,
        })
    }

    /// PEXPIRE the lease only if `token` still holds it.
    pub(crate) async fn extend(
        &self,
        key: &CacheKey,
        token: &LeaseToken,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let k = self.keys(key);
        let mut inv = EXTEND.prepare_invoke();
        inv.key(&k.lock).arg(token.as_str()).arg(millis(ttl));
        let n: i64 = self.invoke("extend", &inv).await?;
        Ok(n == 1)
    }

    /// Delete the lease only if `token` still holds it (compare-and-delete).
    #[allow(
        dead_code,
        reason = "the guarded-work API and Redlock release through it"
    )]
    pub(crate) async fn release(
        &self,
        key: &CacheKey,
        token: &LeaseToken,
    ) -> Result<bool, StoreError> {
        let k = self.keys(key);
        let mut inv = RELEASE.prepare_invoke();
        inv.key(&k.lock).arg(token.as_str());
        let n: i64 = self.invoke("release", &inv).await?;
        Ok(n == 1)
    }

    /// Remove an entry (not its lease) from Redis, and raise its fence so no
    /// fill that leased before the purge can store its answer after it.
    pub(crate) async fn purge(&self, key: &CacheKey) -> Result<(), StoreError> {
        let k = self.keys(key);
        let mut inv = PURGE_ENTRY.prepare_invoke();
        inv.key(&k.value)
            .key(&k.fresh)
            .key(&k.pass)
            .key(&k.fence)
            .arg(millis(self.options.fence_retention));
        let _: i64 = self.invoke("purge", &inv).await?;
        Ok(())
    }

    /// Subscribe to fill notifications for `key` (starting the subscriber
    /// connection on first use).
    pub(crate) fn subscribe_fills(&self, key: CacheKey) -> FillSubscription {
        if !self.fills.started.swap(true, Ordering::SeqCst) {
            let source = self
                .fill_source
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some((source, changes)) = source {
                tokio::spawn(run_subscriber(
                    Arc::downgrade(&self.fills),
                    source,
                    changes,
                    self.options.connect_timeout,
                    self.options.response_timeout,
                    self.shutdown.subscribe(),
                    Arc::clone(&self.renew),
                ));
            }
        }
        self.fills.subscribe(key)
    }

    /// Whether the subscriber connection is up (when it is not, waiters poll faster).
    pub(crate) fn notifications_live(&self) -> bool {
        self.fills.connected.load(Ordering::SeqCst)
    }

    /// A script call under the store's timeouts and breaker.
    pub(crate) async fn invoke<T: redis::FromRedisValue>(
        &self,
        op: &'static str,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        if !self.breaker.allow() {
            return Err(StoreError::Unavailable);
        }
        let (slot, mut conn) = self.connection(op).await?;
        let result =
            tokio::time::timeout(self.options.response_timeout, inv.invoke_async(&mut conn)).await;
        self.settle(op, slot, result)
    }

    /// A command under the store's timeouts and breaker.
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        op: &'static str,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        if !self.breaker.allow() {
            return Err(StoreError::Unavailable);
        }
        let (slot, mut conn) = self.connection(op).await?;
        let result =
            tokio::time::timeout(self.options.response_timeout, cmd.query_async(&mut conn)).await;
        self.settle(op, slot, result)
    }

    fn settle<T>(
        &self,
        op: &'static str,
        slot: usize,
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
                        self.drop_connection(slot, &e);
                        self.failure(op, class, &describe(&e));
                    }
                    ErrorClass::Role => {
                        self.failure(op, class, &describe(&e));
                        self.drop_all_connections();
                    }
                    ErrorClass::Timeout => self.failure(op, class, &describe(&e)),
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

    async fn connection(&self, op: &'static str) -> Result<(usize, Conn), StoreError> {
        let connect_bound = self.options.pool_wait_timeout + self.options.connect_timeout;
        match &self.link {
            Link::Standalone { pool, slots, next } => {
                let i = next.fetch_add(1, Ordering::Relaxed) % slots.len();
                if let Some(conn) = slots[i].current() {
                    return Ok((i, Conn::Standalone(conn)));
                }
                let pending = slots[i].connect(pool, connect_bound);
                // Another kept connection serves meanwhile: nobody waits for
                // a reconnect while one connection is up.
                if let Some((j, conn)) = slots
                    .iter()
                    .enumerate()
                    .find_map(|(j, s)| s.current().map(|c| (j, c)))
                {
                    return Ok((j, Conn::Standalone(conn)));
                }
                // None is up. A probe of an open breaker waits no longer than
                // a reply would; the connect goes on in its task regardless.
                let wait = if self.breaker.is_closed() {
                    connect_bound
                } else {
                    self.options.response_timeout
                };
                match tokio::time::timeout(wait, pending).await {
                    Ok(Ok(conn)) => Ok((i, Conn::Standalone(conn))),
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
                    Ok(Ok(conn)) => Ok((0, Conn::Cluster(conn))),
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

    fn drop_connection(&self, slot: usize, e: &redis::RedisError) {
        match &self.link {
            Link::Standalone { slots, .. } => slots[slot].clear(),
            // A cluster connection reconnects to nodes and refreshes slots by
            // itself; only an error it cannot get past calls for a new one.
            Link::Cluster(link) => {
                if e.is_unrecoverable_error() {
                    link.reset();
                }
            }
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
            if last.is_some_and(|t| now.duration_since(t) < self.options.breaker_min_backoff) {
                return;
            }
            *last = Some(now);
        }
        match &self.link {
            Link::Standalone { slots, .. } => slots.iter().for_each(|s| s.clear()),
            // The cluster client follows READONLY to the new master by
            // itself; one that still surfaces means its view is stale.
            Link::Cluster(link) => link.reset(),
        }
        self.renew.notify_waiters();
    }

    /// A client for classic pub/sub (purge notices) on the first URL. On a
    /// cluster, PUBLISH reaches every node, so one seed node is enough.
    pub(crate) fn pubsub_client(&self) -> Result<redis::Client, StoreError> {
        let url = self
            .options
            .urls
            .first()
            .map(String::as_str)
            .unwrap_or_default();
        let info =
            redis::IntoConnectionInfo::into_connection_info(url).map_err(StoreError::Redis)?;
        #[cfg(feature = "tls")]
        let root_cert = self.options.tls_root_cert.as_deref();
        #[cfg(not(feature = "tls"))]
        let root_cert = None;
        tls::client(info, root_cert).map_err(StoreError::Redis)
    }

    pub(crate) fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    // ---- Lease pieces used by Redlock and the guarded-work API ----

    /// Lookups stop taking the lease here; Redlock takes it instead.
    pub(crate) fn set_lease_elsewhere(&mut self) {
        self.lease_elsewhere = true;
    }

    /// `SET lock token NX PX ttl` on this node alone.
    pub(crate) async fn try_lease(
        &self,
        key: &CacheKey,
        token: &LeaseToken,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let k = self.keys(key);
        let mut cmd = redis::cmd("SET");
        cmd.arg(&k.lock)
            .arg(token.as_str())
            .arg("NX")
            .arg("PX")
            .arg(millis(ttl).max(1));
        let reply: Option<String> = self.query("try_lease", &cmd).await?;
        Ok(reply.is_some())
    }

    /// The next fence token of `key`, from the counter that lives with the value.
    pub(crate) async fn next_fence(&self, key: &CacheKey) -> Result<FenceToken, StoreError> {
        let k = self.keys(key);
        let mut inv = NEXT_FENCE.prepare_invoke();
        inv.key(&k.fence).arg(millis(self.options.fence_retention));
        let n: i64 = self.invoke("next_fence", &inv).await?;
        Ok(FenceToken(n.max(0) as u64))
    }

    /// The stored bytes of `key`, if any (no freshness check).
    pub(crate) async fn read_value(&self, key: &CacheKey) -> Result<Option<Vec<u8>>, StoreError> {
        let k = self.keys(key);
        let mut cmd = redis::cmd("GET");
        cmd.arg(&k.value);
        self.query("read_value", &cmd).await
    }
}

static NEXT_FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("fence.lua"),
        include_str!("next_fence.lua")
    ))
});

fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

fn pttl(ms: i64) -> Duration {
    // -1 (no expiry) cannot happen for our keys; treat it as "long".
    match ms {
        -1 => Duration::from_secs(3600),
        ms if ms > 0 => Duration::from_millis(ms as u64),
        _ => Duration::ZERO,
    }
}

/// An error's text without credentials (redis errors may echo the URL).
pub(crate) fn redact_error(e: &dyn std::fmt::Display) -> String {
    let s = e.to_string();
    match s.find("://") {
        Some(_) => s
            .split_whitespace()
            .map(redact)
            .collect::<Vec<_>>()
            .join(" "),
        None => s,
    }
}

/// A redis error for a log line: credentials redacted, and a rejected login
/// said in plain words (the server's own text is terse).
pub(crate) fn describe(e: &redis::RedisError) -> String {
    let text = redact_error(e);
    let rejected = e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"));
    if rejected {
        format!("authentication failed (check the user and password of the redis url): {text}")
    } else {
        text
    }
}

fn parse_lookup(reply: RedisValue) -> Option<RemoteLookup> {
    let items = match reply {
        RedisValue::Array(items) => items,
        _ => return None,
    };
    let mut it = items.into_iter();
    let status = match it.next()? {
        RedisValue::BulkString(s) => s,
        RedisValue::SimpleString(s) => s.into_bytes(),
        _ => return None,
    };
    let value = match it.next()? {
        RedisValue::BulkString(b) => Bytes::from(b),
        RedisValue::Nil => Bytes::new(),
        _ => return None,
    };
    let mut int = || match it.next() {
        Some(RedisValue::Int(i)) => Some(i),
        _ => None,
    };
    let (fresh, hard, fence, other) = (int()?, int()?, int()?, int()?);
    Some(match status.as_slice() {
        b"fresh" => RemoteLookup::Fresh {
            bytes: value,
            fresh_left: pttl(fresh),
            hard_left: pttl(hard),
        },
        b"stale_leased" => RemoteLookup::Stale {
            bytes: value,
            hard_left: pttl(hard),
            fence: Some(FenceToken(fence as u64)),
        },
        b"stale" => RemoteLookup::Stale {
            bytes: value,
            hard_left: pttl(hard),
            fence: None,
        },
        b"leased" => RemoteLookup::Leased {
            fence: FenceToken(fence as u64),
        },
        b"held" => RemoteLookup::Held {
            lease_left: pttl(other),
        },
        b"pass" => RemoteLookup::Pass { left: pttl(other) },
        b"miss" => RemoteLookup::Miss,
        _ => return None,
    })
}

/// Circuit breaker: open on failure, probe again after a doubling back-off.
#[derive(Debug)]
struct Breaker {
    /// Fast path: a single atomic load while Redis is healthy.
    closed: AtomicBool,
    state: Mutex<BreakerState>,
    min_backoff: Duration,
    max_backoff: Duration,
    /// The `cache` label of the availability gauge and error counter.
    cache: Option<String>,
}

#[derive(Debug)]
struct BreakerState {
    open_until: Instant,
    backoff: Duration,
}

impl Breaker {
    fn new(options: &RedisOptions) -> Self {
        let cache = options.metrics_name.clone();
        crate::metrics::redis_available(cache.as_deref(), true);
        Self {
            closed: AtomicBool::new(true),
            state: Mutex::new(BreakerState {
                open_until: Instant::now(),
                backoff: Duration::ZERO,
            }),
            min_backoff: options.breaker_min_backoff,
            max_backoff: options.breaker_max_backoff,
            cache,
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn would_allow(&self) -> bool {
        self.is_closed()
            || Instant::now()
                >= self
                    .state
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .open_until
    }

    fn allow(&self) -> bool {
        if self.is_closed() {
            return true;
        }
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if now >= s.open_until {
            // Half-open: this call is the probe. The next one may go only
            // after another back-off, so a probe that never settles (its
            // caller was cancelled) cannot wedge the breaker.
            s.open_until = now + s.backoff;
            return true;
        }
        false
    }

    fn success(&self) {
        if self.is_closed() {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.backoff = Duration::ZERO;
        self.closed.store(true, Ordering::Release);
        crate::metrics::redis_available(self.cache.as_deref(), true);
        tracing::info!("redis answers again; using it");
    }

    /// Returns true when this failure opened a closed breaker.
    fn failure(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let was_closed = self.closed.swap(false, Ordering::AcqRel);
        s.backoff = if was_closed || s.backoff.is_zero() {
            self.min_backoff
        } else {
            (s.backoff * 2).min(self.max_backoff)
        };
        s.open_until = Instant::now() + s.backoff;
        crate::metrics::redis_available(self.cache.as_deref(), false);
        was_closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Credentials never survive redaction.
    #[test]
    fn redact_hides_credentials() {
        assert_eq!(
            redact("redis://user:secret@127.0.0.1:6379/0"),
            "redis://***@127.0.0.1:6379/0"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        let opts = RedisOptions::new("rediss://:pw@host:1");
        assert!(!format!("{opts:?}").contains("pw"));
    }

    /// Every key of one entry carries the same hash tag, made only of hex.
    #[test]
    fn keys_share_one_hash_tag() {
        let store = RedisStore::new(RedisOptions::new("redis://127.0.0.1:1")).unwrap();
        let k = store.keys(&CacheKey::new("/{evil}}"));
        let tag = |s: &str| s[s.find('{').unwrap()..=s.find('}').unwrap()].to_owned();
        let t = tag(&k.value);
        assert_eq!(t.len(), 34);
        for name in [&k.fresh, &k.lock, &k.fence, &k.pass] {
            assert_eq!(tag(name), t);
        }
    }

    /// Cluster seed URLs are redacted one by one in Debug output.
    #[test]
    fn cluster_debug_hides_every_password() {
        let opts = RedisOptions::cluster(["redis://:pw-first@h:1", "redis://u:pw-second@h:2"]);
        let shown = format!("{opts:?}");
        assert!(!shown.contains("pw-"), "{shown}");
        assert!(shown.contains("h:1") && shown.contains("cluster: true"));
    }

    /// Several URLs only make sense for a cluster; an empty list is refused.
    #[test]
    fn url_lists_are_validated() {
        let mut several = RedisOptions::new("redis://127.0.0.1:1");
        several.urls.push("redis://127.0.0.1:2".to_owned());
        assert!(RedisStore::new(several).is_err());
        assert!(RedisStore::new(RedisOptions::cluster(Vec::<String>::new())).is_err());
        assert!(RedisStore::new(RedisOptions::cluster(["redis://127.0.0.1:1"])).is_ok());
    }

    /// Without the `tls` feature, `rediss://` is refused with a message naming the feature.
    #[cfg(not(feature = "tls"))]
    #[test]
    fn rediss_needs_the_tls_feature() {
        let err = RedisStore::new(RedisOptions::new("rediss://127.0.0.1:1")).unwrap_err();
        assert!(err.to_string().contains("`tls` feature"), "{err}");
    }

    /// Server errors are sorted by what they say about Redis: a demoted or
    /// loading server, a full one, a foreign value, anything else.
    #[test]
    fn server_errors_are_classified() {
        let class = |reply: &[u8]| {
            let err = redis::parse_redis_value(reply)
                .unwrap()
                .extract_error()
                .unwrap_err();
            ErrorClass::of(&err)
        };
        for reply in [
            &b"-READONLY You can't write against a read only replica. script: x\r\n"[..],
            b"-LOADING Redis is loading the dataset in memory\r\n",
            b"-MASTERDOWN Link with MASTER is down\r\n",
        ] {
            assert_eq!(class(reply), ErrorClass::Role);
        }
        assert_eq!(
            class(b"-OOM command not allowed when used memory > 'maxmemory'.\r\n"),
            ErrorClass::Oom
        );
        assert_eq!(
            class(b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"),
            ErrorClass::Foreign
        );
        assert_eq!(class(b"-ERR something else\r\n"), ErrorClass::Other);
    }

    /// Bad namespaces are refused at build time.
    #[test]
    fn namespace_is_validated() {
        assert!(
            RedisStore::new(RedisOptions::new("redis://127.0.0.1:1").namespace("a{b}")).is_err()
        );
        assert!(RedisStore::new(RedisOptions::new("redis://127.0.0.1:1").namespace("")).is_err());
    }
}
