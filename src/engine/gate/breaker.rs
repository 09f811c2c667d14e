//! The breaker: after consecutive failed origin calls the origin counts as
//! down; calls are refused at once (stale copies answer where they may)
//! and one probe per interval, its backoff doubling, finds out when it is
//! back. With Redis the probe is elected for the whole cluster (`shared`).
//!
//! ```text
//! closed ──(failures in a row ≥ threshold)──► open ──(probe due)──► probing
//!    ▲                                          ▲                      │
//!    └────────────── probe answered ────────────┼── probe failed: backoff × 2
//! ```

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::Refusal;
use crate::metrics::Counters;

/// When the origin counts as down, and how it is probed: the breaker's
/// settings ([`CacheLayerBuilder::origin_breaker`](crate::CacheLayerBuilder::origin_breaker),
/// [`CacheBuilder::origin_breaker`](crate::CacheBuilder::origin_breaker)).
///
/// A call fails when it times out, the origin cannot be reached (the inner
/// service's own error, or a [`Cache`](crate::Cache) computation's error),
/// it panics, or it answers with a 5xx status the
/// [`counting`](Self::counting) rule picks: by default 502, 503 and 504,
/// what an origin that is down, overloaded or cut off from its own backend
/// answers. A plain 500 does not count by default: it is what one request
/// that trips a bug gets, and a client that may send five such requests in
/// a row must not switch the origin off for everyone. A 4xx never counts.
/// Any other answer is a success and resets the count.
///
/// After [`failures`](Self::failures) failed calls in a row (default 5, as
/// Envoy's outlier detection) the breaker opens: calls are refused without
/// reaching the origin, so stale copies allowed by `stale-if-error` are
/// served at once (`Cache-Status: …; detail=origin-down`) and requests with
/// none get `503` with `Retry-After`. After [`backoff`](Self::backoff)'s
/// first interval (1 s) one call goes through as a probe: an answer closes
/// the breaker; a failure doubles the interval, up to its cap (30 s).
///
/// ```
/// use std::time::Duration;
/// use herdguard::OriginBreaker;
///
/// let breaker = OriginBreaker::default()
///     .failures(3)
///     .backoff(Duration::from_millis(500), Duration::from_secs(10))
///     .counting(|status| status != 501); // 501 Not Implemented is no outage
/// # let _ = breaker;
/// let off = OriginBreaker::off();
/// # let _ = off;
/// ```
#[derive(Clone, Copy)]
pub struct OriginBreaker {
    pub(crate) threshold: u32,
    pub(crate) first_backoff: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) counts: fn(u16) -> bool,
}

impl std::fmt::Debug for OriginBreaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginBreaker")
            .field("failures", &self.threshold)
            .field("first_backoff", &self.first_backoff)
            .field("max_backoff", &self.max_backoff)
            .finish_non_exhaustive()
    }
}

impl Default for OriginBreaker {
    fn default() -> Self {
        Self {
            threshold: 5,
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            counts: |status| matches!(status, 502..=504),
        }
    }
}

impl OriginBreaker {
    /// No breaker: every call goes to the origin, however often it fails.
    pub fn off() -> Self {
        Self {
            threshold: 0,
            ..Self::default()
        }
    }

    /// Failed calls in a row that open the breaker (default 5; 0 turns it off).
    #[must_use]
    pub fn failures(mut self, n: u32) -> Self {
        self.threshold = n;
        self
    }

    /// The first interval before a probe, and the most it doubles to
    /// (defaults 1 s and 30 s). `build()` refuses a zero first interval or
    /// a cap below it.
    #[must_use]
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.first_backoff = first;
        self.max_backoff = max;
        self
    }

    /// Which 5xx statuses count as a failure (default: 502, 503 and 504).
    /// Only ever asked about 500–599: a 4xx never counts.
    #[must_use]
    pub fn counting(mut self, rule: fn(u16) -> bool) -> Self {
        self.counts = rule;
        self
    }

    pub(crate) fn enabled(&self) -> bool {
        self.threshold > 0
    }

    /// Whether an answer with `status` is a failure of the origin.
    pub(crate) fn status_fails(&self, status: u16) -> bool {
        (500..=599).contains(&status) && (self.counts)(status)
    }
}

#[derive(Debug, Clone, Copy)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        probe_at: Instant,
        backoff: Duration,
    },
    /// One call is out as the probe, since `since`.
    Probing {
        backoff: Duration,
        since: Instant,
    },
}

/// What the circuit lets a call do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    Call,
    /// The call is the probe; `backoff` is the interval it ends.
    Probe {
        backoff: Duration,
    },
}

/// The breaker's state. A std `Mutex`: held for a few compares, never
/// across an `.await`.
#[derive(Debug)]
pub(super) struct Circuit {
    pub(super) policy: OriginBreaker,
    state: Mutex<State>,
    /// A probe out longer than this gave no verdict and never will (its
    /// call is bounded by it): the next call probes instead.
    probe_limit: Duration,
}

/// A transition the caller reports (metrics, the shared state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turned {
    Opened(Duration),
    Closed,
    Unchanged,
}

impl Circuit {
    pub(super) fn new(policy: OriginBreaker, probe_limit: Duration) -> Self {
        Self {
            policy,
            state: Mutex::new(State::Closed { failures: 0 }),
            probe_limit,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a call may go now: `Err` with how long until the next probe
    /// when the origin is down; a due probe is handed to this call.
    pub(super) fn admit(&self, now: Instant) -> Result<Admit, Refusal> {
        if !self.policy.enabled() {
            return Ok(Admit::Call);
        }
        let mut state = self.state();
        match *state {
            State::Closed { .. } => Ok(Admit::Call),
            State::Open { probe_at, backoff } if now >= probe_at => {
                *state = State::Probing {
                    backoff,
                    since: now,
                };
                Ok(Admit::Probe { backoff })
            }
            State::Probing { backoff, since } if now >= since + self.probe_limit => {
                *state = State::Probing {
                    backoff,
                    since: now,
                };
                Ok(Admit::Probe { backoff })
            }
            State::Open { probe_at, .. } => Err(Refusal::Down(probe_at - now)),
            State::Probing { backoff, .. } => Err(Refusal::Down(backoff)),
        }
    }

    /// Whether a call would be refused right now, without taking a probe.
    pub(super) fn refuses(&self, now: Instant) -> Option<Duration> {
        if !self.policy.enabled() {
            return None;
        }
        match *self.state() {
            State::Closed { .. } => None,
            State::Open { probe_at, .. } if now >= probe_at => None,
            State::Open { probe_at, .. } => Some(probe_at - now),
            State::Probing { since, .. } if now >= since + self.probe_limit => None,
            State::Probing { backoff, .. } => Some(backoff),
        }
    }

    /// A call's verdict. `probe`: it was the probe.
    pub(super) fn record(&self, healthy: bool, probe: bool, now: Instant) -> Turned {
        if !self.policy.enabled() {
            return Turned::Unchanged;
        }
        let mut state = self.state();
        let (next, turned) = match (*state, healthy) {
            (State::Closed { .. }, true) => (State::Closed { failures: 0 }, Turned::Unchanged),
            (_, true) => (State::Closed { failures: 0 }, Turned::Closed),
            (State::Closed { failures }, false) => {
                let failures = failures.saturating_add(1);
                if failures >= self.policy.threshold {
                    let backoff = self.policy.first_backoff;
                    let open = State::Open {
                        probe_at: now + backoff,
                        backoff,
                    };
                    (open, Turned::Opened(backoff))
                } else {
                    (State::Closed { failures }, Turned::Unchanged)
                }
            }
            (State::Probing { backoff, .. }, false) if probe => {
                let backoff = backoff.saturating_mul(2).min(self.policy.max_backoff);
                let open = State::Open {
                    probe_at: now + backoff,
                    backoff,
                };
                (open, Turned::Opened(backoff))
            }
            // A call from before the breaker opened: no news.
            (other, false) => (other, Turned::Unchanged),
        };
        *state = next;
        turned
    }

    /// The probe ended without a verdict (its caller went away, or another
    /// instance probes): the next call that finds it due probes.
    pub(super) fn probe_abandoned(&self, probe_at: Instant) {
        let mut state = self.state();
        if let State::Probing { backoff, .. } = *state {
            *state = State::Open { probe_at, backoff };
        }
    }

    /// The probe out stands for the cluster's `interval` (Redis), so a
    /// failure doubles that one.
    #[cfg_attr(
        not(feature = "redis"),
        allow(dead_code, reason = "only a shared breaker has one")
    )]
    pub(super) fn probing_for(&self, interval: Duration) {
        let mut state = self.state();
        if let State::Probing { backoff, .. } = &mut *state {
            *backoff = interval.min(self.policy.max_backoff);
        }
    }

    /// Another instance's probe found the origin back.
    #[cfg_attr(
        not(feature = "redis"),
        allow(dead_code, reason = "only a shared breaker hears of it")
    )]
    pub(super) fn close(&self) -> Turned {
        let mut state = self.state();
        let was_closed = matches!(*state, State::Closed { .. });
        *state = State::Closed { failures: 0 };
        if was_closed {
            Turned::Unchanged
        } else {
            Turned::Closed
        }
    }

    /// Report `turned` to the metrics.
    pub(super) fn report(turned: Turned, metrics: &Counters) {
        match turned {
            Turned::Opened(_) => metrics.breaker(true),
            Turned::Closed => metrics.breaker(false),
            Turned::Unchanged => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(100);

    fn circuit(threshold: u32) -> Circuit {
        Circuit::new(OriginBreaker::default().failures(threshold), LIMIT)
    }

    /// The breaker opens on the threshold's failure in a row, not before.
    #[test]
    fn opens_after_the_threshold_in_a_row() {
        let c = circuit(3);
        let now = Instant::now();
        assert_eq!(c.record(false, false, now), Turned::Unchanged);
        assert_eq!(c.record(false, false, now), Turned::Unchanged);
        assert!(c.admit(now).is_ok());
        assert_eq!(
            c.record(false, false, now),
            Turned::Opened(Duration::from_secs(1))
        );
        assert_eq!(c.admit(now), Err(Refusal::Down(Duration::from_secs(1))));
    }

    /// A success between failures starts the count again.
    #[test]
    fn a_success_resets_the_count() {
        let c = circuit(2);
        let now = Instant::now();
        c.record(false, false, now);
        c.record(true, false, now);
        assert_eq!(c.record(false, false, now), Turned::Unchanged);
        assert!(c.admit(now).is_ok());
    }

    /// Once due, exactly one call probes; a failed probe doubles the wait
    /// up to the cap, an answered one closes the breaker.
    #[test]
    fn one_probe_at_a_time_with_doubling_backoff() {
        let c = Circuit::new(
            OriginBreaker::default()
                .failures(1)
                .backoff(Duration::from_secs(1), Duration::from_secs(3)),
            LIMIT,
        );
        let t0 = Instant::now();
        c.record(false, false, t0);
        let t1 = t0 + Duration::from_secs(1);
        let backoff = Duration::from_secs(1);
        assert_eq!(c.admit(t1), Ok(Admit::Probe { backoff }));
        assert!(c.admit(t1).is_err(), "a second call while the probe is out");
        let turned = c.record(false, true, t1);
        assert_eq!(turned, Turned::Opened(Duration::from_secs(2)));
        let t3 = t1 + Duration::from_secs(2);
        assert!(matches!(c.admit(t3), Ok(Admit::Probe { .. })));
        assert_eq!(
            c.record(false, true, t3),
            Turned::Opened(Duration::from_secs(3))
        );
        let t6 = t3 + Duration::from_secs(3);
        assert!(matches!(c.admit(t6), Ok(Admit::Probe { .. })));
        assert_eq!(c.record(true, true, t6), Turned::Closed);
        assert_eq!(c.admit(t6), Ok(Admit::Call));
    }

    /// A probe that never reports (its call lost) is taken over once the
    /// longest call could have ended: the breaker cannot stay open for good.
    #[test]
    fn a_lost_probe_is_taken_over_after_the_limit() {
        let c = circuit(1);
        let t0 = Instant::now();
        c.record(false, false, t0);
        let t1 = t0 + Duration::from_secs(1);
        assert!(matches!(c.admit(t1), Ok(Admit::Probe { .. })));
        assert!(c.admit(t1 + LIMIT - Duration::from_millis(1)).is_err());
        assert!(matches!(c.admit(t1 + LIMIT), Ok(Admit::Probe { .. })));
    }

    /// Off, nothing is ever refused.
    #[test]
    fn off_never_refuses() {
        let c = Circuit::new(OriginBreaker::off(), LIMIT);
        let now = Instant::now();
        for _ in 0..10 {
            c.record(false, false, now);
        }
        assert_eq!(c.admit(now), Ok(Admit::Call));
    }

    /// 4xx never counts; the rule picks among 5xx only.
    #[test]
    fn only_chosen_5xx_fail() {
        let b = OriginBreaker::default().counting(|s| s != 501);
        assert!(b.status_fails(503));
        assert!(!b.status_fails(501));
        assert!(!b.status_fails(404));
        assert!(!OriginBreaker::default()
            .counting(|_| true)
            .status_fails(429));
    }
}
