//! Origin calls outside any flight: a reload in `ReloadMode::Honor`, a
//! request under a pass marker (hit-for-miss, or a pass past the fallback
//! cap), and a released request's own call, under a fallback permit (but
//! for such a pass) and the origin timeout. Nothing here is shared with
//! other requests.

use std::future::poll_fn;
use std::sync::Arc;

use http::header::HeaderValue;
use http::response::Parts;
use http::{Method, Request, Response, StatusCode};
use tokio::sync::OwnedSemaphorePermit;
use tower_service::Service;

use crate::engine::{Compute, Fill, Freshness, Priority, Work};
use crate::error::Error;
use crate::hot::Measure;
use crate::http::body::CacheBody;
use crate::http::policy::{self, Forward, NotStored};
use crate::http::response::CachedResponse;
use crate::http::state::LayerState;
use crate::metrics::Source;

use super::bounds::{Origin, OriginBody};
use super::origin::{strip_framing, OriginCall};
use super::respond::{Served, View};
use crate::http::cache_status::CACHE_STATUS;
use crate::http::keys::Target;

/// Why a request calls the origin for itself, outside any flight, and
/// stores what may be stored.
#[derive(Debug, Clone, Copy)]
pub(super) enum OwnFill {
    /// It asked for a fresh answer, in [`ReloadMode::Honor`](crate::ReloadMode::Honor).
    Reload,
    /// It found a pass marker (hit-for-miss, as Varnish calls it): the
    /// marker says the last answer was uncacheable, maybe only for the
    /// request that got it (a `private` page for its cookie), so this one
    /// asks again, forwarded as `fwd`. A storable answer replaces the
    /// marker; an unstored 2xx/3xx streams through unbuffered.
    UnderPassMarker(Forward),
}

impl OwnFill {
    /// How the call is forwarded, and whether it runs under a pass marker.
    fn forward(self) -> (Forward, bool) {
        match self {
            OwnFill::Reload => (Forward::Request, false),
            OwnFill::UnderPassMarker(fwd) => (fwd, true),
        }
    }
}

/// A request that asked for a fresh answer, in [`ReloadMode::Honor`]: call
/// the origin for it alone (holding a fallback permit), and store what comes
/// back for everyone else.
pub(super) async fn honor_reload<S, ReqB, ResB>(
    state: Arc<LayerState>,
    target: Target,
    head: bool,
    inner: S,
    req: Request<ReqB>,
    stored: Option<CachedResponse>,
    permit: OwnedSemaphorePermit,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Origin<ReqB, ResB>,
    ReqB: Default + Send + 'static,
    ResB: OriginBody,
{
    let call = (inner, req, stored);
    fill_alone(state, target, head, call, permit, OwnFill::Reload).await
}

/// A request under a pass marker ([`OwnFill::UnderPassMarker`]): its own
/// origin call under `permit`, never coalesced. The caller takes the
/// permit only if one is free; with none, the request passes on uncached.
pub(super) async fn hit_for_miss<S, ReqB, ResB>(
    state: Arc<LayerState>,
    target: Target,
    head: bool,
    inner: S,
    req: Request<ReqB>,
    fwd: Forward,
    permit: OwnedSemaphorePermit,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Origin<ReqB, ResB>,
    ReqB: Default + Send + 'static,
    ResB: OriginBody,
{
    let call = (inner, req, None);
    let why = OwnFill::UnderPassMarker(fwd);
    fill_alone(state, target, head, call, permit, why).await
}

/// One origin call for this request alone, under `_permit` and the origin
/// timeout; a storable answer is stored (memory, and Redis in the
/// background), fenced and purge-checked like any outside-flight write.
async fn fill_alone<S, ReqB, ResB>(
    state: Arc<LayerState>,
    target: Target,
    head: bool,
    (inner, req, stored): (S, Request<ReqB>, Option<CachedResponse>),
    _permit: OwnedSemaphorePermit,
    why: OwnFill,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Origin<ReqB, ResB>,
    ReqB: Default + Send + 'static,
    ResB: OriginBody,
{
    let request_headers = req.headers().clone();
    // Not on the hit path: the stored validators are looked up (a hit
    // skips that).
    let view = View {
        head,
        headers: &request_headers,
        validators: true,
    };
    let (call, mut returns) = OriginCall::initiated(inner, req, Arc::clone(&state), target, stored);
    let (fwd, under_marker) = why.forward();
    let call = call.passing_unstored(under_marker);
    let counters = state.counters();
    let started = state.engine.outside_start();
    let work = Work::waited(call.start());
    match state.engine.run_compute(target.key, work).await {
        Ok(Fill::Store {
            value,
            fresh_for,
            stale_for,
            copies,
        }) => {
            let freshness = Freshness::new(fresh_for).with_stale(stale_for);
            let value_copy = value.clone();
            let stored = state
                .engine
                .store_outside_flight(target.key, value, freshness, copies, started);
            let Some(entry) = stored else {
                return Ok(state.respond_uncached(value_copy, &view, fwd));
            };
            counters.record(Source::Miss);
            let served = Served::Forwarded {
                fwd,
                collapsed: false,
            };
            let response = state.respond(&entry, &view, served);
            Ok(if under_marker {
                with_detail(response, "hit-for-miss")
            } else {
                response
            })
        }
        Ok(Fill::Share(mut value) | Fill::Pass(Some(mut value)) | Fill::Private(mut value)) => {
            counters.record(Source::Bypass);
            state.hot_outcome(Source::Bypass, &target.key);
            if under_marker {
                value.not_stored = Some(NotStored::HitForPass);
            }
            Ok(state.respond_uncached(value, &view, fwd))
        }
        Ok(Fill::Pass(None) | Fill::Unbuffered) => match returns.try_handoff() {
            Some(handoff) => {
                state.hot_outcome(Source::Bypass, &target.key);
                Ok(state.handed_off(handoff, &view, fwd, Source::Bypass))
            }
            None => {
                counters.record_error();
                Ok(state.error_response(&Error::Aborted))
            }
        },
        Err(error) => {
            counters.record_error();
            if let Some(e) = returns.take_error() {
                return Err(e);
            }
            Ok(state.error_response(&error))
        }
    }
}

/// `response` with `; detail=…` added to its `Cache-Status`.
fn with_detail<B>(mut response: Response<B>, detail: &str) -> Response<B> {
    let Some(status) = response.headers().get(CACHE_STATUS) else {
        return response;
    };
    let mut bytes = Vec::with_capacity(status.len() + detail.len() + 9);
    bytes.extend_from_slice(status.as_bytes());
    bytes.extend_from_slice(b"; detail=");
    bytes.extend_from_slice(detail.as_bytes());
    if let Ok(value) = HeaderValue::from_bytes(&bytes) {
        response.headers_mut().insert(CACHE_STATUS, value);
    }
    response
}

/// A spare inner service and request for a request that may need a call of
/// its own after its flight: a stored entry for other Vary values or other
/// credentials names the variant to look up, or its directives (`max-age`,
/// `min-fresh`) refuse what the flight hands out. If the request leads, its
/// first call is spent on the flight.
pub(super) fn spare_call<S: Clone, B: Default>(
    inner: &S,
    req: &Request<B>,
) -> Option<(S, Request<B>)> {
    Some((inner.clone(), refresh_request(req)))
}

/// Call the origin for this request alone, streaming, storing nothing:
/// under a fallback permit (held until the response head arrives), and
/// bounded by the origin timeout.
pub(super) async fn direct<S, ReqB, ResB>(
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
pub(super) async fn direct_with<S, ReqB, ResB>(
    state: &LayerState,
    call: Option<OriginCall<S, ReqB, ResB, S::Error>>,
    status: HeaderValue,
    permit: Option<OwnedSemaphorePermit>,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    let key = call.as_ref().map(|c| c.target.key);
    let Some((inner, req)) = call.map(OriginCall::into_parts) else {
        // Only the leader has no call left, and a leader always has an outcome.
        state.counters().record_error();
        return Ok(state.error_response(&Error::Aborted));
    };
    let counters = state.counters();
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
    if let Some(key) = key {
        state.hot_outcome(Source::Bypass, &key);
        state.engine.hot_known(Measure::OriginCalls, &key, 1);
    }
    call_alone(state, inner, req, status).await
}

/// A request under a pass marker with no fallback permit free: its own
/// call, outside the cap, as a pass in `route()` makes it (one call per
/// request, queued only on the origin's own readiness), bounded by the
/// origin timeout. The caller
/// counts the bypass.
pub(super) async fn pass_uncapped<S, ReqB, ResB>(
    state: &LayerState,
    call: Option<OriginCall<S, ReqB, ResB, S::Error>>,
    status: HeaderValue,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    let key = call.as_ref().map(|c| c.target.key);
    let Some((inner, req)) = call.map(OriginCall::into_parts) else {
        // Only the leader has no call left, and it keeps a spare.
        state.counters().record_error();
        return Ok(state.error_response(&Error::Aborted));
    };
    if let Some(key) = key {
        state.engine.hot_known(Measure::OriginCalls, &key, 1);
    }
    call_alone(state, inner, req, status).await
}

/// One origin call for one request, streamed, bounded by the origin timeout.
async fn call_alone<S, ReqB, ResB>(
    state: &LayerState,
    mut inner: S,
    req: Request<ReqB>,
    status: HeaderValue,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    let counters = state.counters();
    let engine = &state.engine;
    let pass = match engine.gate.admit(Priority::Waited, None, counters).await {
        Ok(pass) => pass,
        Err(refusal) => {
            counters.record_error();
            let error = engine.refused(refusal, Priority::Waited);
            return Ok(state.refusal_answer(&error, &status));
        }
    };
    counters.origin_call();
    let authorized = req.headers().contains_key(http::header::AUTHORIZATION);
    let call = async {
        poll_fn(|cx| inner.poll_ready(cx)).await?;
        inner.call(req).await
    };
    let Ok(response) = tokio::time::timeout(engine.config.origin_timeout, call).await else {
        pass.finish(Some(false));
        counters.record_error();
        return Ok(state.own_answer(StatusCode::GATEWAY_TIMEOUT, &status, "origin-timeout"));
    };
    let healthy = match &response {
        Ok(r) => !engine.gate.breaker().status_fails(r.status().as_u16()),
        Err(_) => false,
    };
    pass.finish(Some(healthy));
    let (mut parts, body) = response?.into_parts();
    let status = precise_detail(state, status, &parts, authorized);
    parts.headers.insert(CACHE_STATUS, status);
    Ok(Response::from_parts(parts, CacheBody::inner(body)))
}

/// A request released because its flight's answer was uncacheable says why
/// its own answer is not stored either, where that is the missing freshness
/// (what a TTL would fix): `detail=no-freshness` for `detail=uncacheable`.
fn precise_detail(
    state: &LayerState,
    status: HeaderValue,
    parts: &Parts,
    authorized: bool,
) -> HeaderValue {
    const GENERIC: &[u8] = b"; detail=uncacheable";
    let bytes = status.as_bytes();
    if !bytes.ends_with(GENERIC) {
        return status;
    }
    let rules = &state.http.rules;
    let now = std::time::SystemTime::now();
    let verdict =
        policy::classify_response(rules, authorized, parts.status, &parts.headers, now, now);
    if !matches!(verdict, policy::ResponseVerdict::Share)
        || !policy::lacks_freshness(rules, parts.status, &parts.headers)
    {
        return status;
    }
    let kept = &bytes[..bytes.len() - GENERIC.len()];
    let mut precise = Vec::with_capacity(kept.len() + 24);
    precise.extend_from_slice(kept);
    precise.extend_from_slice(b"; detail=no-freshness");
    HeaderValue::from_bytes(&precise).unwrap_or(status)
}

/// A GET for a background refresh, rebuilt from the request that found the
/// entry stale (its body, if any, is not needed for GET or HEAD).
pub(super) fn refresh_request<B: Default>(req: &Request<B>) -> Request<B> {
    let mut r = Request::new(B::default());
    *r.method_mut() = Method::GET;
    *r.uri_mut() = req.uri().clone();
    *r.version_mut() = req.version();
    *r.headers_mut() = req.headers().clone();
    strip_framing(r.headers_mut());
    *r.extensions_mut() = req.extensions().clone();
    r
}

/// A request released from a flight calls the origin itself, under the
/// fallback cap (waiting at most `max_wait` for a permit); past the cap it
/// gets stale-if-error or a 503.
pub(super) async fn released<S, ReqB, ResB>(
    state: &LayerState,
    call: Option<OriginCall<S, ReqB, ResB, S::Error>>,
    status: HeaderValue,
    fallback: impl Fn(Option<u16>) -> Option<Response<CacheBody<ResB>>>,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    // The origin is down: a copy stale-if-error allows answers at once.
    if state.engine.origin_down_for().is_some() {
        if let Some(r) = fallback(None) {
            return Ok(r);
        }
    }
    let Some(permit) = state.engine.fallback_permit().await else {
        if let Some(r) = fallback(None) {
            return Ok(r);
        }
        state.counters().record_error();
        return Ok(state.own_answer(StatusCode::SERVICE_UNAVAILABLE, &status, "overloaded"));
    };
    direct_with(state, call, status, Some(permit)).await
}
