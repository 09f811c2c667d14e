//! Request side: may this request use the cache, or does it bypass it,
//! and what does it ask of a stored response (`no-cache`, `max-age` ...).

use http::header::{self, HeaderMap};
use http::Method;

use super::directives::CacheControl;
use super::unkeyed::{override_named, Unkeyed};

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

/// Which of the request header names the hit path asks about are present,
/// found in one pass over the names (a request has few) instead of one
/// hashed lookup per name asked about. Only presence: values are still read
/// where a name is present.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RequestScan {
    /// `Upgrade`, `If-Match` or `If-Unmodified-Since`: passed through.
    pub(crate) bypass: bool,
    pub(crate) cache_control: bool,
    pub(crate) pragma: bool,
    /// `Transfer-Encoding` or `Content-Length`: it may carry a body.
    pub(crate) framing: bool,
    pub(crate) range: bool,
    /// `If-None-Match` or `If-Modified-Since`: it may get a 304.
    pub(crate) validators: bool,
    pub(crate) authorization: bool,
    /// The first method or URL override header (see `policy::unkeyed`).
    pub(crate) overridden: Option<Unkeyed>,
}

impl RequestScan {
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        let mut s = Self::default();
        // One match on the name's text: a request's names are mostly ones
        // asked about by none of these, and each comparison of names one by
        // one cost more than this whole switch on length and bytes.
        for name in headers.keys() {
            match name.as_str() {
                "upgrade" | "if-match" | "if-unmodified-since" => s.bypass = true,
                "cache-control" => s.cache_control = true,
                "pragma" => s.pragma = true,
                "transfer-encoding" | "content-length" => s.framing = true,
                "range" => s.range = true,
                "if-none-match" | "if-modified-since" => s.validators = true,
                "authorization" => s.authorization = true,
                x if x.starts_with("x-") && s.overridden.is_none() => {
                    s.overridden = override_named(x);
                }
                _ => {}
            }
        }
        s
    }
}

pub(crate) fn classify_request(method: &Method, headers: &HeaderMap) -> RequestVerdict {
    classify_scanned(method, headers, &RequestScan::of(headers))
}

/// [`classify_request`] with the names already scanned.
pub(crate) fn classify_scanned(
    method: &Method,
    headers: &HeaderMap,
    scan: &RequestScan,
) -> RequestVerdict {
    if method != Method::GET && method != Method::HEAD {
        return RequestVerdict::Bypass(Forward::Method);
    }
    // Protocol upgrades are passed through untouched; If-Match and
    // If-Unmodified-Since are the origin's to evaluate (412). `Range` is
    // served from the cache (crate::http::range).
    if scan.bypass {
        return RequestVerdict::Bypass(Forward::Request);
    }
    let (has_cc, has_pragma) = (scan.cache_control, scan.pragma);
    let cc = if has_cc {
        CacheControl::parse(headers)
    } else {
        CacheControl::default()
    };
    // RFC 9111 §5.2.1.5: nothing of this exchange may be stored.
    if cc.no_store {
        return RequestVerdict::Bypass(Forward::Request);
    }
    let pragma_no_cache = !has_cc
        && has_pragma
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
