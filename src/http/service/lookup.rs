//! The steps of [`CacheService::route`](super::CacheService) past its
//! first lines: the gate, and what each kind of lookup result leads to.
//! The request itself stays a local of `route` on the hit path (the
//! helpers here borrow it, or take it only on a path that leaves the
//! cache's memory): moving it would copy all of it.

use std::future::Future;
use std::sync::Arc;

use http::header::HeaderValue;
use http::{Request, Response};

use super::bounds::{Origin, OriginBody};
use super::coalesce::{answer_reload, miss};
use super::direct::{hit_for_miss, refresh_request};
use super::fields::{has_body, hit_for_miss_permit, plain_get};
use super::follow::{follow, running};
use super::miss_status::Wants;
use super::origin::OriginCall;
use super::respond::{stale_detail, Served, StandIn, View};
use crate::engine::{Priority, Refusal};
use crate::http::body::CacheBody;
use crate::http::cache_status::Detail;
use crate::http::future::ResponseFuture;
use crate::http::keys::{effective_uri, Target};
use crate::http::policy::{
    self, Forward, RequestDirectives, RequestForm, RequestScan, RequestVerdict, Usable,
};
use crate::http::purge::Invalidation;
use crate::http::response::CachedResponse;
use crate::http::state::{LayerState, ReloadMode};
use crate::key::CacheKey;
use crate::metrics::Source;
use crate::store::memory::{Probe, Stored};

/// An entry stored in the engine or kept aside.
type Entry = Arc<Stored<CachedResponse>>;

/// What the cache's gate makes of a request (which stays with the caller).
pub(super) enum Gate {
    /// The cache may answer it, under these directives.
    Cache(RequestDirectives),
    /// As `Cache`, once its Host is lowercased.
    LowercaseHost(RequestDirectives),
    /// It goes past the cache untouched: its `Cache-Status`, and the purge
    /// an unsafe method makes.
    Bypass(HeaderValue, Option<Invalidation>),
}

impl LayerState {
    /// Whether the cache may answer `req`, and with which of its
    /// directives; a request it may not answer goes past it untouched.
    #[inline(always)]
    pub(super) fn admit<B>(self: &Arc<Self>, req: &Request<B>, scan: &RequestScan) -> Gate {
        let rd = match policy::classify_scanned(req.method(), req.headers(), scan) {
            // Refusals of the stored response are dropped here, so the
            // request is served like any other.
            RequestVerdict::Cacheable(rd) if self.http.reload == ReloadMode::Ignore => {
                RequestDirectives {
                    no_cache: false,
                    max_age: None,
                    min_fresh: None,
                    ..rd
                }
            }
            RequestVerdict::Cacheable(rd) => rd,
            RequestVerdict::Bypass(fwd) => {
                let invalidate =
                    policy::invalidates(req.method()).then(|| self.invalidation_for(req));
                return Gate::Bypass(self.own_call_status(fwd, None), invalidate);
            }
        };
        // A GET or HEAD with a body means something the key cannot see, and
        // a rebuilt request would drop the body but keep its framing: pass
        // it through untouched, body and all.
        if scan.framing && has_body(req.headers()) {
            let status = self.own_call_status(Forward::Request, Some(Detail::RequestBody));
            return Gate::Bypass(status, None);
        }
        // The key and the origin must read one host and one method and URL:
        // an odd Host or an override header goes past the cache untouched.
        match policy::request_form(
            req.version(),
            effective_uri(req),
            req.headers(),
            scan.overridden,
        ) {
            RequestForm::Keyed => Gate::Cache(rd),
            RequestForm::UppercaseHost => Gate::LowercaseHost(rd),
            RequestForm::Unkeyed(why) => {
                let status = self.own_call_status(Forward::Request, Some(Detail::Unkeyed(why)));
                Gate::Bypass(status, None)
            }
        }
    }

    /// The entry stored for `key` to revalidate: in the engine (fresh or
    /// stale), else a copy kept aside.
    fn stored_for(&self, key: &CacheKey) -> Option<Entry> {
        match self.engine.probe(key) {
            Probe::Fresh(e) | Probe::Stale(e) => Some(e),
            Probe::Pass | Probe::Miss => self.retained.get(key),
        }
    }
}

/// One span per request; fields are filled in as the outcome is known
/// (lease and fence by the leader's task, which carries this span). None
/// until a tracing subscriber is set: without one, tracing would hand each
/// span and field to the `log` crate instead (its `log` feature, which
/// axum's defaults turn on), a few hundred instructions per hit for lines
/// that only a `log` logger at debug level would print.
#[inline(always)]
pub(super) fn request_span(key: &CacheKey) -> tracing::Span {
    if !tracing::dispatcher::has_been_set() {
        return tracing::Span::none();
    }
    tracing::debug_span!(
        "herdguard",
        key = %key.short_display(),
        outcome = tracing::field::Empty,
        lease = tracing::field::Empty,
        fence = tracing::field::Empty,
        wait_ms = tracing::field::Empty,
    )
}

/// A request admitted past the gate: what every answer to it shares.
#[derive(Clone, Copy)]
pub(super) struct Admitted<'a> {
    state: &'a Arc<LayerState>,
    /// The request is a HEAD.
    head: bool,
    /// The request's span, which its boxed answers run in.
    span: &'a tracing::Span,
}

/// A stored candidate that matches the request's variant.
pub(super) struct Found {
    pub(super) entry: Entry,
    /// The engine's own clock still calls it fresh.
    engine_fresh: bool,
    /// Its age in the store at the lookup's clock read.
    stored_age: std::time::Duration,
    /// Its current age (RFC 9111 §4.2.3) at that read.
    age: std::time::Duration,
}

impl Found {
    pub(super) fn new(entry: Entry, engine_fresh: bool, now: tokio::time::Instant) -> Self {
        let stored_age = entry.age_at(now);
        let age = entry.value.current_age(stored_age);
        Self {
            entry,
            engine_fresh,
            stored_age,
            age,
        }
    }
}

/// What a stored candidate that matches the request's variant is used for.
#[derive(Clone, Copy)]
pub(super) enum Use {
    /// Served from it.
    Serve(FromStore),
    /// Fresh for everyone else, but this request's directives refuse it
    /// (max-age, min-fresh): refresh it, as for no-cache.
    Reload,
    /// Lead or follow the key's flight.
    Flight,
}

/// How a stored candidate answers the request itself.
#[derive(Clone, Copy)]
pub(super) enum FromStore {
    /// A hit (with a refresh-ahead when it is the one to start it).
    Hit,
    /// Served stale while a background refresh runs: `StaleWhileRevalidate`
    /// or `Grace`.
    Revalidating(Usable),
    /// Served stale as the request's `max-stale` allows.
    StaleAccepted,
    /// Not usable, and the request says only-if-cached: a 504.
    OnlyIfCached,
}

impl<'a> Admitted<'a> {
    pub(super) fn new(state: &'a Arc<LayerState>, head: bool, span: &'a tracing::Span) -> Self {
        Self { state, head, span }
    }

    /// `fut` boxed once, run in the request's span (when there is one:
    /// without a subscriber it is none, and entering it does nothing).
    fn boxed<F, B: 'static, E: 'static, Fut>(self, fut: Fut) -> ResponseFuture<F, B, E>
    where
        Fut: Future<Output = Result<Response<CacheBody<B>>, E>> + Send + 'static,
    {
        if self.span.is_none() {
            return ResponseFuture::boxed(Box::pin(fut));
        }
        let fut = tracing::Instrument::instrument(fut, self.span.clone());
        ResponseFuture::boxed(Box::pin(fut))
    }

    /// Lead or follow the key's flight.
    #[inline(always)]
    pub(super) fn miss<S, ReqB, ResB>(
        self,
        target: Target,
        inner: S,
        req: Request<ReqB>,
        stale: Option<Entry>,
        wants: Wants,
    ) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Origin<ReqB, ResB> + Clone,
        ReqB: Default + Send + 'static,
        ResB: OriginBody,
    {
        let state = Arc::clone(self.state);
        // Whether it leads or follows is settled as it arrives: a follower's
        // future is a small one of its own, a leader's the whole miss path.
        match running(&state, &target, wants) {
            Some(joined) => {
                let call = (inner, req);
                self.boxed(follow(state, target, self.head, call, stale, joined))
            }
            // One that would lead, while the origin may not be asked, is
            // answered at once instead.
            None => match self.held(stale.as_ref(), &target, &req) {
                Some(held) => held,
                None => self.boxed(miss(state, target, self.head, inner, req, stale, wants)),
            },
        }
    }

    /// An answer at once, without a flight, while the origin may not be
    /// asked: its breaker is open, or the key's last fill failed within its
    /// backoff. The stored copy (or one kept aside) where stale-if-error
    /// allows it; else, with the breaker open and no Redis to look in, the
    /// layer's `503` (a miss would only be refused at the gate). `None`: go
    /// on to the flight.
    fn held<F, ReqB, ResB, E>(
        self,
        stale: Option<&Entry>,
        target: &Target,
        req: &Request<ReqB>,
    ) -> Option<ResponseFuture<F, ResB, E>> {
        let state = self.state;
        let engine = &state.engine;
        let down = engine.origin_down_for();
        let detail = match (down, stale) {
            (Some(_), _) => "origin-down",
            (None, Some(e)) if engine.backing_off(e) => "origin-backoff",
            (None, _) => return None,
        };
        let stand_in = StandIn {
            state: Arc::clone(state),
            stale: stale.cloned(),
            key: target.key,
            headers: Arc::new(req.headers().clone()),
            head: self.head,
        };
        if let Some(answer) = stand_in.answer_as(Served::Held(detail)) {
            return Some(ResponseFuture::ready(answer));
        }
        let retry_after = down?;
        // Redis may hold a copy this instance has not seen: the flight
        // looks there (its call is then refused at the gate, and that
        // copy stands in where stale-if-error allows it).
        if engine.shared_store_available() {
            return None;
        }
        state.counters().record_error();
        let error = engine.refused(Refusal::Down(retry_after), Priority::Waited);
        let status = state.status_fwd(target.miss, None);
        Some(ResponseFuture::ready(state.refusal_answer(&error, &status)))
    }

    /// Refresh, with the stored response's validators when there is one.
    pub(super) fn answer_reload<S, ReqB, ResB>(
        self,
        target: Target,
        inner: S,
        req: Request<ReqB>,
        stored: Option<Entry>,
    ) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Origin<ReqB, ResB> + Clone,
        ReqB: Default + Send + 'static,
        ResB: OriginBody,
    {
        let state = Arc::clone(self.state);
        let fut = answer_reload(state, target, self.head, inner, req, stored);
        self.boxed(fut)
    }

    /// `no-cache`: refresh, with the stored response's validators when
    /// there is one, so the origin may answer 304 and the entry is
    /// freshened; stored for other header values, this request's own
    /// variant is refreshed.
    pub(super) fn refresh<S, ReqB, ResB>(
        self,
        target: Target,
        inner: S,
        req: Request<ReqB>,
    ) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Origin<ReqB, ResB> + Clone,
        ReqB: Default + Send + 'static,
        ResB: OriginBody,
    {
        let state = self.state;
        let headers = req.headers();
        let (target, stored) = match state.stored_for(&target.key) {
            Some(e) if !e.value.vary_matches(headers) => {
                let t = state.variant_for(&target, &e, headers).unwrap_or(target);
                let v = state.stored_for(&t.key);
                (t, v.filter(|v| v.value.vary_matches(headers)))
            }
            other => (target, other),
        };
        self.answer_reload(target, inner, req, stored)
    }

    /// Another variant is stored here (this instance did not know the URL
    /// varies): the request's own variant is served if fresh (`Ok`), else
    /// gets a flight of its own (`Err`: its target and the stale copy),
    /// keyed by the names the stored one varies on.
    pub(super) fn own_variant<F, ReqB, ResB, E>(
        self,
        rd: &RequestDirectives,
        target: Target,
        stored: &Stored<CachedResponse>,
        req: &Request<ReqB>,
        scan: &RequestScan,
    ) -> Result<ResponseFuture<F, ResB, E>, (Target, Option<Entry>)> {
        let state = self.state;
        let target = state
            .variant_for(&target, stored, req.headers())
            .unwrap_or(target);
        match state.engine.probe(&target.key) {
            Probe::Fresh(v) | Probe::Stale(v) if v.value.vary_matches(req.headers()) => {
                let age = v.value.current_age(v.age());
                let fresh = v.fresh_by_meta()
                    && policy::usability(rd, v.value.rules, age, state.http.rules.grace)
                        == Usable::Fresh;
                if fresh {
                    state.counters().record(Source::Hit);
                    let view = View::scanned(req, self.head, scan);
                    return Ok(ResponseFuture::ready(state.respond(&v, &view, Served::Hit)));
                }
                Err((target, Some(v)))
            }
            _ => Err((target, None)),
        }
    }

    /// A pass marker here (and not only-if-cached). With Redis, another
    /// instance's hit-for-miss may have stored the entry over it since: a
    /// plain GET looks there first (one lookup; the marker there sends it
    /// on, in `miss`). Else hit-for-miss: the marker may come from an
    /// answer made for one request alone, so a free fallback permit asks
    /// again, and a storable answer replaces the marker; without one it
    /// passes.
    pub(super) fn under_marker<S, ReqB, ResB>(
        self,
        target: Target,
        inner: S,
        req: Request<ReqB>,
    ) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Origin<ReqB, ResB> + Clone,
        ReqB: Default + Send + 'static,
        ResB: OriginBody,
    {
        let state = self.state;
        if plain_get(req.headers(), self.head) && state.engine.shared_store_available() {
            return self.miss(target, inner, req, None, Wants::PastMarker);
        }
        if let Some(permit) = hit_for_miss_permit(state, req.headers(), self.head) {
            let state = Arc::clone(state);
            let fwd = Forward::UriMiss;
            let fut = hit_for_miss(state, target, self.head, inner, req, fwd, permit);
            return self.boxed(fut);
        }
        state.record_for(Source::Bypass, &target.key);
        let status = state.own_call_status(Forward::UriMiss, Some(Detail::HitForPass));
        ResponseFuture::bypass(inner, req, status, None)
    }

    /// What the stored candidate is used for (a few compares, no copy).
    #[inline(always)]
    pub(super) fn judge(self, rd: &RequestDirectives, found: &Found) -> Use {
        let rules = found.entry.value.rules;
        match policy::usability(rd, rules, found.age, self.state.http.rules.grace) {
            // The engine's own clock may end freshness earlier (an L1
            // bound in front of a shared store): then ask the flight.
            Usable::Fresh if found.engine_fresh => Use::Serve(FromStore::Hit),
            usable @ (Usable::StaleWhileRevalidate | Usable::Grace) => {
                Use::Serve(FromStore::Revalidating(usable))
            }
            Usable::StaleAccepted => Use::Serve(FromStore::StaleAccepted),
            _ if rd.only_if_cached => Use::Serve(FromStore::OnlyIfCached),
            Usable::Revalidate if found.engine_fresh => Use::Reload,
            Usable::Fresh | Usable::Revalidate => Use::Flight,
        }
    }

    /// The answer from the stored candidate. Inlined: it is the hit path.
    #[inline(always)]
    pub(super) fn serve<S, ReqB, ResB>(
        self,
        used: FromStore,
        req: &Request<ReqB>,
        scan: &RequestScan,
        found: Found,
        target: Target,
        origin: &S,
    ) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Origin<ReqB, ResB> + Clone,
        ReqB: Default + Send + 'static,
        ResB: OriginBody,
    {
        let state = self.state;
        let entry = &found.entry;
        let view = View::scanned(req, self.head, scan);
        match used {
            FromStore::Hit => {
                state.counters().count(Source::Hit);
                // Looking the field up by name is most of a record's cost.
                if !self.span.is_disabled() {
                    self.span.record("outcome", Source::Hit.as_str());
                }
                // Refresh-ahead: the one hit that finds this copy in the
                // last part of its freshness starts the background refresh.
                if entry.claim_refresh(found.stored_age) {
                    let stale = Some(entry.value.clone());
                    let req = refresh_request(req);
                    let state2 = Arc::clone(state);
                    let inner = origin.clone();
                    let refresh = OriginCall::new(inner, req, state2, None, target, stale);
                    state.engine.refresh_ahead(target.key, entry, refresh);
                }
                state
                    .respond_aged(entry, found.stored_age, &view, Served::Hit)
                    .ready()
            }
            FromStore::Revalidating(usable) => {
                state.record_for(Source::Stale, &target.key);
                let stale = Some(entry.value.clone());
                let req = refresh_request(req);
                let state2 = Arc::clone(state);
                let inner = origin.clone();
                let refresh = OriginCall::new(inner, req, state2, None, target, stale);
                state
                    .engine
                    .refresh_in_background(target.key, entry, refresh);
                let served = Served::Stale(stale_detail(usable));
                ResponseFuture::ready(state.respond(entry, &view, served))
            }
            FromStore::StaleAccepted => {
                state.record_for(Source::Stale, &target.key);
                let served = Served::Stale("max-stale");
                ResponseFuture::ready(state.respond(entry, &view, served))
            }
            FromStore::OnlyIfCached => ResponseFuture::ready(state.only_if_cached()),
        }
    }
}
