//! [`CacheLayer`]: configuration plus the shared state every route uses.

use std::sync::Arc;

use http::Uri;
use tower_layer::Layer;

use crate::engine::{Flight, OriginStatus};
use crate::entry::Internal;
use crate::hot::HotKeys;
use crate::http::keys::url_key;
use crate::http::purge::{AsUri, PurgeHandle, PurgeMode, PurgeTarget};
use crate::http::route::RoutePolicy;
use crate::http::service::CacheService;
use crate::http::state::{LayerState, VARY_URL_BYTES};
use crate::key::CacheKey;
use crate::metrics::Stats;

/// A Tower layer that caches GET and HEAD responses and lets exactly one
/// request per key compute a missing entry.
///
/// Clones share all state (entries, flights, counters), so one layer added to
/// several routes coalesces across all of them.
#[derive(Debug, Clone)]
pub struct CacheLayer {
    pub(crate) state: Arc<LayerState>,
}

impl CacheLayer {
    /// A layer with the documented defaults: in-memory store of 256 MiB,
    /// 8 MiB body limit, no default TTL, 60 s origin timeout, 65 s maximum wait.
    pub fn new() -> Self {
        Self::builder()
            .build()
            .unwrap_or_else(|_| unreachable!("the default configuration is valid"))
    }

    /// Counters since the layer was built, across all routes.
    pub fn stats(&self) -> Stats {
        self.state.engine.counters.snapshot()
    }

    /// The keys that stood out over the recent window, across all routes:
    /// requests, origin calls, waiters, time waited, stale answers and
    /// passes, the top K of each in fixed memory (see [`HotKeys`] for the
    /// bounds). Each key is named by its axum route (`MatchedPath`) or its
    /// path, with `?…` for a query unless
    /// [`hot_key_full_urls`](crate::CacheLayerBuilder::hot_key_full_urls) is on.
    /// Empty lists when [`hot_keys`](crate::CacheLayerBuilder::hot_keys) is 0.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use http::{Request, Response};
    /// use http_body_util::Full;
    /// use bytes::Bytes;
    /// use tower::{service_fn, Layer, ServiceExt};
    /// use herdguard::CacheLayer;
    ///
    /// let cache = CacheLayer::new();
    /// let svc = cache.layer(service_fn(|_req| async {
    ///     let res = Response::builder()
    ///         .header("cache-control", "max-age=60")
    ///         .body(Full::new(Bytes::from("hello")))
    ///         .unwrap();
    ///     Ok::<_, std::convert::Infallible>(res)
    /// }));
    /// for _ in 0..3 {
    ///     let req = Request::get("http://shop.test/items?session=secret")
    ///         .body(Full::new(Bytes::new()))
    ///         .unwrap();
    ///     svc.clone().oneshot(req).await.unwrap();
    /// }
    /// let hot = cache.hot_keys();
    /// assert_eq!(hot.requests[0].name, "/items?…");
    /// assert_eq!(hot.requests[0].count, 3);
    /// assert_eq!(hot.origin_calls[0].count, 1);
    /// # }
    /// ```
    pub fn hot_keys(&self) -> HotKeys {
        let engine = &self.state.engine;
        match &engine.hot {
            Some(hot) => hot.report(),
            None => HotKeys::off(engine.config.hot_key_window),
        }
    }

    /// Entries held in memory right now.
    pub fn entry_count(&self) -> u64 {
        self.state.engine.memory.entry_count()
    }

    /// This instance's origin budget and breaker now: permits in use,
    /// calls queued, and while the breaker is open, the time to its next
    /// probe.
    ///
    /// ```
    /// let layer = herdguard::CacheLayer::builder().origin_budget(8).build().unwrap();
    /// let origin = layer.origin_status();
    /// assert_eq!((origin.budget_in_use, origin.budget_limit), (0, 8));
    /// assert_eq!(origin.down_for, None);
    /// ```
    pub fn origin_status(&self) -> OriginStatus {
        self.state.engine.gate.status()
    }

    /// The origin calls this instance is making right now, longest
    /// running first, at most `limit` of them: each flight's key, age,
    /// waiters and (with Redis) the time left on its lease. A snapshot
    /// for diagnostics (the proxy's admin `/flights`, `herdguard top`); it
    /// takes the flight map's lock once.
    ///
    /// ```
    /// let layer = herdguard::CacheLayer::new();
    /// assert!(layer.flights(16).is_empty(), "nothing asked yet");
    /// ```
    pub fn flights(&self, limit: usize) -> Vec<Flight> {
        self.state.engine.flights.now_running(limit)
    }

    /// A layer for one route (or a group of routes) with its own
    /// [`RoutePolicy`] on this same cache: the store, the Redis client, the
    /// flights and the counters are shared, so requests of different routes
    /// that come to the same key coalesce into one origin call.
    ///
    /// The policy of the request that leads a flight decides how its answer
    /// is stored; routes that share keys should share policies. Waiters from
    /// any route get the answer only under the rules of
    /// [what is shared between users](crate#what-is-shared-between-users).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// use axum::{body::Body, extract::Path, routing::get, Router};
    /// use herdguard::{CacheLayer, RoutePolicy};
    /// use http::{request::Parts, Request};
    /// use tower::ServiceExt;
    ///
    /// let calls = Arc::new(AtomicUsize::new(0));
    /// let report = {
    ///     let calls = Arc::clone(&calls);
    ///     move |Path(id): Path<String>| async move {
    ///         calls.fetch_add(1, Ordering::SeqCst);
    ///         tokio::time::sleep(Duration::from_millis(50)).await;
    ///         format!("report {id}") // no cache headers at all
    ///     }
    /// };
    /// // Both routes name a report by its id alone.
    /// fn report_key(parts: &Parts) -> String {
    ///     let id = parts.uri.path().rsplit('/').next().unwrap_or("");
    ///     format!("report:{id}")
    /// }
    ///
    /// let cache = CacheLayer::new();
    /// let app = Router::new()
    ///     .route(
    ///         "/reports/{id}",
    ///         get(report.clone()).layer(cache.with_policy(
    ///             RoutePolicy::new()
    ///                 .key(report_key)
    ///                 .ignore_origin_cache_control()
    ///                 .default_ttl(Duration::from_secs(30)),
    ///         )),
    ///     )
    ///     .route(
    ///         "/legacy/report/{id}",
    ///         get(report).layer(cache.with_policy(
    ///             RoutePolicy::new()
    ///                 .key(report_key)
    ///                 .default_ttl(Duration::from_secs(30))
    ///                 .max_ttl(Duration::from_secs(10)),
    ///         )),
    ///     );
    ///
    /// // Eight concurrent requests over both routes, one key: one handler call.
    /// let requests = (0..8).map(|i| {
    ///     let uri = if i % 2 == 0 { "/reports/7" } else { "/legacy/report/7" };
    ///     let req = Request::get(uri).header("host", "example.com").body(Body::empty()).unwrap();
    ///     app.clone().oneshot(req)
    /// });
    /// for response in futures_util::future::join_all(requests).await {
    ///     assert_eq!(response.unwrap().status(), 200);
    /// }
    /// assert_eq!(calls.load(Ordering::SeqCst), 1);
    /// # }
    /// ```
    #[must_use]
    pub fn with_policy(&self, policy: RoutePolicy) -> CacheLayer {
        let root = self
            .state
            .root
            .clone()
            .unwrap_or_else(|| Arc::clone(&self.state));
        let mut http = self.state.http.clone();
        if let Some(key) = policy.key {
            http.route_key = Some(key);
        }
        if let Some(predicate) = policy.predicate {
            http.predicate = Some(predicate);
        }
        if let Some(ttl) = policy.ttl {
            http.rules.default_ttl = Some(ttl);
        }
        if let Some(max) = policy.max_ttl {
            http.rules.max_ttl = Some(max);
        }
        http.rules.ignore_cache_control |= policy.ignore_cache_control;
        let state = LayerState {
            engine: Arc::clone(&self.state.engine),
            http,
            // Clones of these share their contents.
            vary: self.state.vary.clone(),
            retained: self.state.retained.clone(),
            // Flights are shared, so the streams they offer are too.
            streams: Arc::clone(&self.state.streams),
            too_large: self.state.too_large.clone(),
            root: Some(root),
            warnings: Arc::clone(&self.state.warnings),
            route_counters: match policy.cache_label {
                Some(label) => Some(Arc::new(self.state.engine.counters.relabel(&label))),
                None => self.state.route_counters.clone(),
            },
        };
        CacheLayer {
            state: Arc::new(state),
        }
    }

    /// Bytes the layer holds in memory, as counted against
    /// [`capacity_bytes`](crate::CacheLayerBuilder::capacity_bytes): entries,
    /// retained copies and the Vary index (after pending evictions run).
    /// Never above the capacity; a body held both as an entry and as a
    /// retained copy is counted twice, so the real use is at most this.
    pub fn memory_bytes(&self) -> usize {
        let state = &self.state;
        let bytes = state.engine.memory.weighted_bytes()
            + state.retained.weighted_bytes()
            + state.vary.len() * VARY_URL_BYTES;
        // At most the capacity, which was a usize.
        usize::try_from(bytes).unwrap_or(usize::MAX)
    }

    /// Whether this layer works with Redis: `None` when it has none (memory
    /// only), `Some(false)` while its Redis calls are failing and it serves
    /// from memory (probing again after a back-off), `Some(true)` otherwise.
    ///
    /// ```
    /// assert_eq!(herdguard::CacheLayer::new().redis_connected(), None);
    /// ```
    pub fn redis_connected(&self) -> Option<bool> {
        self.state.engine.remote.as_ref().map(|r| r.available())
    }

    /// The cache key this layer derives for `request` (the `{H}` of the Redis
    /// keys is its hex form).
    pub fn key_for<B>(&self, request: &http::Request<B>) -> CacheKey {
        let route_key = self.state.http.route_key.as_ref().map(|k| {
            // Not the request path: a copy of the parts is fine here.
            let mut copy = http::Request::new(());
            *copy.method_mut() = request.method().clone();
            *copy.uri_mut() = request.uri().clone();
            *copy.version_mut() = request.version();
            *copy.headers_mut() = request.headers().clone();
            *copy.extensions_mut() = request.extensions().clone();
            k.key(&copy.into_parts().0)
        });
        self.state.target_for(request, route_key).key
    }
}

impl Default for CacheLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for CacheLayer {
    type Service = CacheService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CacheService::new(inner, Arc::clone(&self.state))
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

    /// The key a [`RoutePolicy::key`](crate::RoutePolicy::key) function
    /// that returns `key` names its entries by: what
    /// [`purge_key`](Self::purge_key) and
    /// [`soft_purge_key`](Self::soft_purge_key) take to remove every entry
    /// stored under it (every variant, with and without Authorization, on
    /// every route whose key function returned these bytes).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use herdguard::{CacheLayer, RoutePolicy};
    /// use herdguard::purge::Purged;
    ///
    /// let cache = CacheLayer::new();
    /// let reports = cache.with_policy(RoutePolicy::new().key(|req: &http::request::Parts| {
    ///     format!("report:{}", req.uri.path().trim_start_matches("/report/"))
    /// }));
    /// # let _ = reports;
    /// // Later, when report 7 changes:
    /// let purged = cache.purge_key(&cache.route_key("report:7")).await;
    /// assert_eq!(purged.unwrap(), Purged::Local);
    /// # }
    /// ```
    pub fn route_key(&self, key: impl AsRef<[u8]>) -> CacheKey {
        crate::http::route::route_key(key.as_ref())
    }

    /// Remove every stored variant of `url` (with and without Authorization,
    /// every Vary variant): from this process at once, and from Redis and
    /// every instance through the returned [`PurgeHandle`].
    ///
    /// `url` is what you have at hand, borrowed: a `&str`, a `&String` or a
    /// `&`[`Uri`] (see [`AsUri`]). Give it the host the requests carried
    /// (`http://shop.test/products/7`): a URL without one names only
    /// entries stored for requests without a host (see
    /// [`url_key`](Self::url_key)). A string that is not a URL purges
    /// nothing: the handle resolves to a [`PurgeError`](crate::purge::PurgeError)
    /// whose [`is_invalid_url`](crate::purge::PurgeError::is_invalid_url) is true
    /// (logged as a warning if the handle is dropped instead), as reqwest's
    /// `get` reports a bad URL when the request is sent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use herdguard::CacheLayer;
    /// use herdguard::purge::Purged;
    ///
    /// let cache = CacheLayer::new();
    /// assert_eq!(cache.purge_url("http://shop.test/products/7").await.unwrap(), Purged::Local);
    /// let uri: http::Uri = "http://shop.test/products/8".parse().unwrap();
    /// assert_eq!(cache.purge_url(&uri).await.unwrap(), Purged::Local);
    ///
    /// let bad = cache.purge_url("http://shop test/").await.unwrap_err();
    /// assert!(bad.is_invalid_url());
    /// # }
    /// ```
    pub fn purge_url<U: AsUri + ?Sized>(&self, url: &U) -> PurgeHandle {
        match url.sealed_uri(Internal) {
            Ok(url) => self.purge_key(&self.url_key(&url)),
            Err(e) => PurgeHandle::invalid_url(e),
        }
    }

    /// Remove the entry with `key`, or every entry of the URL whose
    /// [`url_key`](Self::url_key) it is, or every entry stored under the
    /// [`route_key`](Self::route_key) it is. See [`PurgeHandle`].
    pub fn purge_key(&self, key: &CacheKey) -> PurgeHandle {
        self.state.purge(PurgeTarget::Key(*key))
    }

    /// Remove every entry whose response carried `tag` in its space-separated
    /// `Surrogate-Key` header. See [`PurgeHandle`].
    pub fn purge_tag(&self, tag: &str) -> PurgeHandle {
        self.state.purge(PurgeTarget::Tag(Box::from(tag)))
    }

    /// Mark every stored variant of `url` stale instead of removing it
    /// (Fastly's soft purge), in this process at once and in Redis and
    /// every instance through the returned [`PurgeHandle`].
    ///
    /// The next request starts one refresh (one per cluster, with Redis)
    /// and it and every request after it are answered with the stale copy
    /// until the refresh lands (`Cache-Status: …; fwd=stale; …;
    /// detail=soft-purge`), so a purge of a hot URL does not make its
    /// requests wait. The bound is the entry's own stale window counted
    /// from the purge: the larger of its `stale-while-revalidate` and the
    /// layer's [`grace`](crate::CacheLayerBuilder::grace), and never past the end
    /// it already had. Past that, requests wait for the refresh as after a
    /// purge. An entry with no stale window (`must-revalidate`,
    /// `proxy-revalidate`, `s-maxage`, `no-cache`, or neither
    /// `stale-while-revalidate` nor grace) is never served stale: for it a
    /// soft purge is a purge. `stale-if-error` also counts from the purge.
    ///
    /// As with [`purge_url`](Self::purge_url), a fill that started before
    /// the soft purge is handed to the requests waiting on it but stored
    /// nowhere, and a soft-purged copy counts as stale on every instance
    /// (its `Age` says so too). The stale copies' responses are never
    /// fresh again: only the refresh's answer is. `url` is taken as by
    /// [`purge_url`](Self::purge_url), a bad one included.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use herdguard::CacheLayer;
    /// use herdguard::purge::Purged;
    ///
    /// let cache = CacheLayer::new();
    /// assert_eq!(cache.soft_purge_url("http://example.test/products/7").await.unwrap(), Purged::Local);
    /// # }
    /// ```
    pub fn soft_purge_url<U: AsUri + ?Sized>(&self, url: &U) -> PurgeHandle {
        match url.sealed_uri(Internal) {
            Ok(url) => self.soft_purge_key(&self.url_key(&url)),
            Err(e) => PurgeHandle::invalid_url(e),
        }
    }

    /// [`purge_key`](Self::purge_key), soft: the entry with `key` (or every
    /// entry of the URL whose [`url_key`](Self::url_key) it is, or stored
    /// under the [`route_key`](Self::route_key) it is) is marked stale and
    /// kept. See [`soft_purge_url`](Self::soft_purge_url).
    pub fn soft_purge_key(&self, key: &CacheKey) -> PurgeHandle {
        self.state
            .purge_with(PurgeTarget::Key(*key), PurgeMode::Soft)
    }

    /// [`purge_tag`](Self::purge_tag), soft: every entry whose response
    /// carried `tag` in `Surrogate-Key` is marked stale and kept. See
    /// [`soft_purge_url`](Self::soft_purge_url).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let cache = herdguard::CacheLayer::new();
    /// assert!(cache.soft_purge_tag("product-7").await.is_ok());
    /// # }
    /// ```
    pub fn soft_purge_tag(&self, tag: &str) -> PurgeHandle {
        self.state
            .purge_with(PurgeTarget::Tag(Box::from(tag)), PurgeMode::Soft)
    }
}
