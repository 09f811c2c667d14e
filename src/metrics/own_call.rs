//! Requests that called the origin on their own, outside any flight, and
//! why: the coalescing a cache could not do, counted apart from the
//! followers it did (`herdguard_requests_total{outcome="coalesced"}`).

use std::sync::atomic::Ordering;

use metrics::Key;

use super::{count, names, Counters};

/// Why a request called the origin itself instead of sharing a flight.
/// A fixed set: the label never carries anything from the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OwnCall {
    /// An unsafe method (POST, PUT, …): never cached.
    Method,
    /// The request's own directives refused the shared answer (`no-cache`
    /// with a shared copy, `max-age`, `min-fresh`).
    Request,
    /// A GET or HEAD with a body.
    RequestBody,
    /// A request the key cannot hold (bad Host, method or URL override).
    Unkeyed,
    /// The answer is larger than the cache stores.
    TooLarge,
    /// A pass marker: the key's last answer was not storable.
    HitForPass,
    /// The wait for another request's call ran out.
    WaitTimeout,
    /// The flight's streamed body had moved past this reader.
    StreamWindowPassed,
    /// Too many waiters on one flight.
    Overloaded,
    /// The flight's answer was an error page not shared.
    ErrorNotShared,
    /// The flight's answer was not storable (private, `Set-Cookie`, …).
    Uncacheable,
    /// The stored answer is another variant (`Vary`).
    VaryMiss,
}

impl OwnCall {
    pub(super) const ALL: [Self; 12] = [
        Self::Method,
        Self::Request,
        Self::RequestBody,
        Self::Unkeyed,
        Self::TooLarge,
        Self::HitForPass,
        Self::WaitTimeout,
        Self::StreamWindowPassed,
        Self::Overloaded,
        Self::ErrorNotShared,
        Self::Uncacheable,
        Self::VaryMiss,
    ];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Method => "method",
            Self::Request => "request",
            Self::RequestBody => "request-body",
            Self::Unkeyed => "unkeyed",
            Self::TooLarge => "too-large",
            Self::HitForPass => "hit-for-pass",
            Self::WaitTimeout => "wait-timeout",
            Self::StreamWindowPassed => "stream-window-passed",
            Self::Overloaded => "overloaded",
            Self::ErrorNotShared => "error-not-shared",
            Self::Uncacheable => "uncacheable",
            Self::VaryMiss => "vary-miss",
        }
    }
}

/// One key per reason, in the order of [`OwnCall::ALL`].
pub(super) fn keys(
    key: &dyn Fn(&'static str, Option<(&'static str, &'static str)>) -> Key,
) -> [Key; 12] {
    OwnCall::ALL.map(|r| key(names::OWN_CALLS, Some(("reason", r.as_str()))))
}

impl Counters {
    /// A request that called the origin on its own, for `why`.
    pub(crate) fn own_call(&self, why: OwnCall) {
        self.tally.own_calls.fetch_add(1, Ordering::Relaxed);
        let i = OwnCall::ALL.iter().position(|r| *r == why).unwrap_or(0);
        count(&self.keys.own_calls[i]);
    }
}

/// Help text.
pub(super) fn describe() {
    metrics::describe_counter!(
        names::OWN_CALLS,
        "Requests that called the origin on their own, outside any flight, by reason (method, request, request-body, unkeyed, too-large, hit-for-pass, wait-timeout, stream-window-passed, overloaded, error-not-shared, uncacheable, vary-miss)."
    );
}
