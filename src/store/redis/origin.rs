//! The origin's cluster-wide state in Redis: the cluster's origin budget
//! (a sorted set of expiring permits, Redisson's expirable semaphore) and
//! the shared breaker (a marker while the origin is down, one probe slot).
//!
//! ```text
//! {ns}:{origin:NAME}:budget  ZSET permit id → expiry (ms, server clock),
//!                       expiring with the last of them (NAME: the layer's name)
//! {ns}:{origin:NAME}:down    present while some instance's breaker holds the origin
//!                       down: the cluster's probe interval in ms (doubled by
//!                       each failed probe, so the cluster probes as one instance)
//! {ns}:{origin:NAME}:probe   the cluster's probe: one token, PX = that interval
//! ```
//! One hash tag for all three, so each script touches one slot on a cluster.

use std::sync::LazyLock;
use std::time::Duration;

use deadpool_redis::redis::{self, Script};

use super::error::StoreError;
use super::scripts::{millis, RELEASE};
use super::store::RedisStore;

static TAKE_PERMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("origin_permit.lua")));

static PROBE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("origin_probe.lua")));

/// Whether this instance probes the origin for the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeReply {
    /// It does, for this interval.
    Mine(Duration),
    /// Another instance's probe runs for this much longer.
    Taken(Duration),
    /// No instance holds the origin down any longer.
    Up,
}

impl RedisStore {
    /// `{ns}:{origin:NAME}:what`: NAME is the layer's name (its
    /// `cache_name`), so layers in front of different origins keep apart
    /// budgets and breakers; only its plain characters, so no name can
    /// leave the hash tag.
    fn origin_key(&self, what: &str) -> String {
        let name: String = self
            .options
            .metrics_name
            .as_deref()
            .unwrap_or("herdguard")
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            .take(64)
            .collect();
        format!("{}:{{origin:{name}}}:{what}", self.options.namespace)
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

    /// Ask for the cluster's probe (`first`: the interval if none is set).
    pub(crate) async fn origin_probe(
        &self,
        token: &str,
        first: Duration,
    ) -> Result<ProbeReply, StoreError> {
        let mut inv = PROBE.prepare_invoke();
        inv.key(self.origin_key("down"))
            .key(self.origin_key("probe"))
            .arg(token)
            .arg(millis(first).max(1));
        let (turn, left): (i64, i64) = self.invoke("origin_probe", &inv).await?;
        Ok(match turn {
            1 => ProbeReply::Mine(Duration::from_millis(left.max(1) as u64)),
            2 => ProbeReply::Up,
            _ => ProbeReply::Taken(Duration::from_millis(left.max(1) as u64)),
        })
    }

    /// Hold the origin down for the cluster with probes every `interval`,
    /// for at most `ttl` unless marked again. `prober`: the token of the
    /// probe that just failed, whose slot then runs a whole `interval` from
    /// now (the cluster waits that long for its next probe); without one
    /// (an instance's breaker merely opened), an interval already set is
    /// kept rather than the cadence started over.
    pub(crate) async fn mark_origin_down(
        &self,
        interval: Duration,
        ttl: Duration,
        prober: Option<&str>,
    ) -> Result<(), StoreError> {
        let ms = millis(interval).max(1);
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.origin_key("down"))
            .arg(ms)
            .arg("PX")
            .arg(millis(ttl).max(1));
        if prober.is_none() {
            cmd.arg("NX");
        }
        let _: Option<String> = self.query("origin_down", &cmd).await?;
        if let Some(token) = prober {
            let mut slot = redis::cmd("SET");
            slot.arg(self.origin_key("probe"))
                .arg(token)
                .arg("PX")
                .arg(ms);
            let _: Option<String> = self.query("origin_down", &slot).await?;
        }
        Ok(())
    }

    /// Give the probe slot back if `token` still holds it.
    pub(crate) async fn give_origin_probe(&self, token: &str) -> Result<(), StoreError> {
        let mut inv = RELEASE.prepare_invoke();
        inv.key(self.origin_key("probe")).arg(token);
        let _: i64 = self.invoke("origin_probe", &inv).await?;
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
