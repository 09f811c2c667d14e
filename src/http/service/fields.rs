//! What the service asks of a request's and a response's fields before it
//! picks a path: the fields a fill request drops and a stored response
//! never keeps, whether a request is a plain GET or carries a body, and
//! the fallback permit a plain GET under a pass marker may take. A leaf:
//! it imports none of its siblings.

use http::header::{self, HeaderMap, HeaderName};

use crate::http::cache_status::CACHE_STATUS;
use crate::http::state::LayerState;

/// Request headers dropped from the leader's origin request, so the stored
/// response is a complete one rather than a 304 or a fragment. The cache
/// adds its own validators when it revalidates; a `Range` is cut from the
/// complete answer ([`crate::http::range`]).
pub(super) const CONDITIONAL: [HeaderName; 6] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
    header::RANGE,
];

/// Hop-by-hop and per-response headers never stored with an entry. The
/// origin's `Age` is kept: it goes out unchanged with the response that was
/// just fetched, and every response served from storage replaces it with
/// the age the cache computes.
pub(super) const NOT_STORED: [HeaderName; 7] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::TRAILER,
    header::PROXY_AUTHENTICATE,
    CACHE_STATUS,
];

/// A fallback permit for a request under a pass marker to ask the origin
/// again ([`hit_for_miss`](super::direct::hit_for_miss)), if one is free and the request is a plain GET:
/// a HEAD, a `Range` or a conditional request needs the origin's own answer
/// to it (a 206, a 304), which a fill request would not carry. `None`: it
/// passes on uncached.
pub(super) fn hit_for_miss_permit(
    state: &LayerState,
    request_headers: &HeaderMap,
    head: bool,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    if !plain_get(request_headers, head) {
        return None;
    }
    state.engine.try_fallback_permit()
}

/// A GET with no conditional or `Range` header: what a fill request would ask.
pub(super) fn plain_get(request_headers: &HeaderMap, head: bool) -> bool {
    !head && !CONDITIONAL.iter().any(|n| request_headers.contains_key(n))
}

/// A GET or HEAD that carries a body (RFC 9112 §6.3: Transfer-Encoding, or a
/// Content-Length other than 0).
pub(super) fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get_all(header::CONTENT_LENGTH)
            .iter()
            .any(|v| v.as_bytes().iter().any(|&b| b != b'0'))
}
