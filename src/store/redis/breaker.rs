//! The circuit breaker in front of every Redis call: open on failure, probe
//! again after a doubling back-off. Counts nothing but availability.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::options::RedisOptions;

/// Circuit breaker: open on failure, probe again after a doubling back-off.
#[derive(Debug)]
pub(super) struct Breaker {
    /// Fast path: a single atomic load while Redis is healthy.
    closed: AtomicBool,
    state: Mutex<BreakerState>,
    min_backoff: Duration,
    max_backoff: Duration,
    /// The `cache` label of the availability gauge and error counter.
    pub(super) cache: Option<String>,
}

#[derive(Debug)]
struct BreakerState {
    open_until: Instant,
    backoff: Duration,
}

impl Breaker {
    pub(super) fn new(options: &RedisOptions) -> Self {
        let cache = options.metrics_name.clone();
        crate::metrics::redis_available(cache.as_deref(), true);
        Self {
            closed: AtomicBool::new(true),
            state: Mutex::new(BreakerState {
                open_until: Instant::now(),
                backoff: Duration::ZERO,
            }),
            min_backoff: options.breaker_min_backoff,
            max_backoff: options.breaker_max_backoff,
            cache,
        }
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(super) fn would_allow(&self) -> bool {
        self.is_closed()
            || Instant::now()
                >= self
                    .state
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .open_until
    }

    pub(super) fn allow(&self) -> bool {
        if self.is_closed() {
            return true;
        }
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if now >= s.open_until {
            // Half-open: this call is the probe. The next one may go only
            // after another back-off, so a probe that never settles (its
            // caller was cancelled) cannot wedge the breaker.
            s.open_until = now + s.backoff;
            return true;
        }
        false
    }

    pub(super) fn success(&self) {
        if self.is_closed() {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.backoff = Duration::ZERO;
        self.closed.store(true, Ordering::Release);
        crate::metrics::redis_available(self.cache.as_deref(), true);
        tracing::info!("redis answers again; using it");
    }

    /// Let the next call probe now, whatever the back-off (Redis moved:
    /// the failures so far say nothing about the new server).
    pub(super) fn probe_now(&self) {
        if self.is_closed() {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.open_until = Instant::now();
    }

    /// Returns true when this failure opened a closed breaker.
    pub(super) fn failure(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let was_closed = self.closed.swap(false, Ordering::AcqRel);
        s.backoff = if was_closed || s.backoff.is_zero() {
            self.min_backoff
        } else {
            (s.backoff * 2).min(self.max_backoff)
        };
        s.open_until = Instant::now() + s.backoff;
        crate::metrics::redis_available(self.cache.as_deref(), false);
        was_closed
    }
}
