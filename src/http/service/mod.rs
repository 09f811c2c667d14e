//! The Tower service: HTTP request in, HTTP response out. It never produces an
//! error of its own (`type Error = S::Error`); every cache problem fails open.
//!
//! ```text
//! request ─► classify (method, request no-store …) ── bypass ─► origin
//!    │ body, bad Host, method / URL override ──────────────── bypass ─► origin
//!    │ Range: served as a plain GET, the answer cut to the range (crate::http::range)
//!    │ key = variant of (URL, Authorization?, key headers) by learned Vary names
//!    │ request no-cache ─► forward, store the fresh result (fwd=request)
//!    ▼
//! candidate = engine entry, or a retained one (kept for revalidation)
//!    fresh for this request        ─► hit (304 if the client's validators match)
//!    stale, stale-while-revalidate ─► hit now + one conditional refresh
//!    stale, client max-stale       ─► hit
//!    otherwise                     ─► one conditional request per key (fwd=stale);
//!                                     a 304 freshens the stored response
//! no candidate ─► one origin request per key (fwd=uri-miss / vary-miss)
//! pass marker  ─► its own origin call, not coalesced (hit-for-miss): a storable
//!                 answer replaces the marker; past the fallback cap, and for
//!                 HEAD, Range or conditional requests, a plain pass. With
//!                 Redis, a plain GET looks there first: an entry stored
//!                 since (another instance's hit-for-miss) is a hit
//! only-if-cached and nothing usable ─► 504
//! ```

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::header::{self, HeaderMap, HeaderName};
use http::{Method, Request, Response};
use http_body::Body;
use tower_service::Service;

use crate::error::BoxError;
use crate::http::body::CacheBody;
use crate::http::cache_status::CACHE_STATUS;
use crate::http::future::ResponseFuture;
use crate::http::policy::{
    self, Forward, RequestDirectives, RequestForm, RequestScan, RequestVerdict, Usable,
};
use crate::http::range::RangeRequest;
use crate::http::request_body::RequestBody;
use crate::http::state::{LayerState, ReloadMode};
use crate::metrics::Source;
use crate::store::memory::Probe;

use bounds::{Origin, OriginBody};
use coalesce::{miss, reload, Wants};
use direct::{hit_for_miss, refresh_request};
use origin::OriginCall;
use respond::{stale_detail, Served, View};
use target::{effective_uri, lowercase_host};

mod acceptance;
mod bounds;
mod coalesce;
mod direct;
mod fill;
mod origin;
mod respond;
mod streamed;
mod target;

/// Request headers dropped from the leader's origin request, so the stored
/// response is a complete one rather than a 304 or a fragment. The cache
/// adds its own validators when it revalidates; a `Range` is cut from the
/// complete answer ([`crate::http::range`]).
const CONDITIONAL: [HeaderName; 6] = [
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
const NOT_STORED: [HeaderName; 7] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::TRAILER,
    header::PROXY_AUTHENTICATE,
    CACHE_STATUS,
];

/// The caching service produced by [`CacheLayer`](crate::CacheLayer).
///
/// It takes a `Request<B>` with any body `B` (`hyper::body::Incoming`
/// included) and hands the inner service a `Request<RequestBody<B>>`: see
/// [`RequestBody`] for why and what it holds.
#[derive(Debug, Clone)]
pub struct CacheService<S> {
    inner: S,
    state: Arc<LayerState>,
}

impl<S> CacheService<S> {
    pub(crate) fn new(inner: S, state: Arc<LayerState>) -> Self {
        Self { inner, state }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped service; the cache it used lives on in the layer.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// Any request body: the inner service receives it as [`RequestBody<ReqB>`],
/// so requests the cache builds can carry an empty one.
impl<S, ReqB, ResB> Service<Request<ReqB>> for CacheService<S>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<CacheBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // At the one exit every answer passes, whatever path made it.
        let strip = self.state.http.strip_surrogate_key;
        let hide = !self.state.http.show_cache_status;
        // One pass over the request's names; every later check of a name
        // that is absent is then free.
        let scan = RequestScan::of(req.headers());
        let range = if scan.range {
            RangeRequest::of(req.method(), req.headers())
        } else {
            None
        };
        let mut fut = self.route(req.map(RequestBody::new), &scan);
        fut.set_exit(range, strip, self.state.stripped_header(), hide);
        fut
    }
}

impl<S> CacheService<S> {
    /// `call` but for the final header touch.
    fn route<ReqB, ResB>(
        &mut self,
        req: Request<ReqB>,
        scan: &RequestScan,
    ) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Origin<ReqB, ResB> + Clone,
        ReqB: Default + Send + 'static,
        ResB: OriginBody,
    {
        // The instance that was polled ready is the one we may call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let state = &self.state;

        let rd = match policy::classify_scanned(req.method(), req.headers(), scan) {
            // Refusals of the stored response are dropped here, so the
            // request is served like any other.
            RequestVerdict::Cacheable(rd) if state.http.reload == ReloadMode::Ignore => {
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
                    policy::invalidates(req.method()).then(|| state.invalidation_for(&req));
                state.counters().record(Source::Bypass);
                let status = state.status_fwd(fwd, None);
                return ResponseFuture::bypass(inner.call(req), status, invalidate);
            }
        };
        // A GET or HEAD with a body means something the key cannot see, and
        // a rebuilt request would drop the body but keep its framing: pass
        // it through untouched, body and all.
        if scan.framing && has_body(req.headers()) {
            state.counters().record(Source::Bypass);
            let status = state.status_fwd(Forward::Request, Some("request-body"));
            return ResponseFuture::bypass(inner.call(req), status, None);
        }
        // The key and the origin must read one host and one method and URL:
        // an odd Host or an override header goes past the cache untouched.
        let req = match policy::request_form(req.version(), effective_uri(&req), req.headers()) {
            RequestForm::Keyed => req,
            RequestForm::UppercaseHost => lowercase_host(req),
            RequestForm::Unkeyed(why) => {
                state.counters().record(Source::Bypass);
                let status = state.status_fwd(Forward::Request, Some(why.detail()));
                return ResponseFuture::bypass(inner.call(req), status, None);
            }
        };

        let head = req.method() == Method::HEAD;
        let (req, route_key) = state.route_key(req);
        let target = state.target_with(&req, route_key, scan.authorization);
        if !rd.only_if_cached && scan.range && state.range_to_origin(&req, &target.key) {
            state.counters().record(Source::Bypass);
            let status = state.status_fwd(Forward::Request, Some("too-large"));
            return ResponseFuture::bypass(inner.call(req), status, None);
        }
        // One span per request; fields are filled in as the outcome is known
        // (lease and fence by the leader's task, which carries this span).
        let span = tracing::debug_span!(
            "herdguard",
            key = %target.key.short_display(),
            outcome = tracing::field::Empty,
            lease = tracing::field::Empty,
            fence = tracing::field::Empty,
            wait_ms = tracing::field::Empty,
        );
        let _entered = span.enter();
        let boxed = |fut: BoxFuture<'static, Result<Response<CacheBody<ResB>>, S::Error>>| {
            ResponseFuture::boxed(Box::pin(tracing::Instrument::instrument(fut, span.clone())))
        };
        if rd.no_cache && !rd.only_if_cached {
            // Refresh, with the stored response's validators when there is
            // one: the origin may then answer 304 and the entry is freshened.
            let stored = match state.engine.probe(&target.key) {
                Probe::Fresh(e) | Probe::Stale(e) => Some(e),
                Probe::Pass | Probe::Miss => state.retained.get(&target.key),
            };
            // Stored for other header values: refresh this request's own variant.
            let (target, stored) = match stored {
                Some(e) if !e.value.vary_matches(req.headers()) => {
                    let t = state
                        .variant_for(&target, &e, req.headers())
                        .unwrap_or(target);
                    let v = match state.engine.probe(&t.key) {
                        Probe::Fresh(v) | Probe::Stale(v) => Some(v),
                        Probe::Pass | Probe::Miss => state.retained.get(&t.key),
                    };
                    (t, v.filter(|v| v.value.vary_matches(req.headers())))
                }
                other => (target, other),
            };
            let fut = reload(Arc::clone(state), target, head, inner, req, stored);
            return boxed(Box::pin(fut));
        }

        // One clock read for the lookup, the age and the answer.
        let now = tokio::time::Instant::now();
        let candidate = match state.engine.probe_at(&target.key, now) {
            Probe::Fresh(e) | Probe::Stale(e) if !e.value.vary_matches(req.headers()) => {
                if rd.only_if_cached {
                    return ResponseFuture::ready(state.only_if_cached());
                }
                // Another variant is stored here (this instance did not know
                // the URL varies): the request's own variant gets a flight
                // of its own, keyed by the names the stored one varies on.
                let target = state
                    .variant_for(&target, &e, req.headers())
                    .unwrap_or(target);
                let stale = match state.engine.probe(&target.key) {
                    Probe::Fresh(v) | Probe::Stale(v) if v.value.vary_matches(req.headers()) => {
                        let age = v.value.current_age(v.age());
                        let fresh = v.fresh_by_meta()
                            && policy::usability(&rd, v.value.rules, age, state.http.rules.grace)
                                == Usable::Fresh;
                        if fresh {
                            state.counters().record(Source::Hit);
                            let view = View::scanned(&req, head, scan);
                            return ResponseFuture::ready(state.respond(&v, &view, Served::Hit));
                        }
                        Some(v)
                    }
                    _ => None,
                };
                let fut = miss(
                    Arc::clone(state),
                    target,
                    head,
                    inner,
                    req,
                    stale,
                    Wants::Entry,
                );
                return boxed(Box::pin(fut));
            }
            Probe::Fresh(e) => Some((e, true)),
            Probe::Stale(e) => Some((e, false)),
            Probe::Pass => {
                if rd.only_if_cached {
                    return ResponseFuture::ready(state.only_if_cached());
                }
                // With Redis, another instance's hit-for-miss may have stored
                // the entry over the marker since this one was set here: a
                // plain GET looks there first (one lookup; the marker there
                // sends it on as below, in `miss`).
                if plain_get(req.headers(), head) && state.engine.shared_store_available() {
                    let fut = miss(
                        Arc::clone(state),
                        target,
                        head,
                        inner,
                        req,
                        None,
                        Wants::PastMarker,
                    );
                    return boxed(Box::pin(fut));
                }
                // Hit-for-miss: the marker may come from an answer made for
                // one request alone, so a free fallback permit asks again,
                // and a storable answer replaces the marker.
                if let Some(permit) = hit_for_miss_permit(state, req.headers(), head) {
                    let fut = hit_for_miss(
                        Arc::clone(state),
                        target,
                        head,
                        inner,
                        req,
                        Forward::UriMiss,
                        permit,
                    );
                    return boxed(Box::pin(fut));
                }
                state.counters().record(Source::Bypass);
                let status = state.status_fwd(Forward::UriMiss, Some("hit-for-pass"));
                return ResponseFuture::bypass(inner.call(req), status, None);
            }
            Probe::Miss => state
                .retained
                .get(&target.key)
                .filter(|e| e.value.vary_matches(req.headers()))
                .map(|e| (e, false)),
        };

        let Some((entry, engine_fresh)) = candidate else {
            if rd.only_if_cached {
                return ResponseFuture::ready(state.only_if_cached());
            }
            let fut = miss(
                Arc::clone(state),
                target,
                head,
                inner,
                req,
                None,
                Wants::Entry,
            );
            return boxed(Box::pin(fut));
        };
        let stored_age = entry.age_at(now);
        let age = entry.value.current_age(stored_age);
        let view = View::scanned(&req, head, scan);
        match policy::usability(&rd, entry.value.rules, age, state.http.rules.grace) {
            // The engine's own clock may end freshness earlier (an L1 bound
            // in front of a shared store): then ask the flight.
            Usable::Fresh if engine_fresh => {
                state.counters().record(Source::Hit);
                // Refresh-ahead: the one hit that finds this copy in the last
                // part of its freshness starts the background refresh.
                if entry.claim_refresh(stored_age) {
                    let stale = Some(entry.value.clone());
                    let refresh = OriginCall::new(
                        inner,
                        refresh_request(&req),
                        Arc::clone(state),
                        None,
                        target,
                        stale,
                    );
                    state.engine.refresh_ahead(target.key, &entry, refresh);
                }
                state
                    .respond_aged(&entry, stored_age, &view, Served::Hit)
                    .ready()
            }
            usable @ (Usable::StaleWhileRevalidate | Usable::Grace) => {
                state.counters().record(Source::Stale);
                let refresh = OriginCall::new(
                    inner,
                    refresh_request(&req),
                    Arc::clone(state),
                    None,
                    target,
                    Some(entry.value.clone()),
                );
                state.engine.refresh_in_background(target.key, refresh);
                let served = Served::Stale(stale_detail(usable));
                ResponseFuture::ready(state.respond(&entry, &view, served))
            }
            Usable::StaleAccepted => {
                state.counters().record(Source::Stale);
                let served = Served::Stale("max-stale");
                ResponseFuture::ready(state.respond(&entry, &view, served))
            }
            _ if rd.only_if_cached => ResponseFuture::ready(state.only_if_cached()),
            // Fresh for everyone else, but this request's directives refuse
            // it (max-age, min-fresh): refresh it, as for no-cache.
            Usable::Revalidate if engine_fresh => {
                let fut = reload(Arc::clone(state), target, head, inner, req, Some(entry));
                boxed(Box::pin(fut))
            }
            Usable::Fresh | Usable::Revalidate => {
                let fut = miss(
                    Arc::clone(state),
                    target,
                    head,
                    inner,
                    req,
                    Some(entry),
                    Wants::Entry,
                );
                boxed(Box::pin(fut))
            }
        }
    }
}

/// A fallback permit for a request under a pass marker to ask the origin
/// again ([`hit_for_miss`]), if one is free and the request is a plain GET:
/// a HEAD, a `Range` or a conditional request needs the origin's own answer
/// to it (a 206, a 304), which a fill request would not carry. `None`: it
/// passes as before.
fn hit_for_miss_permit(
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
fn plain_get(request_headers: &HeaderMap, head: bool) -> bool {
    !head && !CONDITIONAL.iter().any(|n| request_headers.contains_key(n))
}

/// A GET or HEAD that carries a body (RFC 9112 §6.3: Transfer-Encoding, or a
/// Content-Length other than 0).
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get_all(header::CONTENT_LENGTH)
            .iter()
            .any(|v| v.as_bytes().iter().any(|&b| b != b'0'))
}
