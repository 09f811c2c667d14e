//! A request with no usable entry: lead or follow the key's flight, take
//! the leader's answer only if it is for this request, or be released to
//! call the origin itself under the fallback cap.

use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderMap, HeaderValue};
use http::{Request, Response};

use crate::engine::Resolved;
use crate::http::body::CacheBody;
use crate::http::cache_status::Detail;
use crate::http::policy::Forward;
use crate::http::response::CachedResponse;
use crate::http::state::{LayerState, ReloadMode};
use crate::http::stream::Stream;
use crate::metrics::Source;
use crate::store::memory::{Probe, Stored};

use super::acceptance::{acceptable, expired_since_handed_out, leaders_error_page, refuses};
use super::bounds::{Origin, OriginBody};
use super::direct::{
    direct, direct_with, hit_for_miss, honor_reload, pass_uncapped, refresh_request, released,
    spare_call,
};
use super::fields::hit_for_miss_permit;
use super::miss_status::{MissStatus, Wants};
use super::origin::OriginCall;
use super::respond::{served_from_flight, StandIn, View};
use super::returned::Handoff;
use super::returned::Returns;
use crate::http::keys::Target;

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
    target: Target,
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
    // Boxed: the steps below move it, and each step's future would
    // otherwise hold a copy of all of it.
    let arrived = std::time::Instant::now();
    let call = (inner, req);
    let mut m = Box::new(Miss::start(
        state, target, head, call, stale, wants, arrived,
    ));
    let first = m.first().await;
    m.after(first).await
}

/// The rest of [`miss`] for a request that followed its key's running
/// flight ([`follow`](super::follow)) and whose first news from it was not
/// a plain answer: from that news on, as if it had joined here.
pub(super) async fn followed<S, ReqB, ResB>(
    state: Arc<LayerState>,
    target: Target,
    head: bool,
    call: (S, Request<ReqB>),
    stale: Option<Arc<Stored<CachedResponse>>>,
    arrived: std::time::Instant,
    first: MissStatus<ResB>,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Origin<ReqB, ResB> + Clone,
    ReqB: Default + Send + 'static,
    ResB: OriginBody,
{
    let m = Box::new(Miss::start(
        state,
        target,
        head,
        call,
        stale,
        Wants::Entry,
        arrived,
    ));
    m.after(first).await
}

/// A request in [`miss`]: its call (unspent while it follows), the spare
/// it keeps if it leads, and how it is forwarded.
struct Miss<S, ReqB, ResB, E> {
    state: Arc<LayerState>,
    target: Target,
    head: bool,
    wants: Wants,
    /// The stored response to revalidate, and to stand in for an error.
    stale: Option<Arc<Stored<CachedResponse>>>,
    /// The request's headers, lent by its call.
    headers: Arc<HeaderMap>,
    fwd: Forward,
    compute: Option<OriginCall<S, ReqB, ResB, E>>,
    /// A spare call for after the flight, made only if this request leads
    /// (its call is spent then): taken from what the call returns after
    /// each resolve. A follower keeps its own call unspent and copies nothing.
    spare: Option<(S, Request<ReqB>)>,
    /// What the call sends back to this request alone.
    returns: Returns<S, ReqB, ResB, E>,
    arrived: std::time::Instant,
    grace: Duration,
    /// It has gone round the key's flights once more after coming too late
    /// for a stream (see [`late_for_a_stream`](Self::late_for_a_stream)).
    went_round: bool,
}

impl<S, ReqB, ResB> Miss<S, ReqB, ResB, S::Error>
where
    S: Origin<ReqB, ResB> + Clone,
    ReqB: Default + Send + 'static,
    ResB: OriginBody,
{
    fn start(
        state: Arc<LayerState>,
        target: Target,
        head: bool,
        (inner, req): (S, Request<ReqB>),
        stale: Option<Arc<Stored<CachedResponse>>>,
        wants: Wants,
        arrived: std::time::Instant,
    ) -> Self {
        let stored = stale.as_ref().map(|e| e.value.clone());
        let (leader, returns) =
            OriginCall::initiated(inner, req, Arc::clone(&state), target, stored);
        // Read here while the call is unspent, copied only if it is made.
        let (leader, headers) = leader.keeping_spare(spare_call).lending_headers();
        let fwd = if wants == Wants::Refresh {
            Forward::Request
        } else if stale.is_some() {
            Forward::Stale
        } else {
            target.miss
        };
        let grace = state.http.rules.grace;
        Self {
            state,
            target,
            head,
            wants,
            stale,
            headers,
            fwd,
            compute: Some(leader),
            spare: None,
            returns,
            arrived,
            grace,
            went_round: false,
        }
    }

    /// What [`miss`] makes of the flight's first news.
    async fn after(
        mut self: Box<Self>,
        first: MissStatus<ResB>,
    ) -> Result<Response<CacheBody<ResB>>, S::Error> {
        let resolved = match first {
            MissStatus::Done(r) => r,
            MissStatus::HandedOff(handoff) => return Ok(self.handed_off(handoff)),
            MissStatus::Streaming(stream) => return self.join_stream(stream).await,
        };
        let resolved = self.follow_variant(resolved).await;
        let resolved = match self.again_if_expired(resolved).await {
            Ok(resolved) => resolved,
            Err(handoff) => return Ok(self.handed_off(handoff)),
        };
        match resolved {
            Resolved::Value { entry, source } => self.answer_entry(entry, source).await,
            Resolved::Pass(Some(value)) => {
                if value.status.is_server_error() {
                    if let Some(r) = self.fallback(Some(value.status.as_u16())) {
                        return Ok(r);
                    }
                }
                self.state.counters().record(Source::Miss);
                Ok(self.state.respond_uncached(*value, &self.view(), self.fwd))
            }
            Resolved::Pass(None) if self.late_for_a_stream() => {
                self.went_round = true;
                let first = self.first().await;
                Box::pin(self.after(first)).await
            }
            Resolved::Pass(None) => self.answer_unshared().await,
            Resolved::Failed(error) => {
                if let Some(r) = self.stand_in().answer_for(&error) {
                    return Ok(r);
                }
                self.state.counters().record_error();
                // The inner service's own error goes back to the caller that made it.
                if let Some(e) = self.returns.take_error() {
                    return Err(e);
                }
                Ok(self.state.error_response(&error))
            }
            Resolved::WaitTimedOut(permit) => {
                // The origin went down meanwhile: stale-if-error answers.
                if let Some(r) = self.stand_in().while_down() {
                    return Ok(r);
                }
                let status = self
                    .state
                    .own_call_status(self.fwd, Some(Detail::WaitTimeout));
                let state = Arc::clone(&self.state);
                direct_with(&state, self.own_call(), status, Some(permit)).await
            }
            Resolved::Overloaded => self.release(Detail::Overloaded).await,
        }
    }

    /// A follower whose flight streamed a body too large to store, which
    /// it came too late to read from the first byte: that flight ends
    /// unshared (its lease is released as the stream starts), but the
    /// request was not refused; it shares the key's next call, as
    /// [`first`](Self::first) promises, rather than calling alone outside
    /// any lease. Once: a second unshared outcome sends it on its own. Only
    /// a request that could have read the stream: not a reload (it never
    /// does) nor one past a pass marker (it never shares a call).
    fn late_for_a_stream(&self) -> bool {
        !self.went_round
            && self.wants == Wants::Entry
            && self.compute.is_some()
            && self.state.too_large.contains(&self.target.key)
    }

    /// It refuses the stored response: only a refresh answers it.
    fn wants_refresh(&self) -> bool {
        self.wants == Wants::Refresh
    }

    /// Not on the hit path: the stored validators are looked up (a hit
    /// skips that).
    fn view(&self) -> View<'_> {
        View {
            head: self.head,
            headers: &self.headers,
            validators: true,
        }
    }

    fn handed_off(&self, handoff: Handoff<ResB>) -> Response<CacheBody<ResB>> {
        self.state
            .handed_off(handoff, &self.view(), self.fwd, Source::Miss)
    }

    /// Resolve the key's flight (again), keeping the spare a leader makes.
    async fn resolve(&mut self, refresh: bool) -> Resolved<CachedResponse> {
        let resolved = if refresh {
            self.state
                .engine
                .resolve_refresh(self.target.key, &mut self.compute)
                .await
        } else {
            self.state
                .engine
                .resolve(self.target.key, &mut self.compute)
                .await
        };
        self.take_spare();
        resolved
    }

    fn take_spare(&mut self) {
        if self.spare.is_none() {
            self.spare = self.returns.take_spare();
        }
    }

    /// The flight's outcome, or before it: this request's own handoff if it
    /// leads, or the leader's stream if the cache could have served it here.
    async fn first(&mut self) -> MissStatus<ResB> {
        let refresh = self.wants_refresh();
        let Self {
            state,
            target,
            headers,
            compute,
            returns,
            grace,
            ..
        } = self;
        let resolving = async {
            if refresh {
                state.engine.resolve_refresh(target.key, compute).await
            } else {
                state.engine.resolve(target.key, compute).await
            }
        };
        // A stream whose first byte is gone is not waited for: requests
        // too late for it share the flight's next call instead.
        let streaming = state.streams.wait(target.key, |s| {
            s.body.attachable()
                && s.head.value.vary_matches(headers)
                && acceptable(headers, &s.head, *grace)
        });
        let first = tokio::select! {
            biased;
            Some(handoff) = returns.handoff() => MissStatus::HandedOff(handoff),
            // A reload refuses what other requests are served; it waits for
            // its refresh's outcome.
            stream = streaming, if !refresh => MissStatus::Streaming(stream),
            resolved = resolving => MissStatus::Done(resolved),
        };
        self.take_spare();
        first
    }

    /// Read the leader's stream from its first byte, or call alone when the
    /// window has left the start.
    async fn join_stream(
        mut self: Box<Self>,
        stream: Arc<Stream>,
    ) -> Result<Response<CacheBody<ResB>>, S::Error> {
        let Some(reader) = stream.body.reader(Some(self.arrived)) else {
            let status = self
                .state
                .own_call_status(self.fwd, Some(Detail::StreamWindowPassed));
            let state = Arc::clone(&self.state);
            return released(&state, self.own_call(), status, |_| None).await;
        };
        self.state.record_waiter(&self.target.key, self.arrived);
        let status = self.state.status(format_args!(
            "fwd={}; fwd-status={}; collapsed; detail=streamed",
            self.fwd.as_str(),
            stream.status().as_u16()
        ));
        Ok(self
            .state
            .respond_streamed(&stream, reader, &self.view(), status))
    }

    /// An entry made for other Vary values (or other credentials) names the
    /// variant this request needs: follow it once, as a flight of its own.
    async fn follow_variant(
        &mut self,
        resolved: Resolved<CachedResponse>,
    ) -> Resolved<CachedResponse> {
        let Resolved::Value { entry, .. } = &resolved else {
            return resolved;
        };
        let Some(next) = self.state.variant_for(&self.target, entry, &self.headers) else {
            return resolved;
        };
        self.target = next;
        self.fwd = Forward::VaryMiss;
        self.compute = match self.compute.take() {
            Some(mut call) => {
                call.target = next;
                call.stale = None;
                Some(call)
            }
            None => self.spare.take().map(|(inner, req)| {
                let (call, returns) =
                    OriginCall::initiated(inner, req, Arc::clone(&self.state), next, None);
                self.returns = returns;
                call
            }),
        };
        if self.compute.is_none() {
            return Resolved::Pass(None);
        }
        self.resolve(self.wants_refresh()).await
    }

    /// A copy the flight handed out fresh by the engine's clock (Redis's
    /// freshness, PTTL past the stale window, may have had a millisecond
    /// left) can have expired by the time this request looks at it. If only
    /// that refuses it, the request goes round the flight once more rather
    /// than to the origin alone; once is enough: that lookup lands after
    /// the copy's end, which is no earlier than Redis's, so it finds the
    /// entry stale and shares its refresh. `Err`: its own handoff came.
    async fn again_if_expired(
        &mut self,
        resolved: Resolved<CachedResponse>,
    ) -> Result<Resolved<CachedResponse>, Handoff<ResB>> {
        let expired = match &resolved {
            Resolved::Value { entry, source } => {
                (refuses(
                    &self.state,
                    self.wants_refresh(),
                    &self.headers,
                    entry,
                    *source,
                ) && expired_since_handed_out(&self.headers, entry, *source, self.grace))
                .then(|| Arc::clone(entry))
            }
            _ => None,
        };
        let Some(entry) = expired else {
            return Ok(resolved);
        };
        if self.compute.is_none() {
            // This request led the flight (its call went unused): it needs a
            // call of its own for the next one, and keeps a spare.
            if let Some((inner, req)) = self.spare.take() {
                self.spare = spare_call(&inner, &req);
                let revalidate = Some(entry.value.clone());
                let (call, returns) = OriginCall::initiated(
                    inner,
                    req,
                    Arc::clone(&self.state),
                    self.target,
                    revalidate,
                );
                self.returns = returns;
                self.compute = Some(call);
            }
        }
        if self.compute.is_none() {
            return Ok(resolved);
        }
        let Self {
            state,
            target,
            compute,
            returns,
            ..
        } = self;
        let again = state.engine.resolve(target.key, compute);
        let resolved = tokio::select! {
            biased;
            Some(handoff) = returns.handoff() => return Err(handoff),
            resolved = again => resolved,
        };
        self.take_spare();
        Ok(resolved)
    }

    fn fallback(&self, fwd_status: Option<u16>) -> Option<Response<CacheBody<ResB>>> {
        self.stand_in().answer(fwd_status)
    }

    fn stand_in(&self) -> StandIn {
        StandIn {
            state: Arc::clone(&self.state),
            stale: self.stale.clone(),
            key: self.target.key,
            headers: Arc::clone(&self.headers),
            head: self.head,
        }
    }

    /// This request's own call, made when the flight's answer is not for it.
    fn own_call(&mut self) -> Option<OriginCall<S, ReqB, ResB, S::Error>> {
        let (state, target) = (&self.state, self.target);
        self.compute.take().or_else(|| {
            self.spare.take().map(|(inner, req)| {
                OriginCall::new(inner, req, Arc::clone(state), None, target, None)
            })
        })
    }

    /// Released to call the origin itself under the fallback cap, with
    /// `detail` in its `Cache-Status`.
    async fn release(
        self: Box<Self>,
        detail: Detail,
    ) -> Result<Response<CacheBody<ResB>>, S::Error> {
        let status = self.state.own_call_status(self.fwd, Some(detail));
        self.release_with(status).await
    }

    async fn release_with(
        mut self: Box<Self>,
        status: HeaderValue,
    ) -> Result<Response<CacheBody<ResB>>, S::Error> {
        let call = self.own_call();
        let stand_in = self.stand_in();
        released(&self.state, call, status, move |s| stand_in.answer(s)).await
    }

    /// The flight's entry, if it is for this request: else its own call.
    async fn answer_entry(
        mut self: Box<Self>,
        entry: Arc<Stored<CachedResponse>>,
        source: Source,
    ) -> Result<Response<CacheBody<ResB>>, S::Error> {
        // Never a variant made for other header values, from any path.
        if !entry.value.vary_matches(&self.headers) {
            let status = self.state.own_call_status(Forward::VaryMiss, None);
            return self.release_with(status).await;
        }
        // A stored copy shared by the flight may still be refused by this
        // request's own directives (max-age, min-fresh): such a request
        // goes to the origin itself.
        if refuses(
            &self.state,
            self.wants_refresh(),
            &self.headers,
            &entry,
            source,
        ) {
            let call = self.own_call();
            let state = Arc::clone(&self.state);
            return direct(&state, call, state.own_call_status(Forward::Request, None)).await;
        }
        if entry.value.status.is_server_error() {
            if let Some(r) = self.fallback(Some(entry.value.status.as_u16())) {
                return Ok(r);
            }
        }
        if leaders_error_page(&self.state, &entry, source) {
            return self.release(Detail::ErrorNotShared).await;
        }
        self.state.record_for(source, &self.target.key);
        let served = served_from_flight(&entry, source, self.fwd, self.grace);
        Ok(self.state.respond(&entry, &self.view(), served))
    }

    /// No answer for everyone: its own handoff, hit-for-miss under a pass
    /// marker, or its own call.
    async fn answer_unshared(mut self: Box<Self>) -> Result<Response<CacheBody<ResB>>, S::Error> {
        if let Some(handoff) = self.returns.try_handoff() {
            return Ok(self.handed_off(handoff));
        }
        // It led, and its flight found a pass marker (in Redis, or here)
        // instead of calling; or it met the marker in memory and Redis
        // still holds it: hit-for-miss, as under a marker in memory.
        let past_marker = self.wants == Wants::PastMarker;
        if (self.compute.is_none() || past_marker)
            && matches!(self.state.engine.probe(&self.target.key), Probe::Pass)
        {
            if let Some(permit) = hit_for_miss_permit(&self.state, &self.headers, self.head) {
                // A follower kept its own call: the same request, rebuilt.
                let spare = self.spare.take().or_else(|| {
                    self.compute.take().map(|c| {
                        let (inner, req) = c.into_parts();
                        (inner, refresh_request(&req))
                    })
                });
                if let Some((inner, req)) = spare {
                    let (state, target, head, fwd) =
                        (Arc::clone(&self.state), self.target, self.head, self.fwd);
                    return hit_for_miss(state, target, head, inner, req, fwd, permit).await;
                }
            }
            if past_marker {
                // No permit free: it passes at once, as in memory.
                self.state.record_for(Source::Bypass, &self.target.key);
                let status = self
                    .state
                    .own_call_status(Forward::UriMiss, Some(Detail::HitForPass));
                let state = Arc::clone(&self.state);
                return pass_uncapped(&state, self.own_call(), status).await;
            }
        }
        // The answer was not for everyone: each waiter asks for its own.
        self.release(Detail::Uncacheable).await
    }
}

/// A request that refuses the stored response (`no-cache`, `max-age` …):
/// by default it shares one refresh per key ([`ReloadMode::Coalesce`]); in
/// [`ReloadMode::Honor`] it calls the origin on its own while a fallback
/// permit is free, and shares a refresh beyond that.
pub(super) async fn answer_reload<S, ReqB, ResB>(
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
