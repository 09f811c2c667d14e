//! The instance's origin budget: one counting semaphore that every origin
//! call takes a permit from, shared out by priority.
//!
//! ```text
//! waited      ─► a free permit, else the queue (FIFO, bounded in length and
//!                time); past either: refused, busy
//! revalidate  ─► a free permit while more than a quarter stay free, else skipped
//! ahead       ─► a free permit while more than half stay free, else skipped
//! ```
//! tokio's semaphore hands a released permit to the longest queued waiter
//! first, so while anyone queues no permit is free and background work
//! takes none: a request somebody waits for always goes first.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::{Priority, Refusal};
use crate::metrics::Counters;

#[derive(Debug)]
pub(super) struct Budget {
    limit: usize,
    permits: Arc<Semaphore>,
    /// Calls queued for a permit right now.
    queued: AtomicUsize,
    /// Most calls queued at once: past it a call is refused at once.
    queue_limit: usize,
}

impl Budget {
    pub(super) fn new(limit: usize, queue_limit: usize) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            limit,
            permits: Arc::new(Semaphore::new(limit)),
            queued: AtomicUsize::new(0),
            queue_limit: queue_limit.max(1),
        }
    }

    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    /// Calls queued for a permit right now.
    pub(super) fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire).min(self.queue_limit)
    }

    /// Permits taken right now.
    pub(super) fn in_use(&self) -> usize {
        self.limit - self.permits.available_permits().min(self.limit)
    }

    /// How many permits a call of `priority` must leave free to take one:
    /// the headroom kept for calls somebody waits for.
    pub(super) fn keep_free(limit: usize, priority: Priority) -> usize {
        match priority {
            Priority::Waited => 0,
            Priority::Revalidate => limit / 4,
            Priority::Ahead => limit / 2,
        }
    }

    /// A permit for a background call, only if one is free beyond the
    /// headroom its priority leaves; never waits.
    pub(super) fn try_take(&self, priority: Priority) -> Result<OwnedSemaphorePermit, Refusal> {
        if self.permits.available_permits() <= Self::keep_free(self.limit, priority) {
            return Err(Refusal::Skipped);
        }
        Arc::clone(&self.permits)
            .try_acquire_owned()
            .map_err(|_| Refusal::Skipped)
    }

    /// A permit for a call somebody waits for: a free one, else a place in
    /// the queue until `deadline`.
    pub(super) async fn take(
        &self,
        deadline: Instant,
        metrics: &Counters,
    ) -> Result<OwnedSemaphorePermit, Refusal> {
        if let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() {
            return Ok(permit);
        }
        let in_queue = self.queued.fetch_add(1, Ordering::AcqRel) + 1;
        let _place = Place(&self.queued, metrics);
        if in_queue > self.queue_limit {
            return Err(Refusal::Busy);
        }
        metrics.origin_queue(in_queue);
        let started = Instant::now();
        let acquired =
            tokio::time::timeout_at(deadline, Arc::clone(&self.permits).acquire_owned()).await;
        metrics.origin_queued_for(started.elapsed());
        match acquired {
            Ok(Ok(permit)) => Ok(permit),
            // Timed out (or closed, which this semaphore never is).
            _ => Err(Refusal::Busy),
        }
    }
}

/// A place in the queue, given back however the wait ends (the caller's
/// future may be dropped while it waits).
struct Place<'a>(&'a AtomicUsize, &'a Counters);

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let left = self.0.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
        self.1.origin_queue(left);
    }
}
