//! Purges in Redis: group indexes (URL and `Surrogate-Key` tags) walked in
//! batches, and the notice every instance hears. Local memory is not cleared
//! here: the purge bus hands notices to the handler the layer installed.
//!
//! A group index `{ns}:g:{G}` (`G` a hash of the group's name) is a sorted
//! set of entry keys scored by when each entry expires. Writes trim the
//! expired members, so an index holds the group's live entries only, and the
//! index key itself expires with its last entry. A purge walks it in batches.
//!
//! A purge stamps the group (`{ns}:g:{G}:p`, the server time) before it
//! reads the index, and a fill records its keys in the index before its
//! fenced write, reading the stamp in the same script: a fill either is in
//! the index when the purge reads it (and the purge raises its fences) or
//! sees the stamp (and stores nothing). So a purge holds against a first
//! fill it could not yet find, without its notice. On a single server a
//! leased fill does both inside its fenced write instead (see
//! [`GroupIndex`]): one script, and the purge is either wholly before the
//! write or wholly after it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis;
use futures_util::future::join_all;
use tokio::time::Instant;

use super::error::StoreError;
use super::purge_bus::{frame, listen, Listener, PurgeHandler};
use super::scripts::{millis, INDEX_GROUP, PURGE_GROUP};
use super::store::{GroupIndex, RedisStore};
use crate::entry::FenceToken;
use crate::key::CacheKey;

/// Members purged per batch: each batch is a few round trips under the reply
/// timeout, so a group of any size never blocks Redis or trips the breaker.
const PURGE_BATCH: usize = 256;

/// How long an index lists an entry past the lifetime it was written with.
const INDEX_MARGIN: Duration = Duration::from_secs(1);

/// How far above a purge stamp (server clock, µs) a lease's fence token
/// must be to count as issued after it on the same server: a token runs
/// ahead of that clock only by the tokens of its key issued within one
/// microsecond (one per script run, so by a few at most), and one issued
/// in the stamp's own microsecond before it is one above.
const STAMP_MARGIN_US: u64 = 1_000;

/// How long a soft purge waits between stamping its group and marking the
/// entries stale, on a single server: longer than [`STAMP_MARGIN_US`] by
/// this process's clock, so the server's clock has passed it too, and every
/// refresh that leases once an entry is stale holds a token above the
/// stamp by more than the margin (see
/// [`index_before_write`](RedisStore::index_before_write)). Measured on the
/// real clock: under paused tokio time a timer would fire at once.
const SOFT_PURGE_GAP: std::time::Duration = std::time::Duration::from_millis(2);

/// An index lists an entry this long past `ttl`, in milliseconds: it is
/// scored before the entry is written, so a member must outlive its entry
/// (see [`RedisStore::anchored`]).
fn index_ttl_ms(ttl: Duration) -> u64 {
    (ttl + INDEX_MARGIN).as_millis().clamp(1, u64::MAX as u128) as u64
}

impl RedisStore {
    /// Add `index` to a fenced write's invocation: each group's index and
    /// stamp keys after the write's own five, and the scoring and member
    /// arguments after its own (see fenced_write.lua).
    pub(super) fn fold_index(&self, inv: &mut redis::ScriptInvocation<'_>, index: &GroupIndex<'_>) {
        for g in index.groups {
            inv.key(self.group_key(g)).key(self.group_stamp_key(g));
        }
        let since = index.asked.elapsed().as_millis().min(u64::MAX as u128) as u64;
        inv.arg(index_ttl_ms(index.ttl))
            .arg(since)
            .arg(STAMP_MARGIN_US);
        for m in index.members {
            inv.arg(m.to_hex());
        }
    }

    fn group_key(&self, group: &str) -> String {
        // Hashed: no request or tag text reaches a key name or picks a slot.
        format!(
            "{}:g:{{{}}}",
            self.options.namespace,
            CacheKey::new(group).to_hex()
        )
    }

    /// The plain set an older version kept a group in (same slot).
    fn legacy_group_key(&self, group: &str) -> String {
        format!("{}:set", self.group_key(group))
    }

    fn purge_channel(&self) -> String {
        format!("{}:purge", self.options.namespace)
    }

    /// The key a group's last purge is stamped in (same slot as its index).
    fn group_stamp_key(&self, group: &str) -> String {
        format!("{}:p", self.group_key(group))
    }

    /// Record `members` (one fill's keys) in each group, kept at least
    /// `ttl`, before the fill is written; and say whether one of the groups
    /// was purged after `asked` (the moment the fill's lease was asked
    /// for). Then the fill must not be stored: the purge may have read the
    /// index before these members were in it.
    ///
    /// The comparison is made on each group's own server clock: its time
    /// now, less the time this process saw pass since `asked` (measured
    /// after the reply, so it is never less than what passed there). That
    /// errs on the safe side by the reply time, so a fill that asked just
    /// after the stamp would count as older. `leased` settles it on a
    /// single server: the fence token of the lease, issued there after
    /// `asked` and before the computation started, is a reading of the
    /// same clock the stamp was (see fence.lua), so a token more than
    /// [`STAMP_MARGIN_US`] above the stamp was issued after it and the fill
    /// is stored. A cluster keeps the index and the entry on different
    /// nodes, whose clocks are not comparable: there, and for a fill whose
    /// token was taken after its computation (`None`), the time rule alone
    /// decides.
    pub(crate) async fn index_before_write(
        &self,
        members: &[CacheKey],
        groups: &[String],
        ttl: Duration,
        asked: Instant,
        leased: Option<FenceToken>,
    ) -> Result<bool, StoreError> {
        // Past the entry's own expiry by a margin: it is written after this
        // call, so it outlives a member scored by its lifetime alone, and a
        // member trimmed while its entry is still there would make the entry
        // unlisted (see `anchored`).
        let ttl_ms = index_ttl_ms(ttl);
        let replies = join_all(groups.iter().map(|g| {
            let mut inv = INDEX_GROUP.prepare_invoke();
            inv.key(self.group_key(g))
                .key(self.group_stamp_key(g))
                .arg(ttl_ms);
            for m in members {
                inv.arg(m.to_hex());
            }
            async move {
                let reply: Result<(i64, i64), _> = self.invoke("index", &inv).await;
                reply.map(|(stamp, now)| {
                    let since = asked.elapsed().as_micros().min(i64::MAX as u128) as i64;
                    let after = leased.filter(|_| !self.options.cluster).is_some_and(|t| {
                        t.0 > (stamp.max(0) as u64).saturating_add(STAMP_MARGIN_US)
                    });
                    stamp > 0 && stamp >= now.saturating_sub(since) && !after
                })
            }
        }))
        .await;
        let mut purged = false;
        for r in replies {
            purged |= r?;
        }
        Ok(purged)
    }

    /// Whether the entry Redis holds under `key` may be served: on a server
    /// that may evict keys, only while each of its `groups` (URL, tags)
    /// still lists it in its index. A purge finds an entry through those
    /// indexes and drops it from them, so an entry none of them lists (its
    /// index evicted, or the purge found it and a fill from before the purge
    /// landed after its fence was evicted too) might have been purged: it
    /// is taken as a miss and filled anew, which indexes it again. Eviction
    /// so takes an entry whole. A server that cannot evict is spared the
    /// round trip; one whose policy is not known yet, or whose index cannot
    /// be read now, is not (the entry then counts as unlisted).
    pub(crate) async fn anchored(&self, key: &CacheKey, groups: &[String]) -> bool {
        if groups.is_empty() {
            return true;
        }
        if self.eviction.claim_reading() {
            let mut info = redis::cmd("INFO");
            info.arg("memory");
            // A cluster answers for each node (a map); any reply counts as
            // a success for the breaker, whatever its shape.
            let read: Result<redis::Value, _> = self.query("info", &info).await;
            self.eviction.record(read.ok().as_ref());
        }
        if !self.eviction.may_evict() {
            return true;
        }
        let member = key.to_hex();
        let scores = join_all(groups.iter().map(|g| {
            let mut cmd = redis::cmd("ZSCORE");
            cmd.arg(self.group_key(g)).arg(&member);
            async move { self.query::<Option<f64>>("anchored", &cmd).await }
        }))
        .await;
        scores.into_iter().all(|s| matches!(s, Ok(Some(_))))
    }

    /// Delete every entry indexed under `group`, walking the index in
    /// batches of [`PURGE_BATCH`]: read a batch, purge its entries, then drop
    /// them from the index. A failed batch stops the walk with its members
    /// still indexed, so a later purge finds them. The group is stamped
    /// purged first, so a fill not yet indexed stores nothing (see
    /// [`index_before_write`](Self::index_before_write)).
    ///
    /// The error says whether nothing at all was done (the first call did
    /// not reach Redis).
    pub(crate) async fn purge_group(&self, group: &str) -> Result<(), (StoreError, bool)> {
        let index = self.group_key(group);
        let mut start = PURGE_GROUP.prepare_invoke();
        start
            .key(&index)
            .key(self.group_stamp_key(group))
            .arg(millis(self.options.fence_retention).max(1));
        let (kind, count): (String, usize) = match self.invoke("purge_group", &start).await {
            Ok(reply) => reply,
            Err(e) => {
                let nothing = e.did_nothing();
                return Err((e, nothing));
            }
        };
        self.walk_group(group, &kind, count)
            .await
            .map_err(|e| (e, false))
    }

    /// Soft-purge every entry indexed under `group` (and `first`, a key
    /// purged on its own, right after the stamp: a key purge's own key).
    /// The group is stamped first, as for [`purge_group`](Self::purge_group),
    /// so a fill that asked for its lease before stores nothing; a refresh
    /// that asks after the stamp (after the entry went stale) stores its
    /// answer. On a single server the entries are marked only
    /// [`SOFT_PURGE_GAP`] after the stamp, so that refresh's token dates it
    /// after the stamp beyond doubt: exactly one refresh runs. Members stay
    /// in the index (their entries are still there,
    /// and a later purge must find them), so the walk is a `ZSCAN`: every
    /// member indexed for the whole walk is visited, whatever fills and
    /// trims do to the index meanwhile. `first` is not visited twice: a
    /// second soft purge of it could catch the refresh that already landed.
    ///
    /// The error says whether nothing at all was done.
    pub(crate) async fn soft_purge_group(
        &self,
        group: &str,
        first: Option<&CacheKey>,
    ) -> Result<(), (StoreError, bool)> {
        let index = self.group_key(group);
        let mut start = PURGE_GROUP.prepare_invoke();
        start
            .key(&index)
            .key(self.group_stamp_key(group))
            .arg(millis(self.options.fence_retention).max(1));
        let (kind, _count): (String, usize) = match self.invoke("purge_group", &start).await {
            Ok(reply) => reply,
            Err(e) => {
                let nothing = e.did_nothing();
                return Err((e, nothing));
            }
        };
        let fail = |e| (e, false);
        if !self.options.cluster {
            let until = std::time::Instant::now() + SOFT_PURGE_GAP;
            loop {
                let left = until.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                tokio::time::sleep(left).await;
            }
        }
        if let Some(k) = first {
            self.soft_purge(k).await.map_err(fail)?;
        }
        let first_hex = first.map(CacheKey::to_hex);
        let skip = |m: &[u8]| first_hex.as_deref().is_some_and(|h| h.as_bytes() == m);
        if kind == "set" {
            // Written by an older version: its entries do not decode here
            // (a miss), so a purge removes them as always.
            self.purge_set(&index).await.map_err(fail)?;
        } else if kind == "zset" {
            let mut cursor: u64 = 0;
            loop {
                let (next, pairs): (u64, Vec<Vec<u8>>) = self
                    .query(
                        "purge_group",
                        redis::cmd("ZSCAN")
                            .arg(&index)
                            .arg(cursor)
                            .arg("COUNT")
                            .arg(PURGE_BATCH),
                    )
                    .await
                    .map_err(fail)?;
                // Member, score, member, score …
                let batch: Vec<Vec<u8>> =
                    pairs.into_iter().step_by(2).filter(|m| !skip(m)).collect();
                self.soft_purge_members(&batch).await.map_err(fail)?;
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        self.purge_set(&self.legacy_group_key(group))
            .await
            .map_err(fail)
    }

    /// [`purge_members`](Self::purge_members), soft.
    async fn soft_purge_members(&self, members: &[Vec<u8>]) -> Result<(), StoreError> {
        let marks = members
            .iter()
            .filter_map(|m| CacheKey::from_hex(m))
            .map(|k| async move { self.soft_purge(&k).await });
        for r in join_all(marks).await {
            r?;
        }
        Ok(())
    }

    async fn walk_group(&self, group: &str, kind: &str, count: usize) -> Result<(), StoreError> {
        let index = self.group_key(group);
        let legacy = self.legacy_group_key(group);
        if kind == "set" {
            // Not rewritten since an older version kept it.
            self.purge_set(&index).await?;
            return self.purge_set(&legacy).await;
        }
        // Bounded by the size at the start: fills that land meanwhile do
        // not keep the walk going.
        for _ in 0..count.div_ceil(PURGE_BATCH) {
            let batch: Vec<Vec<u8>> = self
                .query(
                    "purge_group",
                    redis::cmd("ZRANGE").arg(&index).arg(0).arg(PURGE_BATCH - 1),
                )
                .await?;
            if batch.is_empty() {
                break;
            }
            self.purge_members(&batch).await?;
            let _: i64 = self
                .query("purge_group", redis::cmd("ZREM").arg(&index).arg(&batch))
                .await?;
        }
        self.purge_set(&legacy).await
    }

    /// The same walk over an index kept by an older version (a plain set).
    async fn purge_set(&self, index: &str) -> Result<(), StoreError> {
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<Vec<u8>>) = self
                .query(
                    "purge_group",
                    redis::cmd("SSCAN")
                        .arg(index)
                        .arg(cursor)
                        .arg("COUNT")
                        .arg(PURGE_BATCH),
                )
                .await?;
            if !batch.is_empty() {
                self.purge_members(&batch).await?;
                let _: i64 = self
                    .query("purge_group", redis::cmd("SREM").arg(index).arg(&batch))
                    .await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// Purge the entries of one batch of index members (hex keys), all at
    /// once: they live in different slots, so each is its own call.
    async fn purge_members(&self, members: &[Vec<u8>]) -> Result<(), StoreError> {
        let deletions = members
            .iter()
            .filter_map(|m| CacheKey::from_hex(m))
            .map(|k| async move { self.purge(&k).await });
        for r in join_all(deletions).await {
            r?;
        }
        Ok(())
    }

    /// Tell every instance (this one too) to apply `payload` to its memory,
    /// and wait (at most [`ack_wait`](Self::ack_wait)) until each listener
    /// that received it has acknowledged it. `Ok(true)`: every one did, so
    /// no listening instance still holds a copy the notice names; `Ok(false)`:
    /// some did not within the bound (slow, silent, or an older version
    /// that does not acknowledge). See `purge_bus.rs`.
    pub(crate) async fn publish_purge(&self, payload: &[u8]) -> Result<bool, StoreError> {
        self.ensure_purge_listener();
        let id: u64 = rand::random();
        let acks = self.purge_bus.expect_acks(id);
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(self.purge_channel()).arg(frame(id, payload));
        let receivers: Result<i64, _> = self.query("publish_purge", &cmd).await;
        let confirmed = match receivers {
            // With lease_replicas, done also means the replicas have it: a
            // failover now would not lose it.
            Ok(n) => Ok(acks.wait(n.max(0) as usize, self.ack_wait()).await
                && self.writes_replicated().await),
            Err(e) => Err(e),
        };
        self.purge_bus.forget(id);
        confirmed
    }

    /// How long a purge waits for the other instances' acknowledgements: a
    /// few replies' worth.
    fn ack_wait(&self) -> Duration {
        self.options
            .response_timeout
            .saturating_mul(4)
            .max(Duration::from_millis(100))
    }

    /// Install what applies purge notices here, and start listening.
    pub(crate) fn set_purge_handler(&self, handler: PurgeHandler) {
        self.purge_bus.set_handler(handler);
        self.ensure_purge_listener();
    }

    /// Start the listener task once, when inside a runtime.
    pub(crate) fn ensure_purge_listener(&self) {
        if self.purge_bus.started.load(Ordering::Relaxed)
            || tokio::runtime::Handle::try_current().is_err()
        {
            return;
        }
        if !self.purge_bus.started.swap(true, Ordering::SeqCst) {
            self.watch_sentinels();
            let source = match self.pubsub_source() {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "no purge listener: other instances' purges reach this one only through L1 expiry");
                    return;
                }
            };
            let listener = Listener {
                source,
                channel: self.purge_channel(),
                connect_timeout: self.options.connect_timeout,
                response_timeout: self.options.response_timeout,
            };
            tokio::spawn(listen(
                Arc::downgrade(&self.purge_bus),
                listener,
                self.shutdown_signal(),
                self.connection.renew_signal(),
            ));
        }
    }
}
