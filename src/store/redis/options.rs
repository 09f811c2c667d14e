//! [`RedisOptions`]: how to reach Redis and how to use it, with the checks
//! made when a store is built. Plain data: opens no connection. The settings
//! for how instances work together (leases, fill waits, the cluster's origin
//! budget and breaker) are in `options_coordination.rs`.

#[cfg(feature = "tls")]
use std::sync::Arc;
use std::time::Duration;

use super::tls;
use crate::error::BuildError;

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
/// # Redis Sentinel
///
/// [`RedisOptions::sentinel`] takes the name the sentinels monitor the
/// primary under and the URLs of some sentinels. The primary is asked of the
/// sentinels on every connect and checked (`INFO replication` must say
/// `role:master`) on the connection that will carry the commands, so a
/// sentinel that has not heard of a failover yet cannot send writes to the
/// old primary. The store also subscribes to `+switch-master` on every
/// sentinel: when they promote a replica, every connection (the fill and
/// purge subscribers' too) moves to it without a restart, and a `READONLY`
/// or broken connection seen first does the same. While no primary is known
/// the layer fails open, as when Redis is down.
///
/// The sentinel URLs carry the sentinels' own credentials and TLS
/// (`rediss://`); the data nodes are reached as
/// [`node_url`](Self::node_url) says (scheme, credentials, database).
///
/// ```
/// use herdguard::RedisOptions;
/// let opts = RedisOptions::sentinel(
///     "mymaster",
///     [
///         "redis://10.0.0.1:26379",
///         "redis://10.0.0.2:26379",
///         "redis://10.0.0.3:26379",
///     ],
/// )
/// .node_url("redis://herdguard:secret@primary/0");
/// assert!(opts.is_sentinel());
/// ```
///
/// A failover is where a single primary's lease is weakest: replication is
/// asynchronous, so a promoted replica may not have seen a lease that was
/// just taken, and a second leader may start. The fence still orders their
/// writes (an older fill never replaces a newer one); see the failure table
/// in the crate docs for what a failover costs.
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
    /// Standalone: one URL. Cluster: the seed nodes. Sentinel: the sentinels.
    pub(crate) urls: Vec<String>,
    pub(crate) cluster: bool,
    /// The master name the sentinels monitor, for a store behind Sentinel.
    pub(crate) sentinel_master: Option<String>,
    /// Behind Sentinel: how to reach the data nodes (host and port replaced).
    pub(crate) node_url: String,
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
    /// How long a fence mark (a purge's, a lease's) must outlive its event:
    /// as long as a fill that leased before it may still write, so the
    /// origin timeout plus the lease. A written entry's fence is kept for its
    /// hard expiry plus this. The engine sets it from its own origin
    /// timeout; a lost mark restarts from the server clock, above every
    /// token issued before.
    pub(crate) fence_retention: Duration,
    /// After taking a lease: `WAIT` for this many replicas, at most this long.
    pub(crate) lease_replicas: Option<(usize, Duration)>,
    /// Entries up to this many encoded bytes ride in their fill notice.
    pub(crate) notice_entry_limit: usize,
    /// The `cache` label of this store's metrics: the layer's name, or none
    /// for a store outside a layer.
    pub(crate) metrics_name: Option<String>,
    /// The cluster's origin budget (`None`: each instance's own alone).
    pub(crate) cluster_origin_budget: Option<usize>,
    /// The origin breaker's probe is elected for every instance on this Redis.
    pub(crate) share_origin_breaker: bool,
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|u| redact(u)).collect();
        let mut d = f.debug_struct("RedisOptions");
        d.field("urls", &urls)
            .field("cluster", &self.cluster)
            .field("sentinel_master", &self.sentinel_master)
            .field("node_url", &redact(&self.node_url))
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
    /// The namespace of every key unless [`namespace`](Self::namespace)
    /// sets another: `herdguard`.
    pub const DEFAULT_NAMESPACE: &'static str = "herdguard";

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
    /// Purge notices are heard on any one seed that is up (tried in turn),
    /// so give more than one.
    pub fn cluster<I, U>(urls: I) -> Self
    where
        I: IntoIterator<Item = U>,
        U: Into<String>,
    {
        Self::with_urls(urls.into_iter().map(Into::into).collect(), true)
    }

    /// Options for the primary the sentinels at `sentinel_urls` monitor as
    /// `master_name` (see [Redis Sentinel](Self#redis-sentinel)). Same
    /// defaults as [`RedisOptions::new`]; the data nodes are reached over
    /// `redis://` without credentials unless [`node_url`](Self::node_url)
    /// says otherwise. Give every sentinel: any one that answers names the
    /// primary, and each one is watched for `+switch-master`.
    pub fn sentinel<I, U>(master_name: impl Into<String>, sentinel_urls: I) -> Self
    where
        I: IntoIterator<Item = U>,
        U: Into<String>,
    {
        let mut opts = Self::with_urls(sentinel_urls.into_iter().map(Into::into).collect(), false);
        opts.sentinel_master = Some(master_name.into());
        opts
    }

    /// Behind Sentinel, how to reach the data nodes: a `redis://` or
    /// `rediss://` URL whose scheme, credentials and database are used, and
    /// whose host and port are replaced by the primary's (default
    /// `redis://localhost`: no TLS, no credentials, database 0). The
    /// sentinels' own credentials go in their URLs. Ignored elsewhere.
    #[must_use]
    pub fn node_url(mut self, url: impl Into<String>) -> Self {
        self.node_url = url.into();
        self
    }

    fn with_urls(urls: Vec<String>, cluster: bool) -> Self {
        Self {
            urls,
            cluster,
            sentinel_master: None,
            node_url: "redis://localhost".to_owned(),
            #[cfg(feature = "tls")]
            tls_root_cert: None,
            namespace: Self::DEFAULT_NAMESPACE.to_owned(),
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
            // The engine's default origin timeout plus the default lease.
            fence_retention: Duration::from_secs(65),
            notice_entry_limit: 64 * 1024,
            lease_replicas: None,
            metrics_name: None,
            cluster_origin_budget: None,
            share_origin_breaker: true,
        }
    }

    /// A fill writes at most `longest` after it leased: fence marks and
    /// purge stamps are kept that long plus the lease.
    pub(crate) fn fills_last(mut self, longest: Duration) -> Self {
        self.fence_retention = longest.saturating_add(self.lease_ttl);
        self
    }

    /// These options for one standalone node at `url` (a Redlock node).
    pub(crate) fn for_node(mut self, url: &str) -> Self {
        self.urls = vec![url.to_owned()];
        self.cluster = false;
        self.sentinel_master = None;
        self
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

    /// Whether these options reach the primary through Redis Sentinel.
    pub fn is_sentinel(&self) -> bool {
        self.sentinel_master.is_some()
    }

    pub(super) fn validate(&self) -> Result<(), BuildError> {
        if self.urls.is_empty() || self.urls.iter().any(|u| u.trim().is_empty()) {
            return Err(BuildError::invalid(
                "RedisOptions::new",
                "redis needs at least one non-empty url",
            ));
        }
        if self
            .sentinel_master
            .as_ref()
            .is_some_and(|m| m.trim().is_empty())
        {
            return Err(BuildError::invalid(
                "RedisOptions::sentinel",
                "the sentinel master name must not be empty",
            ));
        }
        if !self.cluster && !self.is_sentinel() && self.urls.len() > 1 {
            return Err(BuildError::invalid(
                "RedisOptions::cluster",
                "several redis urls need RedisOptions::cluster",
            ));
        }
        tls::check_available(&self.urls)?;
        if self.is_sentinel() {
            tls::check_available(std::slice::from_ref(&self.node_url))?;
        }
        let ns = &self.namespace;
        let ok = !ns.is_empty()
            && ns.len() <= 64
            && ns
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b));
        if !ok {
            return Err(BuildError::invalid(
                "RedisOptions::namespace",
                format!(
                    "redis namespace {ns:?} must be 1-64 characters of letters, digits, '_', '-', '.', ':'"
                ),
            ));
        }
        if let Some((replicas, timeout)) = self.lease_replicas {
            if self.cluster || replicas == 0 || timeout.is_zero() {
                return Err(BuildError::invalid(
                    "RedisOptions::lease_replicas",
                    "lease_replicas needs one primary (not a cluster), at least one replica and a timeout above zero",
                ));
            }
        }
        if self.lease_ttl < Duration::from_millis(30) {
            return Err(BuildError::invalid(
                "RedisOptions::lease_ttl",
                "lease ttl must be at least 30 ms",
            ));
        }
        for (name, d) in [
            ("RedisOptions::connect_timeout", self.connect_timeout),
            ("RedisOptions::response_timeout", self.response_timeout),
            ("RedisOptions::pool_wait_timeout", self.pool_wait_timeout),
            ("RedisOptions::poll_interval", self.poll_interval),
            (
                "RedisOptions::fallback_poll_interval",
                self.fallback_poll_interval,
            ),
        ] {
            if d.is_zero() {
                return Err(BuildError::invalid(name, "must be above zero"));
            }
        }
        Ok(())
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

    /// Cluster seed URLs are redacted one by one in Debug output.
    #[test]
    fn cluster_debug_hides_every_password() {
        let opts = RedisOptions::cluster(["redis://:pw-first@h:1", "redis://u:pw-second@h:2"]);
        let shown = format!("{opts:?}");
        assert!(!shown.contains("pw-"), "{shown}");
        assert!(shown.contains("h:1") && shown.contains("cluster: true"));
    }
}
