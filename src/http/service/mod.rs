//! The Tower service: HTTP request in, HTTP response out. It never produces an
//! error of its own (`type Error = S::Error`); every cache problem fails open.
//!
//! ```text
//! request ─► classify (method, Range, request no-store …) ── bypass ─► origin
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
//! only-if-cached and nothing usable ─► 504
//! ```

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tower_service::Service;

use crate::engine::{Compute, ComputeFuture, Fill, Freshness, Resolved};
use crate::entry::CachedResponse;
use crate::error::{BoxError, Error};
use crate::http::body::CacheBody;
use crate::http::conditional;
use crate::http::future::ResponseFuture;
use crate::http::layer::{LayerState, ReloadMode};
use crate::http::policy::{
    self, Forward, RequestDirectives, RequestVerdict, ResponseVerdict, StoredRules, Usable,
};
use crate::http::purge::{key_authority, url_key, Invalidation};
use crate::http::request_body::RequestBody;
use crate::http::stream::{SharedBody, Stream, StreamReader, Writer};
use crate::http::vary::{stored_values, variant_key};
use crate::key::{CacheKey, KeyHasher};
use crate::metrics::Source;
use crate::store::memory::{Probe, Stored};

/// The RFC 9211 response header.
pub(crate) const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// Request headers dropped from the leader's origin request, so the stored
/// response is a complete one rather than a 304 or a fragment. The cache
/// adds its own validators when it revalidates.
const CONDITIONAL: [HeaderName; 5] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
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

/// Where a request's entry lives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    /// URL + Authorization presence + configured key headers.
    base: CacheKey,
    /// `base` refined by the request's values of the learned Vary headers.
    pub(crate) key: CacheKey,
    /// What a miss is reported as: `vary-miss` when other variants are known.
    miss: Forward,
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
        self.route(req.map(RequestBody::new))
            .strip_surrogate_key(strip)
            .hiding_cache_status(hide)
            .stripping(self.state.stripped_header())
    }
}

impl<S> CacheService<S> {
    /// `call` but for the final header touch.
    fn route<ReqB, ResB>(&mut self, req: Request<ReqB>) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ReqB: Default + Send + 'static,
        ResB: Body<Data = Bytes> + Send + 'static,
        ResB::Error: Into<BoxError>,
    {
        // The instance that was polled ready is the one we may call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let state = &self.state;

        let rd = match policy::classify_request(req.method(), req.headers()) {
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
                state.engine.counters.record(Source::Bypass);
                let status = state.status_fwd(fwd, None);
                return ResponseFuture::bypass(inner.call(req), status, invalidate);
            }
        };
        // A GET or HEAD with a body means something the key cannot see, and
        // a rebuilt request would drop the body but keep its framing: pass
        // it through untouched, body and all.
        if has_body(req.headers()) {
            state.engine.counters.record(Source::Bypass);
            let status = state.status_fwd(Forward::Request, Some("request-body"));
            return ResponseFuture::bypass(inner.call(req), status, None);
        }

        let head = req.method() == Method::HEAD;
        let (req, route_key) = state.route_key(req);
        let target = state.target_for(&req, route_key);
        // One span per request; fields are filled in as the outcome is known
        // (lease and fence by the leader's task, which carries this span).
        let span = tracing::debug_span!(
            "herdguard",
            key = %target.key.short(),
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

        let candidate = match state.engine.probe(&target.key) {
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
                            state.engine.counters.record(Source::Hit);
                            let view = View::of(&req, head);
                            return ResponseFuture::ready(state.respond(&v, &view, Served::Hit));
                        }
                        Some(v)
                    }
                    _ => None,
                };
                let spare = spare_call(&inner, &req);
                let fut = miss(
                    Arc::clone(state),
                    target,
                    head,
                    inner,
                    req,
                    stale,
                    spare,
                    false,
                );
                return boxed(Box::pin(fut));
            }
            Probe::Fresh(e) => Some((e, true)),
            Probe::Stale(e) => Some((e, false)),
            Probe::Pass => {
                if rd.only_if_cached {
                    return ResponseFuture::ready(state.only_if_cached());
                }
                state.engine.counters.record(Source::Bypass);
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
            let spare = spare_call(&inner, &req);
            let fut = miss(
                Arc::clone(state),
                target,
                head,
                inner,
                req,
                None,
                spare,
                false,
            );
            return boxed(Box::pin(fut));
        };
        let stored_age = entry.age();
        let age = entry.value.current_age(stored_age);
        let view = View::of(&req, head);
        match policy::usability(&rd, entry.value.rules, age, state.http.rules.grace) {
            // The engine's own clock may end freshness earlier (an L1 bound
            // in front of a shared store): then ask the flight.
            Usable::Fresh if engine_fresh => {
                state.engine.counters.record(Source::Hit);
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
                ResponseFuture::ready(state.respond(&entry, &view, Served::Hit))
            }
            usable @ (Usable::StaleWhileRevalidate | Usable::Grace) => {
                state.engine.counters.record(Source::Stale);
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
                state.engine.counters.record(Source::Stale);
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
                let spare = spare_call(&inner, &req);
                let fut = miss(
                    Arc::clone(state),
                    target,
                    head,
                    inner,
                    req,
                    Some(entry),
                    spare,
                    false,
                );
                boxed(Box::pin(fut))
            }
        }
    }
}

/// What a response is built for: HEAD or not, and the request's headers for
/// its own validators.
struct View<'a> {
    head: bool,
    headers: &'a HeaderMap,
}

impl<'a> View<'a> {
    fn of<B>(req: &'a Request<B>, head: bool) -> Self {
        Self {
            head,
            headers: req.headers(),
        }
    }
}

/// How a response from a stored or shared entry came about, for Cache-Status.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Served {
    Hit,
    /// Served stale; the detail says why.
    Stale(&'static str),
    /// Forwarded to the origin for this request (or collapsed into one that was).
    Forwarded {
        fwd: Forward,
        collapsed: bool,
    },
    /// The origin failed (status or error) and stale-if-error allowed this.
    StaleIfError {
        fwd_status: Option<u16>,
    },
}

/// Lead or follow the flight for `key`, then answer from its outcome.
/// `stale` is the stored response to revalidate, if there is one; `reload`:
/// the request refuses it, so only a refresh answers it.
///
/// A waiter gets the flight's answer only if the cache could have stored it
/// and served it to this very request (storable, its Vary values and
/// credentials match, its directives accept it); otherwise it is released
/// to call the origin itself under the fallback cap.
#[allow(
    clippy::too_many_arguments,
    reason = "the request's parts, moved in once; a struct would only rename them"
)]
async fn miss<S, ReqB, ResB>(
    state: Arc<LayerState>,
    mut target: Target,
    head: bool,
    inner: S,
    req: Request<ReqB>,
    stale: Option<Arc<Stored<CachedResponse>>>,
    mut spare: Option<(S, Request<ReqB>)>,
    reload: bool,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Default + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let request_headers = req.headers().clone();
    let view = View {
        head,
        headers: &request_headers,
    };
    let mut fwd = if reload {
        Forward::Request
    } else if stale.is_some() {
        Forward::Stale
    } else {
        target.miss
    };
    let stored = stale.as_ref().map(|e| e.value.clone());
    let (leader, mut passthrough_rx, mut error_slot) =
        OriginCall::initiated(inner, req, Arc::clone(&state), target, stored);
    let mut compute = Some(leader);
    let arrived = std::time::Instant::now();
    let grace = state.http.rules.grace;
    // The flight's outcome, or before it: this request's own handoff if it
    // leads, or the leader's stream if the cache could have served it here.
    let first = {
        let resolving = async {
            if reload {
                state.engine.resolve_refresh(target.key, &mut compute).await
            } else {
                state.engine.resolve(target.key, &mut compute).await
            }
        };
        let streaming = state.streams.wait(target.key, |s| {
            s.head.value.vary_matches(&request_headers)
                && acceptable(&request_headers, &s.head, grace)
        });
        tokio::select! {
            biased;
            Ok(handoff) = &mut passthrough_rx => First::Handoff(handoff),
            // A reload refuses what other requests are served; it waits for
            // its refresh's outcome.
            stream = streaming, if !reload => First::Stream(stream),
            resolved = resolving => First::Resolved(resolved),
        }
    };
    let mut resolved = match first {
        First::Resolved(r) => r,
        First::Handoff(handoff) => return Ok(state.handed_off(handoff, &view, fwd, Source::Miss)),
        First::Stream(stream) => {
            let Some(reader) = stream.body.reader(Some(arrived)) else {
                // The window has left the start: this request calls itself.
                let status = state.status_fwd(fwd, Some("stream-window-passed"));
                let call = compute.or_else(|| {
                    spare.map(|(inner, req)| {
                        OriginCall::new(inner, req, Arc::clone(&state), None, target, None)
                    })
                });
                return released(&state, call, status, |_| None).await;
            };
            state.engine.counters.record(Source::Coalesced);
            let status = state.status(format_args!(
                "fwd={}; fwd-status={}; collapsed; detail=streamed",
                fwd.as_str(),
                stream.status().as_u16()
            ));
            return Ok(state.respond_streamed(&stream, reader, &view, status));
        }
    };
    // An entry made for other Vary values (or other credentials) names the
    // variant this request needs: follow it once, as a flight of its own.
    if let Resolved::Value { entry, .. } = &resolved {
        if let Some(next) = state.variant_for(&target, entry, &request_headers) {
            target = next;
            fwd = Forward::VaryMiss;
            compute = match compute {
                Some(mut call) => {
                    call.target = next;
                    call.stale = None;
                    Some(call)
                }
                None => spare.take().map(|(inner, req)| {
                    let (call, rx, slot) =
                        OriginCall::initiated(inner, req, Arc::clone(&state), next, None);
                    passthrough_rx = rx;
                    error_slot = slot;
                    call
                }),
            };
            resolved = match compute {
                Some(_) if reload => state.engine.resolve_refresh(target.key, &mut compute).await,
                Some(_) => state.engine.resolve(target.key, &mut compute).await,
                None => Resolved::Pass(None),
            };
        }
    }
    let counters = &state.engine.counters;
    // stale-if-error: the stored response stands in for a failed origin.
    let fallback = |fwd_status: Option<u16>| {
        let entry = stale.as_ref()?;
        let age = entry.value.current_age(entry.age());
        if !policy::stale_if_error_allows(entry.value.rules, age) {
            return None;
        }
        counters.record(Source::Stale);
        Some(state.respond(entry, &view, Served::StaleIfError { fwd_status }))
    };
    // This request's own call, made when the flight's answer is not for it.
    let own_call = |compute: Option<OriginCall<S, ReqB, ResB, S::Error>>,
                    spare: Option<(S, Request<ReqB>)>| {
        compute.or_else(|| {
            spare.map(|(inner, req)| {
                OriginCall::new(inner, req, Arc::clone(&state), None, target, None)
            })
        })
    };
    match resolved {
        Resolved::Value { entry, source } => {
            // Never a variant made for other header values, from any path.
            if !entry.value.vary_matches(&request_headers) {
                let status = state.status_fwd(Forward::VaryMiss, None);
                return released(&state, own_call(compute, spare), status, fallback).await;
            }
            // A stored copy shared by the flight may still be refused by this
            // request's own directives (max-age, min-fresh): such a request
            // goes to the origin itself. The leader's own answer is for it,
            // and so is a refresh to a request that refused the stored one
            // (a refresh's answer is never the entry it refused).
            let grace = state.http.rules.grace;
            let refused = !reload
                && state.http.reload != ReloadMode::Ignore
                && source != Source::Miss
                && is_stored(&entry)
                && !acceptable(&request_headers, &entry, grace);
            if refused {
                let call = own_call(compute, spare);
                return direct(&state, call, state.status_fwd(Forward::Request, None)).await;
            }
            if entry.value.status.is_server_error() {
                if let Some(r) = fallback(Some(entry.value.status.as_u16())) {
                    return Ok(r);
                }
            }
            counters.record(source);
            let served = match source {
                Source::Hit => Served::Hit,
                Source::Stale => Served::Stale(stale_detail(policy::usability(
                    &policy::RequestDirectives::default(),
                    entry.value.rules,
                    entry.value.current_age(entry.age()),
                    grace,
                ))),
                Source::Coalesced => Served::Forwarded {
                    fwd,
                    collapsed: true,
                },
                _ => Served::Forwarded {
                    fwd,
                    collapsed: false,
                },
            };
            Ok(state.respond(&entry, &view, served))
        }
        Resolved::Pass(Some(value)) => {
            if value.status.is_server_error() {
                if let Some(r) = fallback(Some(value.status.as_u16())) {
                    return Ok(r);
                }
            }
            counters.record(Source::Miss);
            Ok(state.respond_uncached(value, &view, fwd))
        }
        Resolved::Pass(None) => {
            if let Ok(handoff) = passthrough_rx.try_recv() {
                return Ok(state.handed_off(handoff, &view, fwd, Source::Miss));
            }
            // The answer was not for everyone: each waiter asks for its own.
            let status = state.status_fwd(fwd, Some("uncacheable"));
            released(&state, own_call(compute, spare), status, fallback).await
        }
        Resolved::Failed(error) => {
            if let Some(r) = fallback(None) {
                return Ok(r);
            }
            // The inner service's own error goes back to the caller that made it.
            if let Some(e) = error_slot
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
            {
                counters.record_error();
                return Err(e);
            }
            counters.record_error();
            Ok(state.error_response(&error))
        }
        Resolved::WaitTimedOut(permit) => {
            let status = state.status_fwd(fwd, Some("wait-timeout"));
            direct_with(&state, own_call(compute, spare), status, Some(permit)).await
        }
        Resolved::Overloaded => {
            let status = state.status_fwd(fwd, Some("overloaded"));
            released(&state, own_call(compute, spare), status, fallback).await
        }
    }
}

/// What a request in [`miss`] learns first.
enum First<V, H> {
    Resolved(V),
    Handoff(H),
    Stream(Arc<Stream>),
}

/// A request that refuses the stored response (`no-cache`, `max-age` …):
/// by default it shares one refresh per key ([`ReloadMode::Coalesce`]); in
/// [`ReloadMode::Honor`] it calls the origin on its own while a fallback
/// permit is free, and shares a refresh beyond that.
async fn reload<S, ReqB, ResB>(
    state: Arc<LayerState>,
    target: Target,
    head: bool,
    inner: S,
    req: Request<ReqB>,
    stored: Option<Arc<Stored<CachedResponse>>>,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Default + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    if state.http.reload == ReloadMode::Honor {
        if let Some(permit) = state.engine.try_fallback_permit() {
            let stored = stored.map(|e| e.value.clone());
            return forward(state, target, head, inner, req, stored, permit).await;
        }
    }
    let spare = spare_call(&inner, &req);
    miss(state, target, head, inner, req, stored, spare, true).await
}

/// A request released from a flight calls the origin itself, under the
/// fallback cap (waiting at most `max_wait` for a permit); past the cap it
/// gets stale-if-error or a 503.
async fn released<S, ReqB, ResB>(
    state: &LayerState,
    call: Option<OriginCall<S, ReqB, ResB, S::Error>>,
    status: HeaderValue,
    fallback: impl FnOnce(Option<u16>) -> Option<Response<CacheBody<ResB>>>,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    let Some(permit) = state.engine.fallback_permit().await else {
        if let Some(r) = fallback(None) {
            return Ok(r);
        }
        state.engine.counters.record_error();
        return Ok(state.own_answer(StatusCode::SERVICE_UNAVAILABLE, &status, "overloaded"));
    };
    direct_with(state, call, status, Some(permit)).await
}

/// A request that asked for a fresh answer, in [`ReloadMode::Honor`]: call
/// the origin for it alone (holding a fallback permit), and store what comes
/// back for everyone else.
async fn forward<S, ReqB, ResB>(
    state: Arc<LayerState>,
    target: Target,
    head: bool,
    inner: S,
    req: Request<ReqB>,
    stored: Option<CachedResponse>,
    _permit: OwnedSemaphorePermit,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Default + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let request_headers = req.headers().clone();
    let view = View {
        head,
        headers: &request_headers,
    };
    let (call, mut passthrough_rx, error_slot) =
        OriginCall::initiated(inner, req, Arc::clone(&state), target, stored);
    let counters = &state.engine.counters;
    counters.origin_call();
    let served = Served::Forwarded {
        fwd: Forward::Request,
        collapsed: false,
    };
    match state.engine.run_compute(call.start()).await {
        Ok(Fill::Store {
            value,
            fresh_for,
            stale_for,
        }) => {
            let freshness = Freshness::new(fresh_for).with_stale(stale_for);
            let value_copy = value.clone();
            match state
                .engine
                .store_outside_flight(target.key, value, freshness)
            {
                Some(entry) => {
                    counters.record(Source::Miss);
                    Ok(state.respond(&entry, &view, served))
                }
                None => Ok(state.respond_uncached(value_copy, &view, Forward::Request)),
            }
        }
        Ok(Fill::Share(value) | Fill::Pass(Some(value)) | Fill::Private(value)) => {
            counters.record(Source::Bypass);
            Ok(state.respond_uncached(value, &view, Forward::Request))
        }
        Ok(Fill::Pass(None) | Fill::Unbuffered) => match passthrough_rx.try_recv() {
            Ok(handoff) => Ok(state.handed_off(handoff, &view, Forward::Request, Source::Bypass)),
            Err(_) => {
                counters.record_error();
                Ok(state.error_response(&Error::Aborted))
            }
        },
        Err(error) => {
            counters.record_error();
            if let Some(e) = error_slot
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
            {
                return Err(e);
            }
            Ok(state.error_response(&error))
        }
    }
}

/// A spare inner service and request for a request that may need a call of
/// its own after its flight: a stored entry for other Vary values or other
/// credentials names the variant to look up, or its directives (`max-age`,
/// `min-fresh`) refuse what the flight hands out. If the request leads, its
/// first call is spent on the flight.
fn spare_call<S: Clone, B: Default>(inner: &S, req: &Request<B>) -> Option<(S, Request<B>)> {
    Some((inner.clone(), refresh_request(req)))
}

/// `Cache-Status` detail of a stale answer: the origin's
/// stale-while-revalidate, or the operator's grace.
fn stale_detail(usable: Usable) -> &'static str {
    match usable {
        Usable::Grace => "grace",
        _ => "stale",
    }
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

/// Whether a request with these headers accepts `entry` served as it is now.
fn acceptable(
    request_headers: &HeaderMap,
    entry: &Stored<CachedResponse>,
    grace: Duration,
) -> bool {
    let RequestVerdict::Cacheable(rd) = policy::classify_request(&Method::GET, request_headers)
    else {
        return false;
    };
    let age = entry.value.current_age(entry.age());
    matches!(
        policy::usability(&rd, entry.value.rules, age, grace),
        Usable::StaleWhileRevalidate | Usable::Grace | Usable::StaleAccepted | Usable::Fresh
    )
}

/// Call the origin for this request alone, streaming, storing nothing:
/// under a fallback permit (held until the response head arrives), and
/// bounded by the origin timeout.
async fn direct<S, ReqB, ResB>(
    state: &LayerState,
    call: Option<OriginCall<S, ReqB, ResB, S::Error>>,
    status: HeaderValue,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    direct_with(state, call, status, None).await
}

/// [`direct`] with a fallback permit already taken (`None`: take one).
async fn direct_with<S, ReqB, ResB>(
    state: &LayerState,
    call: Option<OriginCall<S, ReqB, ResB, S::Error>>,
    status: HeaderValue,
    permit: Option<OwnedSemaphorePermit>,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    let Some(OriginCall { mut inner, req, .. }) = call else {
        // Only the leader has no call left, and a leader always has an outcome.
        state.engine.counters.record_error();
        return Ok(state.error_response(&Error::Aborted));
    };
    let counters = &state.engine.counters;
    let permit = match permit {
        Some(p) => Some(p),
        None => state.engine.fallback_permit().await,
    };
    let Some(_permit) = permit else {
        // The cap stayed full for a whole max_wait: shed this request
        // rather than add to an origin that is already this far behind.
        counters.record_error();
        return Ok(state.own_answer(StatusCode::SERVICE_UNAVAILABLE, &status, "overloaded"));
    };
    counters.record(Source::Bypass);
    counters.origin_call();
    let call = async {
        poll_fn(|cx| inner.poll_ready(cx)).await?;
        inner.call(req).await
    };
    let Ok(response) = tokio::time::timeout(state.engine.config.origin_timeout, call).await else {
        counters.record_error();
        return Ok(state.own_answer(StatusCode::GATEWAY_TIMEOUT, &status, "origin-timeout"));
    };
    let (mut parts, body) = response?.into_parts();
    parts.headers.insert(CACHE_STATUS, status);
    Ok(Response::from_parts(parts, CacheBody::inner(body)))
}

/// A GET for a background refresh, rebuilt from the request that found the
/// entry stale (its body, if any, is not needed for GET or HEAD).
fn refresh_request<B: Default>(req: &Request<B>) -> Request<B> {
    let mut r = Request::new(B::default());
    *r.method_mut() = Method::GET;
    *r.uri_mut() = req.uri().clone();
    *r.version_mut() = req.version();
    *r.headers_mut() = req.headers().clone();
    strip_framing(r.headers_mut());
    *r.extensions_mut() = req.extensions().clone();
    r
}

/// A request the cache builds carries no body, so no body framing either.
fn strip_framing(headers: &mut HeaderMap) {
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::TRANSFER_ENCODING);
}

/// What only the request that started a flight receives.
struct Initiator<ResB, E> {
    /// A response too large to buffer, streamed to this request alone, or
    /// this request's reader of a streamed fill.
    passthrough: oneshot::Sender<Handoff<ResB>>,
    /// The inner service's error, handed back as-is.
    error: Arc<Mutex<Option<E>>>,
}

/// One origin request, run as a flight's computation or directly.
struct OriginCall<S, ReqB, ResB, E> {
    inner: S,
    req: Request<ReqB>,
    state: Arc<LayerState>,
    initiator: Option<Initiator<ResB, E>>,
    target: Target,
    /// The stored response to revalidate: its validators go out with the
    /// request, and a 304 freshens it.
    stale: Option<CachedResponse>,
}

impl<S, ReqB, ResB, E> OriginCall<S, ReqB, ResB, E> {
    fn new(
        inner: S,
        req: Request<ReqB>,
        state: Arc<LayerState>,
        initiator: Option<Initiator<ResB, E>>,
        target: Target,
        stale: Option<CachedResponse>,
    ) -> Self {
        Self {
            inner,
            req,
            state,
            initiator,
            target,
            stale,
        }
    }

    /// A call made for the request that is waiting on it: a response too
    /// large to store comes back through the receiver, and the inner
    /// service's own error through the slot.
    fn initiated(
        inner: S,
        req: Request<ReqB>,
        state: Arc<LayerState>,
        target: Target,
        stale: Option<CachedResponse>,
    ) -> (Self, Passthrough<ResB>, Arc<Mutex<Option<E>>>) {
        let (passthrough, passthrough_rx) = oneshot::channel();
        let error = Arc::new(Mutex::new(None));
        let initiator = Initiator {
            passthrough,
            error: Arc::clone(&error),
        };
        let call = Self::new(inner, req, state, Some(initiator), target, stale);
        (call, passthrough_rx, error)
    }
}

/// Where the initiating request receives a response streamed past the cache.
type Passthrough<ResB> = oneshot::Receiver<Handoff<ResB>>;

/// What the initiating request is handed before the flight's outcome.
enum Handoff<ResB> {
    /// Too large to store and not shared: streamed to it alone.
    TooLarge(Response<CacheBody<ResB>>),
    /// Its own reader of a fill streamed to every waiter, and the
    /// `Cache-Status` detail (`too-large` when it will not be stored).
    Streaming(Arc<Stream>, StreamReader, &'static str),
}

/// The frames a fill had read when it began to stream.
struct StreamStart {
    chunks: VecDeque<Bytes>,
    total: usize,
    /// Fill budget already held for `chunks` (or for the window).
    budget: Option<OwnedSemaphorePermit>,
    /// The body may still be stored: keep every chunk.
    storing: bool,
}

/// The head of a response that could be stored, with an empty body, as
/// waiters check it before they read the stream.
fn stream_head(
    verdict: &ResponseVerdict,
    parts: &http::response::Parts,
    vary: &[(HeaderName, Vec<HeaderValue>)],
    url: CacheKey,
) -> Option<Arc<Stored<CachedResponse>>> {
    let ResponseVerdict::Store {
        fresh_for,
        stale_for,
        initial_age,
        rules,
    } = verdict
    else {
        return None;
    };
    let value = CachedResponse {
        status: parts.status,
        headers: parts.headers.clone(),
        body: Bytes::new(),
        vary: vary.to_vec(),
        initial_age: initial_age.as_secs().min(u64::from(u32::MAX)) as u32,
        url,
        rules: *rules,
        revalidated: false,
    };
    let meta = crate::entry::EntryMeta::now(*fresh_for, *stale_for, 0);
    let usable = fresh_for.saturating_add(*stale_for);
    Some(Arc::new(Stored::new(
        value,
        meta,
        *fresh_for,
        usable,
        Duration::ZERO,
    )))
}

/// Read the rest of the origin body into a shared buffer, offered to the
/// flight's waiters and handed to the initiating request. Returns the
/// whole body if it may still be stored, `None` if not (too large, over
/// the fill budget, or every reader left a body nobody will store).
async fn stream_rest<ResB>(
    state: &Arc<LayerState>,
    key: CacheKey,
    head: Arc<Stored<CachedResponse>>,
    leader: Option<oneshot::Sender<Handoff<ResB>>>,
    start: StreamStart,
    body: &mut std::pin::Pin<Box<ResB>>,
) -> Result<Option<Bytes>, BoxError>
where
    ResB: Body<Data = Bytes>,
    ResB::Error: Into<BoxError>,
{
    let StreamStart {
        mut chunks,
        mut total,
        mut budget,
        mut storing,
    } = start;
    let limit = state.http.max_body_bytes;
    let shared = SharedBody::new();
    if !storing {
        shared.to_window(budget.as_ref().map_or(0, |b| b.num_permits()));
    }
    for c in &chunks {
        shared.push(c.clone());
    }
    let stream = Arc::new(Stream {
        head,
        body: Arc::clone(&shared),
    });
    // The initiator's reader first: it starts at byte 0 whatever happens.
    if let Some(tx) = leader {
        if let Some(reader) = shared.reader(None) {
            let detail = if storing { "streamed" } else { "too-large" };
            let _ = tx.send(Handoff::Streaming(Arc::clone(&stream), reader, detail));
        }
    }
    let writer = Writer {
        body: Arc::clone(&shared),
        _offer: Some(state.streams.register(key, stream)),
    };
    loop {
        // Not `while let`, and the error boxed at once: the inner error
        // type need not be `Send`, and must not live across an `.await`.
        let next = poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
        let Some(frame) = next.map(|f| f.map_err(Into::<BoxError>::into)) else {
            break;
        };
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                shared.fail("origin body failed");
                return Err(e);
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        total += data.len();
        if storing {
            let share = u32::try_from(data.len()).ok().and_then(|n| {
                Arc::clone(&state.engine.fill_bytes)
                    .try_acquire_many_owned(n)
                    .ok()
            });
            match share {
                Some(share) if total <= limit => {
                    match &mut budget {
                        Some(held) => held.merge(share),
                        None => budget = Some(share),
                    }
                    chunks.push_back(data.clone());
                }
                // Not storable after all: keep what the budget already
                // pays for as the window, and stop keeping the rest.
                _ => {
                    if total > limit {
                        state.engine.counters.not_stored("too-large");
                    }
                    storing = false;
                    chunks.clear();
                    shared.to_window(budget.as_ref().map_or(0, |b| b.num_permits()));
                }
            }
        }
        // Past the limit the fastest reader paces the origin; slower ones
        // fall out of the window and are cut off.
        poll_fn(|cx| shared.poll_room(cx)).await;
        shared.push(data);
        if !storing && shared.abandoned() {
            // Nobody reads and nobody can join: drop the origin call.
            return Ok(None);
        }
    }
    shared.finish();
    drop(writer);
    Ok(storing.then(|| join(chunks, total)))
}

/// The origin answered with an error of the inner service's own type.
#[derive(Debug)]
struct OriginFailed;

impl std::fmt::Display for OriginFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the inner service returned an error")
    }
}

impl std::error::Error for OriginFailed {}

impl<S, ReqB, ResB> Compute<CachedResponse> for OriginCall<S, ReqB, ResB, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Default + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    fn start(self) -> ComputeFuture<CachedResponse> {
        Box::pin(self.run())
    }
}

impl<S, ReqB, ResB> OriginCall<S, ReqB, ResB, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Default + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    async fn run(self) -> Result<Fill<CachedResponse>, BoxError> {
        let OriginCall {
            mut inner,
            req,
            state,
            initiator,
            target,
            mut stale,
        } = self;
        let (passthrough, error_slot) = match initiator {
            Some(i) => (Some(i.passthrough), Some(i.error)),
            None => (None, None),
        };
        let url = url_of(&req);
        let (mut template, _body) = req.into_parts();
        // HEAD is filled with a GET so the stored entry can answer both; the
        // body of a GET or HEAD carries no meaning.
        template.method = Method::GET;
        for name in &CONDITIONAL {
            template.headers.remove(name);
        }
        strip_framing(&mut template.headers);
        crate::http::vary::normalise_fill_request(&mut template.headers);
        let had_authorization = template.headers.contains_key(header::AUTHORIZATION);
        let request_headers = template.headers.clone();

        // At most two origin requests: a conditional one, and a plain one if
        // the 304 turns out to describe some other representation.
        let (parts, body, request_time, response_time) = loop {
            let mut req = Request::from_parts(template.clone(), ReqB::default());
            if let Some(s) = &stale {
                conditional::add_validators(req.headers_mut(), s);
            }
            let request_time = SystemTime::now();
            let result = match poll_fn(|cx| inner.poll_ready(cx)).await {
                Ok(()) => inner.call(req).await,
                Err(e) => Err(e),
            };
            let response = match result {
                Ok(r) => r,
                Err(e) => {
                    if let Some(slot) = error_slot {
                        *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
                    }
                    return Err(Box::new(OriginFailed));
                }
            };
            let response_time = SystemTime::now();
            let (parts, body) = response.into_parts();
            if parts.status == StatusCode::NOT_MODIFIED {
                if let Some(s) = stale.take() {
                    let excluded = |n: &HeaderName| NOT_STORED.contains(n) || n == header::AGE;
                    match conditional::freshen(&s, &parts.headers, excluded) {
                        Some(mut merged) => {
                            // The stored origin Age describes the old exchange.
                            merged.headers.remove(header::AGE);
                            // The 304's own Age and Date drive the new age.
                            let mut for_age = merged.headers.clone();
                            for_age.remove(header::AGE);
                            if let Some(age) = parts.headers.get(header::AGE) {
                                for_age.insert(header::AGE, age.clone());
                            }
                            let mut verdict = policy::classify_response(
                                &state.http.rules,
                                had_authorization,
                                merged.status,
                                &for_age,
                                request_time,
                                response_time,
                            );
                            if state.http.predicate.is_some() {
                                let mut res = Response::new(()).into_parts().0;
                                res.status = merged.status;
                                res.headers = merged.headers.clone();
                                verdict = state.route_verdict(&template, &res, verdict);
                            }
                            merged.revalidated = true;
                            return Ok(state.finish(target, merged, verdict, &request_headers));
                        }
                        None => continue,
                    }
                }
            }
            break (parts, body, request_time, response_time);
        };
        let (mut parts, body) = (parts, body);
        let verdict = policy::classify_response(
            &state.http.rules,
            had_authorization,
            parts.status,
            &parts.headers,
            request_time,
            response_time,
        );
        let verdict = state.route_verdict(&template, &parts, verdict);

        let mut names = policy::vary_names(&parts.headers).unwrap_or_default();
        // Credentials vary the answer unless the origin says it is the same
        // for everyone (`public`, `s-maxage`): key it by their digest then.
        if had_authorization
            && !policy::shared_across_credentials(&state.http.rules, &parts.headers)
            && !names.contains(&header::AUTHORIZATION)
        {
            names.push(header::AUTHORIZATION);
        }
        let vary: Vec<(HeaderName, Vec<HeaderValue>)> = names
            .into_iter()
            .map(|n| {
                let values = stored_values(&n, &request_headers);
                (n, values)
            })
            .collect();
        strip_not_stored(&mut parts.headers);
        // Only a response the cache could store is streamed to waiters.
        let mut head = stream_head(&verdict, &parts, &vary, url);
        let mut passthrough = passthrough;

        let limit = state.http.max_body_bytes;
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let mut body = Box::pin(body);
        if declared.is_some_and(|len| len > limit as u64) {
            state.engine.counters.not_stored("too-large");
            // Too large to store, but shareable: stream it through a window
            // of `max_body_bytes`, paid for from the fill budget.
            let window = u32::try_from(limit).ok().and_then(|n| {
                Arc::clone(&state.engine.fill_bytes)
                    .try_acquire_many_owned(n)
                    .ok()
            });
            if let (Some(head), Some(window)) = (head, window) {
                let start = StreamStart {
                    chunks: VecDeque::new(),
                    total: 0,
                    budget: Some(window),
                    storing: false,
                };
                let leader = passthrough;
                stream_rest(&state, target.key, head, leader, start, &mut body).await?;
                return Ok(Fill::Pass(None));
            }
            if let Some(tx) = passthrough {
                let response =
                    Response::from_parts(parts, CacheBody::prefixed(VecDeque::new(), body));
                let _ = tx.send(Handoff::TooLarge(response));
            }
            return Ok(Fill::Pass(None));
        }

        let mut chunks: VecDeque<Bytes> = VecDeque::new();
        let mut total = 0usize;
        // This fill's share of the layer-wide fill buffer budget, given
        // back once the body is joined (the store accounts for it then).
        let mut buffered: Option<OwnedSemaphorePermit> = None;
        let mut streamed: Option<Bytes> = None;
        loop {
            // Not `while let`: its temporary (the inner error type, maybe
            // not `Send`) would live across the stream's `.await`.
            let Some(frame) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await else {
                break;
            };
            let frame = frame.map_err(Into::into)?;
            // Trailers are not stored; the data is.
            let Ok(data) = frame.into_data() else {
                continue;
            };
            total += data.len();
            let share = u32::try_from(data.len()).ok().and_then(|n| {
                Arc::clone(&state.engine.fill_bytes)
                    .try_acquire_many_owned(n)
                    .ok()
            });
            chunks.push_back(data);
            let Some(share) = share else {
                // Over budget: stream on to this request alone, store nothing,
                // and mark nothing (the next request may buffer again).
                if let Some(tx) = passthrough {
                    let response = Response::from_parts(parts, CacheBody::prefixed(chunks, body));
                    let _ = tx.send(Handoff::TooLarge(response));
                }
                return Ok(Fill::Unbuffered);
            };
            match &mut buffered {
                Some(held) => held.merge(share),
                None => buffered = Some(share),
            }
            if total > limit {
                state.engine.counters.not_stored("too-large");
                if let Some(tx) = passthrough {
                    let response = Response::from_parts(parts, CacheBody::prefixed(chunks, body));
                    let _ = tx.send(Handoff::TooLarge(response));
                }
                return Ok(Fill::Pass(None));
            }
            // More than one frame: every reader gets the rest as it arrives
            // (a body in one frame is answered whole, as before).
            if !body.is_end_stream() {
                if let Some(head) = head.take() {
                    let start = StreamStart {
                        chunks: std::mem::take(&mut chunks),
                        total,
                        budget: buffered.take(),
                        storing: true,
                    };
                    let leader = passthrough.take();
                    match stream_rest(&state, target.key, head, leader, start, &mut body).await? {
                        Some(whole) => {
                            streamed = Some(whole);
                            break;
                        }
                        None => return Ok(Fill::Pass(None)),
                    }
                }
            }
        }
        let body = streamed.unwrap_or_else(|| join(chunks, total));
        drop(buffered);

        let value = CachedResponse {
            status: parts.status,
            headers: parts.headers,
            body,
            vary,
            initial_age: 0,
            url,
            rules: StoredRules::default(),
            revalidated: false,
        };
        // While revalidating, an origin error never replaces the stored
        // response: stale-if-error may still need it.
        if stale.is_some() && value.status.is_server_error() {
            return Ok(Fill::Share(value));
        }
        Ok(state.finish(target, value, verdict, &request_headers))
    }
}

impl LayerState {
    /// Turn a response and its verdict into a fill, keeping the Vary index
    /// and the retained store in step with it.
    fn finish(
        &self,
        target: Target,
        mut value: CachedResponse,
        verdict: ResponseVerdict,
        request_headers: &HeaderMap,
    ) -> Fill<CachedResponse> {
        match &verdict {
            ResponseVerdict::Share => self.engine.counters.not_stored("no-freshness"),
            ResponseVerdict::Pass(reason) => self.engine.counters.not_stored(reason),
            ResponseVerdict::Store { .. } => {}
        }
        match verdict {
            ResponseVerdict::Store {
                fresh_for,
                stale_for,
                initial_age,
                rules,
            } => {
                value.initial_age = initial_age.as_secs().min(u64::from(u32::MAX)) as u32;
                value.rules = rules;
                let names: Vec<HeaderName> = value.vary.iter().map(|(n, _)| n.clone()).collect();
                self.vary.learn(target.base, &names);
                // The next request with these values computes this key; file
                // the response there too when it differs from the flight's.
                let key = variant_key(&target.base, &names, request_headers);
                if key != target.key {
                    let freshness = Freshness::new(fresh_for).with_stale(stale_for);
                    self.engine
                        .store_outside_flight(key, value.clone(), freshness);
                }
                // Kept past its stale grace: to revalidate it (validators),
                // for stale-if-error, and for clients that accept max-stale.
                let keep = self
                    .http
                    .keep
                    .max(stale_for)
                    .max(Duration::from_secs(u64::from(rules.sie)));
                self.retained.insert(key, value.clone(), fresh_for, keep);
                // The base key always holds some variant in Redis, carrying
                // the Vary names: an instance that has not learned them yet
                // looks the base key up first and learns them there.
                if !names.is_empty() && target.base != target.key && target.base != key {
                    let freshness = Freshness::new(fresh_for).with_stale(stale_for);
                    self.engine
                        .store_remote_only(target.base, &value, freshness);
                }
                Fill::Store {
                    value,
                    fresh_for,
                    stale_for,
                }
            }
            // A server error goes to the requests waiting on it, stored for
            // none: a failing origin must not be asked once per waiter.
            ResponseVerdict::Share
                if self.http.share_uncacheable || value.status.is_server_error() =>
            {
                Fill::Share(value)
            }
            // No freshness information: uncacheable for everyone.
            ResponseVerdict::Share => {
                tracing::debug!(reason = "no-freshness", "response is not cacheable");
                self.retained.remove(&target.key);
                Fill::Pass(Some(value))
            }
            ResponseVerdict::Pass(reason) if self.http.share_uncacheable => {
                tracing::debug!(reason, "response is not cacheable; shared with waiters");
                if !policy::request_specific(reason) {
                    self.retained.remove(&target.key);
                }
                Fill::Share(value)
            }
            // Uncacheable because of this request alone: the stored entry
            // stays and nobody else is told to pass.
            ResponseVerdict::Pass(reason) if policy::request_specific(reason) => {
                tracing::debug!(reason, "response is for its own request only");
                Fill::Private(value)
            }
            ResponseVerdict::Pass(reason) => {
                tracing::debug!(reason, "response is not cacheable");
                self.retained.remove(&target.key);
                Fill::Pass(Some(value))
            }
        }
    }
}

impl LayerState {
    /// Learn the Vary names `entry` carries for its URL (it may come from
    /// another instance), and say which variant `request` needs when `entry`
    /// is not it and lives under another key.
    fn variant_for(
        &self,
        target: &Target,
        entry: &Stored<CachedResponse>,
        request: &HeaderMap,
    ) -> Option<Target> {
        let names: Vec<HeaderName> = entry.value.vary.iter().map(|(n, _)| n.clone()).collect();
        if is_stored(entry) {
            self.vary.learn(target.base, &names);
        }
        if names.is_empty() || entry.value.vary_matches(request) {
            return None;
        }
        let key = variant_key(&target.base, &names, request);
        (key != target.key).then_some(Target {
            base: target.base,
            key,
            miss: Forward::VaryMiss,
        })
    }
}

/// Whether `entry` was stored (it has a lifetime), rather than handed to
/// the requests waiting on one flight.
fn is_stored(entry: &Stored<CachedResponse>) -> bool {
    !entry.meta.fresh_for.is_zero() || !entry.meta.stale_for.is_zero()
}

fn join(mut chunks: VecDeque<Bytes>, total: usize) -> Bytes {
    if chunks.len() <= 1 {
        return chunks.pop_front().unwrap_or_default();
    }
    // One copy when filling, so every hit afterwards is a reference count.
    let mut out = BytesMut::with_capacity(total);
    for c in chunks {
        out.extend_from_slice(&c);
    }
    out.freeze()
}

fn strip_not_stored(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in NOT_STORED.iter().chain(named.iter()) {
        headers.remove(name);
    }
    headers.remove("keep-alive");
}

impl LayerState {
    /// Where the entry for `req` lives: the base key (URL, Authorization
    /// present or not, configured key headers) and the variant key for the
    /// Vary names learned for that base. One hash on a hit: the URL's own
    /// key (for purges) is only needed when a response is stored.
    /// A route's own key (`route_key`) takes the place of the URL parts;
    /// everything after them still applies.
    pub(crate) fn target_for<B>(&self, req: &Request<B>, route_key: Option<CacheKey>) -> Target {
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
        .part(&[u8::from(req.headers().contains_key(header::AUTHORIZATION))]);
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
            },
            None => Target {
                base,
                key: base,
                miss: Forward::UriMiss,
            },
        }
    }

    /// What a successful unsafe request to this URI invalidates.
    fn invalidation_for<B>(self: &Arc<Self>, req: &Request<B>) -> Invalidation {
        let uri = effective_uri(req);
        let authority = request_authority(req, uri).and_then(|a| std::str::from_utf8(a).ok());
        let path = uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        Invalidation::new(Arc::clone(self), authority, path)
    }

    fn status(&self, params: std::fmt::Arguments<'_>) -> HeaderValue {
        use std::fmt::Write;
        let mut s = String::with_capacity(64);
        let _ = write!(s, "{}; {}", self.http.cache_name, params);
        // One allocation: the String's buffer becomes the header's bytes.
        // The cache name is validated as a token when the layer is built.
        HeaderValue::from_maybe_shared(Bytes::from(s))
            .unwrap_or_else(|_| HeaderValue::from_static("herdguard"))
    }

    pub(crate) fn status_fwd(&self, fwd: Forward, detail: Option<&str>) -> HeaderValue {
        match detail {
            Some(d) => self.status(format_args!("fwd={}; detail={d}", fwd.as_str())),
            None => self.status(format_args!("fwd={}", fwd.as_str())),
        }
    }

    /// A response built from a stored (or shared) entry.
    fn respond<B>(
        &self,
        entry: &Stored<CachedResponse>,
        view: &View<'_>,
        served: Served,
    ) -> Response<CacheBody<B>> {
        let value = &entry.value;
        let age = value.current_age(entry.age()).as_secs();
        // The entry's own remaining freshness (RFC 9211), not how long this
        // instance keeps its L1 copy before asking Redis again.
        let ttl = i64::from(value.rules.lifetime) - age.min(i64::MAX as u64) as i64;
        let origin_status = if value.revalidated {
            304
        } else {
            value.status.as_u16()
        };
        let status = match served {
            Served::Hit => self.status(format_args!("hit; ttl={ttl}")),
            Served::Stale(detail) => self.status(format_args!("hit; ttl={ttl}; detail={detail}")),
            Served::Forwarded { fwd, collapsed } => {
                let fwd = fwd.as_str();
                let stored = !entry.meta.fresh_for.is_zero() || !entry.meta.stale_for.is_zero();
                if collapsed {
                    self.status(format_args!(
                        "fwd={fwd}; fwd-status={origin_status}; collapsed"
                    ))
                } else if stored {
                    self.status(format_args!(
                        "fwd={fwd}; fwd-status={origin_status}; stored; ttl={ttl}"
                    ))
                } else {
                    self.status(format_args!("fwd={fwd}; fwd-status={origin_status}"))
                }
            }
            Served::StaleIfError {
                fwd_status: Some(s),
            } => self.status(format_args!(
                "fwd=stale; fwd-status={s}; ttl={ttl}; detail=stale-if-error"
            )),
            Served::StaleIfError { fwd_status: None } => {
                self.status(format_args!("fwd=stale; ttl={ttl}; detail=stale-if-error"))
            }
        };
        // A response fetched for this request (or collapsed into its fetch)
        // keeps the origin's own Age; anything served from storage, including
        // after a 304, carries the age computed here (RFC 9111 §4.2.3, §5.1).
        let fetched = matches!(served, Served::Forwarded { .. }) && !value.revalidated;
        self.build(value, view, status, (!fetched).then_some(age))
    }

    /// The initiating request's answer from what its fill handed it.
    fn handed_off<B>(
        &self,
        handoff: Handoff<B>,
        view: &View<'_>,
        fwd: Forward,
        source: Source,
    ) -> Response<CacheBody<B>> {
        self.engine.counters.record(source);
        match handoff {
            Handoff::TooLarge(mut response) => {
                let status = self.status_fwd(fwd, Some("too-large"));
                response.headers_mut().insert(CACHE_STATUS, status);
                response
            }
            Handoff::Streaming(stream, reader, detail) => {
                let status = self.status(format_args!(
                    "fwd={}; fwd-status={}; detail={detail}",
                    fwd.as_str(),
                    stream.status().as_u16()
                ));
                self.respond_streamed(&stream, reader, view, status)
            }
        }
    }

    /// A response whose body is read from a streaming fill. The head is
    /// built as for a fetched response (the origin's `Age` kept); a 304 for
    /// the request's own validators and HEAD carry no body.
    fn respond_streamed<B>(
        &self,
        stream: &Stream,
        reader: StreamReader,
        view: &View<'_>,
        status: HeaderValue,
    ) -> Response<CacheBody<B>> {
        let mut response = self.build(&stream.head.value, view, status, None);
        if response.status() != StatusCode::NOT_MODIFIED && !view.head {
            *response.body_mut() = CacheBody::shared(reader);
        }
        response
    }

    /// A response the leader may use but nobody else.
    fn respond_uncached<B>(
        &self,
        value: CachedResponse,
        view: &View<'_>,
        fwd: Forward,
    ) -> Response<CacheBody<B>> {
        let status = self.status(format_args!(
            "fwd={}; fwd-status={}; detail=uncacheable",
            fwd.as_str(),
            value.status.as_u16()
        ));
        self.build(&value, view, status, None)
    }

    fn build<B>(
        &self,
        value: &CachedResponse,
        view: &View<'_>,
        status: HeaderValue,
        age: Option<u64>,
    ) -> Response<CacheBody<B>> {
        let mut response = if conditional::not_modified(view.headers, value) {
            let mut r = Response::new(CacheBody::empty());
            *r.status_mut() = StatusCode::NOT_MODIFIED;
            *r.headers_mut() = conditional::not_modified_headers(&value.headers);
            r
        } else {
            let body = if view.head {
                CacheBody::empty()
            } else {
                CacheBody::full(value.body.clone())
            };
            let mut r = Response::new(body);
            *r.status_mut() = value.status;
            *r.headers_mut() = value.headers.clone();
            r
        };
        let headers = response.headers_mut();
        if let Some(age) = age {
            headers.insert(header::AGE, HeaderValue::from(age));
        }
        headers.insert(CACHE_STATUS, status);
        response
    }

    /// An answer of the layer's own for a call outside any flight: the
    /// `Cache-Status` it would have had, with `detail` in place of its own.
    fn own_answer<B>(
        &self,
        code: StatusCode,
        status: &HeaderValue,
        detail: &str,
    ) -> Response<CacheBody<B>> {
        let text = status.to_str().unwrap_or("");
        let kept = text.split("; detail=").next().unwrap_or(text);
        let mut response = Response::new(CacheBody::empty());
        *response.status_mut() = code;
        if code == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        let value = HeaderValue::from_maybe_shared(Bytes::from(format!("{kept}; detail={detail}")))
            .unwrap_or_else(|_| HeaderValue::from_static("herdguard"));
        response.headers_mut().insert(CACHE_STATUS, value);
        response
    }

    /// RFC 9111 §5.2.1.7: nothing stored may answer an only-if-cached request.
    fn only_if_cached<B>(&self) -> Response<CacheBody<B>> {
        self.engine.counters.record(Source::Bypass);
        let mut response = Response::new(CacheBody::empty());
        *response.status_mut() = StatusCode::GATEWAY_TIMEOUT;
        let status = self.status(format_args!("detail=only-if-cached"));
        response.headers_mut().insert(CACHE_STATUS, status);
        response
    }

    /// The answer when a shared computation failed and nothing can be served.
    pub(crate) fn error_response<B>(&self, error: &Error) -> Response<CacheBody<B>> {
        let (code, detail) = match error {
            Error::OriginTimeout => (StatusCode::GATEWAY_TIMEOUT, "origin-timeout"),
            Error::Overloaded => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            Error::Panicked => (StatusCode::BAD_GATEWAY, "origin-panic"),
            Error::Aborted => (StatusCode::BAD_GATEWAY, "origin-aborted"),
            _ => (StatusCode::BAD_GATEWAY, "origin-error"),
        };
        let mut response = Response::new(CacheBody::empty());
        *response.status_mut() = code;
        let status = self.status(format_args!("fwd=uri-miss; collapsed; detail={detail}"));
        response.headers_mut().insert(CACHE_STATUS, status);
        response
    }
}

/// The authority a request names: the URI's, else the Host header.
fn request_authority<'a, B>(req: &'a Request<B>, uri: &'a http::Uri) -> Option<&'a [u8]> {
    uri.authority()
        .map(|a| a.as_str().as_bytes())
        .or_else(|| req.headers().get(header::HOST).map(HeaderValue::as_bytes))
}

/// The key of a request's URL alone (purge by URL matches on it).
fn url_of<B>(req: &Request<B>) -> CacheKey {
    let uri = effective_uri(req);
    url_key(
        request_authority(req, uri),
        uri.path().as_bytes(),
        uri.query().map(str::as_bytes),
    )
}

/// `""` and `"/"` name the same resource.
fn non_empty_path(path: &[u8]) -> &[u8] {
    if path.is_empty() {
        b"/"
    } else {
        path
    }
}

/// The URI as the client sent it: axum's nested routers strip their prefix,
/// and two nested routes must not share a key.
fn effective_uri<B>(req: &Request<B>) -> &http::Uri {
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
    fn key_authority_keeps_port_drops_userinfo() {
        assert_eq!(key_authority(b"example.com:8080"), b"example.com:8080");
        assert_eq!(key_authority(b"user:pw@example.com:1"), b"example.com:1");
        assert_eq!(key_authority(b"[::1]:3000"), b"[::1]:3000");
        assert_eq!(key_authority(b"plain"), b"plain");
    }
}
