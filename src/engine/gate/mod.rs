//! The origin as a whole. Every origin call the cache makes passes this
//! gate: a budget bounds how many run at once, by priority (per instance,
//! and with Redis optionally per cluster), and a breaker stops calling an
//! origin that keeps failing, letting one probe at a time find out when it
//! is back (with Redis, one probe for the whole cluster).
//!
//! ```text
//! call ─► breaker ── open, probe not due ─► refused: down (Retry-After: until the probe)
//!           │ closed, or the due probe (cluster: one instance wins it)
//!           ▼
//!         budget by priority ── none to spare ─► skipped (background) / queued, then busy
//!           ▼
//!         cluster budget (Redis, optional) ─► the origin ─► its health ─► breaker
//! ```
//! HTTP-agnostic: the caller says whether the call failed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use crate::metrics::Counters;

pub use breaker::OriginBreaker;
use breaker::{Admit, Circuit, Turned};
use budget::Budget;
#[cfg(feature = "redis")]
pub(crate) use shared::Shared;

mod breaker;
mod budget;
#[cfg(feature = "redis")]
mod shared;

/// What waits on an origin call, highest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Priority {
    /// A request waits for its answer (a flight's leader, a call outside
    /// any flight, a revalidation someone waits for).
    Waited,
    /// A background refresh of a stale copy that is being served.
    Revalidate,
    /// A refresh ahead of a fresh copy's expiry.
    Ahead,
}

/// The origin gate now, as [`CacheLayer::origin_status`](crate::CacheLayer::origin_status)
/// reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct OriginStatus {
    /// Origin calls this instance is making now (permits of its budget taken).
    pub budget_in_use: usize,
    /// The instance's budget.
    pub budget_limit: usize,
    /// Calls queued for a permit now.
    pub queued: usize,
    /// `Some(until the next probe)` while the breaker refuses calls.
    pub down_for: Option<Duration>,
}

/// Why a call did not go to the origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The budget's queue was full, or its wait ran out.
    Busy,
    /// The breaker is open: the next probe is this far off.
    Down(Duration),
    /// A background call found no permit to spare.
    Skipped,
}

/// A place in the instance's budget taken before a flight was made (a
/// background refresh), and the probe, if it is one.
#[derive(Debug)]
pub(crate) struct Ticket {
    /// Held for the call's whole life; given back when dropped.
    _permit: OwnedSemaphorePermit,
    /// `Some(backoff)` when this call is the breaker's probe.
    probe: Option<Duration>,
    /// The probe was elected for the cluster: its slot in Redis is given
    /// back if it goes unused.
    shared_probe: bool,
    circuit: Arc<Circuit>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Dropped unused: the probe is free again for the next call.
        if self.probe.take().is_some() {
            self.circuit.probe_abandoned(Instant::now());
        }
    }
}

/// Every origin call's way through: the budget and the breaker.
#[derive(Debug)]
pub(crate) struct OriginGate {
    budget: Budget,
    circuit: Arc<Circuit>,
    /// A call somebody waits for queues at most this long.
    wait: Duration,
    /// Requests in flight that may wait on the origin (see [`Caller`]).
    callers: Arc<AtomicUsize>,
    #[cfg(feature = "redis")]
    shared: Option<Shared>,
}

/// One request in flight that may wait on the origin (a miss, a
/// revalidation, a bypass), counted while it lives. A background call goes
/// out only while this instance has fewer origin calls in flight than such
/// requests, or none at all while none waits: its calls then stay close to
/// what its clients could make at once without a cache, whatever the
/// budget, also for several instances with a budget each and none shared.
/// Close, not exact: a background call outlives the requests whose wait
/// made room for it, and their clients' next misses are not held back.
#[derive(Debug)]
pub(crate) struct Caller(Arc<AtomicUsize>);

impl Drop for Caller {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An admitted call: its permits, given back when it is dropped.
#[derive(Debug)]
pub(crate) struct GatePass<'a> {
    ticket: Option<Ticket>,
    gate: &'a OriginGate,
    counters: &'a Counters,
    #[cfg(feature = "redis")]
    _cluster: Option<shared::ClusterPermit>,
}

impl OriginGate {
    /// `budget` permits, a call waiting at most `wait` (and at most
    /// `queue` calls waiting at once).
    /// `probe_limit`: the longest a call can take once admitted, after
    /// which a probe that gave no verdict is taken to be lost.
    pub(crate) fn new(
        budget: usize,
        queue: usize,
        wait: Duration,
        breaker: OriginBreaker,
        probe_limit: Duration,
        counters: &Counters,
    ) -> Self {
        let budget = Budget::new(budget, queue);
        counters.budget_limits(budget.limit(), 0);
        Self {
            budget,
            circuit: Arc::new(Circuit::new(breaker, probe_limit)),
            wait,
            callers: Arc::new(AtomicUsize::new(0)),
            #[cfg(feature = "redis")]
            shared: None,
        }
    }

    /// Count one request in flight until the [`Caller`] is dropped.
    pub(crate) fn caller(&self) -> Caller {
        self.callers.fetch_add(1, Ordering::Relaxed);
        Caller(Arc::clone(&self.callers))
    }

    /// A background call's place in the budget: one to spare beyond its
    /// priority's headroom, and fewer calls in flight for this instance
    /// than requests waiting on the origin here (or, with none waiting, no
    /// call at all). `flights`: the flights running here, each a call here
    /// or one this instance waits on elsewhere in the cluster (a lease
    /// another instance holds), so a request waiting on another instance's
    /// call does not make room for a call of its own here as well.
    fn background_permit(
        &self,
        priority: Priority,
        flights: usize,
    ) -> Result<OwnedSemaphorePermit, Refusal> {
        let waiting = self.callers.load(Ordering::Relaxed);
        if self.budget.in_use().max(flights) >= waiting.max(1) {
            return Err(Refusal::Skipped);
        }
        self.budget.try_take(priority)
    }

    /// Share the breaker (and a cluster budget, if it has one) through Redis.
    #[cfg(feature = "redis")]
    pub(crate) fn with_shared(mut self, shared: Shared, counters: &Counters) -> Self {
        counters.budget_limits(self.budget.limit(), shared.budget_limit());
        self.shared = Some(shared);
        self
    }

    /// The budget and the breaker now.
    pub(crate) fn status(&self) -> OriginStatus {
        OriginStatus {
            budget_in_use: self.budget.in_use(),
            budget_limit: self.budget.limit(),
            queued: self.budget.queued(),
            down_for: self.down_for(),
        }
    }

    pub(crate) fn breaker(&self) -> &OriginBreaker {
        &self.circuit.policy
    }

    /// How long until the next probe, while the breaker refuses calls.
    pub(crate) fn down_for(&self) -> Option<Duration> {
        self.circuit.refuses(Instant::now())
    }

    /// A place in this instance's budget for a background call, now or
    /// never (a refresh finds none to spare: it is skipped, the copy it
    /// would replace is served meanwhile). `flights`: those running here.
    pub(crate) fn try_ticket(&self, priority: Priority, flights: usize) -> Result<Ticket, Refusal> {
        if let Some(left) = self.down_for() {
            return Err(Refusal::Down(left));
        }
        let permit = self.background_permit(priority, flights)?;
        // Last: a probe is taken only by a call that has its permit.
        let probe = self.circuit_admit()?;
        Ok(self.ticket(permit, probe))
    }

    fn circuit_admit(&self) -> Result<Option<Duration>, Refusal> {
        match self.circuit.admit(Instant::now())? {
            Admit::Call => Ok(None),
            Admit::Probe { backoff } => Ok(Some(backoff)),
        }
    }

    fn ticket(&self, permit: OwnedSemaphorePermit, probe: Option<Duration>) -> Ticket {
        Ticket {
            _permit: permit,
            probe,
            shared_probe: false,
            circuit: Arc::clone(&self.circuit),
        }
    }

    /// Admit a call of `priority` (with the `ticket` it already holds, if
    /// any): `Err` says why it must not reach the origin. A call somebody
    /// waits for queues up to the gate's wait for a permit.
    pub(crate) async fn admit<'a>(
        &'a self,
        priority: Priority,
        ticket: Option<Ticket>,
        counters: &'a Counters,
    ) -> Result<GatePass<'a>, Refusal> {
        let deadline = Instant::now() + self.wait;
        let result = self.admit_by(priority, ticket, counters, deadline).await;
        if let Ok(pass) = &result {
            if pass.ticket.as_ref().is_some_and(|t| t.probe.is_some()) {
                counters.probe();
            }
        }
        counters.budget_in_use(self.budget.in_use());
        result
    }

    async fn admit_by<'a>(
        &'a self,
        priority: Priority,
        ticket: Option<Ticket>,
        counters: &'a Counters,
        deadline: Instant,
    ) -> Result<GatePass<'a>, Refusal> {
        let mut ticket = match ticket {
            Some(t) => t,
            None => {
                // Refused at once while the origin is down, never queued.
                if let Some(left) = self.down_for() {
                    return Err(Refusal::Down(left));
                }
                let permit = match priority {
                    Priority::Waited => self.budget.take(deadline, counters).await?,
                    background => self.background_permit(background, 0)?,
                };
                // Asked again once the permit is held: the breaker may have
                // opened while this call queued, and a probe is taken only
                // by a call that will go out at once.
                let probe = self.circuit_admit()?;
                self.ticket(permit, probe)
            }
        };
        #[cfg(feature = "redis")]
        let cluster = match &self.shared {
            Some(shared) => {
                // The cluster permit first, so a probe the cluster elects
                // goes out at once.
                let cluster = shared.take(priority, deadline, counters).await?;
                self.shared_probe(shared, &mut ticket, counters).await?;
                cluster
            }
            None => None,
        };
        #[cfg(not(feature = "redis"))]
        let _ = &mut ticket;
        Ok(GatePass {
            ticket: Some(ticket),
            gate: self,
            counters,
            #[cfg(feature = "redis")]
            _cluster: cluster,
        })
    }

    /// With a shared breaker, a probe due here goes out only if this
    /// instance wins it for the cluster; an origin another instance found
    /// back closes the breaker here without one.
    #[cfg(feature = "redis")]
    async fn shared_probe(
        &self,
        shared: &Shared,
        ticket: &mut Ticket,
        counters: &Counters,
    ) -> Result<(), Refusal> {
        if ticket.probe.is_none() {
            return Ok(());
        }
        match shared.probe(self.circuit.policy.first_backoff).await {
            shared::ProbeTurn::Mine(None) => Ok(()),
            shared::ProbeTurn::Mine(Some(interval)) => {
                // The cluster's cadence: a failure doubles that interval.
                ticket.probe = Some(interval);
                ticket.shared_probe = true;
                self.circuit.probing_for(interval);
                Ok(())
            }
            shared::ProbeTurn::Up => {
                ticket.probe = None;
                Circuit::report(self.circuit.close(), counters);
                Ok(())
            }
            shared::ProbeTurn::Wait(left) => {
                ticket.probe = None;
                // Ask again within a quarter of the first interval (one
                // lookup, never a probe while the slot is taken), so a probe
                // another instance gets answered closes this breaker soon
                // after.
                let again = left.min(self.circuit.policy.first_backoff / 4);
                self.circuit.probe_abandoned(Instant::now() + again);
                Err(Refusal::Down(left))
            }
        }
    }

    /// A probe went out without a verdict: due again now, here and (its
    /// slot given back) for the cluster.
    fn probe_unused(&self, shared_probe: bool) {
        self.circuit.probe_abandoned(Instant::now());
        #[cfg(feature = "redis")]
        if let (true, Some(shared)) = (shared_probe, &self.shared) {
            shared.probe_unused();
        }
        #[cfg(not(feature = "redis"))]
        let _ = shared_probe;
    }

    /// Report a transition (`probe`: the call that made it was the probe).
    fn turned(&self, turned: Turned, probe: bool, counters: &Counters) {
        Circuit::report(turned, counters);
        #[cfg(not(feature = "redis"))]
        let _ = probe;
        #[cfg(feature = "redis")]
        if let Some(shared) = &self.shared {
            match turned {
                Turned::Opened(interval) => shared.opened(interval, probe),
                Turned::Closed => shared.closed(),
                Turned::Unchanged => {}
            }
        }
    }
}

impl GatePass<'_> {
    /// The call's verdict: `Some(false)` when the origin failed it,
    /// `None` when it says nothing of the origin (aborted).
    pub(crate) fn finish(mut self, healthy: Option<bool>) {
        let Some(mut ticket) = self.ticket.take() else {
            return;
        };
        let probe = ticket.probe.take().is_some();
        match healthy {
            Some(healthy) => {
                let turned = self.gate.circuit.record(healthy, probe, Instant::now());
                self.gate.turned(turned, probe, self.counters);
            }
            None if probe => self.gate.probe_unused(ticket.shared_probe),
            None => {}
        }
        drop(ticket);
        self.counters.budget_in_use(self.gate.budget.in_use());
    }
}

impl Drop for GatePass<'_> {
    fn drop(&mut self) {
        if let Some(mut ticket) = self.ticket.take() {
            if ticket.probe.take().is_some() {
                self.gate.probe_unused(ticket.shared_probe);
            }
            drop(ticket);
            self.counters.budget_in_use(self.gate.budget.in_use());
        }
    }
}
