//! How long a response stays fresh (explicit, heuristic), its age, and
//! whether a stored one may answer a given request now.

use std::time::{Duration, SystemTime};

use http::header::{self, HeaderMap};

use super::directives::{parse_delta, CacheControl};
use super::request::RequestDirectives;

/// What a stored response allows, computed once when it is stored so a hit
/// parses no headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StoredRules {
    /// Freshness lifetime, seconds (RFC 9111 §4.2.1).
    pub(crate) lifetime: u32,
    /// `stale-while-revalidate`, seconds (0 when stale is forbidden).
    pub(crate) swr: u32,
    /// `stale-if-error`, seconds (0 when stale is forbidden).
    pub(crate) sie: u32,
    pub(crate) flags: u8,
}

impl StoredRules {
    /// must-revalidate, proxy-revalidate or s-maxage: never served stale
    /// without validation, whatever the client accepts.
    pub(crate) const NO_STALE: u8 = 1;
    /// Response `no-cache`: validated before every use.
    pub(crate) const NO_CACHE: u8 = 2;
    /// Has an ETag or Last-Modified, so it can be revalidated.
    pub(crate) const VALIDATORS: u8 = 4;

    pub(crate) fn has(self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    pub(crate) fn lifetime(self) -> Duration {
        Duration::from_secs(u64::from(self.lifetime))
    }
}

pub(super) fn secs_u32(secs: u64) -> u32 {
    secs.min(u64::from(u32::MAX)) as u32
}

/// How a stored response may answer one request (RFC 9111 §4.2, §4.2.4,
/// RFC 5861).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Usable {
    Fresh,
    /// Stale, inside `stale-while-revalidate`: serve now, refresh in the background.
    StaleWhileRevalidate,
    /// Stale past any `stale-while-revalidate`, inside the operator's grace:
    /// serve now, refresh in the background.
    Grace,
    /// Stale, but the client's `max-stale` accepts it.
    StaleAccepted,
    /// Must be validated with the origin first.
    Revalidate,
}

/// How a stored answer with `rules`, `age` old, may serve a request that
/// `asked` these directives. `grace` is the operator's stale-while-updating allowance
/// ([`CacheLayerBuilder::grace`](crate::CacheLayerBuilder::grace)); zero when off.
pub(crate) fn usability(
    asked: &RequestDirectives,
    rules: StoredRules,
    age: Duration,
    grace: Duration,
) -> Usable {
    if asked.no_cache || rules.has(StoredRules::NO_CACHE) {
        return Usable::Revalidate;
    }
    if asked.max_age.is_some_and(|max| age.as_secs() > max) {
        return Usable::Revalidate;
    }
    let lifetime = rules.lifetime();
    if age < lifetime {
        let left = (lifetime - age).as_secs();
        if asked.min_fresh.is_some_and(|min| left < min) {
            return Usable::Revalidate;
        }
        return Usable::Fresh;
    }
    let staleness = age - lifetime;
    if !rules.has(StoredRules::NO_STALE)
        && asked
            .max_stale
            .is_some_and(|max| staleness.as_secs() <= max)
    {
        return Usable::StaleAccepted;
    }
    // `swr` is already zero when the origin forbade stale.
    if asked.min_fresh.is_some() {
        return Usable::Revalidate;
    }
    if staleness < Duration::from_secs(u64::from(rules.swr)) {
        return Usable::StaleWhileRevalidate;
    }
    // no-cache returned above; must-revalidate, proxy-revalidate and
    // s-maxage are NO_STALE: the operator's grace never overrides the origin.
    if staleness < grace && !rules.has(StoredRules::NO_STALE) {
        return Usable::Grace;
    }
    Usable::Revalidate
}

/// Whether a stored response may stand in for an origin error
/// (`stale-if-error`, RFC 5861 §4; zero when the origin forbade stale).
pub(crate) fn stale_if_error_allows(rules: StoredRules, age: Duration) -> bool {
    let staleness = age.saturating_sub(rules.lifetime());
    rules.sie > 0 && staleness <= Duration::from_secs(u64::from(rules.sie))
}

/// RFC 9111 §4.2.1, for a shared cache: s-maxage, then max-age, then
/// Expires − Date (`headers` is `None` when Expires does not count).
pub(super) fn freshness_lifetime(
    cc: &CacheControl,
    headers: Option<&HeaderMap>,
) -> Option<Duration> {
    if let Some(s) = cc.s_maxage {
        return Some(Duration::from_secs(s));
    }
    if let Some(m) = cc.max_age {
        return Some(Duration::from_secs(m));
    }
    let headers = headers?;
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

/// RFC 9111 §4.2.3, in whole seconds (rounded down), the resolution of
/// HTTP dates and `Age`. Counted to the nanosecond, the response's transit
/// (and a `Date` stamped earlier in the same second) shortened every
/// answer's freshness by that much: with `max-age=1` and a 50 ms origin
/// under load, 14 % more origin calls than a cache that keeps each answer
/// its max-age from arrival (benches/origin_load, "many"). Rounded down, a
/// response is fresh for its max-age from when it arrived, as in Varnish
/// and nginx, and a `Date` or `Age` a second or more behind counts in
/// whole seconds.
pub(super) fn corrected_initial_age(
    headers: &HeaderMap,
    request_time: SystemTime,
    response_time: SystemTime,
) -> Duration {
    let age_value = headers
        .get(header::AGE)
        .and_then(|v| v.to_str().ok())
        .and_then(first_age)
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
    let age = apparent_age.max(age_value + response_delay);
    Duration::from_secs(age.as_secs())
}

/// The first value of an `Age` field (a list like `7200, 0` is a repeated
/// field folded into one line, and the first occurrence counts); a
/// parameter after `;` is not part of the number. Anything else that is not
/// delta-seconds is ignored.
pub(super) fn first_age(line: &str) -> Option<u64> {
    let first = line.split(',').next()?;
    parse_delta(first.split(';').next()?.trim())
}

/// An HTTP date (RFC 9110 §5.6.7). Recipients are asked to be lenient, so a
/// date that fails the strict parse is retried with its letters in canonical
/// case and with the weekday ignored (it is redundant, and some origins get
/// it wrong). A wrong time zone (`UTC`, `AEST`) or a malformed layout still
/// fails, and the caller treats that as "already expired".
pub(crate) fn http_date(bytes: &[u8]) -> Option<SystemTime> {
    let s = std::str::from_utf8(bytes).ok()?;
    if let Ok(t) = httpdate::parse_http_date(s) {
        return Some(t);
    }
    if s.len() > 64 {
        return None;
    }
    let canonical = canonical_case(s);
    if let Ok(t) = httpdate::parse_http_date(&canonical) {
        return Some(t);
    }
    // The weekday is the leading word: try each, keeping the rest.
    let split = canonical.find(|c: char| !c.is_ascii_alphabetic())?;
    let (day, rest) = canonical.split_at(split);
    const SHORT: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const LONG: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let names = if day.len() == 3 {
        &SHORT
    } else if LONG.contains(&day) {
        &LONG
    } else {
        return None;
    };
    names
        .iter()
        .find_map(|name| httpdate::parse_http_date(&format!("{name}{rest}")).ok())
}

/// Letters in the case HTTP dates use: `GMT`, and capitalised names.
pub(super) fn canonical_case(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for word in s.split_inclusive(|c: char| !c.is_ascii_alphabetic()) {
        let letters = word.trim_end_matches(|c: char| !c.is_ascii_alphabetic());
        if letters.eq_ignore_ascii_case("gmt") {
            out.push_str("GMT");
        } else {
            for (j, c) in letters.chars().enumerate() {
                out.push(if j == 0 {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                });
            }
        }
        out.push_str(&word[letters.len()..]);
    }
    out
}
