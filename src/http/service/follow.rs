//! A request with no usable entry whose key's flight is already running:
//! it joins that flight straight away. Nothing of a leader's is set up (no
//! origin call, no spare copy, no channel for what the call returns): its
//! service and request stay as they came, unspent. When the flight's
//! outcome is a plain answer for it, it is answered here; anything else
//! (the leader's stream, another variant, an error, a pass, a wait that
//! ran out) goes on through [`miss`](super::coalesce) exactly as if it had
//! joined there.

use std::future::Future;
use std::sync::Arc;

use http::{Request, Response};

use crate::engine::Resolved;
use crate::http::body::CacheBody;
use crate::http::keys::Target;
use crate::http::policy::Forward;
use crate::http::response::CachedResponse;
use crate::http::state::LayerState;
use crate::http::stream::Stream;
use crate::store::memory::Stored;

use super::acceptance::{acceptable, plainly_answers};
use super::bounds::{Origin, OriginBody};
use super::coalesce::{followed, miss};
use super::miss_status::{MissStatus, Wants};
use super::respond::{served_from_flight, View};

/// An entry stored in the engine or kept aside.
type Entry = Arc<Stored<CachedResponse>>;

/// A running flight of the layer's engine, joined.
pub(super) type Joined = crate::engine::Joined<CachedResponse>;

/// The flight running for `target`'s key, when the request, arriving now,
/// may [`follow`] it: it wants an entry (a refresh or a request past a
/// pass marker takes the whole miss path).
pub(super) fn running(state: &LayerState, target: &Target, wants: Wants) -> Option<Joined> {
    match wants {
        Wants::Entry => state.engine.running(&target.key),
        Wants::Refresh | Wants::PastMarker => None,
    }
}

/// Follow `joined`, the flight running for `target`'s key.
///
/// An async block rather than an async fn: the block uses what it captures
/// in place, where an async fn's arguments would each take room twice in
/// the future, which is boxed (and so copied) for every follower: keep it
/// under 1 KiB.
#[allow(
    clippy::manual_async_fn,
    reason = "an async block uses its captures in place; an async fn's arguments take room twice in the future"
)]
pub(super) fn follow<S, ReqB, ResB>(
    state: Arc<LayerState>,
    target: Target,
    head: bool,
    (inner, req): (S, Request<ReqB>),
    stale: Option<Entry>,
    joined: Joined,
) -> impl Future<Output = Result<Response<CacheBody<ResB>>, S::Error>>
where
    S: Origin<ReqB, ResB> + Clone,
    ReqB: Default + Send + 'static,
    ResB: OriginBody,
{
    async move {
        // Settled again when first polled, as an election there would be:
        // a flight that has ended since the request arrived is not taken
        // (a purge may have come after its outcome); it goes the whole way.
        if joined.ended() {
            let again = Box::pin(miss(state, target, head, inner, req, stale, Wants::Entry));
            return again.await;
        }
        let arrived = std::time::Instant::now();
        // As in `miss`: a stream whose first byte is not gone is read.
        // (Everything the select waits on is made inside it: a local moved
        // into it would keep its own room in this future.)
        let headers = req.headers();
        let first = tokio::select! {
            biased;
            stream = state.streams.wait(target.key, |s: &Stream| {
                s.body.attachable()
                    && s.head.value.vary_matches(headers)
                    && acceptable(headers, &s.head, state.http.rules.grace)
            }) => MissStatus::Streaming(stream),
            resolved = state.engine.follow(target.key, joined) => MissStatus::Done(resolved),
        };
        let fwd = if stale.is_some() {
            Forward::Stale
        } else {
            target.miss
        };
        // A copy a purge marked after the flight ended (and before this
        // waiter woke) is not served: the purge has answered "purged"; this
        // request goes the whole way, as if it came after the purge.
        if matches!(&first, MissStatus::Done(Resolved::Value { entry, .. }) if entry.is_purged()) {
            let again = Box::pin(miss(state, target, head, inner, req, stale, Wants::Entry));
            return again.await;
        }
        if let MissStatus::Done(Resolved::Value { entry, source }) = &first {
            if plainly_answers(&state, &target, req.headers(), entry, *source) {
                state.record_for(*source, &target.key);
                let served = served_from_flight(entry, *source, fwd, state.http.rules.grace);
                let view = View {
                    head,
                    headers: req.headers(),
                    validators: true,
                };
                return Ok(state.respond(entry, &view, served));
            }
        }
        let call = (inner, req);
        let rest = Box::pin(followed(state, target, head, call, stale, arrived, first));
        rest.await
    }
}
