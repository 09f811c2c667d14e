//! Background refreshes: of a stale copy, and ahead of a fresh one's expiry.
//! Only starts flights; waiting and storing are `resolve`'s and `fill`'s.

use std::sync::Arc;
use std::time::Duration;

use super::compute::{Compute, Work};
use super::flight::Role;
use super::gate::{Priority, Ticket};
use super::resolve::{unrun, Engine};
use super::spawn::spawn_detached;
use crate::entry::Value;
use crate::key::CacheKey;
use crate::metrics::Skipped;
use crate::store::memory::Stored;

impl<V: Value> Engine<V> {
    /// Start one background refresh of `key`, whose stored copy `current`
    /// is being served stale, unless a flight already runs. Skipped (the
    /// stale copy keeps being served, and the next request that finds it
    /// tries again) when the leader cap is full, the budget has no permit
    /// to spare for it, the breaker is open, or the key's last fill failed
    /// within its backoff.
    pub(crate) fn refresh_in_background(
        self: &Arc<Self>,
        key: CacheKey,
        current: &Stored<V>,
        compute: impl Compute<V>,
    ) {
        if self.flights.is_running(&key) {
            return;
        }
        let priority = Priority::Revalidate;
        let Some(ticket) = self.background_ticket(current, priority) else {
            return;
        };
        if let (Role::Leader(handle), _) = self.flights.join_or_lead(key, &self.leaders, false) {
            self.spawn_drive(handle, Work::background(compute.start(), priority, ticket));
        }
    }

    /// A place at the origin for a background refresh of `current`'s key,
    /// if it may have one now (see [`Self::refresh_in_background`]).
    fn background_ticket(&self, current: &Stored<V>, priority: Priority) -> Option<Ticket> {
        if self.backing_off(current) {
            self.counters.refresh_skipped(Skipped::Backoff);
            return None;
        }
        match self.gate.try_ticket(priority, self.flights.len()) {
            Ok(ticket) => Some(ticket),
            Err(refusal) => {
                let _ = self.refused(refusal, priority);
                None
            }
        }
    }

    /// Refresh `current` ahead of its expiry, in the background, unless a
    /// flight for `key` already runs. With Redis, the lease makes it one
    /// refresh for the whole cluster: an instance that finds the lease taken
    /// (or a newer entry already written) computes nothing.
    pub(crate) fn refresh_ahead(
        self: &Arc<Self>,
        key: CacheKey,
        current: &Arc<Stored<V>>,
        compute: impl Compute<V>,
    ) {
        if self.flights.is_running(&key) {
            return;
        }
        let priority = Priority::Ahead;
        let Some(ticket) = self.background_ticket(current, priority) else {
            // Skipped, not done: a later hit on this copy may start it.
            current.release_refresh_claim();
            return;
        };
        let (Role::Leader(handle), _) = self.flights.join_or_lead(key, &self.leaders, false) else {
            return;
        };
        // Requests that need a fresh copy meanwhile (their L1 bound ran out)
        // take this one while it is fresh, instead of waiting for the origin.
        handle.publish_fresh(Arc::clone(current));
        let shared = Arc::clone(self);
        let current = Arc::clone(current);
        let fut = Work::background(compute.start(), priority, ticket);
        let span = tracing::Span::current();
        spawn_detached(
            "refresh-ahead",
            tracing::Instrument::instrument(
                async move {
                    let key = handle.key();
                    let outcome = match &shared.remote {
                        Some(remote) if remote.available() => {
                            shared
                                .drive_remote(remote, &handle, fut, Some(&current))
                                .await
                        }
                        _ => shared.compute_locally(key, fut).await,
                    };
                    handle.complete(unrun(outcome, true));
                },
                span,
            ),
        );
    }

    /// The age at which a hit on an entry fresh for `fresh_for` starts its
    /// refresh ahead: the last `refresh_ahead` fraction of the freshness, or
    /// twice the origin time measured here for it if that is longer.
    pub(super) fn refresh_age(&self, fresh_for: Duration, origin_time: Duration) -> Duration {
        let fraction = self.config.refresh_ahead;
        // NaN and negative fractions turn it off, like zero.
        if fraction.is_nan() || fraction <= 0.0 || fresh_for.is_zero() {
            return Duration::MAX;
        }
        let lead = fresh_for
            .mul_f64(fraction.min(1.0))
            .max(origin_time.saturating_mul(2))
            .min(fresh_for);
        fresh_for - lead
    }
}
