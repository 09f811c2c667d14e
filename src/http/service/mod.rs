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
use http::{Method, Request, Response};
use http_body::Body;
use tower_service::Service;

use crate::error::BoxError;
use crate::http::body::CacheBody;
use crate::http::cache_status::Detail;
use crate::http::future::ResponseFuture;
use crate::http::policy::{Forward, RequestScan};
use crate::http::range::RangeRequest;
use crate::http::request_body::RequestBody;
use crate::http::state::LayerState;
use crate::metrics::Source;
use crate::store::memory::Probe;

use crate::http::keys::{lowercase_host, HostSeen};
use bounds::{Origin, OriginBody};
use lookup::{request_span, Admitted, Found, Gate, Use};
use miss_status::Wants;

mod acceptance;
mod bounds;
mod coalesce;
mod direct;
mod fields;
mod fill;
mod follow;
mod lookup;
mod miss_status;
mod origin;
mod origin_body;
mod respond;
mod returned;
mod streamed;

/// The caching service produced by [`CacheLayer`](crate::CacheLayer).
///
/// It is always ready: a hit never waits for the inner service, and each
/// call that reaches the origin makes a clone of it ready first (see
/// *Bounds and timeouts* in the crate docs).
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

    /// Always ready: a hit does not use the inner service, so it never
    /// waits for the origin's readiness (a `ConcurrencyLimit` whose permits
    /// are all out, a full `Buffer`). Each call that reaches the inner
    /// service makes a clone of it ready first, within the origin timeout.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
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
        if fut.may_wait() {
            fut.set_caller(self.state.engine.gate.caller());
        }
        fut
    }
}

impl<S> CacheService<S> {
    /// `call` but for the final header touch.
    fn route<ReqB, ResB>(
        &self,
        mut req: Request<ReqB>,
        scan: &RequestScan,
    ) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Origin<ReqB, ResB> + Clone,
        ReqB: Default + Send + 'static,
        ResB: OriginBody,
    {
        // Never readied (see `poll_ready`): only a call to the origin clones it.
        let inner = &self.inner;
        let state = &self.state;
        // The request stays a local here: a helper that took it by value
        // would copy all of it on the hit path.
        let rd = match state.admit(&req, scan) {
            Gate::Cache(rd) => rd,
            Gate::LowercaseHost(rd) => {
                req = lowercase_host(req);
                rd
            }
            Gate::Bypass(status, invalidate) => {
                state.counters().record(Source::Bypass);
                return ResponseFuture::bypass(inner.clone(), req, status, invalidate);
            }
        };
        let head = req.method() == Method::HEAD;
        // Only a route key takes the request apart (its function reads the
        // parts); without one the request is not moved on the hit path.
        let route_key = if state.http.route_key.is_some() {
            let (r, key) = state.route_key(req);
            req = r;
            key
        } else {
            None
        };
        let target = state.target_with(&req, route_key, scan.authorization, HostSeen::Admitted);
        // One clock read for the hot keys, the lookup, the age and the answer.
        let now = tokio::time::Instant::now();
        state.hot_request(&target.key, &req, now);
        if !rd.only_if_cached && scan.range && state.range_to_origin(&req, &target.key) {
            state.record_for(Source::Bypass, &target.key);
            let status = state.own_call_status(Forward::Request, Some(Detail::TooLarge));
            return ResponseFuture::bypass(inner.clone(), req, status, None);
        }
        let span = request_span(&target.key);
        let _entered = span.enter();
        let admitted = Admitted::new(state, head, &span);
        if rd.no_cache && !rd.only_if_cached {
            return admitted.refresh(target, inner.clone(), req);
        }
        let (entry, engine_fresh) = match state.engine.probe_at(&target.key, now) {
            Probe::Fresh(e) | Probe::Stale(e) if !e.value.vary_matches(req.headers()) => {
                if rd.only_if_cached {
                    return ResponseFuture::ready(state.only_if_cached());
                }
                return match admitted.own_variant(&rd, target, &e, &req, scan) {
                    Ok(hit) => hit,
                    Err((t, stale)) => admitted.miss(t, inner.clone(), req, stale, Wants::Entry),
                };
            }
            Probe::Fresh(e) => (e, true),
            Probe::Stale(e) => (e, false),
            Probe::Pass if rd.only_if_cached => {
                return ResponseFuture::ready(state.only_if_cached())
            }
            Probe::Pass => return admitted.under_marker(target, inner.clone(), req),
            Probe::Miss => match state.retained.get(&target.key) {
                Some(e) if e.value.vary_matches(req.headers()) => (e, false),
                _ if rd.only_if_cached => return ResponseFuture::ready(state.only_if_cached()),
                _ => return admitted.miss(target, inner.clone(), req, None, Wants::Entry),
            },
        };
        let found = Found::new(entry, engine_fresh, now);
        match admitted.judge(&rd, &found) {
            Use::Reload => admitted.answer_reload(target, inner.clone(), req, Some(found.entry)),
            Use::Flight => {
                admitted.miss(target, inner.clone(), req, Some(found.entry), Wants::Entry)
            }
            Use::Serve(a) => admitted.serve(a, &req, scan, found, target, inner),
        }
    }
}
