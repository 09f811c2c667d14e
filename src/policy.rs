//! RFC 9111 decisions for a shared cache: may this request use the cache, may
//! this response be stored or shared, and for how long.

use std::time::{Duration, SystemTime};

use http::header::{self, HeaderMap, HeaderName};
use http::{Method, StatusCode};

/// RFC 9111 §1.2.2: delta-seconds past 2^31 are treated as 2^31.
const MAX_DELTA_SECS: u64 = 2_147_483_648;

/// Cache-Control directives we act on, from every Cache-Control field line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct CacheControl {
    pub(crate) no_store: bool,
    pub(crate) no_cache: bool,
    pub(crate) private: bool,
    pub(crate) public: bool,
    pub(crate) must_revalidate: bool,
    pub(crate) proxy_revalidate: bool,
    pub(crate) max_age: Option<u64>,
    pub(crate) s_maxage: Option<u64>,
    pub(crate) stale_while_revalidate: Option<u64>,
    pub(crate) stale_if_error: Option<u64>,
    pub(crate) only_if_cached: bool,
}

impl CacheControl {
    pub(crate) fn parse(headers: &HeaderMap) -> Self {
        let mut cc = CacheControl::default();
        for line in headers.get_all(header::CACHE_CONTROL) {
            // Non-ASCII or non-UTF-8 bytes cannot form a directive we know.
            let Ok(line) = line.to_str() else { continue };
            for directive in line.split(',') {
                let directive = directive.trim();
                if directive.is_empty() {
                    continue;
                }
                let (name, value) = match directive.split_once('=') {
                    Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
                    None => (directive, None),
                };
                let secs = || value.map(parse_delta);
                match name.to_ascii_lowercase().as_str() {
                    "no-store" => cc.no_store = true,
                    // `no-cache="field"` restricts named fields; treating it as a
                    // plain no-cache is the conservative reading.
                    "no-cache" => cc.no_cache = true,
                    "private" => cc.private = true,
                    "public" => cc.public = true,
                    "must-revalidate" => cc.must_revalidate = true,
                    "proxy-revalidate" => cc.proxy_revalidate = true,
                    "only-if-cached" => cc.only_if_cached = true,
                    // A duplicate or invalid age is treated as 0 (stale), the
                    // safe reading of RFC 9111 §4.2.1.
                    "max-age" => cc.max_age = Some(merge(cc.max_age, secs())),
                    "s-maxage" => cc.s_maxage = Some(merge(cc.s_maxage, secs())),
                    "stale-while-revalidate" => {
                        cc.stale_while_revalidate = Some(merge(cc.stale_while_revalidate, secs()))
                    }
                    "stale-if-error" => cc.stale_if_error = Some(merge(cc.stale_if_error, secs())),
                    _ => {}
                }
            }
        }
        cc
    }
}

fn merge(previous: Option<u64>, new: Option<Option<u64>>) -> u64 {
    match (previous, new) {
        (None, Some(Some(v))) => v,
        _ => 0,
    }
}

fn parse_delta(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(
        s.parse::<u64>()
            .unwrap_or(MAX_DELTA_SECS)
            .min(MAX_DELTA_SECS),
    )
}

/// Whether a request may be answered from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestVerdict {
    Cacheable,
    /// Go straight to the origin; the reason becomes `Cache-Status: fwd=`.
    Bypass(Forward),
}

/// RFC 9211 `fwd` reasons we report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forward {
    Method,
    Request,
    VaryMiss,
    UriMiss,
}

impl Forward {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Forward::Method => "method",
            Forward::Request => "request",
            Forward::VaryMiss => "vary-miss",
            Forward::UriMiss => "uri-miss",
        }
    }
}

pub(crate) fn classify_request(method: &Method, headers: &HeaderMap) -> RequestVerdict {
    if method != Method::GET && method != Method::HEAD {
        return RequestVerdict::Bypass(Forward::Method);
    }
    // Partial content and protocol upgrades are passed through untouched.
    if headers.contains_key(header::RANGE) || headers.contains_key(header::UPGRADE) {
        return RequestVerdict::Bypass(Forward::Request);
    }
    let cc = CacheControl::parse(headers);
    let pragma_no_cache = headers
        .get_all(header::PRAGMA)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"no-cache"));
    if cc.no_store
        || cc.no_cache
        || cc.max_age == Some(0)
        || (pragma_no_cache && !headers.contains_key(header::CACHE_CONTROL))
    {
        return RequestVerdict::Bypass(Forward::Request);
    }
    RequestVerdict::Cacheable
}

/// Whether a method is unsafe, so a success must invalidate the target URI.
pub(crate) fn invalidates(method: &Method) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

/// What may be done with an origin response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResponseVerdict {
    /// Store it: fresh for `fresh_for` from now, then usable stale for `stale_for`.
    Store {
        fresh_for: Duration,
        stale_for: Duration,
        initial_age: Duration,
    },
    /// Safe to hand to the requests waiting for it now, but not to store
    /// (no freshness information).
    Share,
    /// Neither store nor share with other requests.
    Pass(&'static str),
}

/// Settings that change response decisions.
#[derive(Debug, Clone, Default)]
pub(crate) struct ResponseRules {
    /// Freshness for responses that carry none (off by default).
    pub(crate) default_ttl: Option<Duration>,
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
    let cc = CacheControl::parse(headers);
    if cc.no_store {
        return ResponseVerdict::Pass("no-store");
    }
    if cc.private {
        return ResponseVerdict::Pass("private");
    }
    if headers.contains_key(header::SET_COOKIE) {
        return ResponseVerdict::Pass("set-cookie");
    }
    if vary_names(headers).is_none() {
        return ResponseVerdict::Pass("vary-star");
    }
    // RFC 9111 §3.5: a shared cache stores a response to an authorized
    // request only when the origin explicitly allows it.
    if request_had_authorization && !(cc.public || cc.s_maxage.is_some() || cc.must_revalidate) {
        return ResponseVerdict::Pass("authorization");
    }
    if status == StatusCode::PARTIAL_CONTENT
        || status.is_informational()
        || status == StatusCode::NOT_MODIFIED
    {
        return ResponseVerdict::Pass("status");
    }
    if cc.no_cache {
        // Storable, but every use must be revalidated: nothing to gain from
        // storing it until revalidation is supported; waiters may share it.
        return ResponseVerdict::Share;
    }
    let lifetime = match freshness_lifetime(&cc, headers) {
        Some(l) => l,
        None => match rules.default_ttl {
            Some(ttl) if heuristically_cacheable(status) => ttl,
            _ => return ResponseVerdict::Share,
        },
    };
    let initial_age = corrected_initial_age(headers, request_time, response_time);
    let fresh_for = lifetime.saturating_sub(initial_age);
    let stale_for = if cc.must_revalidate || cc.proxy_revalidate {
        Duration::ZERO
    } else {
        Duration::from_secs(cc.stale_while_revalidate.unwrap_or(0))
    };
    if fresh_for.is_zero() && stale_for.is_zero() {
        return ResponseVerdict::Share;
    }
    ResponseVerdict::Store {
        fresh_for,
        stale_for,
        initial_age,
    }
}

/// RFC 9111 §4.2.1, for a shared cache: s-maxage, then max-age, then Expires − Date.
fn freshness_lifetime(cc: &CacheControl, headers: &HeaderMap) -> Option<Duration> {
    if let Some(s) = cc.s_maxage {
        return Some(Duration::from_secs(s));
    }
    if let Some(m) = cc.max_age {
        return Some(Duration::from_secs(m));
    }
    let expires = headers.get(header::EXPIRES)?;
    // An invalid Expires (e.g. "0") means already expired.
    let Some(expires) = http_date(expires.as_bytes()) else {
        return Some(Duration::ZERO);
    };
    let date = headers
        .get(header::DATE)
        .and_then(|d| http_date(d.as_bytes()))
        .unwrap_or_else(SystemTime::now);
    Some(expires.duration_since(date).unwrap_or(Duration::ZERO))
}

/// RFC 9111 §4.2.3.
fn corrected_initial_age(
    headers: &HeaderMap,
    request_time: SystemTime,
    response_time: SystemTime,
) -> Duration {
    let age_value = headers
        .get(header::AGE)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_delta)
        .map(Duration::from_secs)
        .unwrap_or(Duration::ZERO);
    let apparent_age = headers
        .get(header::DATE)
        .and_then(|d| http_date(d.as_bytes()))
        .and_then(|date| response_time.duration_since(date).ok())
        .unwrap_or(Duration::ZERO);
    let response_delay = response_time
        .duration_since(request_time)
        .unwrap_or(Duration::ZERO);
    apparent_age.max(age_value + response_delay)
}

fn http_date(bytes: &[u8]) -> Option<SystemTime> {
    httpdate::parse_http_date(std::str::from_utf8(bytes).ok()?).ok()
}

/// RFC 9110 §15.1: statuses cacheable by default (heuristic freshness).
fn heuristically_cacheable(status: StatusCode) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn classify(pairs: &[(&str, &str)], auth: bool) -> ResponseVerdict {
        let now = SystemTime::now();
        classify_response(
            &ResponseRules::default(),
            auth,
            StatusCode::OK,
            &headers(pairs),
            now,
            now,
        )
    }

    /// s-maxage wins over max-age for a shared cache.
    #[test]
    fn s_maxage_wins() {
        let v = classify(&[("cache-control", "max-age=5, s-maxage=60")], false);
        assert!(
            matches!(v, ResponseVerdict::Store { fresh_for, .. } if fresh_for == Duration::from_secs(60))
        );
    }

    /// A duplicated max-age is treated as stale, not as the larger value.
    #[test]
    fn duplicate_max_age_is_zero() {
        let cc = CacheControl::parse(&headers(&[
            ("cache-control", "max-age=60"),
            ("cache-control", "max-age=5"),
        ]));
        assert_eq!(cc.max_age, Some(0));
    }

    /// The Age header shortens the freshness left.
    #[test]
    fn age_header_is_subtracted() {
        let v = classify(&[("cache-control", "max-age=60"), ("age", "50")], false);
        assert!(
            matches!(v, ResponseVerdict::Store { fresh_for, .. } if fresh_for == Duration::from_secs(10))
        );
    }

    /// must-revalidate removes the stale grace.
    #[test]
    fn must_revalidate_forbids_stale() {
        let v = classify(
            &[(
                "cache-control",
                "max-age=5, stale-while-revalidate=30, must-revalidate",
            )],
            false,
        );
        assert!(matches!(v, ResponseVerdict::Store { stale_for, .. } if stale_for.is_zero()));
    }

    /// Expires relative to Date gives the lifetime; an invalid Expires is already stale.
    #[test]
    fn expires_minus_date() {
        let date = SystemTime::now();
        let d = httpdate::fmt_http_date(date);
        let e = httpdate::fmt_http_date(date + Duration::from_secs(120));
        let v = classify(&[("date", &d), ("expires", &e)], false);
        assert!(
            matches!(v, ResponseVerdict::Store { fresh_for, .. } if fresh_for >= Duration::from_secs(119))
        );
        assert_eq!(classify(&[("expires", "0")], false), ResponseVerdict::Share);
    }

    /// Huge max-age values saturate instead of overflowing.
    #[test]
    fn huge_max_age_saturates() {
        let cc = CacheControl::parse(&headers(&[(
            "cache-control",
            "max-age=99999999999999999999999",
        )]));
        assert_eq!(cc.max_age, Some(MAX_DELTA_SECS));
    }

    /// Vary with an invalid header name can never match.
    #[test]
    fn unreadable_vary_is_star() {
        assert_eq!(vary_names(&headers(&[("vary", "accept, bad name")])), None);
        assert_eq!(
            vary_names(&headers(&[("vary", "Accept, accept")]))
                .unwrap()
                .len(),
            1
        );
    }
}
