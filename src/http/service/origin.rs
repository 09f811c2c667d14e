//! One origin request as a flight's computation: validators in, 304 merge,
//! verdict, Vary capture, body buffered up to the limit (or handed to
//! `streamed` when it spans frames). It decides nothing about waiters.

use std::future::poll_fn;
use std::sync::Arc;
use std::time::SystemTime;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use crate::engine::{Compute, ComputeFuture, Fill};
use crate::error::BoxError;
use crate::http::conditional;
use crate::http::policy::{self, StoredRules};
use crate::http::response::CachedResponse;
use crate::http::state::LayerState;
use crate::http::vary::stored_values;
use crate::key::CacheKey;

use super::bounds::{Origin, OriginBody};
use super::fields::{CONDITIONAL, NOT_STORED};
use super::fill::is_error;
use super::origin_body::{Read, Responding};
use super::returned::{ReturnTo, Returns};
use super::streamed::stream_head;
use crate::http::keys::{url_of, Target};

/// What only the request that started a flight receives.
pub(super) struct Initiator<S, ReqB, ResB, E> {
    /// Where the call sends what is this request's alone: its spare, its
    /// answer handed over, the inner service's error
    /// ([`Returned`](super::returned::Returned)).
    pub(super) return_to: ReturnTo<S, ReqB, ResB, E>,
    /// Hand a 2xx or 3xx the cache will not store to this request as it
    /// arrives ([`Handoff::Passed`](super::returned::Handoff::Passed))
    /// instead of buffering its body: set for a request under a pass
    /// marker, which nobody else waits on.
    pub(super) pass_unstored: bool,
    /// Makes a spare copy of the service and request, sent back when the
    /// call starts ([`OriginCall::keeping_spare`]).
    pub(super) spare: Option<MakeSpare<S, ReqB>>,
    /// The request's headers, lent to the request waiting on this call
    /// ([`OriginCall::lending_headers`]): put back before the call is made.
    pub(super) headers: Option<Arc<HeaderMap>>,
}

/// Copies an inner service and request (`direct::spare_call`).
pub(super) type MakeSpare<S, ReqB> = fn(&S, &Request<ReqB>) -> Option<(S, Request<ReqB>)>;

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

    /// A call made for the request that is waiting on it: what is that
    /// request's alone (a response too large to store, the inner service's
    /// own error, a spare) comes back through the [`Returns`].
    pub(super) fn initiated(
        inner: S,
        req: Request<ReqB>,
        state: Arc<LayerState>,
        target: Target,
        stale: Option<CachedResponse>,
    ) -> (Self, Returns<S, ReqB, ResB, E>) {
        let (return_to, returns) = Returns::channel();
        let initiator = Initiator {
            return_to,
            pass_unstored: false,
            spare: None,
            headers: None,
        };
        let call = Self::new(inner, req, state, Some(initiator), target, stale);
        (call, returns)
    }

    /// An initiated call that, when it starts as a flight's computation,
    /// sends back a spare copy of its service and request (made by
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

    /// With `on`, an initiated call whose answer, if it will not be stored
    /// and is no error, streams straight to its request
    /// ([`Handoff::Passed`](super::returned::Handoff::Passed)).
    pub(super) fn passing_unstored(mut self, on: bool) -> Self {
        if let Some(i) = &mut self.initiator {
            i.pass_unstored = on;
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
        if let Some(i) = &self.initiator {
            if let Some(spare) = i.spare.and_then(|make| make(&self.inner, &self.req)) {
                i.return_to.spare(spare);
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
        let (return_to, pass_unstored) = match initiator {
            Some(i) => (Some(i.return_to), i.pass_unstored),
            None => (None, false),
        };
        // A copy kept aside since the call was made (read from Redis past its
        // stale grace, by another instance's write): revalidate it, and an
        // origin error does not replace it.
        stale = stale.or_else(|| state.kept_aside(&target, req.headers()));
        let asked = Asked::of(req);
        let answer = match exchange(&mut inner, &asked, &mut stale, &state, &target).await {
            Ok(Exchange::Answered(a)) => a,
            Ok(Exchange::Revalidated(fill)) => return Ok(*fill),
            Err(e) => {
                if let Some(r) = return_to {
                    r.failed(e);
                }
                return Err(Box::new(OriginFailed));
            }
        };
        let OriginHead {
            mut parts,
            body,
            request_time,
            response_time,
        } = answer;
        let verdict = judge(&state, &asked, &parts, request_time, response_time);
        let vary = vary_of(&state, &asked, &parts.headers);
        strip_not_stored(&mut parts.headers);
        // Only a response the cache could store is streamed to waiters.
        let head = stream_head(&verdict, &parts, &vary, asked.url, target.route);
        let responding = Responding {
            state: Arc::clone(&state),
            key: target.key,
            verdict,
            head,
            hand_to: return_to.map(ReturnTo::handing),
            parts,
        };
        let (parts, verdict, body) = match responding.read(Box::pin(body), pass_unstored).await? {
            Read::Done(fill) => return Ok(*fill),
            Read::Whole(parts, verdict, body) => (parts, verdict, body),
        };
        let value = CachedResponse {
            status: parts.status,
            headers: parts.headers,
            body,
            vary,
            initial_age: 0,
            url: asked.url,
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
        Ok(state.finish(target, value, verdict, &asked.headers))
    }
}

/// What the origin is asked, made once from the request.
struct Asked {
    /// The request the cache sends: a GET (HEAD is filled with a GET so
    /// the stored entry can answer both), without the client's validators
    /// or body framing, its varied fields normalised.
    template: http::request::Parts,
    had_authorization: bool,
    /// The template's headers, for Vary values and the stored entry.
    headers: HeaderMap,
    url: CacheKey,
}

impl Asked {
    fn of<ReqB>(req: Request<ReqB>) -> Self {
        let url = url_of(&req);
        // The body of a GET or HEAD carries no meaning.
        let (mut template, _body) = req.into_parts();
        template.method = Method::GET;
        for name in &CONDITIONAL {
            template.headers.remove(name);
        }
        strip_framing(&mut template.headers);
        crate::http::vary::normalise_fill_request(&mut template.headers);
        let had_authorization = template.headers.contains_key(header::AUTHORIZATION);
        let headers = template.headers.clone();
        Self {
            template,
            had_authorization,
            headers,
            url,
        }
    }
}

/// The origin's answer, its body not read yet.
struct OriginHead<ResB> {
    parts: http::response::Parts,
    body: ResB,
    request_time: SystemTime,
    response_time: SystemTime,
}

enum Exchange<ResB> {
    /// A 304 freshened the stale copy: the call's fill.
    Revalidated(Box<Fill<CachedResponse>>),
    Answered(OriginHead<ResB>),
}

/// Ask the origin: at most two requests, a conditional one, and a plain one
/// if the 304 turns out to describe some other representation. The inner
/// service's own error is returned as it is.
async fn exchange<S, ReqB, ResB>(
    inner: &mut S,
    asked: &Asked,
    stale: &mut Option<CachedResponse>,
    state: &Arc<LayerState>,
    target: &Target,
) -> Result<Exchange<ResB>, S::Error>
where
    S: Origin<ReqB, ResB>,
    ReqB: Default + Send + 'static,
    ResB: OriginBody,
{
    loop {
        let mut req = Request::from_parts(asked.template.clone(), ReqB::default());
        if let Some(s) = &*stale {
            conditional::add_validators(req.headers_mut(), s);
        }
        // The wait for the origin's readiness (a full `ConcurrencyLimit`)
        // is not part of the exchange: counted in, it would age the answer
        // (RFC 9111 §4.2.3's response_delay) by however long it queued.
        poll_fn(|cx| inner.poll_ready(cx)).await?;
        let request_time = SystemTime::now();
        let response = inner.call(req).await?;
        let response_time = SystemTime::now();
        let (parts, body) = response.into_parts();
        if parts.status == StatusCode::NOT_MODIFIED {
            if let Some(s) = stale.take() {
                let times = (request_time, response_time);
                match revalidated(state, asked, &s, &parts.headers, times, target) {
                    Some(fill) => return Ok(Exchange::Revalidated(Box::new(fill))),
                    None => continue,
                }
            }
        }
        return Ok(Exchange::Answered(OriginHead {
            parts,
            body,
            request_time,
            response_time,
        }));
    }
}

/// The stored response freshened by a 304's headers, with its verdict, or
/// `None` when the 304 does not describe it.
fn revalidated(
    state: &Arc<LayerState>,
    asked: &Asked,
    stored: &CachedResponse,
    not_modified: &HeaderMap,
    (request_time, response_time): (SystemTime, SystemTime),
    target: &Target,
) -> Option<Fill<CachedResponse>> {
    let excluded = |n: &HeaderName| NOT_STORED.contains(n) || n == header::AGE;
    let mut merged = conditional::freshen(stored, not_modified, excluded)?;
    // The stored origin Age describes the old exchange.
    merged.headers.remove(header::AGE);
    // The 304's own Age and Date drive the new age.
    let mut for_age = merged.headers.clone();
    for_age.remove(header::AGE);
    if let Some(age) = not_modified.get(header::AGE) {
        for_age.insert(header::AGE, age.clone());
    }
    let mut verdict = policy::classify_response(
        &state.http.rules,
        asked.had_authorization,
        merged.status,
        &for_age,
        request_time,
        response_time,
    );
    if state.http.predicate.is_some() {
        let mut res = Response::new(()).into_parts().0;
        res.status = merged.status;
        res.headers = merged.headers.clone();
        verdict = state.route_verdict(&asked.template, &res, verdict);
    }
    merged.revalidated = true;
    Some(state.finish(*target, merged, verdict, &asked.headers))
}

/// The answer's verdict (RFC 9111, then the route's), warning once per
/// route about answers without freshness.
fn judge(
    state: &Arc<LayerState>,
    asked: &Asked,
    parts: &http::response::Parts,
    request_time: SystemTime,
    response_time: SystemTime,
) -> policy::ResponseVerdict {
    let verdict = policy::classify_response(
        &state.http.rules,
        asked.had_authorization,
        parts.status,
        &parts.headers,
        request_time,
        response_time,
    );
    let verdict = state.route_verdict(&asked.template, parts, verdict);
    if matches!(verdict, policy::ResponseVerdict::Share)
        && policy::lacks_freshness(&state.http.rules, parts.status, &parts.headers)
    {
        state.warn_no_freshness(&asked.template, parts.status);
    }
    verdict
}

/// The request's values of every field the answer varies on. Credentials
/// vary the answer unless the origin says it is the same for everyone
/// (`public`, `s-maxage`): it is keyed by their digest then.
fn vary_of(
    state: &Arc<LayerState>,
    asked: &Asked,
    response: &HeaderMap,
) -> Vec<(HeaderName, Vec<HeaderValue>)> {
    let mut names = policy::vary_names(response).unwrap_or_default();
    if asked.had_authorization
        && !policy::shared_across_credentials(&state.http.rules, response)
        && !names.contains(&header::AUTHORIZATION)
    {
        names.push(header::AUTHORIZATION);
    }
    names
        .into_iter()
        .map(|n| {
            let values = stored_values(&n, &asked.headers);
            (n, values)
        })
        .collect()
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
