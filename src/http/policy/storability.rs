//! Response side: may a shared cache store this response, share it with
//! the requests waiting on it, or must it pass it on for one request only.

use std::time::{Duration, SystemTime};

use http::header::{self, HeaderMap, HeaderName};
use http::StatusCode;

use super::directives::CacheControl;
use super::freshness::{
    corrected_initial_age, freshness_lifetime, http_date, secs_u32, StoredRules,
};
use super::not_stored::NotStored;

/// What may be done with an origin response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResponseVerdict {
    /// Store it: fresh for `fresh_for` from now, then usable stale for
    /// `stale_for` (stale-while-revalidate). Both may be zero for a response
    /// kept only to be revalidated (`no-cache`, or stale on arrival).
    Store {
        fresh_for: Duration,
        stale_for: Duration,
        initial_age: Duration,
        rules: StoredRules,
    },
    /// Safe to hand to the requests waiting for it now, but not to store
    /// (no freshness information).
    Share,
    /// Neither store nor share with other requests.
    Pass(NotStored),
}

/// Settings that change response decisions.
#[derive(Debug, Clone, Default)]
pub(crate) struct ResponseRules {
    /// Freshness for responses that carry none (off by default).
    pub(crate) default_ttl: Option<Duration>,
    /// Heuristic freshness from Last-Modified: 10 % of its age, at most this
    /// (off by default).
    pub(crate) heuristic_max: Option<Duration>,
    /// Operator grace: how long past its freshness a response may be served
    /// while one refresh runs, without the origin's stale-while-revalidate
    /// (zero: off, the default).
    pub(crate) grace: Duration,
    /// A targeted field of the user's own, obeyed above `CDN-Cache-Control`.
    pub(crate) own_cache_control: Option<HeaderName>,
    /// No freshness lifetime is longer than this (a route's cap).
    pub(crate) max_ttl: Option<Duration>,
    /// The origin's freshness directives are ignored; `default_ttl` decides.
    pub(crate) ignore_cache_control: bool,
}

/// The response directives this cache obeys, and whether `Expires` still
/// counts: the first valid targeted field (RFC 9213) replaces both
/// `Cache-Control` and `Expires`. With `ignore_cache_control`, only
/// `no-store` and `private` survive (they protect users, and ignoring them
/// is never what a route wants), and `Expires` does not count.
pub(crate) fn response_directives(
    rules: &ResponseRules,
    headers: &HeaderMap,
) -> (CacheControl, bool) {
    let (cc, expires) =
        match crate::http::policy::targeted::targeted(rules.own_cache_control.as_ref(), headers) {
            Some(cc) => (cc, false),
            None => (CacheControl::parse(headers), true),
        };
    if !rules.ignore_cache_control {
        return (cc, expires);
    }
    let kept = CacheControl {
        no_store: cc.no_store,
        private: cc.private,
        ..CacheControl::default()
    };
    (kept, false)
}

/// Decide about an origin response to a cacheable request.
///
/// `request_time` and `response_time` are the wall-clock moments the request
/// went out and the response came back, for the age calculation.
pub(crate) fn classify_response(
    rules: &ResponseRules,
    request_had_authorization: bool,
    status: StatusCode,
    headers: &HeaderMap,
    request_time: SystemTime,
    response_time: SystemTime,
) -> ResponseVerdict {
    let (cc, expires_counts) = response_directives(rules, headers);
    if let Some(reason) = pass_reason(&cc, request_had_authorization, status, headers) {
        return ResponseVerdict::Pass(reason);
    }
    let validators =
        headers.contains_key(header::ETAG) || headers.contains_key(header::LAST_MODIFIED);
    let explicit = if rules.ignore_cache_control {
        None
    } else {
        freshness_lifetime(&cc, expires_counts.then_some(headers))
    };
    let lifetime = match explicit {
        Some(l) => l,
        None => match heuristic_lifetime(rules, status, headers, response_time) {
            Some(l) => l,
            // no-cache with validators is worth keeping: the next use costs a 304.
            None if cc.no_cache && validators => Duration::ZERO,
            None => return ResponseVerdict::Share,
        },
    };
    let lifetime = rules.max_ttl.map_or(lifetime, |max| lifetime.min(max));
    let initial_age = corrected_initial_age(headers, request_time, response_time);
    // s-maxage carries proxy-revalidate for a shared cache (RFC 9111 §5.2.2.10).
    let no_stale = cc.must_revalidate || cc.proxy_revalidate || cc.s_maxage.is_some();
    let stored = stored_rules(&cc, lifetime, validators);
    let (swr, sie) = (u64::from(stored.swr), u64::from(stored.sie));
    let fresh_for = if cc.no_cache {
        Duration::ZERO
    } else {
        lifetime.saturating_sub(initial_age)
    };
    // The operator's grace keeps the entry servable (and stored, in memory
    // and in Redis) that long past its freshness; never where the origin
    // forbade stale answers.
    let grace = if no_stale || cc.no_cache {
        Duration::ZERO
    } else {
        rules.grace
    };
    // Stale grace counts from the end of freshness, even if that has passed.
    let stale_for = Duration::from_secs(swr)
        .max(grace)
        .saturating_sub(initial_age.saturating_sub(lifetime));
    if fresh_for.is_zero() && stale_for.is_zero() && !validators && sie == 0 {
        return ResponseVerdict::Share;
    }
    ResponseVerdict::Store {
        fresh_for,
        stale_for,
        initial_age,
        rules: stored,
    }
}

/// Why a response is not stored whatever its freshness, if it is not.
fn pass_reason(
    cc: &CacheControl,
    request_had_authorization: bool,
    status: StatusCode,
    headers: &HeaderMap,
) -> Option<NotStored> {
    // RFC 9111 §5.2.2.3: with must-understand, a status whose caching rules
    // we know overrides no-store, and any other status is not stored.
    if cc.must_understand && !understood(status) {
        return Some(NotStored::MustUnderstand);
    }
    if cc.no_store && !cc.must_understand {
        return Some(NotStored::NoStore);
    }
    if cc.private {
        return Some(NotStored::Private);
    }
    if headers.contains_key(header::SET_COOKIE) {
        return Some(NotStored::SetCookie);
    }
    if vary_names(headers).is_none() {
        return Some(NotStored::VaryStar);
    }
    // RFC 9111 §3.5: a shared cache stores a response to an authorized
    // request only when the origin explicitly allows it.
    if request_had_authorization && !(cc.public || cc.s_maxage.is_some() || cc.must_revalidate) {
        return Some(NotStored::Authorization);
    }
    // A 206 answers the request that got it (its range, or an origin
    // that answered a whole-object fill with a part): never stored, and
    // never a reason to stop caching the URL.
    if status == StatusCode::PARTIAL_CONTENT {
        return Some(NotStored::PartialContent);
    }
    if status.is_informational() || status == StatusCode::NOT_MODIFIED {
        return Some(NotStored::Status);
    }
    None
}

/// The rules stored with an entry of `lifetime`: its stale permissions and
/// flags.
fn stored_rules(cc: &CacheControl, lifetime: Duration, validators: bool) -> StoredRules {
    let no_stale = cc.must_revalidate || cc.proxy_revalidate || cc.s_maxage.is_some();
    let mut flags = 0;
    if no_stale {
        flags |= StoredRules::NO_STALE;
    }
    if cc.no_cache {
        flags |= StoredRules::NO_CACHE;
    }
    if validators {
        flags |= StoredRules::VALIDATORS;
    }
    // stale-while-revalidate and stale-if-error are the origin's explicit
    // permission, so they hold with s-maxage; must-revalidate and
    // proxy-revalidate withdraw them.
    let explicit_no_stale = cc.must_revalidate || cc.proxy_revalidate;
    let swr = if explicit_no_stale || cc.no_cache {
        0
    } else {
        cc.stale_while_revalidate.unwrap_or(0)
    };
    let sie = if explicit_no_stale || cc.no_cache {
        0
    } else {
        cc.stale_if_error.unwrap_or(0)
    };
    StoredRules {
        lifetime: secs_u32(lifetime.as_secs()),
        swr: secs_u32(swr),
        sie: secs_u32(sie),
        flags,
    }
}

/// Whether a response the verdict hands out unstored
/// ([`ResponseVerdict::Share`]) is so because it carries no freshness at
/// all (no `s-maxage`, `max-age` or `Expires`, and no heuristic or TTL
/// applies), rather than a zero one (`max-age=0`, an `Expires` in the past):
/// the case a TTL on the layer or the route would fix. Never for a server
/// error, which is handed to its waiters anyway.
pub(crate) fn lacks_freshness(
    rules: &ResponseRules,
    status: StatusCode,
    headers: &HeaderMap,
) -> bool {
    if !heuristically_cacheable(status) || status.is_server_error() {
        return false;
    }
    let (cc, expires_counts) = response_directives(rules, headers);
    let explicit = if rules.ignore_cache_control {
        None
    } else {
        freshness_lifetime(&cc, expires_counts.then_some(headers))
    };
    let validators =
        headers.contains_key(header::ETAG) || headers.contains_key(header::LAST_MODIFIED);
    explicit.is_none()
        && !(cc.no_cache && validators)
        && heuristic_lifetime(rules, status, headers, SystemTime::now()).is_none()
}

/// Whether a response to an authorized request may be reused for other
/// credentials: only when the origin says so with `public` or `s-maxage`.
/// `must-revalidate` alone (§3.5 allows it) still lets it be stored, but
/// only for the same credentials.
pub(crate) fn shared_across_credentials(rules: &ResponseRules, headers: &HeaderMap) -> bool {
    let (cc, _) = response_directives(rules, headers);
    cc.public || cc.s_maxage.is_some()
}

/// Whether a [`ResponseVerdict::Pass`] reason lies with the one request that
/// got the response (its credentials, a cookie set for it) rather than with
/// the resource: then the stored entry stays and no pass marker is set.
pub(crate) fn request_specific(reason: NotStored) -> bool {
    matches!(
        reason,
        NotStored::SetCookie | NotStored::Authorization | NotStored::PartialContent
    )
}

/// Statuses whose caching requirements this cache implements (for
/// `must-understand`): the ones cacheable by default and the redirects.
pub(super) fn understood(status: StatusCode) -> bool {
    heuristically_cacheable(status) || matches!(status.as_u16(), 302 | 303 | 307)
}

/// RFC 9110 §15.1: statuses cacheable by default (heuristic freshness).
pub(super) fn heuristically_cacheable(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// The header names a response varies on; `None` for `Vary: *`.
pub(crate) fn vary_names(headers: &HeaderMap) -> Option<Vec<HeaderName>> {
    let mut names = Vec::new();
    for line in headers.get_all(header::VARY) {
        let Ok(line) = line.to_str() else {
            // Unreadable Vary: we cannot match it, so it must never match.
            return None;
        };
        for name in line.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "*" {
                return None;
            }
            match HeaderName::from_bytes(name.as_bytes()) {
                Ok(n) if !names.contains(&n) => names.push(n),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }
    Some(names)
}

/// RFC 9111 §4.2.2: a tenth of the time since Last-Modified, capped; else
/// the configured default TTL. Only for statuses cacheable by default.
pub(super) fn heuristic_lifetime(
    rules: &ResponseRules,
    status: StatusCode,
    headers: &HeaderMap,
    response_time: SystemTime,
) -> Option<Duration> {
    if !heuristically_cacheable(status) {
        return None;
    }
    // A route that ignores the origin's directives ignores its dates too.
    if let Some(max) = rules.heuristic_max.filter(|_| !rules.ignore_cache_control) {
        let last_modified = headers
            .get(header::LAST_MODIFIED)
            .and_then(|v| http_date(v.as_bytes()));
        if let Some(lm) = last_modified {
            let date = headers
                .get(header::DATE)
                .and_then(|d| http_date(d.as_bytes()))
                .unwrap_or(response_time);
            let since = date.duration_since(lm).unwrap_or(Duration::ZERO);
            return Some((since / 10).min(max));
        }
    }
    rules.default_ttl
}
