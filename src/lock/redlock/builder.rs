//! [`RedlockBuilder`]: a [`Redlock`]'s settings (nodes, namespace, TTL,
//! per-node timeout, drift, retries) and the checks made when it is built.

use std::time::Duration;

use super::Redlock;
use crate::error::BuildError;
use crate::lock;
use crate::store::redis::{RedisOptions, RedisStore};

impl Redlock {
    /// A builder for the masters at `urls` (N odd, typically 5).
    pub fn builder<I, S>(urls: I) -> RedlockBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedlockBuilder {
            urls: urls.into_iter().map(Into::into).collect(),
            node_options: None,
            namespace: "herdguard".to_owned(),
            // The same default as `RedisOptions::lease_ttl`.
            ttl: Duration::from_secs(5),
            node_timeout: None,
            drift: 0.01,
            retries: 3,
            retry_delay: Duration::from_millis(100),
        }
    }
}

/// Configures a [`Redlock`].
#[derive(Debug, Clone)]
pub struct RedlockBuilder {
    urls: Vec<String>,
    /// Connection settings every node takes (TLS root, connect timeout …).
    node_options: Option<RedisOptions>,
    namespace: String,
    ttl: Duration,
    node_timeout: Option<Duration>,
    drift: f64,
    retries: u32,
    retry_delay: Duration,
}

impl RedlockBuilder {
    /// Key namespace on every node (default `herdguard`).
    #[must_use]
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = ns.into();
        self
    }

    /// Connection settings for every node, as for the main Redis: the TLS
    /// root certificate of a private CA
    /// ([`RedisOptions::tls_root_cert_pem`], for `rediss://` nodes), the
    /// connect timeout, and the rest of [`RedisOptions`]. The URL of each
    /// node is its own; the namespace is [`namespace`](Self::namespace)'s;
    /// the per-call timeouts are [`node_timeout`](Self::node_timeout)'s, one
    /// connection per node, and the breaker back-off (100 ms to 2 s) stays
    /// short, since a quorum needs its nodes back soon. The template's own
    /// URL is ignored.
    ///
    /// ```
    /// use std::time::Duration;
    /// use herdguard::RedisOptions;
    /// use herdguard::redlock::Redlock;
    ///
    /// let template = RedisOptions::new("redis://ignored").connect_timeout(Duration::from_millis(300));
    /// let lock = Redlock::builder(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])
    ///     .node_options(template)
    ///     .build()?;
    /// # let _ = lock; Ok::<(), herdguard::BuildError>(())
    /// ```
    #[must_use]
    pub fn node_options(mut self, template: RedisOptions) -> Self {
        self.node_options = Some(template);
        self
    }

    /// Lease lifetime (default 5 s, as
    /// [`RedisOptions::lease_ttl`](crate::RedisOptions::lease_ttl)).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Per-node bound on each call (default TTL/100, clamped to 5–50 ms), so
    /// a slow or frozen node never stalls an acquisition.
    #[must_use]
    pub fn node_timeout(mut self, t: Duration) -> Self {
        self.node_timeout = Some(t);
        self
    }

    /// Clock drift factor (default 0.01): validity loses TTL × drift + 2 ms.
    #[must_use]
    pub fn drift(mut self, factor: f64) -> Self {
        self.drift = factor;
        self
    }

    /// Attempts after the first (default 3), each after a random delay up to
    /// `delay` (default 100 ms).
    #[must_use]
    pub fn retries(mut self, retries: u32, delay: Duration) -> Self {
        self.retries = retries;
        self.retry_delay = delay;
        self
    }

    /// Build; nothing connects until the first acquisition.
    ///
    /// # Errors
    /// [`BuildError`] for an even or zero node count, an invalid URL or
    /// namespace, or a drift outside `0..0.5`.
    pub fn build(self) -> Result<Redlock, BuildError> {
        let n = self.urls.len();
        if n == 0 || n.is_multiple_of(2) {
            return Err(BuildError::invalid(
                "Redlock::builder",
                format!("redlock needs an odd number of independent masters, got {n}"),
            ));
        }
        if !(0.0..0.5).contains(&self.drift) {
            return Err(BuildError::invalid(
                "RedlockBuilder::drift",
                "must be in 0..0.5",
            ));
        }
        let node_timeout = self.node_timeout.unwrap_or_else(|| {
            (self.ttl / 100).clamp(Duration::from_millis(5), Duration::from_millis(50))
        });
        let nodes = self
            .urls
            .iter()
            .map(|url| {
                let opts = match &self.node_options {
                    Some(template) => template.clone().for_node(url),
                    None => RedisOptions::new(url.as_str()),
                };
                let opts = opts
                    .namespace(self.namespace.clone())
                    .connections(1)
                    .response_timeout(node_timeout)
                    .pool_wait_timeout(node_timeout)
                    .breaker_backoff(Duration::from_millis(100), Duration::from_secs(2));
                RedisStore::new(opts)
            })
            .collect::<Result<Vec<_>, _>>()?;
        lock::register_metrics();
        Ok(Redlock {
            nodes: nodes.into(),
            quorum: n / 2 + 1,
            ttl: self.ttl,
            node_timeout,
            drift: self.drift,
            retries: self.retries,
            retry_delay: self.retry_delay,
        })
    }
}
