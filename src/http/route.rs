//! Per-route policy on one shared cache: [`RoutePolicy`], applied with
//! [`CacheLayer::with_policy`](crate::CacheLayer::with_policy).
//!
//! A route layer shares everything that makes the cache one cache (the
//! store, the Redis client and subscriber, the flights, the Vary index, the
//! counters) and changes only the decisions: what the key is, what may be
//! stored, and for how long.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{request, response};

use crate::key::CacheKey;

/// Decides whether a response may be stored, after the HTTP rules allowed
/// it (tower-http's `Predicate` style: closures implement it).
///
/// A `false` is treated like an origin `no-store`: nothing is stored and
/// waiters call the origin themselves. Unless an entry still usable by
/// other requests is stored, or the status is an error (4xx/5xx, which
/// never marks anything), the kept copy for the key is dropped and a short
/// hit-for-pass marker keeps the next requests from queueing.
///
/// ```
/// use herdguard::RoutePolicy;
/// use herdguard::service::Predicate;
/// use http::{request, response};
///
/// // Store only 200s, and never for a request that asks for a preview.
/// let policy = RoutePolicy::new().cache_when(|req: &request::Parts, res: &response::Parts| {
///     res.status == 200 && !req.uri.query().is_some_and(|q| q.contains("preview"))
/// });
/// # let _ = policy;
/// ```
pub trait Predicate: Send + Sync + 'static {
    /// Whether the response to this request may be stored and shared.
    fn should_cache(&self, request: &request::Parts, response: &response::Parts) -> bool;
}

impl<F> Predicate for F
where
    F: Fn(&request::Parts, &response::Parts) -> bool + Send + Sync + 'static,
{
    fn should_cache(&self, request: &request::Parts, response: &response::Parts) -> bool {
        self(request, response)
    }
}

/// The default [`Predicate`]: store whatever the HTTP rules allow.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultPredicate;

impl Predicate for DefaultPredicate {
    fn should_cache(&self, _: &request::Parts, _: &response::Parts) -> bool {
        true
    }
}

/// The key a route's key function returning `key` names: what
/// [`CacheLayer::route_key`](crate::CacheLayer::route_key) gives to purge by.
/// The `route` part keeps it apart from URL keys (which start with `url`),
/// as the purge groups that share the `url:` prefix rely on.
pub(crate) fn route_key(key: &[u8]) -> CacheKey {
    CacheKey::from_parts(&[b"route", key])
}

/// A route's key function, its output already folded into a key.
#[derive(Clone)]
pub(crate) struct RouteKey(Arc<dyn Fn(&request::Parts) -> CacheKey + Send + Sync>);

impl RouteKey {
    pub(crate) fn key(&self, parts: &request::Parts) -> CacheKey {
        (self.0)(parts)
    }
}

impl fmt::Debug for RouteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RouteKey(..)")
    }
}

/// A route's predicate, shared by every clone of its layer.
#[derive(Clone)]
pub(crate) struct RoutePredicate(pub(crate) Arc<dyn Predicate>);

impl fmt::Debug for RoutePredicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RoutePredicate(..)")
    }
}

/// What one route changes on a shared [`CacheLayer`](crate::CacheLayer):
/// its key, what it stores, and for how long. Everything else (store,
/// Redis, flights, limits) stays the layer's.
///
/// ```
/// use std::time::Duration;
/// use herdguard::{CacheLayer, RoutePolicy};
///
/// let cache = CacheLayer::new();
/// let reports = cache.with_policy(
///     RoutePolicy::new()
///         // The handler sets no Cache-Control: 30 s for every answer.
///         .ignore_origin_cache_control()
///         .default_ttl(Duration::from_secs(30)),
/// );
/// let feeds = cache.with_policy(RoutePolicy::new().max_ttl(Duration::from_secs(5)));
/// # let _ = (reports, feeds);
/// ```
#[derive(Clone, Default)]
pub struct RoutePolicy {
    pub(crate) key: Option<RouteKey>,
    pub(crate) predicate: Option<RoutePredicate>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) max_ttl: Option<Duration>,
    pub(crate) ignore_cache_control: bool,
    pub(crate) cache_label: Option<String>,
}

impl fmt::Debug for RoutePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoutePolicy")
            .field("key", &self.key.is_some())
            .field("predicate", &self.predicate.is_some())
            .field("ttl", &self.ttl)
            .field("max_ttl", &self.max_ttl)
            .field("ignore_cache_control", &self.ignore_cache_control)
            .field("cache_label", &self.cache_label)
            .finish()
    }
}

impl RoutePolicy {
    /// A policy that changes nothing: the layer's own settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Name the resource with your own key instead of host, path and query.
    ///
    /// Requests of any route whose key functions return the same bytes share
    /// one entry and one flight. What the cache adds to every key still
    /// applies on top, so a key function cannot make one user's answer
    /// reach another: anonymous and authorized requests never share, an
    /// answer to credentials is keyed by their digest unless it says
    /// `public` or `s-maxage`, configured
    /// [`key_header`](crate::CacheLayerBuilder::key_header)s count, and
    /// `Vary` variants are keyed and checked after it.
    ///
    /// Purge them by the same bytes:
    /// `cache.purge_key(&cache.route_key("report:7"))` removes every entry
    /// a key function returning `"report:7"` named (see
    /// [`CacheLayer::route_key`](crate::CacheLayer::route_key)). Purging by
    /// URL finds an entry by the URL of the request that stored it only,
    /// where requests for other URLs may share it. With Redis the route key
    /// is one more purge index beside the URL's, as a `Surrogate-Key` tag
    /// is: a leader's fill costs 25 Redis commands instead of 20.
    #[must_use]
    pub fn key<F, K>(mut self, key: F) -> Self
    where
        F: Fn(&request::Parts) -> K + Send + Sync + 'static,
        K: AsRef<[u8]>,
    {
        self.key = Some(RouteKey(Arc::new(move |parts| {
            route_key(key(parts).as_ref())
        })));
        self
    }

    /// Store a response only when `predicate` agrees (default:
    /// [`DefaultPredicate`], whatever the HTTP rules allow). It is asked
    /// only about responses the rules would store; see [`Predicate`].
    #[must_use]
    pub fn cache_when(mut self, predicate: impl Predicate) -> Self {
        self.predicate = Some(RoutePredicate(Arc::new(predicate)));
        self
    }

    /// Freshness for this route's responses that carry none of their own:
    /// the route's form of the layer's
    /// [`default_ttl`](crate::CacheLayerBuilder::default_ttl), which it
    /// replaces; with
    /// [`ignore_origin_cache_control`](Self::ignore_origin_cache_control),
    /// the freshness of every storable response of this route.
    ///
    /// ```
    /// use std::time::Duration;
    /// let reports = herdguard::RoutePolicy::new().default_ttl(Duration::from_secs(30));
    /// # let _ = reports;
    /// ```
    #[must_use]
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The former name of [`default_ttl`](Self::default_ttl), the same
    /// setting as the layer's.
    #[deprecated(since = "0.1.0", note = "renamed to `default_ttl`, as on the layer")]
    #[must_use]
    pub fn ttl(self, ttl: Duration) -> Self {
        self.default_ttl(ttl)
    }

    /// The longest freshness any response of this route gets, whatever the
    /// origin says (its stale grace is not shortened).
    #[must_use]
    pub fn max_ttl(mut self, max: Duration) -> Self {
        self.max_ttl = Some(max);
        self
    }

    /// The `cache` label of this route's request metrics
    /// (`herdguard_requests_total`, `herdguard_not_stored_total`, and the
    /// origin calls its requests make outside a flight), to read each
    /// route's hit ratio apart. The route still shares the layer's store and
    /// flights: requests of two routes for one key are one origin call, and
    /// what belongs to the flight (its origin call, waits, stored sizes,
    /// leases, fences, Redis errors) keeps the layer's
    /// [`cache_name`](crate::CacheLayerBuilder::cache_name), as does
    /// `Cache-Status`. [`CacheLayer::stats`](crate::CacheLayer::stats) still
    /// counts every route. Default: the layer's name.
    ///
    /// ```
    /// use herdguard::{CacheLayer, RoutePolicy};
    /// let cache = CacheLayer::new();
    /// let reports = cache.with_policy(RoutePolicy::new().cache_label("reports"));
    /// # let _ = reports;
    /// ```
    #[must_use]
    pub fn cache_label(mut self, label: impl Into<String>) -> Self {
        self.cache_label = Some(label.into());
        self
    }

    /// For handlers that set no cache headers: ignore the origin's
    /// freshness directives (`Cache-Control`, targeted fields, `Expires`,
    /// heuristics) and store every storable response for [`default_ttl`](Self::default_ttl)
    /// (or the layer's `default_ttl`; with neither, nothing is stored).
    ///
    /// What protects users still holds: `no-store`, `private`,
    /// `Set-Cookie` and `Vary` are obeyed, answers to requests with
    /// `Authorization` are not stored (nothing here says they are for
    /// everyone), and only statuses cacheable by default (200, 404, 301, …)
    /// are stored.
    #[must_use]
    pub fn ignore_origin_cache_control(mut self) -> Self {
        self.ignore_cache_control = true;
        self
    }
}
