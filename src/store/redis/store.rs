//! [`RedisStore`], the facade the engine and the locks use: lookups, fenced
//! writes, leases and fill subscriptions of one cache, each one script or
//! command through the connection. Holds no HTTP and no policy.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use deadpool_redis::redis::{self, Value as RedisValue};
use tokio::sync::{mpsc, watch};

use super::connection::Connection;
use super::error::StoreError;
use super::eviction::EvictionWatch;
use super::fills::{run_subscriber, FillSource, FillSubscription, Fills};
use super::keys::EntryKeys;
use super::options::RedisOptions;
use super::purge_bus::{PurgeBus, Subscribe};
use super::scripts::{
    millis, parse_lookup, RemoteLookup, WriteMode, WriteOutcome, EXTEND, FENCED_WRITE_AND_RELEASE,
    LOOKUP_OR_LEASE, NEXT_FENCE, PURGE_ENTRY, RELEASE, SOFT_PURGE_ENTRY,
};
use super::sentinel::watch_switches;
use super::tls;
use crate::entry::envelope::{FENCE_OFFSET, MAGIC, VERSION};
use crate::entry::{FenceToken, LeaseToken};
use crate::error::BuildError;
use crate::key::CacheKey;

/// The payload of a fill notice that carries no entry: read it.
pub(crate) const WAKE: &[u8] = b"wake";

/// A leased fill's keys and purge groups, recorded in its fenced write (see
/// [`RedisStore::write_indexed_and_release`]).
#[derive(Debug)]
pub(crate) struct GroupIndex<'a> {
    /// The fill's own key and its copies'.
    pub(crate) members: &'a [CacheKey],
    /// The groups (URL, tags) to record them in.
    pub(crate) groups: &'a [String],
    /// The entry's lifetime in Redis.
    pub(crate) ttl: Duration,
    /// When the lease was asked for.
    pub(crate) asked: Instant,
}

/// The Redis store of one cache.
pub(crate) struct RedisStore {
    pub(crate) options: RedisOptions,
    pub(super) connection: Connection,
    fills: Arc<Fills>,
    /// Taken by the subscriber task when the first waiter subscribes.
    fill_source: Mutex<Option<(FillSource, mpsc::UnboundedReceiver<CacheKey>)>>,
    entry_prefix: Vec<u8>,
    shutdown: watch::Sender<bool>,
    /// The lease is taken on Redlock nodes, so lookups never lease here.
    lease_elsewhere: bool,
    pub(crate) purge_bus: Arc<PurgeBus>,
    /// Whether the server may evict keys (then entries are checked against
    /// their purge indexes before they are served).
    pub(super) eviction: EvictionWatch,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("options", &self.options)
            .field("available", &self.connection.is_closed())
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
        let (connection, fill_source) = Connection::new(&options)?;
        let (fills, changes) = Fills::new(&options.namespace, options.notice_entry_limit);
        let mut entry_prefix = MAGIC.to_vec();
        entry_prefix.push(VERSION);
        Ok(Self {
            connection,
            fills,
            fill_source: Mutex::new(Some((fill_source, changes))),
            entry_prefix,
            shutdown: watch::channel(false).0,
            lease_elsewhere: false,
            purge_bus: Arc::default(),
            eviction: EvictionWatch::default(),
            options,
        })
    }

    pub(crate) fn keys(&self, key: &CacheKey) -> EntryKeys {
        EntryKeys::new(&self.options.namespace, key)
    }

    /// Whether calls go to Redis now (the breaker is closed, or due a probe).
    /// Does not use up the probe: the call itself does.
    pub(crate) fn available(&self) -> bool {
        self.connection.available()
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
        inv.key(k.value())
            .key(k.lock())
            .key(k.fence())
            .arg(token.as_str())
            .arg(millis(self.options.lease_ttl))
            .arg(if skip_entry { "1" } else { "0" })
            .arg(millis(self.options.fence_retention))
            .arg(&self.entry_prefix[..])
            .arg(if self.lease_elsewhere { "1" } else { "0" })
            .arg(millis(ahead))
            .arg(FENCE_OFFSET);
        let reply: RedisValue = self.invoke("lookup_or_lease", &inv).await?;
        let found = parse_lookup(reply).ok_or(StoreError::Protocol)?;
        let leased = matches!(
            found,
            RemoteLookup::Leased { .. } | RemoteLookup::Stale { fence: Some(_), .. }
        );
        if leased
            && self.options.lease_replicas.is_some()
            && !self.lease_replicated(key, token).await
        {
            // A lease a failover could lose: give it back, and compute here
            // as when Redis is down, so no second leader can follow.
            let _ = self.release(key, token).await;
            return Err(StoreError::Unavailable);
        }
        Ok(found)
    }

    /// Store (or mark pass, or nothing) only if `fence` is newer than the
    /// newest accepted write; release the lease if it is still ours; wake waiters.
    pub(crate) async fn write_and_release(
        &self,
        key: &CacheKey,
        token: &LeaseToken,
        fence: FenceToken,
        mode: WriteMode<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        self.write(key, Some(token), fence, mode, None).await
    }

    /// [`write_and_release`](Self::write_and_release) that also records the
    /// fill's keys in its purge groups, in the same script, and stores
    /// nothing (`purged`) when one of them was purged after the lease
    /// `fence` was issued. Only where [`folds_index`](Self::folds_index);
    /// elsewhere the groups are indexed first, by
    /// [`index_before_write`](Self::index_before_write).
    pub(crate) async fn write_indexed_and_release(
        &self,
        key: &CacheKey,
        token: &LeaseToken,
        fence: FenceToken,
        mode: WriteMode<'_>,
        index: &GroupIndex<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        self.write(key, Some(token), fence, mode, Some(index)).await
    }

    /// Whether a leased fill's purge groups are indexed inside its fenced
    /// write: on a single server, where one script may name every key. A
    /// cluster keeps each index in a slot of its own.
    pub(crate) fn folds_index(&self) -> bool {
        !self.options.cluster
    }

    /// [`write_and_release`](Self::write_and_release) for a write no lease
    /// of this key guards (a Vary copy, a write outside a flight, a
    /// `FencedStore` write): the fence alone decides, and the lease is not
    /// looked at.
    pub(crate) async fn write_unleased(
        &self,
        key: &CacheKey,
        fence: FenceToken,
        mode: WriteMode<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        self.write(key, None, fence, mode, None).await
    }

    async fn write(
        &self,
        key: &CacheKey,
        token: Option<&LeaseToken>,
        fence: FenceToken,
        mode: WriteMode<'_>,
        index: Option<&GroupIndex<'_>>,
    ) -> Result<WriteOutcome, StoreError> {
        let k = self.keys(key);
        let mut carry = false;
        let (mode_name, value, fresh, hard, pass): (&str, &[u8], u64, u64, u64) = match mode {
            WriteMode::Store { bytes, fresh, hard } => {
                carry = bytes.len() <= self.options.notice_entry_limit;
                ("store", bytes, millis(fresh), millis(hard).max(1), 0)
            }
            WriteMode::Pass { ttl } => ("pass", &[], 0, 0, millis(ttl).max(1)),
            WriteMode::Release => ("release", &[], 0, 0, 0),
        };
        // The two unused key slots get `v` again: the script's KEYS keep
        // their places, and every key named is in the entry's slot.
        let mut inv = FENCED_WRITE_AND_RELEASE.prepare_invoke();
        inv.key(k.value())
            .key(k.value())
            .key(k.lock())
            .key(k.fence())
            .key(k.value())
            .arg(token.map_or("", LeaseToken::as_str))
            .arg(fence.0)
            .arg(mode_name)
            .arg(value)
            .arg(fresh)
            .arg(hard)
            .arg(self.fills.channel(key))
            .arg(WAKE)
            .arg(millis(self.options.fence_retention))
            .arg(pass)
            .arg(&self.entry_prefix[..])
            .arg(FENCE_OFFSET)
            .arg(if carry { "1" } else { "0" })
            .arg(if self.lease_elsewhere { "0" } else { "1" });
        if let Some(index) = index.filter(|i| !i.groups.is_empty()) {
            self.fold_index(&mut inv, index);
        }
        let (accepted, released): (i64, i64) = match self.invoke("write_and_release", &inv).await {
            Ok(reply) => reply,
            Err(e) => {
                if let (true, Some(token)) = (e.is_oom(), token) {
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
            kept: accepted == 2,
            purged: accepted == 3,
        })
    }

    /// Whether the lease of `key` is still held by `holder` (one GET): a
    /// waiter's check, after its fill subscription is in place, that the
    /// fill it waits for has not landed meanwhile.
    pub(crate) async fn lease_held_by(
        &self,
        key: &CacheKey,
        holder: &[u8],
    ) -> Result<bool, StoreError> {
        let k = self.keys(key);
        let mut cmd = redis::cmd("GET");
        cmd.arg(k.lock());
        let now: Option<Vec<u8>> = self.query("lease_held_by", &cmd).await?;
        Ok(now.is_some_and(|t| t == holder))
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
        inv.key(k.lock()).arg(token.as_str()).arg(millis(ttl));
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
        inv.key(k.lock()).arg(token.as_str());
        let n: i64 = self.invoke("release", &inv).await?;
        Ok(n == 1)
    }

    /// Remove an entry (not its lease) from Redis, and raise its fence so no
    /// fill that leased before the purge can store its answer after it.
    pub(crate) async fn purge(&self, key: &CacheKey) -> Result<(), StoreError> {
        let k = self.keys(key);
        let mut inv = PURGE_ENTRY.prepare_invoke();
        inv.key(k.value())
            .key(k.fresh())
            .key(k.pass())
            .key(k.fence())
            .key(k.lock())
            .arg(millis(self.options.fence_retention));
        let _: i64 = self.invoke("purge", &inv).await?;
        Ok(())
    }

    /// Soft-purge one entry: kept, stale from now on (deleted when it may
    /// not be served stale), its fence raised as by [`purge`](Self::purge).
    pub(crate) async fn soft_purge(&self, key: &CacheKey) -> Result<(), StoreError> {
        let k = self.keys(key);
        let mut inv = SOFT_PURGE_ENTRY.prepare_invoke();
        inv.key(k.value())
            .key(k.fresh())
            .key(k.pass())
            .key(k.fence())
            .key(k.lock())
            .arg(millis(self.options.fence_retention))
            .arg(&self.entry_prefix[..]);
        let _: i64 = self.invoke("soft_purge", &inv).await?;
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
                    self.connection.renew_signal(),
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
        self.connection.invoke(op, inv).await
    }

    /// A command under the store's timeouts and breaker.
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        op: &'static str,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        self.connection.query(op, cmd).await
    }

    /// Where classic pub/sub (purge notices) subscribes: the primary the
    /// sentinels name, or [`pubsub_clients`](Self::pubsub_clients).
    pub(super) fn pubsub_source(&self) -> Result<Subscribe, StoreError> {
        match self.connection.sentinel_master() {
            Some(master) => Ok(Subscribe::Primary(master)),
            None => self.pubsub_clients().map(Subscribe::To),
        }
    }

    /// Behind Sentinel, start watching the sentinels for `+switch-master`
    /// (once, inside a runtime).
    pub(super) fn watch_sentinels(&self) {
        if let Some(master) = self.connection.sentinel_master() {
            watch_switches(
                &master,
                &self.connection.renew_signal(),
                &self.shutdown_signal(),
            );
        }
    }

    /// Clients for classic pub/sub (purge notices): on the URL of a
    /// standalone Redis, or one per seed of a cluster, where a PUBLISH
    /// reaches every node, so any live one will do.
    pub(crate) fn pubsub_clients(&self) -> Result<Vec<redis::Client>, StoreError> {
        let urls = if self.options.cluster {
            &self.options.urls[..]
        } else {
            &self.options.urls[..self.options.urls.len().min(1)]
        };
        urls.iter()
            .map(|url| {
                let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                    .map_err(StoreError::Redis)?;
                #[cfg(feature = "tls")]
                let root_cert = self.options.tls_root_cert.as_deref();
                #[cfg(not(feature = "tls"))]
                let root_cert = None;
                tls::client(info, root_cert).map_err(StoreError::Redis)
            })
            .collect()
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
        cmd.arg(k.lock())
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
        inv.key(k.fence()).arg(millis(self.options.fence_retention));
        let n: i64 = self.invoke("next_fence", &inv).await?;
        Ok(FenceToken(n.max(0) as u64))
    }

    /// The stored bytes of `key`, if any (no freshness check).
    pub(crate) async fn read_value(&self, key: &CacheKey) -> Result<Option<Vec<u8>>, StoreError> {
        let k = self.keys(key);
        let mut cmd = redis::cmd("GET");
        cmd.arg(k.value());
        self.query("read_value", &cmd).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key of one entry carries the same hash tag, made only of hex.
    #[test]
    fn keys_share_one_hash_tag() {
        let store = RedisStore::new(RedisOptions::new("redis://127.0.0.1:1")).unwrap();
        let k = store.keys(&CacheKey::new("/{evil}}"));
        let tag = |s: &str| s[s.find('{').unwrap()..=s.find('}').unwrap()].to_owned();
        let t = tag(k.value());
        assert_eq!(t.len(), 34);
        for name in [k.fresh(), k.lock(), k.fence(), k.pass()] {
            assert_eq!(tag(name), t);
        }
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

    /// Bad namespaces are refused at build time.
    #[test]
    fn namespace_is_validated() {
        assert!(
            RedisStore::new(RedisOptions::new("redis://127.0.0.1:1").namespace("a{b}")).is_err()
        );
        assert!(RedisStore::new(RedisOptions::new("redis://127.0.0.1:1").namespace("")).is_err());
    }
}
