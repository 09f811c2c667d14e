//! One origin request as a flight's computation: validators in, 304 merge,
//! verdict, Vary capture, body buffered up to the limit (or handed to
//! `streamed` when it spans frames). It decides nothing about waiters.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use crate::engine::{Compute, ComputeFuture, Fill};
use crate::error::BoxError;
use crate::http::body::CacheBody;
use crate::http::conditional;
use crate::http::policy::{self, StoredRules};
use crate::http::response::CachedResponse;
use crate::http::state::LayerState;
use crate::http::vary::stored_values;

use super::bounds::{Origin, OriginBody};
use super::fill::is_error;
use super::streamed::{join, stream_head, stream_rest, Handoff, Passthrough, StreamStart};
use super::target::{url_of, Target};
use super::{CONDITIONAL, NOT_STORED};

/// What only the request that started a flight receives.
pub(super) struct Initiator<S, ReqB, ResB, E> {
    /// A response too large to buffer, streamed to this request alone, or
    /// this request's reader of a streamed fill.
    pub(super) passthrough: oneshot::Sender<Handoff<ResB>>,
    /// The inner service's error, and the spare call, handed back.
    pub(super) slot: Arc<Mutex<Slot<S, ReqB, E>>>,
    /// Hand a 2xx or 3xx the cache will not store to this request as it
    /// arrives ([`Handoff::Passed`]) instead of buffering its body: set for
    /// a request under a pass marker, which nobody else waits on.
    pub(super) pass_unstored: bool,
    /// Makes a spare copy of the service and request into the slot when the
    /// call starts ([`OriginCall::keeping_spare`]).
    pub(super) spare: Option<MakeSpare<S, ReqB>>,
    /// The request's headers, lent to the request waiting on this call
    /// ([`OriginCall::lending_headers`]): put back before the call is made.
    pub(super) headers: Option<Arc<HeaderMap>>,
}

/// Copies an inner service and request (`direct::spare_call`).
pub(super) type MakeSpare<S, ReqB> = fn(&S, &Request<ReqB>) -> Option<(S, Request<ReqB>)>;

/// What a started call hands back to the request that made it.
pub(super) struct Slot<S, ReqB, E> {
    /// The inner service's error, as-is.
    pub(super) error: Option<E>,
    /// A spare service and request, made as the call started: the call
    /// itself is spent then (see [`OriginCall::keeping_spare`]).
    pub(super) spare: Option<(S, Request<ReqB>)>,
}

/// Shared between a call and the request that made it.
pub(super) type SlotRef<S, ReqB, E> = Arc<Mutex<Slot<S, ReqB, E>>>;

/// The slot's spare, if the call started and made one.
pub(super) fn take_spare<S, ReqB, E>(slot: &SlotRef<S, ReqB, E>) -> Option<(S, Request<ReqB>)> {
    slot.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .spare
        .take()
}

/// The slot's error, if the inner service returned one.
pub(super) fn take_error<S, ReqB, E>(slot: &SlotRef<S, ReqB, E>) -> Option<E> {
    slot.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .error
        .take()
}

/// One origin request, run as a flight's computation or directly.
pub(super) struct OriginCall<S, ReqB, ResB, E> {
    pub(super) inner: S,
    pub(super) req: Request<ReqB>,
    pub(super) state: Arc<LayerState>,
    pub(super) initiator: Option<Initiator<S, ReqB, ResB, E>>,
    pub(super) target: Target,
    /// The stored response to revalidate: its validators go out with the
    /// request, and a 304 freshens it.
    pub(super) stale: Option<CachedResponse>,
}

impl<S, ReqB, ResB, E> OriginCall<S, ReqB, ResB, E> {
    pub(super) fn new(
        inner: S,
        req: Request<ReqB>,
        state: Arc<LayerState>,
        initiator: Option<Initiator<S, ReqB, ResB, E>>,
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
    pub(super) fn initiated(
        inner: S,
        req: Request<ReqB>,
        state: Arc<LayerState>,
        target: Target,
        stale: Option<CachedResponse>,
    ) -> (Self, Passthrough<ResB>, SlotRef<S, ReqB, E>) {
        let (passthrough, passthrough_rx) = oneshot::channel();
        let slot = Arc::new(Mutex::new(Slot {
            error: None,
            spare: None,
        }));
        let initiator = Initiator {
            passthrough,
            slot: Arc::clone(&slot),
            pass_unstored: false,
            spare: None,
            headers: None,
        };
        let call = Self::new(inner, req, state, Some(initiator), target, stale);
        (call, passthrough_rx, slot)
    }

    /// An initiated call that, when it starts as a flight's computation,
    /// leaves a spare copy of its service and request in its slot (made by
    /// `make`): the request that led then still has a call of its own for
    /// after the flight, and one that follows, whose call is never spent,
    /// makes no copy.
    pub(super) fn keeping_spare(mut self, make: MakeSpare<S, ReqB>) -> Self {
        if let Some(i) = &mut self.initiator {
            i.spare = Some(make);
        }
        self
    }

    /// An initiated call whose request's headers the request waiting on it
    /// reads meanwhile: moved out into an `Arc` it shares, not copied, and
    /// put back when the call starts, runs or is taken apart. A follower,
    /// whose call never starts, so copies no headers.
    pub(super) fn lending_headers(mut self) -> (Self, Arc<HeaderMap>) {
        let headers = Arc::new(std::mem::take(self.req.headers_mut()));
        match &mut self.initiator {
            Some(i) => i.headers = Some(Arc::clone(&headers)),
            // Nobody to put them back: the call keeps its own.
            None => *self.req.headers_mut() = (*headers).clone(),
        }
        (self, headers)
    }

    /// Put lent headers back into the request.
    fn restore_headers(&mut self) {
        if let Some(h) = self.initiator.as_mut().and_then(|i| i.headers.take()) {
            *self.req.headers_mut() = Arc::unwrap_or_clone(h);
        }
    }

    /// The service and the request, headers back in place.
    pub(super) fn into_parts(mut self) -> (S, Request<ReqB>) {
        self.restore_headers();
        (self.inner, self.req)
    }

    /// An initiated call whose answer, if it will not be stored and is no
    /// error, streams straight to its request ([`Handoff::Passed`]).
    pub(super) fn passing_unstored(mut self) -> Self {
        if let Some(i) = &mut self.initiator {
            i.pass_unstored = true;
        }
        self
    }
}

/// The origin answered with an error of the inner service's own type.
#[derive(Debug)]
pub(super) struct OriginFailed;

impl std::fmt::Display for OriginFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the inner service returned an error")
    }
}

impl std::error::Error for OriginFailed {}

impl<S, ReqB, ResB> Compute<CachedResponse> for OriginCall<S, ReqB, ResB, S::Error>
where
    S: Origin<ReqB, ResB>,
    ReqB: Default + Send + 'static,
    ResB: OriginBody,
{
    fn start(mut self) -> ComputeFuture<CachedResponse> {
        self.restore_headers();
        if let Some(make) = self.initiator.as_ref().and_then(|i| i.spare) {
            let spare = make(&self.inner, &self.req);
            if let Some(i) = &self.initiator {
                i.slot.lock().unwrap_or_else(PoisonError::into_inner).spare = spare;
            }
        }
        Box::pin(self.run())
    }
}

impl<S, ReqB, ResB> OriginCall<S, ReqB, ResB, S::Error>
where
    S: Origin<ReqB, ResB>,
    ReqB: Default + Send + 'static,
    ResB: OriginBody,
{
    pub(super) async fn run(mut self) -> Result<Fill<CachedResponse>, BoxError> {
        self.restore_headers();
        let OriginCall {
            mut inner,
            req,
            state,
            initiator,
            target,
            mut stale,
        } = self;
        let (passthrough, error_slot, pass_unstored) = match initiator {
            Some(i) => (Some(i.passthrough), Some(i.slot), i.pass_unstored),
            None => (None, None, false),
        };
        let url = url_of(&req);
        // A copy kept aside since the call was made (read from Redis past its
        // stale grace, by another instance's write): revalidate it, and an
        // origin error does not replace it.
        if stale.is_none() {
            stale = state
                .retained
                .get(&target.key)
                .filter(|e| e.value.vary_matches(req.headers()))
                .map(|e| e.value.clone());
        }
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
                        slot.lock().unwrap_or_else(PoisonError::into_inner).error = Some(e);
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
        if matches!(verdict, policy::ResponseVerdict::Share)
            && policy::lacks_freshness(&state.http.rules, parts.status, &parts.headers)
        {
            state.warn_no_freshness(&template, parts.status);
        }

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
        let mut head = stream_head(&verdict, &parts, &vary, url, target.route);
        let mut passthrough = passthrough;

        let parts_status = parts.status;
        let limit = state.http.max_body_bytes;
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let mut body = Box::pin(body);
        // Under a pass marker, an answer that will not be stored goes to its
        // request as it comes, never buffered: an event stream streams. An
        // error status goes the usual way below (an origin error never
        // replaces what stale-if-error may still serve).
        if pass_unstored && head.is_none() && !is_error(parts_status) {
            if let Some(tx) = passthrough.take() {
                match &verdict {
                    policy::ResponseVerdict::Pass(reason) => state.counters().not_stored(reason),
                    policy::ResponseVerdict::Share => {
                        state.counters().not_stored("no-freshness");
                    }
                    policy::ResponseVerdict::Store { .. } => {}
                }
                let response =
                    Response::from_parts(parts, CacheBody::prefixed(VecDeque::new(), body));
                let _ = tx.send(Handoff::Passed(response));
                return Ok(state.unbuffered_fill(&verdict, parts_status));
            }
        }
        if declared.is_some_and(|len| len > limit as u64) {
            state.counters().not_stored("too-large");
            state.too_large.mark(target.key);
            let Some(head) = head else {
                if let Some(tx) = passthrough {
                    let response =
                        Response::from_parts(parts, CacheBody::prefixed(VecDeque::new(), body));
                    let _ = tx.send(Handoff::TooLarge(response));
                }
                return Ok(state.unbuffered_fill(&verdict, parts_status));
            };
            // Storable but for its size: the flight ends as soon as the
            // stream is set up (see `stream_rest`), releasing its lease, so
            // instances waiting on it each make one call for their readers.
            // Shared all the same: streamed through a window of
            // `max_body_bytes`, paid for from the fill budget.
            let window = u32::try_from(limit).ok().and_then(|n| {
                Arc::clone(&state.engine.fill_bytes)
                    .try_acquire_many_owned(n)
                    .ok()
            });
            if let Some(window) = window {
                let start = StreamStart {
                    chunks: VecDeque::new(),
                    total: 0,
                    budget: Some(window),
                    storing: false,
                };
                let leader = passthrough;
                stream_rest(&state, target.key, head, leader, start, body).await?;
                // Too large is not uncacheable: no pass marker, so the next
                // request leads a new shared fill.
                return Ok(Fill::Unbuffered);
            }
            if let Some(tx) = passthrough {
                let response =
                    Response::from_parts(parts, CacheBody::prefixed(VecDeque::new(), body));
                let _ = tx.send(Handoff::TooLarge(response));
            }
            return Ok(Fill::Unbuffered);
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
                state.counters().not_stored("too-large");
                state.too_large.mark(target.key);
                // Storable but for its size (then this is its first frame;
                // later ones stream below): shared through a window of
                // `max_body_bytes` like a declared length, paid from what the
                // frame took. The frame itself may be larger than the window.
                let storable = head.take();
                let window = buffered.take().and_then(|mut held| held.split(limit));
                if let (Some(head), Some(window)) = (storable, window) {
                    let start = StreamStart {
                        chunks: std::mem::take(&mut chunks),
                        total,
                        budget: Some(window),
                        storing: false,
                    };
                    let leader = passthrough.take();
                    stream_rest(&state, target.key, head, leader, start, body).await?;
                    return Ok(Fill::Unbuffered);
                }
                if let Some(tx) = passthrough {
                    let response = Response::from_parts(parts, CacheBody::prefixed(chunks, body));
                    let _ = tx.send(Handoff::TooLarge(response));
                }
                return Ok(state.unbuffered_fill(&verdict, parts_status));
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
                    match stream_rest(&state, target.key, head, leader, start, body).await? {
                        Some(whole) => {
                            streamed = Some(whole);
                            break;
                        }
                        // Too large, over the budget, or abandoned: none
                        // of these makes the response uncacheable.
                        None => return Ok(Fill::Unbuffered),
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
            route: target.route,
            rules: StoredRules::default(),
            revalidated: false,
            not_stored: None,
            served_head: Default::default(),
        };
        // While revalidating, an origin error never replaces the stored
        // response: stale-if-error may still need it. Nor does any error
        // page while that response still serves everyone else: it answered
        // one request (a reload with an oversized header, say), and the
        // entry is replaced once it expires.
        let guarded = value.status.is_server_error()
            || (is_error(value.status) && state.usable_entry(&target));
        if stale.is_some() && guarded {
            return Ok(Fill::Share(value));
        }
        Ok(state.finish(target, value, verdict, &request_headers))
    }
}

pub(super) fn strip_not_stored(headers: &mut HeaderMap) {
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

/// A request the cache builds carries no body, so no body framing either.
pub(super) fn strip_framing(headers: &mut HeaderMap) {
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::TRANSFER_ENCODING);
}
