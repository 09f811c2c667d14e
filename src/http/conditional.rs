//! Conditional requests: answering a client's If-None-Match /
//! If-Modified-Since with 304 from a stored response, and revalidating a
//! stored response with the origin (RFC 9110 §13, RFC 9111 §4.3).
//!
//! Every parser here works on bytes and gives up (no match) on anything it
//! does not understand, so hostile validators cannot cause a wrong 304.

use std::time::SystemTime;

use http::header::{self, HeaderMap, HeaderName};

use crate::http::response::CachedResponse;

/// Whether the client's own validators match `stored`, so the answer is 304.
///
/// If-None-Match wins over If-Modified-Since (RFC 9110 §13.2.2); both only
/// apply to a 2xx response.
pub(crate) fn not_modified(request: &HeaderMap, stored: &CachedResponse) -> bool {
    if !stored.status.is_success() {
        return false;
    }
    if request.contains_key(header::IF_NONE_MATCH) {
        let Some(etag) = stored.headers.get(header::ETAG) else {
            return false;
        };
        return request
            .get_all(header::IF_NONE_MATCH)
            .iter()
            .any(|line| list_matches(line.as_bytes(), etag.as_bytes()));
    }
    let Some(since) = request
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|v| http_date(v.as_bytes()))
    else {
        return false;
    };
    // RFC 9111 §4.3.2: Last-Modified, else the Date the origin sent.
    let modified = stored
        .headers
        .get(header::LAST_MODIFIED)
        .or_else(|| stored.headers.get(header::DATE))
        .and_then(|v| http_date(v.as_bytes()));
    modified.is_some_and(|m| m <= since)
}

/// Headers of a 304 built from a stored response: the ones RFC 9110 §15.4.5
/// asks for, plus Last-Modified to guide caches downstream.
pub(crate) fn not_modified_headers(stored: &HeaderMap) -> HeaderMap {
    const KEEP: [HeaderName; 7] = [
        header::CACHE_CONTROL,
        header::CONTENT_LOCATION,
        header::DATE,
        header::ETAG,
        header::EXPIRES,
        header::VARY,
        header::LAST_MODIFIED,
    ];
    let mut out = HeaderMap::new();
    for name in KEEP {
        for v in stored.get_all(&name) {
            out.append(name.clone(), v.clone());
        }
    }
    out
}

/// Add the stored validators to an origin request so it can answer 304.
pub(crate) fn add_validators(request: &mut HeaderMap, stored: &CachedResponse) {
    if let Some(etag) = stored.headers.get(header::ETAG) {
        request.insert(header::IF_NONE_MATCH, etag.clone());
    }
    if let Some(lm) = stored.headers.get(header::LAST_MODIFIED) {
        request.insert(header::IF_MODIFIED_SINCE, lm.clone());
    }
}

/// The stored response updated by a 304 (RFC 9111 §3.2, §4.3.4), or `None`
/// when the 304 names a different representation.
///
/// Every field of the 304 replaces the stored one, except Content-Length
/// (the stored body is what is served) and the fields `excluded` names
/// (hop-by-hop and per-response ones, which are never stored).
pub(crate) fn freshen(
    stored: &CachedResponse,
    not_modified: &HeaderMap,
    excluded: impl Fn(&HeaderName) -> bool,
) -> Option<CachedResponse> {
    if let Some(new) = not_modified.get(header::ETAG) {
        let old = stored.headers.get(header::ETAG)?;
        if opaque(new.as_bytes()) != opaque(old.as_bytes()) || opaque(new.as_bytes()).is_none() {
            return None;
        }
    } else if let Some(new) = not_modified.get(header::LAST_MODIFIED) {
        if stored.headers.get(header::LAST_MODIFIED) != Some(new) {
            return None;
        }
    }
    let mut merged = stored.clone();
    for name in not_modified.keys() {
        if *name == header::CONTENT_LENGTH || excluded(name) {
            continue;
        }
        merged.headers.remove(name);
        for v in not_modified.get_all(name) {
            merged.headers.append(name.clone(), v.clone());
        }
    }
    Some(merged)
}

/// Whether an If-None-Match field line matches `etag` by weak comparison.
fn list_matches(line: &[u8], etag: &[u8]) -> bool {
    let Some(target) = opaque(etag) else {
        return false;
    };
    if line.trim_ascii() == b"*" {
        return true;
    }
    let mut rest = line;
    loop {
        rest = rest.trim_ascii_start();
        while let [b',', tail @ ..] = rest {
            rest = tail.trim_ascii_start();
        }
        if rest.is_empty() {
            return false;
        }
        let Some((tag, tail)) = split_tag(rest) else {
            return false;
        };
        if tag == target {
            return true;
        }
        rest = tail;
    }
}

/// The opaque part (quotes included) of one entity-tag, weak or strong.
fn opaque(etag: &[u8]) -> Option<&[u8]> {
    match split_tag(etag.trim_ascii()) {
        Some((tag, rest)) if rest.trim_ascii().is_empty() => Some(tag),
        _ => None,
    }
}

/// Split the first entity-tag off `s`: its quoted opaque part and the rest.
fn split_tag(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let s = s.strip_prefix(b"W/").unwrap_or(s);
    if s.first() != Some(&b'"') {
        return None;
    }
    let end = s[1..].iter().position(|b| *b == b'"')? + 2;
    Some(s.split_at(end))
}

fn http_date(bytes: &[u8]) -> Option<SystemTime> {
    httpdate::parse_http_date(std::str::from_utf8(bytes).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn hv(s: &'static str) -> HeaderValue {
        HeaderValue::from_static(s)
    }

    /// Weak comparison: W/"a" matches "a"; lists, spaces and * are understood; junk never matches.
    #[test]
    fn if_none_match_weak_comparison() {
        assert!(list_matches(b"W/\"a\"", b"\"a\""));
        assert!(list_matches(b"\"x\", W/\"a\"", b"W/\"a\""));
        assert!(list_matches(b"*", b"\"a\""));
        assert!(!list_matches(b"\"ab\"", b"\"a\""));
        assert!(!list_matches(b"a", b"a"));
        assert!(!list_matches(b"\"a", b"\"a\""));
        assert!(!list_matches(b"\"x\" junk", b"\"a\""));
        assert!(list_matches(b",, \"a,b\" ,", b"\"a,b\""));
    }

    /// A 304 with a different ETag does not freshen the stored response.
    #[test]
    fn freshen_requires_same_etag() {
        let mut headers = HeaderMap::new();
        headers.insert(header::ETAG, hv("\"v1\""));
        let stored = CachedResponse {
            status: http::StatusCode::OK,
            headers,
            body: bytes::Bytes::from_static(b"x"),
            vary: Vec::new(),
            initial_age: 0,
            url: crate::key::CacheKey::new("u"),
            route: None,
            rules: Default::default(),
            revalidated: false,
            not_stored: None,
            served_head: Default::default(),
        };
        let mut nm = HeaderMap::new();
        nm.insert(header::ETAG, hv("\"v2\""));
        assert!(freshen(&stored, &nm, |_| false).is_none());
        nm.insert(header::ETAG, hv("\"v1\""));
        nm.insert("x-new", hv("1"));
        nm.insert(header::CONTENT_LENGTH, hv("0"));
        let merged = freshen(&stored, &nm, |_| false).unwrap();
        assert_eq!(merged.headers.get("x-new").unwrap(), "1");
        assert!(merged.headers.get(header::CONTENT_LENGTH).is_none());
    }
}
