//! Who shared an origin call and who could not: followers (requests
//! answered by another request's call, here or on another instance), and
//! requests that called the origin on their own, outside any flight, with
//! why.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use metrics::Key;

use super::{count, names, Counters, Tally};

/// The follower count of one cache, for the flights to add to: the
/// requests on a flight that another instance's call filled.
#[derive(Debug)]
pub(crate) struct FollowerCount {
    tally: Arc<Tally>,
    key: Key,
}

impl FollowerCount {
    pub(crate) fn add(&self, n: usize) {
        let n = n as u64;
        if n == 0 {
            return;
        }
        self.tally.followers.fetch_add(n, Ordering::Relaxed);
        metrics::with_recorder(|r| {
            r.register_counter(&self.key, &super::METADATA).increment(n);
        });
    }
}

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

/// The followers' key, then one key per reason, in the order of
/// [`OwnCall::ALL`].
pub(super) fn keys(
    key: &dyn Fn(&'static str, Option<(&'static str, &'static str)>) -> Key,
) -> (Key, [Key; 12]) {
    (
        key(names::FOLLOWERS, None),
        OwnCall::ALL.map(|r| key(names::OWN_CALLS, Some(("reason", r.as_str())))),
    )
}

impl Counters {
    /// A request answered by another request's origin call.
    pub(crate) fn follower(&self) {
        self.tally.followers.fetch_add(1, Ordering::Relaxed);
        count(&self.keys.followers);
    }

    /// What the flights count followers with.
    pub(crate) fn follower_count(&self) -> FollowerCount {
        FollowerCount {
            tally: Arc::clone(&self.tally),
            key: self.keys.followers.clone(),
        }
    }

    /// A request that called the origin on its own, for `why`.
    pub(crate) fn own_call(&self, why: OwnCall) {
        self.tally.own_calls.fetch_add(1, Ordering::Relaxed);
        let i = OwnCall::ALL.iter().position(|r| *r == why).unwrap_or(0);
        count(&self.keys.own_calls[i]);
    }
}

/// Help texts.
pub(super) fn describe() {
    metrics::describe_counter!(
        names::FOLLOWERS,
        "Requests answered by another request's origin call, on this instance or another on the same Redis (the caller not counted)."
    );
    metrics::describe_counter!(
        names::OWN_CALLS,
        "Requests that called the origin on their own, outside any flight, by reason (method, request, request-body, unkeyed, too-large, hit-for-pass, wait-timeout, stream-window-passed, overloaded, error-not-shared, uncacheable, vary-miss)."
    );
}
