//! How the engine's origin calls meet the gate ([`super::gate`]): building
//! it from the settings, what a refusal becomes, a call's health, and the
//! mark a failed fill leaves on the key's stored copy (its backoff).

use std::sync::Arc;
use std::time::Duration;

use super::compute::Fill;
use super::config::EngineConfig;
use super::gate::{OriginGate, Priority, Refusal};
use super::resolve::Engine;
use crate::entry::{Value, ValueMeta};
use crate::error::Error;
use crate::key::CacheKey;
use crate::metrics::{Counters, Skipped};
use crate::store::memory::Probe;
use crate::store::redis::RedisStore;

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

impl<V: Value> Engine<V> {
    /// What a call the gate refused ends in, counted: a call somebody
    /// waited for is refused, a background one skipped.
    pub(crate) fn refused(&self, refusal: Refusal, priority: Priority) -> Error {
        let waited = priority == Priority::Waited;
        match refusal {
            Refusal::Down(retry_after) => {
                if waited {
                    self.counters.origin_refused(true);
                } else {
                    self.counters.refresh_skipped(Skipped::Breaker);
                }
                Error::OriginDown { retry_after }
            }
            Refusal::Busy | Refusal::Skipped => {
                if waited {
                    self.counters.origin_refused(false);
                } else {
                    self.counters.refresh_skipped(Skipped::Budget);
                }
                Error::OriginBusy
            }
        }
    }

    /// What a call's result says of the origin, for the breaker:
    /// `Some(false)` when it failed (timed out, unreachable, panicked, or
    /// answered with a 5xx the breaker counts), `None` when it says nothing
    /// (aborted here).
    pub(super) fn health(&self, result: &Result<Fill<V>, Error>) -> Option<bool> {
        match result {
            Ok(fill) => {
                let status = fill.value().and_then(ValueMeta::origin_status);
                Some(!status.is_some_and(|s| self.gate.breaker().status_fails(s)))
            }
            Err(Error::Compute(_) | Error::OriginTimeout | Error::Panicked) => Some(false),
            Err(_) => None,
        }
    }

    /// Whether the fill failed for its key's backoff: as for the breaker,
    /// or any 5xx, which `stale-if-error` stands in for (RFC 5861).
    pub(super) fn fill_failed(healthy: Option<bool>, result: &Result<Fill<V>, Error>) -> bool {
        let status = match result {
            Ok(fill) => fill.value().and_then(ValueMeta::origin_status),
            Err(_) => None,
        };
        healthy == Some(false) || status.is_some_and(|s| (500..=599).contains(&s))
    }

    /// A fill of `key` failed: the copy stored for it (if any) remembers
    /// when, so requests it may answer under `stale-if-error` get it
    /// without a new attempt until the backoff has passed. The fact is kept,
    /// never the error page.
    pub(super) fn note_failed_fill(&self, key: &CacheKey) {
        if let Probe::Fresh(entry) | Probe::Stale(entry) = self.memory.probe(key) {
            entry.note_failed_fill();
        }
        // A copy past its stale window, kept aside for stale-if-error.
        if let Some(kept) = self.retained.as_ref().and_then(|r| r.get(key)) {
            kept.note_failed_fill();
        }
    }

    /// Whether `key`'s last fill failed within the backoff, going by the
    /// copy `entry` that is stored for it.
    pub(crate) fn backing_off(&self, entry: &crate::store::memory::Stored<V>) -> bool {
        entry
            .failed_fill_for()
            .is_some_and(|since| since < self.config.failure_backoff)
    }

    /// How long until the origin may be called again, while the breaker
    /// holds it down.
    pub(crate) fn origin_down_for(&self) -> Option<Duration> {
        self.gate.down_for()
    }
}
