//! Invalidation: purge by key, by URL (every variant) or by `Surrogate-Key`
//! tag, and the invalidation an unsafe method causes (RFC 9111 §4.4).
//!
//! [`LayerState::purge`] is the one seam every purge goes through. It clears
//! this process (the engine's memory and the retained responses); a shared
//! store extends it to delete its copies and publish the purge to every
//! instance, which then runs the same [`PurgeTarget`] on its own memory.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Uri};
use tokio::sync::oneshot;

use crate::entry::Internal;
use crate::error::StoreFailure;
use crate::http::keys::{effective_uri, key_authority, request_authority, url_key};
use crate::http::response::CachedResponse;
use crate::http::state::LayerState;
use crate::key::CacheKey;
use crate::store::notice::Notice;
pub(crate) use crate::store::notice::PurgeMode;
use crate::store::redis::{redact_error, RedisStore, StoreError};

/// What a purge removes. Plain data, so it can travel over pub/sub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PurgeTarget {
    /// The entry with this key, and every entry whose URL key or route key
    /// it is.
    Key(CacheKey),
    /// Every entry whose response carries this `Surrogate-Key` tag.
    Tag(Box<str>),
}

impl PurgeTarget {
    pub(crate) fn matches(&self, key: &CacheKey, value: &CachedResponse) -> bool {
        match self {
            PurgeTarget::Key(k) => key == k || value.url == *k || value.route == Some(*k),
            PurgeTarget::Tag(t) => value.has_tag(t),
        }
    }
}

impl PurgeTarget {
    /// Its names in the purge log: a key purge also names the URL group
    /// whose URL key (or route key) it is, as [`matches`](Self::matches) does.
    fn names(&self) -> Vec<String> {
        match self {
            PurgeTarget::Key(k) => {
                vec![
                    crate::engine::purge_log::key_name(k),
                    format!("url:{}", k.to_hex()),
                ]
            }
            PurgeTarget::Tag(t) => vec![format!("tag:{t}")],
        }
    }

    /// The notice other instances receive over pub/sub
    /// ([`crate::store::notice`]).
    fn notice(&self, mode: PurgeMode) -> Vec<u8> {
        match self {
            PurgeTarget::Key(k) => Notice::Key(*k, mode),
            PurgeTarget::Tag(t) => Notice::Tag(t, mode),
        }
        .encode()
    }
}

/// What [`CacheLayer::purge_url`](crate::CacheLayer::purge_url) and
/// [`soft_purge_url`](crate::CacheLayer::soft_purge_url) take a reference
/// to: a parsed [`Uri`], or a URL as text ([`str`], [`String`]), parsed
/// when the purge is asked for. Implemented by this crate only.
///
/// ```
/// let cache = herdguard::CacheLayer::new();
/// let uri: http::Uri = "http://shop.test/a".parse().unwrap();
/// let text = String::from("http://shop.test/b");
/// drop(cache.purge_url(&uri));
/// drop(cache.purge_url("http://shop.test/c"));
/// drop(cache.purge_url(&text));
/// ```
pub trait AsUri {
    /// The URL, parsed if it is text. Sealed: the argument cannot be named
    /// outside this crate.
    #[doc(hidden)]
    fn sealed_uri(&self, _: Internal) -> Result<Cow<'_, Uri>, http::Error>;
}

impl AsUri for Uri {
    fn sealed_uri(&self, _: Internal) -> Result<Cow<'_, Uri>, http::Error> {
        Ok(Cow::Borrowed(self))
    }
}

impl AsUri for str {
    fn sealed_uri(&self, _: Internal) -> Result<Cow<'_, Uri>, http::Error> {
        Ok(Cow::Owned(Uri::try_from(self)?))
    }
}

impl AsUri for String {
    fn sealed_uri(&self, i: Internal) -> Result<Cow<'_, Uri>, http::Error> {
        self.as_str().sealed_uri(i)
    }
}

/// How far a purge reached, once its [`PurgeHandle`] resolves: it is done
/// everywhere there is to reach. A purge that is not is a [`PurgeError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Purged {
    /// Everywhere, which is this process only: the layer has no Redis.
    Local,
    /// Everywhere: the entries are deleted in Redis (or, for a soft purge,
    /// made stale there), their fences raised and their groups stamped (so no fill that started before the purge
    /// stores its answer, on any instance, heard the notice or not), and
    /// the notice is published, and every instance listening for notices
    /// acknowledged it: none of them still answers from a copy the purge
    /// named. An instance that was not listening (its connection lost) drops
    /// every copy it holds when it listens again.
    Redis,
    /// Done in Redis as for [`Redis`](Self::Redis), but not every listening
    /// instance acknowledged the notice within a few reply timeouts (one is
    /// slow or its connection went silent, or it runs an older version). Such
    /// an instance answers from its copy at most until its L1 lifetime ends.
    Unconfirmed,
}

/// A purge that is not done everywhere. This process's memory was purged
/// either way, unless the URL given did not parse
/// ([`is_invalid_url`](PurgeError::is_invalid_url)): then nothing was.
/// [`local_only`](PurgeError::local_only) tells the other two cases
/// apart: Redis was not reached at all (nothing there changed, other
/// instances still serve their copies: retry), or it failed part-way or
/// with an unknown result (a timeout).
///
/// Where a Redis call failed, [`store_failure`](Self::store_failure) (also
/// its `source()`) says how, to branch on.
#[derive(Debug, Clone)]
pub struct PurgeError {
    reason: String,
    local_only: bool,
    failure: Option<StoreFailure>,
    /// Why the URL given to `purge_url` did not parse (`http::Error` is not
    /// `Clone`, this error is).
    invalid_url: Option<Arc<http::Error>>,
}

impl PurgeError {
    /// Whether the purge is done in this process only because Redis could
    /// not be reached (circuit open, connection refused, server not a
    /// writable primary). `false`: it failed part-way or its outcome in
    /// Redis is unknown.
    pub fn local_only(&self) -> bool {
        self.local_only
    }

    /// The Redis call that failed, when one did (not when the purge could
    /// not start, such as outside a tokio runtime).
    pub fn store_failure(&self) -> Option<&StoreFailure> {
        self.failure.as_ref()
    }

    /// Whether the URL given to [`purge_url`](crate::CacheLayer::purge_url)
    /// or [`soft_purge_url`](crate::CacheLayer::soft_purge_url) did not
    /// parse, so nothing was purged anywhere. The parse error is the
    /// `source()`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::error::Error as _;
    ///
    /// let cache = herdguard::CacheLayer::new();
    /// let e = cache.purge_url("http://shop test/").await.unwrap_err();
    /// assert!(e.is_invalid_url() && !e.local_only());
    /// assert_eq!(e.to_string(), "nothing purged: invalid url");
    /// assert!(e.source().is_some());
    /// # }
    /// ```
    pub fn is_invalid_url(&self) -> bool {
        self.invalid_url.is_some()
    }
}

impl fmt::Display for PurgeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.invalid_url.is_some() {
            // The parse error is the source.
            return f.write_str("nothing purged: invalid url");
        }
        let what = if self.local_only {
            "purged in this process only, redis unreachable"
        } else {
            "purge did not complete in redis"
        };
        match self.failure {
            // The failure itself is the source, not repeated here.
            Some(_) => f.write_str(what),
            None => write!(f, "{what}: {}", self.reason),
        }
    }
}

impl std::error::Error for PurgeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match (&self.failure, &self.invalid_url) {
            (Some(e), _) => Some(e),
            (None, Some(e)) => Some(&**e),
            (None, None) => None,
        }
    }
}

/// A purge in progress, returned by [`CacheLayer::purge_url`](crate::CacheLayer::purge_url),
/// [`purge_key`](crate::CacheLayer::purge_key) and
/// [`purge_tag`](crate::CacheLayer::purge_tag), and by their soft forms
/// ([`soft_purge_url`](crate::CacheLayer::soft_purge_url) …).
///
/// This process's memory is purged before the call returns. The Redis part
/// runs in a spawned task whether or not the handle is awaited: drop it to
/// purge in the background (a failure is then logged), or await it for the
/// outcome. Each Redis call in it is bounded by the
/// [`RedisOptions`](crate::RedisOptions) timeouts.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use herdguard::CacheLayer;
/// use herdguard::purge::Purged;
///
/// let cache = CacheLayer::new();
/// // Without Redis only this process holds entries.
/// assert_eq!(cache.purge_tag("product-7").await.unwrap(), Purged::Local);
/// # }
/// ```
///
/// The handle is `#[must_use]`: leaving it unused is a warning that says
/// dropping it purges in the background. Drop it on purpose instead:
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// fn changed(cache: &herdguard::CacheLayer) {
///     cache.purge_tag("product-7"); // error: unused `PurgeHandle` that must be used
/// }
/// ```
/// ```
/// fn changed(cache: &herdguard::CacheLayer) {
///     drop(cache.purge_tag("product-7")); // in the background; failures are logged
/// }
/// # changed(&herdguard::CacheLayer::new());
/// ```
#[derive(Debug)]
#[must_use = "dropping a PurgeHandle purges in the background; await it to learn whether Redis was reached"]
pub struct PurgeHandle {
    state: HandleState,
}

#[derive(Debug)]
enum HandleState {
    Ready(Option<Result<Purged, PurgeError>>),
    Waiting(oneshot::Receiver<Result<Purged, PurgeError>>),
}

impl PurgeHandle {
    fn ready(outcome: Result<Purged, PurgeError>) -> Self {
        Self {
            state: HandleState::Ready(Some(outcome)),
        }
    }

    /// A purge that never started: `purge_url` was given a string that is
    /// not a URL.
    pub(crate) fn invalid_url(error: http::Error) -> Self {
        Self::ready(Err(PurgeError {
            reason: error.to_string(),
            local_only: false,
            failure: None,
            invalid_url: Some(Arc::new(error)),
        }))
    }
}

impl Drop for PurgeHandle {
    /// A handle dropped unawaited is a purge in the background, whose
    /// failures are logged: a URL that did not parse is one, caught before
    /// any task could log it.
    fn drop(&mut self) {
        if let HandleState::Ready(Some(Err(e))) = &self.state {
            if e.invalid_url.is_some() {
                tracing::warn!(error = %e.reason, "purge_url: nothing purged: invalid url");
            }
        }
    }
}

impl Future for PurgeHandle {
    type Output = Result<Purged, PurgeError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().state {
            HandleState::Ready(outcome) => match outcome.take() {
                Some(o) => Poll::Ready(o),
                // Polled after completion: a contract violation by the caller.
                None => Poll::Pending,
            },
            HandleState::Waiting(rx) => Pin::new(rx).poll(cx).map(|r| match r {
                Ok(result) => result,
                Err(_) => Err(PurgeError {
                    reason: "the purge task ended early (runtime shut down)".to_owned(),
                    local_only: false,
                    failure: None,
                    invalid_url: None,
                }),
            }),
        }
    }
}

impl LayerState {
    /// Remove what `target` names from this process now and, with Redis,
    /// from Redis and (through a published notice) from every other
    /// instance, in a spawned task the handle reports on.
    pub(crate) fn purge(&self, target: PurgeTarget) -> PurgeHandle {
        self.purge_with(target, PurgeMode::Hard)
    }

    /// [`purge`](Self::purge), or with [`PurgeMode::Soft`] mark stale what
    /// `target` names instead of removing it, in the same places.
    pub(crate) fn purge_with(&self, target: PurgeTarget, mode: PurgeMode) -> PurgeHandle {
        let Some(remote) = &self.engine.remote else {
            self.purge_local(target, mode);
            return PurgeHandle::ready(Ok(Purged::Local));
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("purge outside a tokio runtime: redis and other instances not purged");
            self.purge_local(target, mode);
            return PurgeHandle::ready(Err(PurgeError {
                reason: "no tokio runtime to run it on".to_owned(),
                local_only: true,
                failure: None,
                invalid_url: None,
            }));
        };
        let remote = Arc::clone(remote);
        let (tx, rx) = oneshot::channel();
        let t = target.clone();
        runtime.spawn(async move {
            let result = purge_remote(&remote, &t, mode)
                .await
                .map_err(|(e, did_nothing)| PurgeError {
                    reason: redact_error(&e),
                    local_only: did_nothing,
                    failure: Some(StoreFailure::from(&e)),
                    invalid_url: None,
                });
            // Nobody awaits the handle: the log is the only place left to say it.
            if let Err(Err(e)) = tx.send(result) {
                tracing::warn!(error = %e.reason, "purge in redis failed");
            }
        });
        self.purge_local(target, mode);
        PurgeHandle {
            state: HandleState::Waiting(rx),
        }
    }

    /// Apply a purge notice published by any instance.
    pub(crate) fn apply_notice(&self, payload: &[u8]) {
        tracing::debug!(notice = %String::from_utf8_lossy(payload), "purge notice");
        match Notice::parse(payload) {
            Some(Notice::Missed) => {
                // Purges may have gone by unheard: keep no copy from before.
                self.engine.purge_where(|_, _| true);
                self.retained.purge_where(|_, _| true);
            }
            Some(Notice::Key(k, mode)) => self.purge_local(PurgeTarget::Key(k), mode),
            Some(Notice::Tag(t, mode)) => self.purge_local(PurgeTarget::Tag(Box::from(t)), mode),
            None => {}
        }
    }

    /// Remove (or soft-purge) what `target` names from this process only.
    /// Fills running here that it names then store nothing (see
    /// [`crate::purge_log`]): a soft purge beats an older fill as a purge does.
    fn purge_local(&self, target: PurgeTarget, mode: PurgeMode) {
        if mode == PurgeMode::Soft {
            self.engine.record_soft_purge(target.names());
        } else {
            self.engine.record_purge(target.names());
        }
        if mode == PurgeMode::Soft {
            // Marked in place, so a copy a running flight handed out is
            // stale for everyone who holds it too.
            let t = target.clone();
            self.engine
                .memory
                .soft_purge_where(move |k, v| t.matches(k, v));
            self.retained
                .soft_purge_where(move |k, v| target.matches(k, v));
            return;
        }
        if let PurgeTarget::Key(k) = &target {
            self.engine.memory.purge(k);
            self.retained.remove(k);
        }
        let t = target.clone();
        self.engine.purge_where(move |k, v| t.matches(k, v));
        self.retained.purge_where(move |k, v| target.matches(k, v));
    }

    /// What a successful unsafe request to this URI invalidates.
    pub(crate) fn invalidation_for<B>(self: &Arc<Self>, req: &Request<B>) -> Invalidation {
        let uri = effective_uri(req);
        let authority = request_authority(req, uri).and_then(|a| std::str::from_utf8(a).ok());
        let path = uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        Invalidation::new(Arc::clone(self), authority, path)
    }
}

/// Delete (or soft-purge) what `target` names from Redis, then tell every
/// instance. The notice goes out even when the deletion failed: memory
/// copies still go. The error says whether nothing at all reached Redis.
async fn purge_remote(
    remote: &RedisStore,
    target: &PurgeTarget,
    mode: PurgeMode,
) -> Result<Purged, (StoreError, bool)> {
    let result = match (target, mode) {
        (PurgeTarget::Key(k), PurgeMode::Hard) => match remote.purge(k).await {
            Ok(()) => remote
                .purge_group(&format!("url:{}", k.to_hex()))
                .await
                .map_err(|(e, _)| (e, false)),
            Err(e) => {
                let nothing = e.did_nothing();
                Err((e, nothing))
            }
        },
        (PurgeTarget::Key(k), PurgeMode::Soft) => {
            remote
                .soft_purge_group(&format!("url:{}", k.to_hex()), Some(k))
                .await
        }
        (PurgeTarget::Tag(tag), PurgeMode::Hard) => remote.purge_group(&format!("tag:{tag}")).await,
        (PurgeTarget::Tag(tag), PurgeMode::Soft) => {
            remote.soft_purge_group(&format!("tag:{tag}"), None).await
        }
    };
    let published = remote.publish_purge(&target.notice(mode)).await;
    match (result, published) {
        (Err(e), _) => Err(e),
        (Ok(()), Err(e)) => Err((e, false)),
        (Ok(()), Ok(true)) => Ok(Purged::Redis),
        (Ok(()), Ok(false)) => Ok(Purged::Unconfirmed),
    }
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
        // Handles dropped: the response does not wait for Redis.
        drop(
            self.state
                .purge(PurgeTarget::Key(url_key(authority, path.as_bytes(), query))),
        );
        for name in [header::LOCATION, header::CONTENT_LOCATION] {
            for value in headers.get_all(&name) {
                if let Some(key) = self.same_origin_key(value) {
                    drop(self.state.purge(PurgeTarget::Key(key)));
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
