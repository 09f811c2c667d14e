//! Byte ranges (RFC 9110 §14) cut from a complete 200 the cache serves:
//! a stored entry, a flight's shared answer, or a fill streaming to its
//! readers. The cache itself only ever asks the origin for whole objects
//! (the fill drops `Range`), so what every other request gets is unchanged.
//!
//! - One range (`a-b`, `a-`, `-n`): a 206 with `Content-Range`.
//! - `If-Range` (RFC 9110 §13.1.5): a strong ETag equal to the response's
//!   strong ETag, or a date equal to a strong `Last-Modified` (at least one
//!   second before `Date`); anything else (a weak tag, a mismatch, a date
//!   that is not strong) gets the whole 200.
//! - No satisfiable range: 416 with `Content-Range: bytes */len`.
//! - Several ranges, a unit other than `bytes`, or any syntax error: the
//!   `Range` field is ignored and the whole 200 goes out (RFC 9110 §14.2
//!   lets a server ignore it). No `multipart/byteranges`.
//! - Only GET: `Range` on HEAD is ignored (RFC 9110 §14.2 defines it for
//!   GET alone), so HEAD is served like a plain HEAD.
//! - Only a 200 whose complete length is known (a body in memory, or a
//!   streamed one with `Content-Length`): any other answer (a 304 for the
//!   client's own validators, a 404, a 206 of the origin's own, a stream of
//!   unknown length) goes out as it is.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode};
use moka::sync::Cache as MokaCache;

use crate::http::body::CacheBody;
use crate::http::numbers;
use crate::http::CACHE_STATUS;
use crate::key::CacheKey;

/// How many keys [`TooLarge`] remembers per layer (a few hundred KiB at most).
const TOO_LARGE_KEYS: u64 = 4096;

/// How long a key stays known as too large to store.
const TOO_LARGE_FOR: Duration = Duration::from_secs(60);

/// Keys whose last fill was too large to store (`max_body_bytes`), on this
/// instance. A range request for one goes to the origin with its `Range`
/// instead of waiting for a whole object the cache will not keep; plain
/// requests are not affected (they still share one streamed fill). Bounded
/// in count and time: after a minute a range request leads or joins a whole
/// fill again, and finds out afresh.
#[derive(Clone)]
pub(crate) struct TooLarge(MokaCache<CacheKey, ()>);

impl TooLarge {
    pub(crate) fn new() -> Self {
        Self(
            MokaCache::builder()
                .max_capacity(TOO_LARGE_KEYS)
                .time_to_live(TOO_LARGE_FOR)
                .build(),
        )
    }

    /// `key`'s body was too large to store.
    pub(crate) fn mark(&self, key: CacheKey) {
        self.0.insert(key, ());
    }

    /// Whether `key`'s last fill was too large to store.
    pub(crate) fn contains(&self, key: &CacheKey) -> bool {
        self.0.contains_key(key)
    }
}

impl std::fmt::Debug for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TooLarge")
            .field("keys", &self.0.entry_count())
            .finish()
    }
}

/// One byte range asked for, as written (RFC 9110 §14.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spec {
    /// `first-last`.
    FromTo(u64, u64),
    /// `first-`.
    From(u64),
    /// `-length`: the last `length` bytes.
    Suffix(u64),
}

/// A GET's `Range` (one valid byte range) and its `If-Range`, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RangeRequest {
    spec: Spec,
    if_range: Option<HeaderValue>,
}

/// What a range makes of a complete representation of `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Bytes `start..=end`.
    Part { start: u64, end: u64 },
    /// Nothing of it: 416.
    Unsatisfiable,
    /// The whole 200 (an empty body asked for its last bytes).
    Whole,
}

impl RangeRequest {
    /// The range a request asks for, or `None` when the request is to be
    /// answered whole: no `Range`, not a GET, several ranges, another unit,
    /// or a syntax error.
    pub(crate) fn of(method: &Method, headers: &HeaderMap) -> Option<Self> {
        if method != Method::GET {
            return None;
        }
        let mut values = headers.get_all(header::RANGE).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        let spec = parse(value.as_bytes())?;
        let mut if_range = headers.get_all(header::IF_RANGE).iter();
        let first = if_range.next().cloned();
        // Two If-Range fields cannot both be a validator: no range then.
        if if_range.next().is_some() {
            return None;
        }
        Some(Self {
            spec,
            if_range: first,
        })
    }

    fn cut(&self, len: u64) -> Cut {
        match self.spec {
            Spec::FromTo(first, _) | Spec::From(first) if first >= len => Cut::Unsatisfiable,
            Spec::FromTo(start, last) => Cut::Part {
                start,
                end: last.min(len - 1),
            },
            Spec::From(start) => Cut::Part {
                start,
                end: len - 1,
            },
            Spec::Suffix(0) => Cut::Unsatisfiable,
            Spec::Suffix(_) if len == 0 => Cut::Whole,
            Spec::Suffix(n) => Cut::Part {
                start: len - n.min(len),
                end: len - 1,
            },
        }
    }

    /// Turn a complete 200 into this range's 206 or 416; every other answer,
    /// and one whose `If-Range` does not hold, is returned unchanged.
    pub(crate) fn apply<B>(&self, response: Response<CacheBody<B>>) -> Response<CacheBody<B>> {
        if response.status() != StatusCode::OK
            || response.headers().contains_key(header::CONTENT_RANGE)
        {
            return response;
        }
        if let Some(validator) = &self.if_range {
            if !if_range_holds(validator.as_bytes(), response.headers()) {
                return response;
            }
        }
        // A body in memory has its length; one still arriving (a streamed
        // fill, a too-large one passed through) has the origin's declared
        // length, or none: then it goes out whole.
        let Some(len) = response
            .body()
            .complete_len()
            .or_else(|| content_length(response.headers()))
        else {
            return response;
        };
        match self.cut(len) {
            Cut::Whole => response,
            Cut::Part { start, end } => {
                let (mut parts, body) = response.into_parts();
                let count = end - start + 1;
                parts.status = StatusCode::PARTIAL_CONTENT;
                parts.headers.insert(
                    header::CONTENT_RANGE,
                    value(format!("bytes {start}-{end}/{len}")),
                );
                parts
                    .headers
                    .insert(header::CONTENT_LENGTH, numbers::number_value(count));
                Response::from_parts(parts, body.slice(start, count))
            }
            Cut::Unsatisfiable => {
                let (parts, _) = response.into_parts();
                // Only what describes this answer: a 416 must not carry the
                // stored response's freshness to caches downstream.
                let mut headers = HeaderMap::new();
                for name in [CACHE_STATUS, header::AGE, header::DATE] {
                    if let Some(v) = parts.headers.get(&name) {
                        headers.insert(name, v.clone());
                    }
                }
                headers.insert(header::CONTENT_RANGE, value(format!("bytes */{len}")));
                headers.insert(header::CONTENT_LENGTH, numbers::number_value(0));
                let mut r = Response::new(CacheBody::empty());
                *r.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
                *r.headers_mut() = headers;
                r
            }
        }
    }
}

fn value(s: String) -> HeaderValue {
    // Digits, spaces, `-`, `/` and `*` only: always a valid header value.
    HeaderValue::from_maybe_shared(Bytes::from(s))
        .unwrap_or_else(|_| HeaderValue::from_static("bytes */0"))
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(header::CONTENT_LENGTH).iter();
    let v = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let s = v.as_bytes();
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// `bytes=` and exactly one byte-range-spec; `None` for anything else.
fn parse(value: &[u8]) -> Option<Spec> {
    let value = value.trim_ascii();
    let (unit, set) = value.split_at(value.iter().position(|&b| b == b'=')?);
    if !unit.trim_ascii().eq_ignore_ascii_case(b"bytes") {
        return None;
    }
    let set = set[1..].trim_ascii();
    // Empty list elements are allowed (RFC 9110 §5.6.1); more than one
    // range is answered whole.
    let mut specs = set
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|s| !s.is_empty());
    let one = specs.next()?;
    if specs.next().is_some() {
        return None;
    }
    let dash = one.iter().position(|&b| b == b'-')?;
    let (first, last) = (&one[..dash], &one[dash + 1..]);
    match (number(first), number(last)) {
        (Some(first), Some(last)) if first <= last => Some(Spec::FromTo(first, last)),
        (Some(first), None) if last.is_empty() => Some(Spec::From(first)),
        (None, Some(n)) if first.is_empty() => Some(Spec::Suffix(n)),
        _ => None,
    }
}

/// 1*DIGIT that fits a u64.
fn number(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// RFC 9110 §13.1.5: the range applies only if the validator matches the
/// representation by strong comparison.
fn if_range_holds(validator: &[u8], response: &HeaderMap) -> bool {
    let validator = validator.trim_ascii();
    if validator.starts_with(b"W/") {
        return false;
    }
    if validator.starts_with(b"\"") {
        let Some(etag) = response.get(header::ETAG) else {
            return false;
        };
        let etag = etag.as_bytes().trim_ascii();
        return validator.len() >= 2
            && validator.ends_with(b"\"")
            && !etag.starts_with(b"W/")
            && etag == validator;
    }
    let date = |v: &[u8]| httpdate::parse_http_date(std::str::from_utf8(v).ok()?).ok();
    let (Some(asked), Some(modified)) = (
        date(validator),
        response
            .get(header::LAST_MODIFIED)
            .and_then(|v| date(v.as_bytes())),
    ) else {
        return false;
    };
    // Strong only if the origin's Date is a second or more later.
    let strong = response
        .get(header::DATE)
        .and_then(|v| date(v.as_bytes()))
        .and_then(|d| d.duration_since(modified).ok())
        .is_some_and(|gap| gap.as_secs() >= 1);
    strong && asked == modified
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> Option<Spec> {
        parse(s.as_bytes())
    }

    /// The three forms parse; invalid syntax, other units and several ranges do not.
    #[test]
    fn parses_one_byte_range_only() {
        assert_eq!(spec("bytes=0-9"), Some(Spec::FromTo(0, 9)));
        assert_eq!(spec("bytes=5-"), Some(Spec::From(5)));
        assert_eq!(spec("bytes=-3"), Some(Spec::Suffix(3)));
        assert_eq!(spec(" BYTES = 1-2 ,"), Some(Spec::FromTo(1, 2)));
        for bad in [
            "bytes=9-1",
            "bytes=-",
            "bytes=a-b",
            "bytes=1-2-3",
            "bytes=+1-2",
            "items=0-1",
            "bytes 0-1",
            "bytes=",
            "bytes=0-1,3-4",
            "bytes=99999999999999999999-",
        ] {
            assert_eq!(spec(bad), None, "{bad}");
        }
    }

    /// Each form cuts the right bytes; past the end is unsatisfiable, a last byte past it is clamped.
    #[test]
    fn cuts_per_rfc_9110() {
        let r = |s: &str| RangeRequest {
            spec: spec(s).unwrap(),
            if_range: None,
        };
        let part = |start, end| Cut::Part { start, end };
        assert_eq!(r("bytes=0-9").cut(100), part(0, 9));
        assert_eq!(r("bytes=90-200").cut(100), part(90, 99));
        assert_eq!(r("bytes=10-").cut(100), part(10, 99));
        assert_eq!(r("bytes=-5").cut(100), part(95, 99));
        assert_eq!(r("bytes=-500").cut(100), part(0, 99));
        assert_eq!(r("bytes=100-").cut(100), Cut::Unsatisfiable);
        assert_eq!(r("bytes=100-101").cut(100), Cut::Unsatisfiable);
        assert_eq!(r("bytes=-0").cut(100), Cut::Unsatisfiable);
        assert_eq!(r("bytes=0-").cut(0), Cut::Unsatisfiable);
        assert_eq!(r("bytes=-1").cut(0), Cut::Whole);
    }

    /// If-Range holds only for an equal strong ETag or a strong Last-Modified date.
    #[test]
    fn if_range_needs_a_strong_match() {
        let mut h = HeaderMap::new();
        h.insert(header::ETAG, HeaderValue::from_static("\"a\""));
        h.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_static("Tue, 01 Dec 2026 10:00:00 GMT"),
        );
        h.insert(
            header::DATE,
            HeaderValue::from_static("Tue, 01 Dec 2026 10:00:05 GMT"),
        );
        assert!(if_range_holds(b"\"a\"", &h));
        assert!(!if_range_holds(b"\"b\"", &h));
        assert!(!if_range_holds(b"W/\"a\"", &h));
        assert!(if_range_holds(b"Tue, 01 Dec 2026 10:00:00 GMT", &h));
        assert!(!if_range_holds(b"Tue, 01 Dec 2026 10:00:01 GMT", &h));
        assert!(!if_range_holds(b"garbage", &h));
        // A weak stored tag never matches; a date equal to Date is not strong.
        h.insert(header::ETAG, HeaderValue::from_static("W/\"a\""));
        assert!(!if_range_holds(b"\"a\"", &h));
        h.insert(
            header::DATE,
            HeaderValue::from_static("Tue, 01 Dec 2026 10:00:00 GMT"),
        );
        assert!(!if_range_holds(b"Tue, 01 Dec 2026 10:00:00 GMT", &h));
    }
}
