//! A request with no usable entry whose key's flight is already running:
//! it joins that flight straight away. Nothing of a leader's is set up (no
//! origin call, no spare copy, no slot for the inner service's error): its
//! service and request stay as they came, unspent. When the flight's
//! outcome is a plain answer for it, it is answered here; anything else
//! (the leader's stream, another variant, an error, a pass, a wait that
//! ran out) goes on through [`miss`](super::coalesce) exactly as if it had
//! joined there.

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
use super::coalesce::{followed, miss, First, Wants};
use super::respond::{served_from_flight, View};

/// An entry stored in the engine or kept aside.
type Entry = Arc<Stored<CachedResponse>>;

/// Follow the flight running for `target`'s key, or, when none runs (or
/// the request wants more than an entry), take the whole miss path.
pub(super) async fn follow_or_miss<S, ReqB, ResB>(
    state: Arc<LayerState>,
    target: Target,
    head: bool,
    inner: S,
    req: Request<ReqB>,
    stale: Option<Entry>,
    wants: Wants,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Origin<ReqB, ResB> + Clone,
    ReqB: Default + Send + 'static,
    ResB: OriginBody,
{
    let joined = match wants {
        Wants::Entry => state.engine.running(&target.key),
        Wants::Refresh | Wants::PastMarker => None,
    };
    let Some(joined) = joined else {
        // Boxed, in a statement of its own (a temporary in the awaited
        // expression would keep its room in this future): a follower's
        // future does not carry a leader's.
        let leading = Box::pin(miss(state, target, head, inner, req, stale, wants));
        return leading.await;
    };
    let arrived = std::time::Instant::now();
    let first = {
        let headers = req.headers();
        let grace = state.http.rules.grace;
        // As in `miss`: a stream whose first byte is not gone is read.
        // (Each future is made inside the select: a local moved into it
        // would keep its own room in this future.)
        let usable = |s: &Stream| {
            s.body.attachable()
                && s.head.value.vary_matches(headers)
                && acceptable(headers, &s.head, grace)
        };
        tokio::select! {
            biased;
            stream = state.streams.wait(target.key, usable) => First::Stream(stream),
            resolved = state.engine.follow(joined) => First::Resolved(resolved),
        }
    };
    let fwd = if stale.is_some() {
        Forward::Stale
    } else {
        target.miss
    };
    if let First::Resolved(Resolved::Value { entry, source }) = &first {
        if plainly_answers(&state, &target, req.headers(), entry, *source) {
            state.counters().record(*source);
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
