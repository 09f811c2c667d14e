//! How HTTP names an entry, all in one place: the key of a URL alone
//! (`url_key`, `key_authority`: what purges and invalidations compute), a
//! request's base key (URL, credentials present, key headers) and its
//! variant key by the learned Vary names (`target_for`, `variant_key`).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::Request;

use crate::http::policy::Forward;
use crate::http::state::LayerState;
use crate::http::vary::normal_form;
use crate::key::{CacheKey, KeyHasher};

/// Where a request's entry lives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    /// URL + Authorization presence + configured key headers.
    pub(crate) base: CacheKey,
    /// `base` refined by the request's values of the learned Vary headers.
    pub(crate) key: CacheKey,
    /// What a miss is reported as: `vary-miss` when other variants are known.
    pub(crate) miss: Forward,
    /// The route's own key, when it has a key function: stored with the
    /// entry, so a purge by that key finds it.
    pub(crate) route: Option<CacheKey>,
}

/// What is known of a request's host when its key is made. Both hash the
/// same bytes for one host: the admitted form only skips the work.
#[derive(Debug, Clone, Copy)]
pub(crate) enum HostSeen {
    /// Admitted by the layer (`policy::request_form`, then lowercased where
    /// it had capitals): inside the grammar, so no userinfo, and lowercase.
    Admitted,
    /// Anything else: userinfo is dropped and capitals lowered while hashing.
    Unchecked,
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
        self.target_with(req, route_key, authorization, HostSeen::Unchecked)
    }

    /// [`Self::target_for`] with Authorization's presence already known
    /// (from the request's one scan of its names) and what is known of its
    /// host.
    pub(crate) fn target_with<B>(
        &self,
        req: &Request<B>,
        route_key: Option<CacheKey>,
        authorization: bool,
        host: HostSeen,
    ) -> Target {
        let mut h = KeyHasher::new();
        match route_key {
            Some(k) => h.part(b"route-base").part(k.as_bytes()),
            None => {
                let uri = effective_uri(req);
                let authority = request_authority(req, uri);
                match host {
                    HostSeen::Admitted => {
                        debug_assert!(authority.is_none_or(
                            |a| key_authority(a) == a && !a.iter().any(u8::is_ascii_uppercase)
                        ));
                        h.part(b"base").opt_part(authority)
                    }
                    HostSeen::Unchecked => h
                        .part(b"base")
                        .opt_part_lowercase(authority.map(key_authority)),
                }
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
}

/// The authority a request names: the URI's, else the Host header.
pub(crate) fn request_authority<'a, B>(
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
pub(crate) fn lowercase_host<B>(req: Request<B>) -> Request<B> {
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
pub(crate) fn url_of<B>(req: &Request<B>) -> CacheKey {
    let uri = effective_uri(req);
    url_key(
        request_authority(req, uri),
        uri.path().as_bytes(),
        uri.query().map(str::as_bytes),
    )
}

/// `""` and `"/"` name the same resource.
pub(crate) fn non_empty_path(path: &[u8]) -> &[u8] {
    if path.is_empty() {
        b"/"
    } else {
        path
    }
}

/// The URI as the client sent it: axum's nested routers strip their prefix,
/// and two nested routes must not share a key.
pub(crate) fn effective_uri<B>(req: &Request<B>) -> &http::Uri {
    #[cfg(feature = "axum")]
    if let Some(original) = req.extensions().get::<axum::extract::OriginalUri>() {
        return &original.0;
    }
    req.uri()
}

/// The key of a URL alone: authority (lowercase, port kept, userinfo
/// dropped, as in the main key), path and query.
pub(crate) fn url_key(authority: Option<&[u8]>, path: &[u8], query: Option<&[u8]>) -> CacheKey {
    let mut h = crate::key::KeyHasher::new();
    h.part(b"url");
    // Hosts are case-insensitive: lowercased while hashing, no allocation.
    h.opt_part_lowercase(authority.map(key_authority));
    h.part(if path.is_empty() { b"/" } else { path })
        .opt_part(query);
    h.finish()
}

/// The authority as the key sees it: without userinfo, port kept. The
/// host a request names, port included, is what the origin is told (Host,
/// X-Forwarded-Host) and may build links from, so `shop.test:1337` and
/// `shop.test` are different resources. Userinfo is dropped only from the
/// URLs given to a purge and from unsafe requests' invalidation targets: a
/// GET or HEAD naming userinfo never gets this far, it bypasses the cache
/// (the origin would see a host the key does not).
pub(crate) fn key_authority(authority: &[u8]) -> &[u8] {
    match authority.iter().rposition(|&b| b == b'@') {
        Some(at) => &authority[at + 1..],
        None => authority,
    }
}

/// The key of the variant of `base` that `request` selects.
pub(crate) fn variant_key(base: &CacheKey, names: &[HeaderName], request: &HeaderMap) -> CacheKey {
    if names.is_empty() {
        return *base;
    }
    let mut h = KeyHasher::new();
    h.part(b"variant").part(base.as_bytes());
    for name in names {
        h.part(name.as_str().as_bytes());
        if name == header::AUTHORIZATION {
            let values = request.get_all(name);
            h.part(&(values.iter().count() as u64).to_le_bytes());
            for v in values {
                h.part(v.as_bytes());
            }
            continue;
        }
        // Absent and present-but-empty are different requests.
        match normal_form(name, request) {
            None => h.part(&0u64.to_le_bytes()),
            Some(v) => h.part(&1u64.to_le_bytes()).part(&v),
        };
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use http::header::{self, HeaderMap, HeaderName, HeaderValue};

    use super::{key_authority, variant_key};
    use crate::http::vary::{stored_values, values_match};
    use crate::key::CacheKey;

    /// The key keeps the port (the upstream is told it too) and drops userinfo.
    #[test]
    pub(crate) fn key_authority_keeps_port_drops_userinfo() {
        assert_eq!(key_authority(b"example.com:8080"), b"example.com:8080");
        assert_eq!(key_authority(b"user:pw@example.com:1"), b"example.com:1");
        assert_eq!(key_authority(b"[::1]:3000"), b"[::1]:3000");
        assert_eq!(key_authority(b"plain"), b"plain");
    }

    /// A variant key and its stored values agree across equivalent requests.
    #[test]
    fn equivalent_requests_select_one_variant() {
        let base = CacheKey::new("u");
        let names = [header::ACCEPT_ENCODING, HeaderName::from_static("foo")];
        let mut chrome = HeaderMap::new();
        chrome.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("gzip, deflate, br, zstd"),
        );
        chrome.insert("foo", HeaderValue::from_static("1,2"));
        let mut firefox = HeaderMap::new();
        firefox.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("gzip, deflate, br"),
        );
        firefox.append("foo", HeaderValue::from_static("1"));
        firefox.append("foo", HeaderValue::from_static(" 2"));
        assert_eq!(
            variant_key(&base, &names, &chrome),
            variant_key(&base, &names, &firefox)
        );
        for name in &names {
            let stored = stored_values(name, &chrome);
            assert!(values_match(name, &firefox, &stored));
        }
        let mut curl = HeaderMap::new();
        curl.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        let stored = stored_values(&header::ACCEPT_ENCODING, &chrome);
        assert!(!values_match(&header::ACCEPT_ENCODING, &curl, &stored));
        assert!(!values_match(
            &header::ACCEPT_ENCODING,
            &HeaderMap::new(),
            &stored
        ));
    }
}
