//! The origin's cluster-wide state in Redis: the cluster's origin budget
//! (a sorted set of expiring permits, Redisson's expirable semaphore) and
//! the shared breaker (a marker while the origin is down, one probe slot).
//!
//! ```text
//! {ns}:{origin}:budget  ZSET permit id → expiry (ms, server clock); PX = the last expiry
//! {ns}:{origin}:down    present while some instance's breaker holds the origin down
//! {ns}:{origin}:probe   the cluster's probe: one token, PX = the probe interval
//! ```
//! One hash tag for all three, so each script touches one slot on a cluster.

use std::sync::LazyLock;
use std::time::Duration;

use deadpool_redis::redis::{self, Script};

use super::error::StoreError;
use super::scripts::millis;
use super::store::RedisStore;

static TAKE_PERMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("origin_permit.lua")));

static PROBE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("origin_probe.lua")));

/// Whether this instance probes the origin for the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeReply {
    /// It does.
    Mine,
    /// Another instance's probe runs for this much longer.
    Taken(Duration),
    /// No instance holds the origin down any longer.
    Up,
}

impl RedisStore {
    fn origin_key(&self, what: &str) -> String {
        format!("{}:{{origin}}:{what}", self.options.namespace)
    }

    /// Take a cluster permit `id` for `ttl` if fewer than `limit - keep`
    /// are out: whether it was taken, and how many are out now.
    pub(crate) async fn take_origin_permit(
        &self,
        id: &str,
        limit: usize,
        keep: usize,
        ttl: Duration,
    ) -> Result<(bool, u64), StoreError> {
        let mut inv = TAKE_PERMIT.prepare_invoke();
        inv.key(self.origin_key("budget"))
            .arg(id)
            .arg(limit)
            .arg(keep)
            .arg(millis(ttl).max(1));
        let (taken, out): (i64, u64) = self.invoke("origin_permit", &inv).await?;
        Ok((taken == 1, out))
    }

    /// Give a cluster permit back.
    pub(crate) async fn give_origin_permit(&self, id: &str) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("ZREM");
        cmd.arg(self.origin_key("budget")).arg(id);
        let _: i64 = self.query("origin_permit", &cmd).await?;
        Ok(())
    }

    /// Ask for the cluster's probe for `interval`.
    pub(crate) async fn origin_probe(
        &self,
        token: &str,
        interval: Duration,
    ) -> Result<ProbeReply, StoreError> {
        let mut inv = PROBE.prepare_invoke();
        inv.key(self.origin_key("down"))
            .key(self.origin_key("probe"))
            .arg(token)
            .arg(millis(interval).max(1));
        let (turn, left): (i64, i64) = self.invoke("origin_probe", &inv).await?;
        Ok(match turn {
            1 => ProbeReply::Mine,
            2 => ProbeReply::Up,
            _ => ProbeReply::Taken(Duration::from_millis(left.max(1) as u64)),
        })
    }

    /// Hold the origin down for the cluster, for at most `ttl` unless marked again.
    pub(crate) async fn mark_origin_down(&self, ttl: Duration) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.origin_key("down"))
            .arg(1)
            .arg("PX")
            .arg(millis(ttl).max(1));
        let _: () = self.query("origin_down", &cmd).await?;
        Ok(())
    }

    /// The origin is back: no instance needs to probe it.
    pub(crate) async fn mark_origin_up(&self) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(self.origin_key("down"))
            .arg(self.origin_key("probe"));
        let _: i64 = self.query("origin_up", &cmd).await?;
        Ok(())
    }
}
