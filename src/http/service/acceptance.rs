//! Whether the answer a flight shared serves this request too: its own
//! directives may refuse a stored copy (`max-age`, `min-fresh`, `no-cache`),
//! and a copy handed out fresh may have expired since.

use std::time::Duration;

use http::header::HeaderMap;
use http::Method;

use crate::http::keys::Target;
use crate::http::policy::{self, RequestVerdict, Usable};
use crate::http::response::CachedResponse;
use crate::http::state::{LayerState, ReloadMode};
use crate::metrics::Source;
use crate::store::memory::Stored;

use super::fill::{is_error, is_stored};

/// Whether a request refuses `entry`, a stored copy the flight shared with
/// it. The leader's own answer is for it, and so is a refresh's to a request
/// that refused the stored one (`refresh`) (a refresh's answer is never the entry it
/// refused).
pub(super) fn refuses(
    state: &LayerState,
    refresh: bool,
    request_headers: &HeaderMap,
    entry: &Stored<CachedResponse>,
    source: Source,
) -> bool {
    !refresh
        && state.http.reload != ReloadMode::Ignore
        && source != Source::Miss
        && is_stored(entry)
        && !acceptable(request_headers, entry, state.http.rules.grace)
}

/// Whether `entry`, the outcome of a flight the request followed, answers
/// it as it is, with nothing else to do first: its own variant (no other
/// to follow), not refused by its directives, no server error a stale copy
/// might stand in for, and no error page made for the leading request
/// alone. Where this says no, `miss` decides from the same outcome.
pub(super) fn plainly_answers(
    state: &LayerState,
    target: &Target,
    request_headers: &HeaderMap,
    entry: &Stored<CachedResponse>,
    source: Source,
) -> bool {
    entry.value.vary_matches(request_headers)
        && state.variant_for(target, entry, request_headers).is_none()
        && !refuses(state, false, request_headers, entry, source)
        && !entry.value.status.is_server_error()
        && !leaders_error_page(state, entry, source)
}

/// An error page the cache did not store, shared by a flight another
/// request led: it was made for that request (its headers, its cookie),
/// so a waiter asks for its own (unless the operator shares such answers).
pub(super) fn leaders_error_page(
    state: &LayerState,
    entry: &Stored<CachedResponse>,
    source: Source,
) -> bool {
    source == Source::Coalesced
        && !is_stored(entry)
        && is_error(entry.value.status)
        && !state.http.share_uncacheable
}

/// Whether `entry`, handed out fresh, is past its freshness now while the
/// request would have taken it in its last moment of freshness: expiry, not
/// the request's own directives (`max-age`, `min-fresh`), refuses it.
pub(super) fn expired_since_handed_out(
    request_headers: &HeaderMap,
    entry: &Stored<CachedResponse>,
    source: Source,
    grace: Duration,
) -> bool {
    if !matches!(source, Source::Hit | Source::Coalesced) {
        return false;
    }
    let RequestVerdict::Cacheable(rd) = policy::classify_request(&Method::GET, request_headers)
    else {
        return false;
    };
    let rules = entry.value.rules;
    let lifetime = rules.lifetime();
    if lifetime.is_zero() || entry.value.current_age(entry.age()) < lifetime {
        return false;
    }
    // Ages count in whole seconds: any instant before the end is the last one.
    let last_fresh = lifetime.saturating_sub(Duration::from_millis(1));
    policy::usability(&rd, rules, last_fresh, grace) == Usable::Fresh
}

/// Whether a request with these headers accepts `entry` served as it is now.
pub(super) fn acceptable(
    request_headers: &HeaderMap,
    entry: &Stored<CachedResponse>,
    grace: Duration,
) -> bool {
    let RequestVerdict::Cacheable(rd) = policy::classify_request(&Method::GET, request_headers)
    else {
        return false;
    };
    let age = entry.value.current_age(entry.age());
    matches!(
        policy::usability(&rd, entry.value.rules, age, grace),
        Usable::StaleWhileRevalidate | Usable::Grace | Usable::StaleAccepted | Usable::Fresh
    )
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::header::HeaderValue;
    use http::StatusCode;

    use super::*;
    use crate::entry::envelope::EntryMeta;
    use crate::http::policy::StoredRules;
    use crate::key::CacheKey;

    /// A copy fresh for `lifetime` seconds, `age` old now.
    fn copy(lifetime: u32, age: Duration) -> Stored<CachedResponse> {
        let value = CachedResponse {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Bytes::from_static(b"x"),
            vary: Vec::new(),
            initial_age: 0,
            url: CacheKey::new("example.test/x"),
            route: None,
            rules: StoredRules {
                lifetime,
                swr: 0,
                sie: 0,
                flags: 0,
            },
            revalidated: false,
            not_stored: None,
            served_head: Default::default(),
        };
        let fresh = Duration::from_secs(u64::from(lifetime));
        let meta = EntryMeta::now(fresh, Duration::ZERO, 1);
        Stored::new(value, meta, fresh.saturating_sub(age), fresh, age)
    }

    fn asking(cache_control: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        if !cache_control.is_empty() {
            h.insert("cache-control", HeaderValue::from_static(cache_control));
        }
        h
    }

    /// Expiry alone refuses a copy past its end; a request's own max-age or min-fresh, a copy refused while still fresh, or a stale one does not count.
    #[test]
    fn only_expiry_since_the_handout_counts() {
        let just_past = copy(1, Duration::from_millis(1_002));
        let grace = Duration::ZERO;
        for cc in ["", "max-age=5"] {
            assert!(
                expired_since_handed_out(&asking(cc), &just_past, Source::Hit, grace),
                "{cc:?}"
            );
        }
        assert!(expired_since_handed_out(
            &asking(""),
            &just_past,
            Source::Coalesced,
            grace
        ));
        // Its own directives refuse the copy even in its last moment.
        assert!(!expired_since_handed_out(
            &asking("min-fresh=1"),
            &just_past,
            Source::Hit,
            grace
        ));
        let older = copy(3, Duration::from_millis(3_002));
        assert!(!expired_since_handed_out(
            &asking("max-age=1"),
            &older,
            Source::Hit,
            grace
        ));
        // Refused while fresh: by its directives, not by expiry.
        let fresh = copy(60, Duration::from_secs(20));
        assert!(!expired_since_handed_out(
            &asking("max-age=10"),
            &fresh,
            Source::Hit,
            grace
        ));
        // Handed out stale: it never was fresh for this request.
        assert!(!expired_since_handed_out(
            &asking(""),
            &just_past,
            Source::Stale,
            grace
        ));
    }
}
