//! The gate's cluster-wide half, through Redis: a budget of expiring
//! permits every instance takes from, and the breaker's probe elected for
//! the whole cluster. Redis failing never blocks a call: the instance's
//! own budget and breaker then stand alone (fail open).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::budget::Budget;
use super::{Priority, Refusal};
use crate::engine::spawn::spawn_detached;
use crate::entry::LeaseToken;
use crate::metrics::Counters;
use crate::store::redis::{ProbeReply, RedisStore};

/// How often a call somebody waits for asks again for a cluster permit,
/// at first and at most (the pause doubles between).
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const MAX_PAUSE: Duration = Duration::from_millis(20);

/// The cluster-wide half of the gate.
#[derive(Debug)]
pub(crate) struct Shared {
    store: Arc<RedisStore>,
    /// The cluster's origin budget, if it has one.
    budget: Option<usize>,
    /// The breaker's probe is elected for the cluster.
    breaker: bool,
    /// How long a permit lives unless given back: past any call's end.
    permit_ttl: Duration,
    /// How long the origin stays marked down unless marked again: past
    /// the longest probe interval.
    down_ttl: Duration,
    /// This instance's probe token.
    token: LeaseToken,
}

/// A cluster permit, given back (in the background) when dropped; if it
/// never is (the instance died), it expires.
#[derive(Debug)]
pub(crate) struct ClusterPermit {
    store: Arc<RedisStore>,
    id: LeaseToken,
}

impl Drop for ClusterPermit {
    fn drop(&mut self) {
        let store = Arc::clone(&self.store);
        let id = std::mem::replace(&mut self.id, LeaseToken::random());
        spawn_detached("origin-permit", async move {
            let _ = store.give_origin_permit(id.as_str()).await;
        });
    }
}

/// What the cluster says of a probe due here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ProbeTurn {
    /// This instance probes, for the cluster's interval (`None`: Redis did
    /// not answer; it probes for its own).
    Mine(Option<Duration>),
    Up,
    Wait(Duration),
}

impl Shared {
    /// `budget`: the cluster's permits (`None`: none); `breaker`: elect
    /// the probe for the cluster; a permit lives at most `permit_ttl`; the
    /// down marker `down_ttl`.
    pub(crate) fn new(
        store: Arc<RedisStore>,
        budget: Option<usize>,
        breaker: bool,
        permit_ttl: Duration,
        down_ttl: Duration,
    ) -> Self {
        Self {
            store,
            budget: budget.map(|n| n.max(1)),
            breaker,
            permit_ttl,
            down_ttl,
            token: LeaseToken::random(),
        }
    }

    pub(super) fn budget_limit(&self) -> usize {
        self.budget.unwrap_or(0)
    }

    /// A cluster permit for a call of `priority`: a background call asks
    /// once, a call somebody waits for asks again until `deadline`.
    /// `Ok(None)`: no cluster budget, or Redis did not answer.
    pub(super) async fn take(
        &self,
        priority: Priority,
        deadline: Instant,
        counters: &Counters,
    ) -> Result<Option<ClusterPermit>, Refusal> {
        let Some(limit) = self.budget else {
            return Ok(None);
        };
        let keep = Budget::keep_free(limit, priority);
        let id = LeaseToken::random();
        let mut pause = FIRST_PAUSE;
        loop {
            let taken = self
                .store
                .take_origin_permit(id.as_str(), limit, keep, self.permit_ttl)
                .await;
            let (taken, out) = match taken {
                Ok(reply) => reply,
                Err(_) => return Ok(None),
            };
            counters.cluster_budget_in_use(out);
            if taken {
                let store = Arc::clone(&self.store);
                return Ok(Some(ClusterPermit { store, id }));
            }
            if priority != Priority::Waited {
                return Err(Refusal::Skipped);
            }
            if Instant::now() + pause > deadline {
                return Err(Refusal::Busy);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// Whether the probe due here goes out (`first`: the interval when the
    /// cluster has none yet).
    pub(super) async fn probe(&self, first: Duration) -> ProbeTurn {
        if !self.breaker {
            return ProbeTurn::Mine(None);
        }
        match self.store.origin_probe(self.token.as_str(), first).await {
            Ok(ProbeReply::Mine(interval)) => ProbeTurn::Mine(Some(interval)),
            Err(_) => ProbeTurn::Mine(None),
            Ok(ProbeReply::Up) => ProbeTurn::Up,
            Ok(ProbeReply::Taken(left)) => ProbeTurn::Wait(left),
        }
    }

    /// This instance's breaker opened (`probed`: its probe failed): hold the
    /// origin down for the cluster, probed every `interval` from now on.
    /// An instance that merely opened keeps the interval the cluster's
    /// probes have reached.
    pub(super) fn opened(&self, interval: Duration, probed: bool) {
        if !self.breaker {
            return;
        }
        let store = Arc::clone(&self.store);
        let ttl = self.down_ttl;
        let prober = probed.then(|| self.token.as_str().to_owned());
        spawn_detached("origin-down", async move {
            let _ = store
                .mark_origin_down(interval, ttl, prober.as_deref())
                .await;
        });
    }

    /// The probe this instance won went out without a verdict: give its
    /// slot back, so the cluster's next due probe need not wait out the
    /// interval.
    pub(super) fn probe_unused(&self) {
        let store = Arc::clone(&self.store);
        let token = self.token.as_str().to_owned();
        spawn_detached("origin-probe", async move {
            let _ = store.give_origin_probe(&token).await;
        });
    }

    /// This instance found the origin back: every instance may call it.
    pub(super) fn closed(&self) {
        if !self.breaker {
            return;
        }
        let store = Arc::clone(&self.store);
        spawn_detached("origin-up", async move {
            let _ = store.mark_origin_up().await;
        });
    }
}
