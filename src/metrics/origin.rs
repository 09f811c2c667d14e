//! The origin gate's metrics: budget, queue, refusals, skipped refreshes
//! and the breaker. Keys built once per cache, like the others.

use std::sync::atomic::Ordering;
use std::time::Duration;

use metrics::Key;

use super::{count, gauge, names, observe, Counters};

/// Why a background refresh was not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skipped {
    /// The budget had no permit to spare for it.
    Budget,
    /// The breaker is open.
    Breaker,
    /// The key's last fill failed moments ago.
    Backoff,
}

impl Skipped {
    const ALL: [Self; 3] = [Self::Budget, Self::Breaker, Self::Backoff];

    fn as_str(self) -> &'static str {
        match self {
            Self::Budget => "budget",
            Self::Breaker => "breaker",
            Self::Backoff => "backoff",
        }
    }
}

#[derive(Debug)]
pub(super) struct OriginKeys {
    limit: Key,
    in_use: Key,
    cluster_limit: Key,
    cluster_in_use: Key,
    queue: Key,
    pub(super) queue_seconds: Key,
    /// busy, down.
    refused: [Key; 2],
    /// In the order of [`Skipped::ALL`].
    skipped: [Key; 3],
    open: Key,
    /// open, closed.
    transitions: [Key; 2],
    probes: Key,
}

impl OriginKeys {
    pub(super) fn new(
        key: &dyn Fn(&'static str, Option<(&'static str, &'static str)>) -> Key,
    ) -> Self {
        Self {
            limit: key(names::ORIGIN_BUDGET_LIMIT, None),
            in_use: key(names::ORIGIN_BUDGET_IN_USE, None),
            cluster_limit: key(names::CLUSTER_BUDGET_LIMIT, None),
            cluster_in_use: key(names::CLUSTER_BUDGET_IN_USE, None),
            queue: key(names::ORIGIN_QUEUE, None),
            queue_seconds: key(names::ORIGIN_QUEUE_SECONDS, None),
            refused: [
                key(names::ORIGIN_REFUSED, Some(("reason", "busy"))),
                key(names::ORIGIN_REFUSED, Some(("reason", "down"))),
            ],
            skipped: Skipped::ALL
                .map(|s| key(names::REFRESHES_SKIPPED, Some(("reason", s.as_str())))),
            open: key(names::BREAKER_OPEN, None),
            transitions: [
                key(names::BREAKER_TRANSITIONS, Some(("to", "open"))),
                key(names::BREAKER_TRANSITIONS, Some(("to", "closed"))),
            ],
            probes: key(names::BREAKER_PROBES, None),
        }
    }

    pub(super) fn counters(&self) -> impl Iterator<Item = &Key> {
        self.refused
            .iter()
            .chain(&self.skipped)
            .chain(&self.transitions)
            .chain([&self.probes])
    }

    /// Every gauge, registered at 0 (the gate sets the limits as it is built).
    pub(super) fn gauges(&self) -> Vec<&Key> {
        vec![
            &self.limit,
            &self.in_use,
            &self.cluster_limit,
            &self.cluster_in_use,
            &self.queue,
            &self.open,
        ]
    }
}

impl Counters {
    fn origin(&self) -> &OriginKeys {
        &self.keys.origin
    }

    /// The budgets' sizes (`cluster`: 0 when there is none).
    pub(crate) fn budget_limits(&self, local: usize, cluster: usize) {
        gauge(&self.origin().limit, local as f64);
        gauge(&self.origin().cluster_limit, cluster as f64);
    }

    pub(crate) fn budget_in_use(&self, n: usize) {
        gauge(&self.origin().in_use, n as f64);
    }

    pub(crate) fn cluster_budget_in_use(&self, n: u64) {
        gauge(&self.origin().cluster_in_use, n as f64);
    }

    pub(crate) fn origin_queue(&self, n: usize) {
        gauge(&self.origin().queue, n as f64);
    }

    pub(crate) fn origin_queued_for(&self, d: Duration) {
        observe(&self.origin().queue_seconds, d.as_secs_f64());
    }

    /// A call refused before reaching the origin: `down` for the breaker,
    /// else the budget.
    pub(crate) fn origin_refused(&self, down: bool) {
        self.tally.origin_refused.fetch_add(1, Ordering::Relaxed);
        count(&self.origin().refused[usize::from(down)]);
    }

    pub(crate) fn refresh_skipped(&self, why: Skipped) {
        self.tally.refreshes_skipped.fetch_add(1, Ordering::Relaxed);
        let i = Skipped::ALL.iter().position(|s| *s == why).unwrap_or(0);
        count(&self.origin().skipped[i]);
    }

    /// The breaker opened (`true`) or closed.
    pub(crate) fn breaker(&self, open: bool) {
        gauge(&self.origin().open, if open { 1.0 } else { 0.0 });
        count(&self.origin().transitions[usize::from(!open)]);
    }

    pub(crate) fn probe(&self) {
        self.tally.probes.fetch_add(1, Ordering::Relaxed);
        count(&self.origin().probes);
    }
}

/// Help texts for the gate's metrics.
pub(super) fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(
        names::ORIGIN_BUDGET_LIMIT,
        "Origin calls this instance makes at once at most."
    );
    describe_gauge!(
        names::ORIGIN_BUDGET_IN_USE,
        "Origin calls this instance is making now."
    );
    describe_gauge!(
        names::CLUSTER_BUDGET_LIMIT,
        "Origin calls the cluster makes at once at most (0: no cluster budget)."
    );
    describe_gauge!(
        names::CLUSTER_BUDGET_IN_USE,
        "Cluster-wide origin calls in flight, as last seen by this instance."
    );
    describe_gauge!(
        names::ORIGIN_QUEUE,
        "Origin calls queued for a budget permit."
    );
    describe_histogram!(
        names::ORIGIN_QUEUE_SECONDS,
        Unit::Seconds,
        "How long an origin call queued for a budget permit."
    );
    describe_counter!(
        names::ORIGIN_REFUSED,
        "Origin calls refused before reaching the origin, by reason (busy, down)."
    );
    describe_counter!(
        names::REFRESHES_SKIPPED,
        "Background refreshes not started, by reason (budget, breaker, backoff)."
    );
    describe_gauge!(
        names::BREAKER_OPEN,
        "1 while the origin's breaker is open or probing."
    );
    describe_counter!(
        names::BREAKER_TRANSITIONS,
        "Breaker transitions, by the state entered (open, closed)."
    );
    describe_counter!(
        names::BREAKER_PROBES,
        "Probes sent to an origin whose breaker is open."
    );
}
