//! RFC 9111 decisions for a shared cache: may this request use the cache, may
//! this response be stored or shared, and for how long.

pub(crate) mod targeted;
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
    pub(crate) must_understand: bool,
    /// `max-stale` without a value accepts any staleness (`u64::MAX`).
    pub(crate) max_stale: Option<u64>,
    pub(crate) min_fresh: Option<u64>,
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
                // No whitespace around `=` (RFC 9110 §5.6.2): `max-age =60`
                // is an unknown directive and `max-age= 60` an invalid value.
                let (name, value) = match directive.split_once('=') {
                    Some((n, v)) => (n, Some(unquote(v))),
                    None => (directive, None),
                };
                let secs = || value.map(parse_delta);
                // Lowercased on the stack: every directive we know is short,
                // and a longer one is one we ignore.
                let mut buf = [0u8; 24];
                let lower = match buf.get_mut(..name.len()) {
                    Some(b) => {
                        b.copy_from_slice(name.as_bytes());
                        b.make_ascii_lowercase();
                        std::str::from_utf8(b).unwrap_or("")
                    }
                    None => "",
                };
                match lower {
                    "no-store" => cc.no_store = true,
                    // `no-cache="field"` restricts named fields; treating it as a
                    // plain no-cache is the conservative reading.
                    "no-cache" => cc.no_cache = true,
                    "private" => cc.private = true,
                    "public" => cc.public = true,
                    "must-revalidate" => cc.must_revalidate = true,
                    "proxy-revalidate" => cc.proxy_revalidate = true,
                    "only-if-cached" => cc.only_if_cached = true,
                    "must-understand" => cc.must_understand = true,
                    // A duplicate or invalid age is treated as 0 (stale), the
                    // safe reading of RFC 9111 §4.2.1.
                    "max-age" => cc.max_age = Some(merge(cc.max_age, secs())),
                    "s-maxage" => cc.s_maxage = Some(merge(cc.s_maxage, secs())),
                    "stale-while-revalidate" => {
                        cc.stale_while_revalidate = Some(merge(cc.stale_while_revalidate, secs()))
                    }
                    "stale-if-error" => cc.stale_if_error = Some(merge(cc.stale_if_error, secs())),
                    // A bare max-stale accepts any staleness; an invalid value
                    // accepts none (the safe reading).
                    "max-stale" => {
                        cc.max_stale = Some(match value {
                            None => u64::MAX,
                            Some(v) => parse_delta(v).unwrap_or(0),
                        })
                    }
                    // An invalid min-fresh asks for more than any entry has.
                    "min-fresh" => cc.min_fresh = Some(secs().flatten().unwrap_or(u64::MAX)),
                    _ => {}
                }
            }
        }
        cc
    }
}

/// A directive value without the quotes of a quoted-string (and only those:
/// `'60'` stays invalid).
fn unquote(v: &str) -> &str {
    v.strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(v)
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
    /// Look in the cache, honouring the request's own directives.
    Cacheable(RequestDirectives),
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
    Stale,
}

impl Forward {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Forward::Method => "method",
            Forward::Request => "request",
            Forward::VaryMiss => "vary-miss",
            Forward::UriMiss => "uri-miss",
            Forward::Stale => "stale",
        }
    }
}

/// The request directives of RFC 9111 §5.2.1 that change what may be served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RequestDirectives {
    /// `no-cache`, `max-age=0` or `Pragma: no-cache`: go forward, store the result.
    pub(crate) no_cache: bool,
    pub(crate) max_age: Option<u64>,
    pub(crate) max_stale: Option<u64>,
    pub(crate) min_fresh: Option<u64>,
    pub(crate) only_if_cached: bool,
}

pub(crate) fn classify_request(method: &Method, headers: &HeaderMap) -> RequestVerdict {
    if method != Method::GET && method != Method::HEAD {
        return RequestVerdict::Bypass(Forward::Method);
    }
    // Partial content and protocol upgrades are passed through untouched;
    // If-Match and If-Unmodified-Since are the origin's to evaluate (412).
    if headers.contains_key(header::RANGE)
        || headers.contains_key(header::UPGRADE)
        || headers.contains_key(header::IF_MATCH)
        || headers.contains_key(header::IF_UNMODIFIED_SINCE)
    {
        return RequestVerdict::Bypass(Forward::Request);
    }
    let cc = CacheControl::parse(headers);
    // RFC 9111 §5.2.1.5: nothing of this exchange may be stored.
    if cc.no_store {
        return RequestVerdict::Bypass(Forward::Request);
    }
    let pragma_no_cache = !headers.contains_key(header::CACHE_CONTROL)
        && headers.get_all(header::PRAGMA).iter().any(|v| {
            v.as_bytes()
                .split(|b| *b == b',')
                .any(|d| d.trim_ascii().eq_ignore_ascii_case(b"no-cache"))
        });
    RequestVerdict::Cacheable(RequestDirectives {
        no_cache: cc.no_cache || pragma_no_cache || cc.max_age == Some(0),
        max_age: cc.max_age,
        max_stale: cc.max_stale,
        min_fresh: cc.min_fresh,
        only_if_cached: cc.only_if_cached,
    })
}

/// Whether a method is unsafe, so a success must invalidate the target URI.
/// RFC 9111 §4.4 counts methods whose safety is unknown (`M-SEARCH`, …) as
/// unsafe: only the safe methods of RFC 9110 §9.2.1 leave the cache alone.
pub(crate) fn invalidates(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

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

fn secs_u32(secs: u64) -> u32 {
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

/// `grace` is the operator's stale-while-updating allowance
/// ([`CacheLayerBuilder::grace`](crate::CacheLayerBuilder::grace)); zero when off.
pub(crate) fn usability(
    rd: &RequestDirectives,
    rules: StoredRules,
    age: Duration,
    grace: Duration,
) -> Usable {
    if rd.no_cache || rules.has(StoredRules::NO_CACHE) {
        return Usable::Revalidate;
    }
    if rd.max_age.is_some_and(|max| age.as_secs() > max) {
        return Usable::Revalidate;
    }
    let lifetime = rules.lifetime();
    if age < lifetime {
        let left = (lifetime - age).as_secs();
        if rd.min_fresh.is_some_and(|min| left < min) {
            return Usable::Revalidate;
        }
        return Usable::Fresh;
    }
    let staleness = age - lifetime;
    if !rules.has(StoredRules::NO_STALE)
        && rd.max_stale.is_some_and(|max| staleness.as_secs() <= max)
    {
        return Usable::StaleAccepted;
    }
    // `swr` is already zero when the origin forbade stale.
    if rd.min_fresh.is_some() {
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
    Pass(&'static str),
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
    // RFC 9111 §5.2.2.3: with must-understand, a status whose caching rules
    // we know overrides no-store, and any other status is not stored.
    if cc.must_understand && !understood(status) {
        return ResponseVerdict::Pass("must-understand");
    }
    if cc.no_store && !cc.must_understand {
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
    let stored = StoredRules {
        lifetime: secs_u32(lifetime.as_secs()),
        swr: secs_u32(swr),
        sie: secs_u32(sie),
        flags,
    };
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
pub(crate) fn request_specific(reason: &str) -> bool {
    matches!(reason, "set-cookie" | "authorization")
}

/// RFC 9111 §4.2.1, for a shared cache: s-maxage, then max-age, then
/// Expires − Date (`headers` is `None` when Expires does not count).
fn freshness_lifetime(cc: &CacheControl, headers: Option<&HeaderMap>) -> Option<Duration> {
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

/// RFC 9111 §4.2.2: a tenth of the time since Last-Modified, capped; else
/// the configured default TTL. Only for statuses cacheable by default.
fn heuristic_lifetime(
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

/// RFC 9111 §4.2.3.
fn corrected_initial_age(
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
    apparent_age.max(age_value + response_delay)
}

/// The first value of an `Age` field (a list like `7200, 0` is a repeated
/// field folded into one line, and the first occurrence counts); a
/// parameter after `;` is not part of the number. Anything else that is not
/// delta-seconds is ignored.
fn first_age(line: &str) -> Option<u64> {
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
fn canonical_case(s: &str) -> String {
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

/// Statuses whose caching requirements this cache implements (for
/// `must-understand`): the ones cacheable by default and the redirects.
fn understood(status: StatusCode) -> bool {
    heuristically_cacheable(status) || matches!(status.as_u16(), 302 | 303 | 307)
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

    /// Directive names are case-insensitive, and an overlong unknown name is ignored.
    #[test]
    fn directive_names_ignore_case() {
        let long = format!("{}=1, Max-Age=7", "x".repeat(100));
        let cc = CacheControl::parse(&headers(&[
            ("cache-control", "NO-STORE"),
            ("cache-control", &long),
        ]));
        assert!(cc.no_store);
        assert_eq!(cc.max_age, Some(7));
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
