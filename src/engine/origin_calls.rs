//! How the engine's origin calls meet the gate ([`super::gate`], built
//! from the settings by `config::origin_gate`): what a refusal becomes, a
//! call's health, and the mark a failed fill leaves on the key's stored
//! copy (its backoff).

use std::time::Duration;

use super::compute::Fill;
use super::gate::{Priority, Refusal};
use super::resolve::Engine;
use crate::entry::{Value, ValueMeta};
use crate::error::Error;
use crate::key::CacheKey;
use crate::metrics::Skipped;
use crate::store::memory::Probe;

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
