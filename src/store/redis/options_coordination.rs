//! The [`RedisOptions`] settings for how the instances on one Redis work
//! together: leases and their watchdog, waiting for another's fill (polls,
//! fill notices), the cluster's origin budget and breaker, leases that must
//! survive a failover. Kept apart from the connection settings in
//! `options.rs`; the fields stay there.

use std::time::Duration;

use super::options::RedisOptions;

impl RedisOptions {
    /// Lease lifetime (default 5 s). A dead leader blocks a key at most this long.
    #[must_use]
    pub fn lease_ttl(mut self, t: Duration) -> Self {
        self.lease_ttl = t;
        self
    }

    /// Poll interval of a waiter in case a fill notification is lost (default 200 ms).
    ///
    /// Waiters are woken by the fill notification; this poll is only the
    /// fallback. A waiter never sleeps longer than one lease TTL, so a
    /// leader that dies is noticed at most a lease TTL (or one poll, if
    /// shorter) after its lease ends, whatever the poll.
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

    /// The largest entry (encoded bytes: body, headers and a 52-byte
    /// envelope) that rides in its fill notice (default 64 KiB; 0: none).
    ///
    /// When a leader stores an entry, the other instances waiting for it
    /// are told over sharded pub/sub. An entry up to this size is in the
    /// notice itself, checksummed as stored, so each waiting instance is
    /// answered with no further Redis read; a larger one is read once per
    /// waiting instance. A notice is never trusted over the fence: one that
    /// carries an older write than an instance already holds is ignored.
    /// Every subscribed instance receives the notice, so the bound caps the
    /// bytes one fill sends per waiting instance.
    ///
    /// ```
    /// use herdguard::RedisOptions;
    /// // Large pages: notices announce them; each waiting instance reads once.
    /// let opts = RedisOptions::new("redis://127.0.0.1:6379").notice_entry_limit(16 * 1024);
    /// # let _ = opts;
    /// ```
    #[must_use]
    pub fn notice_entry_limit(mut self, bytes: usize) -> Self {
        self.notice_entry_limit = bytes;
        self
    }

    /// Most origin calls all instances on this Redis (and namespace) make
    /// at once, on top of each instance's own
    /// [`origin_budget`](crate::CacheLayerBuilder::origin_budget) (default:
    /// none). Each call takes a permit in Redis (one round trip) and gives
    /// it back when it ends; a permit also expires on its own a second
    /// after the [origin timeout](crate::CacheLayerBuilder::origin_timeout),
    /// so an instance that dies holding permits frees them. A call somebody
    /// waits for asks again (every 5 ms, backing off to 100 ms) until
    /// `max_wait`, then gets `503`; a background refresh asks once and is
    /// skipped. If Redis does not answer, the instance's own budget stands
    /// alone. At least 1.
    ///
    /// ```
    /// use herdguard::RedisOptions;
    /// // Four instances, one database that takes 32 queries at once.
    /// let opts = RedisOptions::new("redis://127.0.0.1:6379").cluster_origin_budget(32);
    /// # let _ = opts;
    /// ```
    #[must_use]
    pub fn cluster_origin_budget(mut self, permits: usize) -> Self {
        self.cluster_origin_budget = Some(permits.max(1));
        self
    }

    /// Whether the origin breaker's probe is elected for the whole cluster
    /// (default on): while the origin is down, one instance on this Redis
    /// probes it per interval, and an origin found back closes every
    /// instance's breaker at its next due probe. Off, each instance probes
    /// on its own.
    #[must_use]
    pub fn share_origin_breaker(mut self, on: bool) -> Self {
        self.share_origin_breaker = on;
        self
    }

    /// After taking a lease, wait until `replicas` replicas have it, at most
    /// `timeout` (`WAIT`; default: do not wait), so a failover cannot lose
    /// a lease its leader started work under.
    ///
    /// Replication is asynchronous: a primary that dies right after a lease
    /// may not have passed it on, and the replica promoted in its place then
    /// hands the same key's lease to a second leader (the fence still orders
    /// their writes, so this costs an origin call, not a wrong answer). With
    /// this set, a leader calls the origin only once `replicas` replicas
    /// acknowledged its lease. When fewer do within `timeout` (replicas
    /// down or lagging), the lease is given back and the instance computes
    /// the answer on its own, as when Redis is down: no second leader is
    /// possible, but instances stop coalescing with each other until the
    /// replicas catch up. The wait runs on a connection of its own, so it
    /// holds up no other command. A purge, too, is answered
    /// `Purged::Redis` only once `replicas` replicas have it, else
    /// `Purged::Unconfirmed` (done on the primary, but a failover now would
    /// lose it).
    ///
    /// It costs every leader fill two round trips on that connection (a
    /// token-checked `PEXPIRE` of the lease, then `WAIT`) plus the
    /// replicas' acknowledgement. Use it where a second origin call after a
    /// failover is expensive (a slow or metered origin); not on Redis
    /// Cluster (refused when the layer is built).
    ///
    /// ```
    /// use std::time::Duration;
    /// use herdguard::RedisOptions;
    /// let opts = RedisOptions::sentinel("mymaster", ["redis://10.0.0.1:26379"])
    ///     .lease_replicas(1, Duration::from_millis(50));
    /// # let _ = opts;
    /// ```
    #[must_use]
    pub fn lease_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.lease_replicas = Some((replicas, timeout));
        self
    }

    /// Whether to extend the lease while the origin works (default on).
    #[must_use]
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }
}
