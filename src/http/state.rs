//! The state every clone of a layer, every route layer made from it and
//! every service they make share: the engine, the HTTP settings, the Vary
//! index, retained copies and streaming fills. Settings only; no I/O.

use std::sync::Arc;
use std::time::Duration;

use http::{header, request, response, HeaderName, Method, Request, StatusCode};

use crate::engine::retained::RetainedStore;
use crate::engine::Engine;
use crate::http::policy::{self, ResponseRules, ResponseVerdict};
use crate::http::response::CachedResponse;
use crate::http::route::{RouteKey, RoutePredicate};
use crate::http::stream::Streams;
use crate::http::vary::VaryIndex;
use crate::http::warnings::RouteWarnings;
use crate::key::CacheKey;
use crate::metrics::Counters;

/// HTTP-side settings.
#[derive(Debug, Clone)]
pub(crate) struct HttpConfig {
    pub(crate) max_body_bytes: usize,
    pub(crate) rules: ResponseRules,
    pub(crate) cache_name: String,
    pub(crate) key_headers: Vec<HeaderName>,
    /// How long a stored response is kept past its stale grace: to be
    /// revalidated with a conditional request, or served to `max-stale`.
    pub(crate) keep: Duration,
    /// Whether clients see `Cache-Status` (else it is only logged).
    pub(crate) show_cache_status: bool,
    pub(crate) reload: ReloadMode,
    /// Hand responses that may not be stored to every request waiting on
    /// the same key (opt-in: only for origins that answer everyone alike).
    pub(crate) share_uncacheable: bool,
    /// Remove the user's own targeted field from every response sent on.
    pub(crate) strip_own_cache_control: bool,
    /// A route's own key function, in place of host, path and query.
    pub(crate) route_key: Option<RouteKey>,
    /// A route's say on what is stored.
    pub(crate) predicate: Option<RoutePredicate>,
    /// Remove `Surrogate-Key` from every response to a client.
    pub(crate) strip_surrogate_key: bool,
    /// Name hot keys by their whole URL, query included (opt-in: queries
    /// can hold tokens).
    pub(crate) hot_key_full_urls: bool,
}

/// What a request that refuses the stored response does: `Cache-Control:
/// no-cache`, `Pragma: no-cache`, `max-age=0`, a `max-age` below the entry's
/// age, or a `min-fresh` the entry cannot meet (what browsers send on reload).
///
/// Whatever the mode, such requests never multiply origin calls without
/// bound: [`Honor`](Self::Honor) is capped by the fallback limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReloadMode {
    /// Join the single flight (the default): the request shares the refresh
    /// already running for its key, or starts one that goes to the origin
    /// (with the stored validators) and replaces the entry. One such refresh
    /// runs per key at a time, cluster-wide with Redis, so a thousand reloads
    /// cost one origin call. A reload may thus share a refresh that started
    /// a moment before it arrived, never the entry it refused.
    #[default]
    Coalesce,
    /// Each request makes its own origin call and stores the result (RFC
    /// 9111 to the letter), while fewer than
    /// [`fallback_limit`](crate::CacheLayerBuilder::fallback_limit) such calls run;
    /// beyond that, requests share a refresh as with `Coalesce`.
    Honor,
    /// The directives above are ignored and the stored response is served
    /// while it is fresh (what nginx and Varnish do by default). `max-stale`,
    /// `only-if-cached` and `no-store` still apply.
    Ignore,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 8 * 1024 * 1024,
            rules: ResponseRules::default(),
            cache_name: "herdguard".to_owned(),
            key_headers: Vec::new(),
            keep: Duration::from_secs(600),
            show_cache_status: true,
            reload: ReloadMode::Coalesce,
            share_uncacheable: false,
            strip_own_cache_control: true,
            route_key: None,
            predicate: None,
            strip_surrogate_key: true,
            hot_key_full_urls: false,
        }
    }
}

/// What one Vary index entry (a URL's key and its header names) costs in
/// memory, moka's bookkeeping included: an estimate, generous for the usual
/// one or two names.
pub(crate) const VARY_URL_BYTES: u64 = 256;

/// `capacity_bytes` carved into the stores that hold memory for long: every
/// stored byte counts against exactly one of them, so together they never
/// exceed the capacity (a body shared by L1 and a retained copy counts
/// twice, so the real total is lower still).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemoryBudget {
    /// Entries (fresh and stale) in the engine's store.
    pub(crate) l1: u64,
    /// Responses kept past their stale window for revalidation.
    pub(crate) retained: u64,
    /// The Vary index.
    pub(crate) vary: u64,
}

impl MemoryBudget {
    pub(crate) fn of(capacity: u64) -> Self {
        let retained = capacity / 4;
        let vary = (capacity / 64).max(VARY_URL_BYTES * 64);
        Self {
            l1: capacity.saturating_sub(retained + vary),
            retained,
            vary,
        }
    }
}

/// What every clone of a layer, and every service it makes, shares.
///
/// Its methods live with their job, one `impl` block per file:
/// - here: its settings applied (the counters, the route's key and
///   verdict, range requests sent on, the no-freshness warning);
/// - `keys.rs`: a request's [`Target`](crate::http::keys::Target);
/// - `hot.rs`: what it feeds the hot keys;
/// - `cache_status.rs`: `Cache-Status` values;
/// - `purge.rs`: purges and the invalidation an unsafe method makes;
/// - `service/lookup.rs`: admitting a request, the stored candidate;
/// - `service/fill.rs`: an origin answer turned into a fill, the copies
///   kept aside, Vary variants;
/// - `service/respond.rs`: answers built from entries, and its own.
#[derive(Debug)]
pub(crate) struct LayerState {
    pub(crate) engine: Arc<Engine<CachedResponse>>,
    pub(crate) http: HttpConfig,
    /// Header names each URL varies on, so variants get keys of their own.
    pub(crate) vary: VaryIndex,
    /// Responses kept past their stale grace for revalidation and stale-if-error.
    pub(crate) retained: RetainedStore<CachedResponse>,
    /// Fills whose body is streaming, offered to their flight's waiters.
    pub(crate) streams: Arc<Streams>,
    /// Keys whose body was too large to store: their range requests go to the origin.
    pub(crate) too_large: crate::http::range::TooLarge,
    /// The layer a route layer was made from: kept alive while any route is,
    /// because the Redis purge handler reaches memory through it.
    pub(crate) root: Option<Arc<LayerState>>,
    /// When each route was last warned that its answers lack freshness.
    pub(crate) warnings: Arc<RouteWarnings>,
    /// A route's own `cache` label on the engine's tally
    /// ([`RoutePolicy::cache_label`](crate::RoutePolicy::cache_label)).
    pub(crate) route_counters: Option<Arc<Counters>>,
}

impl LayerState {
    /// What this layer's requests are counted with: the route's label, or
    /// the engine's. Flights, stores and Redis count with the engine's.
    pub(crate) fn counters(&self) -> &Counters {
        self.route_counters
            .as_deref()
            .unwrap_or(&self.engine.counters)
    }

    /// The response header to remove before a response leaves the layer.
    pub(crate) fn stripped_header(&self) -> Option<HeaderName> {
        if !self.http.strip_own_cache_control {
            return None;
        }
        self.http.rules.own_cache_control.clone()
    }

    /// The request, and the route's key for it when the route has a key
    /// function (the request is taken apart and put back: no copy).
    pub(crate) fn route_key<B>(
        &self,
        req: http::Request<B>,
    ) -> (http::Request<B>, Option<CacheKey>) {
        let Some(route_key) = &self.http.route_key else {
            return (req, None);
        };
        let (parts, body) = req.into_parts();
        let key = route_key.key(&parts);
        (http::Request::from_parts(parts, body), Some(key))
    }

    /// The verdict on a response once the route's predicate has had its say.
    pub(crate) fn route_verdict(
        &self,
        request: &request::Parts,
        response: &response::Parts,
        verdict: ResponseVerdict,
    ) -> ResponseVerdict {
        match &self.http.predicate {
            // Only storing is the predicate's to refuse.
            Some(p)
                if matches!(verdict, ResponseVerdict::Store { .. })
                    && !p.0.should_cache(request, response) =>
            {
                ResponseVerdict::Pass(policy::NotStored::Predicate)
            }
            _ => verdict,
        }
    }

    /// Whether `req` is a range request for a key known to be too large to
    /// store: it goes to the origin untouched, `Range` and all.
    pub(crate) fn range_to_origin<B>(&self, req: &Request<B>, key: &CacheKey) -> bool {
        req.method() == Method::GET
            && req.headers().contains_key(header::RANGE)
            && self.too_large.contains(key)
    }

    /// An answer was not stored only because it carries no freshness and no
    /// TTL applies: warn once per route (per [`ROUTE_INTERVAL`]), naming
    /// the fix.
    pub(crate) fn warn_no_freshness(&self, request: &request::Parts, status: StatusCode) {
        let route = crate::http::warnings::route_of(request);
        if !self.warnings.due(route) {
            return;
        }
        tracing::warn!(
            cache = %self.http.cache_name,
            route = ?route,
            status = status.as_u16(),
            "response not stored: it carries no freshness (no Cache-Control max-age or \
             s-maxage, no Expires) and no TTL is configured, so every request to this route \
             calls the handler (Cache-Status: detail=no-freshness). Fix: set \
             `Cache-Control: max-age=N` in the handler, or a TTL on the layer \
             (CacheLayerBuilder::default_ttl) or the route (RoutePolicy::default_ttl) if the answer \
             is the same for every user. Logged once per route per 10 minutes."
        );
    }
}
