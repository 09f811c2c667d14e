//! Where a request's entry lives: its base key (URL, credentials present,
//! key headers) and its variant key by the learned Vary names.

use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::Request;

use crate::http::policy::Forward;
use crate::http::purge::{key_authority, url_key, Invalidation};
use crate::http::state::LayerState;
use crate::http::vary::variant_key;
use crate::key::{CacheKey, KeyHasher};

/// Where a request's entry lives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    /// URL + Authorization presence + configured key headers.
    pub(super) base: CacheKey,
    /// `base` refined by the request's values of the learned Vary headers.
    pub(crate) key: CacheKey,
    /// What a miss is reported as: `vary-miss` when other variants are known.
    pub(super) miss: Forward,
    /// The route's own key, when it has a key function: stored with the
    /// entry, so a purge by that key finds it.
    pub(super) route: Option<CacheKey>,
}

impl LayerState {
    /// Where the entry for `req` lives: the base key (URL, Authorization
    /// present or not, configured key headers) and the variant key for the
    /// Vary names learned for that base. One hash on a hit: the URL's own
    /// key (for purges) is only needed when a response is stored.
    /// A route's own key (`route_key`) takes the place of the URL parts;
    /// everything after them still applies.
    pub(crate) fn target_for<B>(&self, req: &Request<B>, route_key: Option<CacheKey>) -> Target {
        let authorization = req.headers().contains_key(header::AUTHORIZATION);
        self.target_with(req, route_key, authorization)
    }

    /// [`Self::target_for`] with Authorization's presence already known
    /// (from the request's one scan of its names).
    pub(crate) fn target_with<B>(
        &self,
        req: &Request<B>,
        route_key: Option<CacheKey>,
        authorization: bool,
    ) -> Target {
        let mut h = KeyHasher::new();
        match route_key {
            Some(k) => h.part(b"route-base").part(k.as_bytes()),
            None => {
                let uri = effective_uri(req);
                h.part(b"base")
                    .opt_part_lowercase(request_authority(req, uri).map(key_authority))
                    .part(non_empty_path(uri.path().as_bytes()))
                    .opt_part(uri.query().map(str::as_bytes))
            }
        }
        .part(&[u8::from(authorization)]);
        for name in &self.http.key_headers {
            let values = req.headers().get_all(name);
            // Counted, and each value length-prefixed: ["a,b"] and ["a", "b"]
            // and one header's values running into the next never collide.
            h.part(name.as_str().as_bytes())
                .part(&(values.iter().count() as u64).to_le_bytes());
            for v in values {
                h.part(v.as_bytes());
            }
        }
        let base = h.finish();
        match self.vary.names(&base) {
            Some(names) => Target {
                base,
                key: variant_key(&base, &names, req.headers()),
                miss: Forward::VaryMiss,
                route: route_key,
            },
            None => Target {
                base,
                key: base,
                miss: Forward::UriMiss,
                route: route_key,
            },
        }
    }

    /// What a successful unsafe request to this URI invalidates.
    pub(super) fn invalidation_for<B>(self: &Arc<Self>, req: &Request<B>) -> Invalidation {
        let uri = effective_uri(req);
        let authority = request_authority(req, uri).and_then(|a| std::str::from_utf8(a).ok());
        let path = uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        Invalidation::new(Arc::clone(self), authority, path)
    }
}

/// The authority a request names: the URI's, else the Host header.
pub(super) fn request_authority<'a, B>(
    req: &'a Request<B>,
    uri: &'a http::Uri,
) -> Option<&'a [u8]> {
    uri.authority()
        .map(|a| a.as_str().as_bytes())
        .or_else(|| req.headers().get(header::HOST).map(HeaderValue::as_bytes))
}

/// The request with its host lowercased wherever it is named (Host, the
/// target, axum's original URI): the key lowercases hosts, and the
/// application must see the string the key used.
pub(super) fn lowercase_host<B>(req: Request<B>) -> Request<B> {
    let (mut parts, body) = req.into_parts();
    if let Some(host) = parts.headers.get(header::HOST) {
        if let Ok(v) = HeaderValue::from_bytes(&host.as_bytes().to_ascii_lowercase()) {
            parts.headers.insert(header::HOST, v);
        }
    }
    parts.uri = lowercase_authority(&parts.uri);
    #[cfg(feature = "axum")]
    if let Some(original) = parts.extensions.get_mut::<axum::extract::OriginalUri>() {
        original.0 = lowercase_authority(&original.0);
    }
    Request::from_parts(parts, body)
}

fn lowercase_authority(uri: &http::Uri) -> http::Uri {
    let Some(authority) = uri.authority() else {
        return uri.clone();
    };
    let lower = authority.as_str().to_ascii_lowercase();
    let mut parts = uri.clone().into_parts();
    parts.authority = http::uri::Authority::try_from(lower).ok();
    http::Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
}

/// The key of a request's URL alone (purge by URL matches on it).
pub(super) fn url_of<B>(req: &Request<B>) -> CacheKey {
    let uri = effective_uri(req);
    url_key(
        request_authority(req, uri),
        uri.path().as_bytes(),
        uri.query().map(str::as_bytes),
    )
}

/// `""` and `"/"` name the same resource.
pub(super) fn non_empty_path(path: &[u8]) -> &[u8] {
    if path.is_empty() {
        b"/"
    } else {
        path
    }
}

/// The URI as the client sent it: axum's nested routers strip their prefix,
/// and two nested routes must not share a key.
pub(super) fn effective_uri<B>(req: &Request<B>) -> &http::Uri {
    #[cfg(feature = "axum")]
    if let Some(original) = req.extensions().get::<axum::extract::OriginalUri>() {
        return &original.0;
    }
    req.uri()
}

#[cfg(test)]
mod tests {
    use super::key_authority;

    /// The key keeps the port (the upstream is told it too) and drops userinfo.
    #[test]
    pub(super) fn key_authority_keeps_port_drops_userinfo() {
        assert_eq!(key_authority(b"example.com:8080"), b"example.com:8080");
        assert_eq!(key_authority(b"user:pw@example.com:1"), b"example.com:1");
        assert_eq!(key_authority(b"[::1]:3000"), b"[::1]:3000");
        assert_eq!(key_authority(b"plain"), b"plain");
    }
}
