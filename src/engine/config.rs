//! The engine's settings and their defaults, plain data, and the origin
//! gate they make (here, not beside the calls that use it, so that
//! `resolve` and `origin_calls` do not import each other).

use std::sync::Arc;
use std::time::Duration;

use super::gate::{OriginBreaker, OriginGate};
use crate::error::BuildError;
use crate::lock::redlock::Redlock;
use crate::metrics::Counters;
use crate::store::redis::{RedisOptions, RedisStore};

#[derive(Debug, Clone)]
pub(crate) struct EngineConfig {
    pub(crate) capacity_bytes: u64,
    /// `None`: follow the origin timeout (see [`EngineConfig::max_wait`]).
    pub(crate) max_wait: Option<Duration>,
    pub(crate) origin_timeout: Duration,
    pub(crate) pass_ttl: Duration,
    pub(crate) fallback_limit: usize,
    pub(crate) max_leaders: usize,
    pub(crate) max_fill_bytes: usize,
    /// Refresh-ahead: the last fraction of an entry's freshness in which a
    /// hit starts one background refresh (0 turns it off).
    pub(crate) refresh_ahead: f64,
    /// Most origin calls at once from this instance (every priority).
    pub(crate) origin_budget: usize,
    pub(crate) breaker: OriginBreaker,
    /// After a key's fill failed, how long its stale copy answers alone
    /// before the next attempt.
    pub(crate) failure_backoff: Duration,
    pub(crate) redis: Option<RedisOptions>,
    pub(crate) redlock: Option<Arc<Redlock>>,
    /// The `cache` label on every metric (the layer's `cache_name`).
    pub(crate) metrics_name: String,
    /// Keys listed per hot-key measure (0: no hot keys kept).
    pub(crate) hot_keys: usize,
    /// The window hot keys are counted over.
    pub(crate) hot_key_window: Duration,
}

/// How much longer than the origin timeout a waiter waits by default: room
/// for the leader's Redis round trips and the fill notification, so a slow
/// but healthy origin never releases the waiters to call it themselves.
pub(crate) const WAIT_MARGIN: Duration = Duration::from_secs(5);

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            capacity_bytes: 256 * 1024 * 1024,
            max_wait: None,
            // Well above typical origin times (nginx gives up after 5 s).
            origin_timeout: Duration::from_secs(60),
            pass_ttl: Duration::from_secs(5),
            fallback_limit: 64,
            max_leaders: 1024,
            max_fill_bytes: 64 * 1024 * 1024,
            refresh_ahead: DEFAULT_REFRESH_AHEAD,
            origin_budget: DEFAULT_ORIGIN_BUDGET,
            breaker: OriginBreaker::default(),
            failure_backoff: Duration::from_secs(1),
            redis: None,
            redlock: None,
            metrics_name: "herdguard".to_owned(),
            hot_keys: crate::hot::DEFAULT_K,
            hot_key_window: crate::hot::DEFAULT_WINDOW,
        }
    }
}

impl EngineConfig {
    /// Refuse settings that would otherwise be changed or ignored silently.
    pub(crate) fn validate(&self) -> Result<(), BuildError> {
        let fraction = self.refresh_ahead;
        if !(0.0..1.0).contains(&fraction) {
            return Err(BuildError::invalid(
                "refresh_ahead",
                format!("{fraction} is not a fraction in 0 ≤ f < 1 (0 turns it off)"),
            ));
        }
        if self.hot_keys > crate::hot::MAX_K {
            return Err(BuildError::invalid(
                "hot_keys",
                format!(
                    "{} is above the most kept, {}",
                    self.hot_keys,
                    crate::hot::MAX_K
                ),
            ));
        }
        if self.hot_keys > 0 && self.hot_key_window < std::time::Duration::from_secs(1) {
            return Err(BuildError::invalid(
                "hot_key_window",
                "below 1 s: at least 1 s",
            ));
        }
        if self.max_leaders == 0 {
            return Err(BuildError::invalid(
                "leader_limit",
                "0 would run no flight at all: at least 1",
            ));
        }
        if self.origin_budget == 0 {
            return Err(BuildError::invalid(
                "origin_budget",
                "0 would allow no origin call at all: at least 1",
            ));
        }
        let b = &self.breaker;
        if b.enabled() && (b.first_backoff.is_zero() || b.max_backoff < b.first_backoff) {
            return Err(BuildError::invalid(
                "origin_breaker",
                "its first backoff must be above 0 and at most its cap",
            ));
        }
        if self.fallback_limit == 0 {
            return Err(BuildError::invalid(
                "fallback_limit",
                "0 would allow no call outside a flight: at least 1",
            ));
        }
        Ok(())
    }

    /// A waiter's longest wait: as set, else the origin timeout plus
    /// [`WAIT_MARGIN`], so it outlasts the call it waits for.
    pub(crate) fn max_wait(&self) -> Duration {
        self.max_wait
            .unwrap_or(self.origin_timeout.saturating_add(WAIT_MARGIN))
    }
}

/// The default refresh-ahead fraction: the last quarter of the freshness.
pub(crate) const DEFAULT_REFRESH_AHEAD: f64 = 0.25;

/// The default origin budget: the fallback cap's default, a connection
/// pool's usual size, and no more than the clients of a typical instance
/// keep busy (see the crate docs, "The origin as a whole").
pub(crate) const DEFAULT_ORIGIN_BUDGET: usize = 64;

/// A permit in the cluster budget outlives the longest call by this much,
/// then frees itself (its instance died holding it).
#[cfg(feature = "redis")]
const PERMIT_SLACK: Duration = Duration::from_secs(1);

/// The gate for `config`: the instance's budget and breaker, shared
/// through `remote` where the Redis options ask for it.
pub(super) fn origin_gate(
    config: &EngineConfig,
    remote: Option<&Arc<RedisStore>>,
    counters: &Counters,
) -> OriginGate {
    let queue = config.max_leaders.saturating_add(config.fallback_limit);
    // A waited call queues up to max_wait, twice with a cluster budget,
    // then runs up to the origin timeout.
    let probe_limit = config
        .max_wait()
        .saturating_mul(2)
        .saturating_add(config.origin_timeout);
    let gate = OriginGate::new(
        config.origin_budget,
        queue,
        config.max_wait(),
        config.breaker,
        probe_limit,
        counters,
    );
    #[cfg(feature = "redis")]
    if let (Some(remote), Some(opts)) = (remote, &config.redis) {
        if opts.share_origin_breaker || opts.cluster_origin_budget.is_some() {
            let shared = super::gate::Shared::new(
                Arc::clone(remote),
                opts.cluster_origin_budget,
                opts.share_origin_breaker,
                config.origin_timeout.saturating_add(PERMIT_SLACK),
                config.breaker.max_backoff.saturating_mul(2),
            );
            return gate.with_shared(shared, counters);
        }
    }
    #[cfg(not(feature = "redis"))]
    let _ = remote;
    gate
}
