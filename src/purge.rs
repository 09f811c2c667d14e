//! Invalidation: purge by key, by URL (every variant) or by `Surrogate-Key`
//! tag, and the invalidation an unsafe method causes (RFC 9111 §4.4).
//!
//! [`LayerState::purge`] is the one seam every purge goes through. It clears
//! this process (the engine's memory and the retained responses); a shared
//! store extends it to delete its copies and publish the purge to every
//! instance, which then runs the same [`PurgeTarget`] on its own memory.

use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderValue};
use http::Uri;

use crate::entry::CachedResponse;
use crate::key::CacheKey;
use crate::layer::{CacheLayer, LayerState};
use crate::store::redis::{RedisStore, StoreError};

/// What a purge removes. Plain data, so it can travel over pub/sub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PurgeTarget {
    /// The entry with this key, and every entry whose URL key it is.
    Key(CacheKey),
    /// Every entry whose response carries this `Surrogate-Key` tag.
    Tag(Box<str>),
}

impl PurgeTarget {
    pub(crate) fn matches(&self, key: &CacheKey, value: &CachedResponse) -> bool {
        match self {
            PurgeTarget::Key(k) => key == k || value.url == *k,
            PurgeTarget::Tag(t) => value.has_tag(t),
        }
    }
}

impl PurgeTarget {
    /// The notice other instances receive over pub/sub.
    fn notice(&self) -> Vec<u8> {
        match self {
            PurgeTarget::Key(k) => format!("k:{}", k.to_hex()).into_bytes(),
            PurgeTarget::Tag(t) => format!("t:{t}").into_bytes(),
        }
    }

    fn from_notice(payload: &[u8]) -> Option<Self> {
        if let Some(hex) = payload.strip_prefix(b"k:") {
            return CacheKey::from_hex(hex).map(PurgeTarget::Key);
        }
        let tag = std::str::from_utf8(payload.strip_prefix(b"t:")?).ok()?;
        Some(PurgeTarget::Tag(Box::from(tag)))
    }
}

impl LayerState {
    /// Remove what `target` names from this process and, with Redis, from
    /// Redis and (through a published notice) from every other instance.
    pub(crate) fn purge(&self, target: PurgeTarget) {
        if let Some(remote) = &self.engine.remote {
            let remote = Arc::clone(remote);
            let t = target.clone();
            crate::engine::spawn_detached("purge", async move {
                if let Err(e) = purge_remote(&remote, &t).await {
                    tracing::warn!(error = %e, "purge in redis failed");
                }
            });
        }
        self.purge_local(target);
    }

    /// Like [`purge`](Self::purge), but waits for Redis and reports its
    /// failure instead of logging it (for the diagnostics CLI). `Ok(false)`:
    /// the layer has no Redis, so only this process was purged.
    pub(crate) async fn purge_and_wait(&self, target: PurgeTarget) -> Result<bool, StoreError> {
        self.purge_local(target.clone());
        match &self.engine.remote {
            Some(remote) => purge_remote(remote, &target).await.map(|()| true),
            None => Ok(false),
        }
    }

    /// Apply a purge notice published by any instance.
    pub(crate) fn apply_notice(&self, payload: &[u8]) {
        tracing::debug!(notice = %String::from_utf8_lossy(payload), "purge notice");
        if let Some(target) = PurgeTarget::from_notice(payload) {
            self.purge_local(target);
        }
    }

    /// Remove what `target` names from this process only.
    fn purge_local(&self, target: PurgeTarget) {
        if let PurgeTarget::Key(k) = &target {
            self.engine.memory.remove(k);
            self.retained.remove(k);
        }
        let t = target.clone();
        self.engine.purge_where(move |k, v| t.matches(k, v));
        self.retained.purge_where(move |k, v| target.matches(k, v));
    }
}

/// Delete what `target` names from Redis, then tell every instance. The
/// notice goes out even when the deletion failed: memory copies still go.
async fn purge_remote(remote: &RedisStore, target: &PurgeTarget) -> Result<(), StoreError> {
    let result = match target {
        PurgeTarget::Key(k) => match remote.purge(k).await {
            Ok(()) => remote.purge_group(&format!("url:{}", k.to_hex())).await,
            Err(e) => Err(e),
        },
        PurgeTarget::Tag(tag) => remote.purge_group(&format!("tag:{tag}")).await,
    };
    let published = remote.publish_purge(&target.notice()).await;
    result.and(published)
}

/// The invalidation a successful unsafe request causes, decided once its
/// response arrives (RFC 9111 §4.4).
#[derive(Debug)]
pub(crate) struct Invalidation {
    state: Arc<LayerState>,
    authority: Option<Box<str>>,
    path: Box<str>,
}

impl Invalidation {
    pub(crate) fn new(state: Arc<LayerState>, authority: Option<&str>, path: &str) -> Self {
        Self {
            state,
            authority: authority.map(Box::from),
            path: Box::from(path),
        }
    }

    /// Purge the target URI, and Location / Content-Location when they share
    /// its origin, if the response is a success or a redirect.
    pub(crate) fn apply(&self, status: http::StatusCode, headers: &HeaderMap) {
        if !(status.is_success() || status.is_redirection()) {
            return;
        }
        let authority = self.authority.as_deref().map(str::as_bytes);
        let (path, query) = split_query(&self.path);
        self.state
            .purge(PurgeTarget::Key(url_key(authority, path.as_bytes(), query)));
        for name in [header::LOCATION, header::CONTENT_LOCATION] {
            for value in headers.get_all(&name) {
                if let Some(key) = self.same_origin_key(value) {
                    self.state.purge(PurgeTarget::Key(key));
                }
            }
        }
    }

    /// The URL key of a Location-like reference, if it is on the same origin.
    fn same_origin_key(&self, value: &HeaderValue) -> Option<CacheKey> {
        let s = value.to_str().ok()?.trim();
        let s = s.split('#').next().unwrap_or(s);
        let own = self.authority.as_deref().map(str::as_bytes);
        if s.contains("://") || s.starts_with("//") {
            let uri: Uri = if s.starts_with("//") {
                format!("http:{s}").parse().ok()?
            } else {
                s.parse().ok()?
            };
            let theirs = key_authority(uri.authority()?.as_str().as_bytes());
            if !own.is_some_and(|own| key_authority(own).eq_ignore_ascii_case(theirs)) {
                return None;
            }
            return Some(url_key(
                own,
                uri.path().as_bytes(),
                uri.query().map(str::as_bytes),
            ));
        }
        let (path, query) = split_query(s);
        if path.starts_with('/') {
            return Some(url_key(own, path.as_bytes(), query));
        }
        // A relative reference: resolve against the target's directory.
        let (base, _) = split_query(&self.path);
        let dir = &base[..base.rfind('/').map_or(0, |i| i + 1)];
        let joined = format!("{}{path}", if dir.is_empty() { "/" } else { dir });
        Some(url_key(own, joined.as_bytes(), query))
    }
}

fn split_query(s: &str) -> (&str, Option<&[u8]>) {
    match s.split_once('?') {
        Some((p, q)) => (p, Some(q.as_bytes())),
        None => (s, None),
    }
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
/// `shop.test` are different resources.
pub(crate) fn key_authority(authority: &[u8]) -> &[u8] {
    match authority.iter().rposition(|&b| b == b'@') {
        Some(at) => &authority[at + 1..],
        None => authority,
    }
}

impl CacheLayer {
    /// The key of a URL: what [`purge_key`](Self::purge_key) takes to remove
    /// every stored variant of it. Scheme and fragment are ignored; the host
    /// is compared case-insensitively and the port counts, as in the cache
    /// key (a request's `Host: shop.test:1337` is another site than
    /// `shop.test`).
    ///
    /// ```
    /// use herdguard::CacheLayer;
    /// let cache = CacheLayer::new();
    /// let a = cache.url_key(&"http://example.test/r?x=1".parse().unwrap());
    /// let b = cache.url_key(&"https://EXAMPLE.test/r?x=1".parse().unwrap());
    /// let c = cache.url_key(&"http://example.test:8443/r?x=1".parse().unwrap());
    /// assert_eq!(a, b);
    /// assert_ne!(a, c);
    /// ```
    pub fn url_key(&self, url: &Uri) -> CacheKey {
        url_key(
            url.authority().map(|a| a.as_str().as_bytes()),
            url.path().as_bytes(),
            url.query().map(str::as_bytes),
        )
    }

    /// Remove every stored variant of `url` (with and without Authorization,
    /// every Vary variant) from this process.
    pub fn purge_url(&self, url: &Uri) {
        self.purge_key(&self.url_key(url));
    }

    /// Remove the entry with `key`, or every entry of the URL whose
    /// [`url_key`](Self::url_key) it is.
    pub fn purge_key(&self, key: &CacheKey) {
        self.state.purge(PurgeTarget::Key(*key));
    }

    /// Remove every entry whose response carried `tag` in its space-separated
    /// `Surrogate-Key` header.
    pub fn purge_tag(&self, tag: &str) {
        self.state.purge(PurgeTarget::Tag(Box::from(tag)));
    }
}
