//! A request with no usable entry: lead or follow the key's flight, take
//! the leader's answer only if it is for this request, or be released to
//! call the origin itself under the fallback cap.

use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use tower_service::Service;

use crate::engine::Resolved;
use crate::http::body::CacheBody;
use crate::http::policy::{self, Forward, RequestVerdict, Usable};
use crate::http::response::CachedResponse;
use crate::http::state::{LayerState, ReloadMode};
use crate::http::stream::Stream;
use crate::metrics::Source;
use crate::store::memory::{Probe, Stored};

use super::bounds::{Origin, OriginBody};
use super::direct::{
    direct, direct_with, hit_for_miss, honor_reload, pass_uncapped, refresh_request, spare_call,
};
use super::fill::{is_error, is_stored};
use super::hit_for_miss_permit;
use super::origin::{take_error, take_spare, OriginCall};
use super::respond::{stale_detail, Served, View};
use super::target::Target;

/// What a request in [`miss`] takes from its flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wants {
    /// A usable stored entry, or the flight's answer.
    Entry,
    /// Only a refresh: it refuses the stored response (`no-cache`, `max-age` …).
    Refresh,
    /// It met a pass marker in memory, with Redis reachable: the flight
    /// looks in Redis, where another instance's hit-for-miss may have
    /// stored the entry since. While Redis still holds the marker, it is a
    /// request under a marker as in `route()`: never coalesced on an
    /// origin call, never queued for a permit.
    PastMarker,
}

/// Lead or follow the flight for `key`, then answer from its outcome.
/// `stale` is the stored response to revalidate, if there is one; `wants`:
/// what of the flight's outcome may answer it.
///
/// A waiter gets the flight's answer only if the cache could have stored it
/// and served it to this very request (storable, its Vary values and
/// credentials match, its directives accept it); otherwise it is released
/// to call the origin itself under the fallback cap: for that, it keeps a
/// spare copy of its service and request (see [`spare_call`]).
pub(super) async fn miss<S, ReqB, ResB>(
    state: Arc<LayerState>,
    mut target: Target,
    head: bool,
    inner: S,
    req: Request<ReqB>,
    stale: Option<Arc<Stored<CachedResponse>>>,
    wants: Wants,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Origin<ReqB, ResB> + Clone,
    ReqB: Default + Send + 'static,
    ResB: OriginBody,
{
    let reload = wants == Wants::Refresh;
    // A spare call for after the flight, made only if this request leads
    // (its call is spent then): taken from the call's slot after each
    // resolve. A follower keeps its own call unspent and copies nothing.
    let mut spare = None;
    let stored = stale.as_ref().map(|e| e.value.clone());
    let (leader, mut passthrough_rx, mut error_slot) =
        OriginCall::initiated(inner, req, Arc::clone(&state), target, stored);
    // Read here while the call is unspent, copied only if it is made.
    let (leader, request_headers) = leader.keeping_spare(spare_call).lending_headers();
    let request_headers = &*request_headers;
    // Not on the hit path: the validators are looked up as before.
    let view = View {
        head,
        headers: request_headers,
        validators: true,
    };
    let mut fwd = if reload {
        Forward::Request
    } else if stale.is_some() {
        Forward::Stale
    } else {
        target.miss
    };
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
        // A stream whose first byte is gone is not waited for: requests
        // too late for it share the flight's next call instead.
        let streaming = state.streams.wait(target.key, |s| {
            s.body.attachable()
                && s.head.value.vary_matches(request_headers)
                && acceptable(request_headers, &s.head, grace)
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
    spare = spare.or_else(|| take_spare(&error_slot));
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
            state.counters().record(Source::Coalesced);
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
        if let Some(next) = state.variant_for(&target, entry, request_headers) {
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
            spare = spare.or_else(|| take_spare(&error_slot));
        }
    }
    // A copy the flight handed out fresh by the engine's clock (Redis's
    // freshness, PTTL past the stale window, may have had a millisecond left) can have expired by the
    // time this request looks at it. If only that refuses it, the request
    // goes round the flight once more rather than to the origin alone; once
    // is enough: that lookup lands after the copy's end, which is no earlier
    // than Redis's, so it finds the entry stale and shares its refresh.
    let expired = match &resolved {
        Resolved::Value { entry, source } => {
            (refuses(&state, reload, request_headers, entry, *source)
                && expired_since_handed_out(request_headers, entry, *source, grace))
            .then(|| Arc::clone(entry))
        }
        _ => None,
    };
    if let Some(entry) = expired {
        if compute.is_none() {
            // This request led the flight (its call went unused): it needs a
            // call of its own for the next one, and keeps a spare.
            if let Some((inner, req)) = spare.take() {
                spare = spare_call(&inner, &req);
                let revalidate = Some(entry.value.clone());
                let (call, rx, slot) =
                    OriginCall::initiated(inner, req, Arc::clone(&state), target, revalidate);
                passthrough_rx = rx;
                error_slot = slot;
                compute = Some(call);
            }
        }
        if compute.is_some() {
            let again = state.engine.resolve(target.key, &mut compute);
            resolved = tokio::select! {
                biased;
                Ok(handoff) = &mut passthrough_rx => {
                    return Ok(state.handed_off(handoff, &view, fwd, Source::Miss));
                }
                resolved = again => resolved,
            };
            spare = spare.or_else(|| take_spare(&error_slot));
        }
    }
    let counters = state.counters();
    // stale-if-error: the stored response stands in for a failed origin.
    // Without a copy of its own, a copy kept aside since (read from Redis
    // during the flight) stands in.
    let fallback = |fwd_status: Option<u16>| {
        let kept;
        let entry = match stale.as_ref() {
            Some(e) => e,
            None => {
                kept = state
                    .retained
                    .get(&target.key)
                    .filter(|e| e.value.vary_matches(request_headers))?;
                &kept
            }
        };
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
            if !entry.value.vary_matches(request_headers) {
                let status = state.status_fwd(Forward::VaryMiss, None);
                return released(&state, own_call(compute, spare), status, fallback).await;
            }
            // A stored copy shared by the flight may still be refused by this
            // request's own directives (max-age, min-fresh): such a request
            // goes to the origin itself.
            if refuses(&state, reload, request_headers, &entry, source) {
                let call = own_call(compute, spare);
                return direct(&state, call, state.status_fwd(Forward::Request, None)).await;
            }
            if entry.value.status.is_server_error() {
                if let Some(r) = fallback(Some(entry.value.status.as_u16())) {
                    return Ok(r);
                }
            }
            // An error page the cache did not store was made for the request
            // that led (its headers, its cookie): a waiter asks for its own.
            if source == Source::Coalesced
                && !is_stored(&entry)
                && is_error(entry.value.status)
                && !state.http.share_uncacheable
            {
                let status = state.status_fwd(fwd, Some("error-not-shared"));
                return released(&state, own_call(compute, spare), status, fallback).await;
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
            // It led, and its flight found a pass marker (in Redis, or here)
            // instead of calling; or it met the marker in memory and Redis
            // still holds it: hit-for-miss, as under a marker in memory.
            let past_marker = wants == Wants::PastMarker;
            if (compute.is_none() || past_marker)
                && matches!(state.engine.probe(&target.key), Probe::Pass)
            {
                if let Some(permit) = hit_for_miss_permit(&state, request_headers, head) {
                    // A follower kept its own call: the same request, rebuilt.
                    let spare = spare.take().or_else(|| {
                        compute.take().map(|c| {
                            let (inner, req) = c.into_parts();
                            (inner, refresh_request(&req))
                        })
                    });
                    if let Some((inner, req)) = spare {
                        let state = Arc::clone(&state);
                        return hit_for_miss(state, target, head, inner, req, fwd, permit).await;
                    }
                }
                if past_marker {
                    // No permit free: it passes at once, as in memory.
                    counters.record(Source::Bypass);
                    let status = state.status_fwd(Forward::UriMiss, Some("hit-for-pass"));
                    return pass_uncapped(&state, own_call(compute, spare), status).await;
                }
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
            if let Some(e) = take_error(&error_slot) {
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
pub(super) enum First<V, H> {
    Resolved(V),
    Handoff(H),
    Stream(Arc<Stream>),
}

/// A request that refuses the stored response (`no-cache`, `max-age` …):
/// by default it shares one refresh per key ([`ReloadMode::Coalesce`]); in
/// [`ReloadMode::Honor`] it calls the origin on its own while a fallback
/// permit is free, and shares a refresh beyond that.
pub(super) async fn reload<S, ReqB, ResB>(
    state: Arc<LayerState>,
    target: Target,
    head: bool,
    inner: S,
    req: Request<ReqB>,
    stored: Option<Arc<Stored<CachedResponse>>>,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Origin<ReqB, ResB> + Clone,
    ReqB: Default + Send + 'static,
    ResB: OriginBody,
{
    if state.http.reload == ReloadMode::Honor {
        if let Some(permit) = state.engine.try_fallback_permit() {
            let stored = stored.map(|e| e.value.clone());
            return honor_reload(state, target, head, inner, req, stored, permit).await;
        }
    }
    miss(state, target, head, inner, req, stored, Wants::Refresh).await
}

/// A request released from a flight calls the origin itself, under the
/// fallback cap (waiting at most `max_wait` for a permit); past the cap it
/// gets stale-if-error or a 503.
pub(super) async fn released<S, ReqB, ResB>(
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
        state.counters().record_error();
        return Ok(state.own_answer(StatusCode::SERVICE_UNAVAILABLE, &status, "overloaded"));
    };
    direct_with(state, call, status, Some(permit)).await
}

/// Whether a request refuses `entry`, a stored copy the flight shared with
/// it. The leader's own answer is for it, and so is a refresh's to a request
/// that refused the stored one (a refresh's answer is never the entry it
/// refused).
fn refuses(
    state: &LayerState,
    reload: bool,
    request_headers: &HeaderMap,
    entry: &Stored<CachedResponse>,
    source: Source,
) -> bool {
    !reload
        && state.http.reload != ReloadMode::Ignore
        && source != Source::Miss
        && is_stored(entry)
        && !acceptable(request_headers, entry, state.http.rules.grace)
}

/// Whether `entry`, handed out fresh, is past its freshness now while the
/// request would have taken it in its last moment of freshness: expiry, not
/// the request's own directives (`max-age`, `min-fresh`), refuses it.
fn expired_since_handed_out(
    request_headers: &HeaderMap,
    entry: &Stored<CachedResponse>,
    source: Source,
    grace: Duration,
) -> bool {
    if !matches!(source, Source::Hit | Source::Coalesced) {
        return false;
    }
    let RequestVerdict::Cacheable(rd) = policy::classify_request(&Method::GET, request_headers)
    else {
        return false;
    };
    let rules = entry.value.rules;
    let lifetime = rules.lifetime();
    if lifetime.is_zero() || entry.value.current_age(entry.age()) < lifetime {
        return false;
    }
    // Ages count in whole seconds: any instant before the end is the last one.
    let last_fresh = lifetime.saturating_sub(Duration::from_millis(1));
    policy::usability(&rd, rules, last_fresh, grace) == Usable::Fresh
}

/// Whether a request with these headers accepts `entry` served as it is now.
pub(super) fn acceptable(
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::engine::envelope::EntryMeta;
    use crate::http::policy::StoredRules;
    use crate::key::CacheKey;

    /// A copy fresh for `lifetime` seconds, `age` old now.
    fn copy(lifetime: u32, age: Duration) -> Stored<CachedResponse> {
        let value = CachedResponse {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Bytes::from_static(b"x"),
            vary: Vec::new(),
            initial_age: 0,
            url: CacheKey::new("example.test/x"),
            route: None,
            rules: StoredRules {
                lifetime,
                swr: 0,
                sie: 0,
                flags: 0,
            },
            revalidated: false,
            not_stored: None,
            served_head: Default::default(),
        };
        let fresh = Duration::from_secs(u64::from(lifetime));
        let meta = EntryMeta::now(fresh, Duration::ZERO, 1);
        Stored::new(value, meta, fresh.saturating_sub(age), fresh, age)
    }

    fn asking(cache_control: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        if !cache_control.is_empty() {
            h.insert("cache-control", HeaderValue::from_static(cache_control));
        }
        h
    }

    /// Expiry alone refuses a copy past its end; a request's own max-age or min-fresh, a copy refused while still fresh, or a stale one does not count.
    #[test]
    fn only_expiry_since_the_handout_counts() {
        let just_past = copy(1, Duration::from_millis(1_002));
        let grace = Duration::ZERO;
        for cc in ["", "max-age=5"] {
            assert!(
                expired_since_handed_out(&asking(cc), &just_past, Source::Hit, grace),
                "{cc:?}"
            );
        }
        assert!(expired_since_handed_out(
            &asking(""),
            &just_past,
            Source::Coalesced,
            grace
        ));
        // Its own directives refuse the copy even in its last moment.
        assert!(!expired_since_handed_out(
            &asking("min-fresh=1"),
            &just_past,
            Source::Hit,
            grace
        ));
        let older = copy(3, Duration::from_millis(3_002));
        assert!(!expired_since_handed_out(
            &asking("max-age=1"),
            &older,
            Source::Hit,
            grace
        ));
        // Refused while fresh: by its directives, not by expiry.
        let fresh = copy(60, Duration::from_secs(20));
        assert!(!expired_since_handed_out(
            &asking("max-age=10"),
            &fresh,
            Source::Hit,
            grace
        ));
        // Handed out stale: it never was fresh for this request.
        assert!(!expired_since_handed_out(
            &asking(""),
            &just_past,
            Source::Stale,
            grace
        ));
    }
}
