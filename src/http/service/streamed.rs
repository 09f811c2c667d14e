//! A fill whose body spans several frames: read it once into a shared
//! buffer that the leader and its coalesced waiters read as it arrives.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use tokio::sync::OwnedSemaphorePermit;

use crate::error::BoxError;
use crate::http::cache_status::Detail;
use crate::http::policy::{NotStored, ResponseVerdict};
use crate::http::response::CachedResponse;
use crate::http::state::LayerState;
use crate::http::stream::{SharedBody, Stream, Writer};
use crate::key::CacheKey;
use crate::store::memory::Stored;

use super::bounds::OriginBody;
use super::returned::{HandTo, Handoff};

/// The frames a fill had read when it began to stream.
pub(super) struct StreamStart {
    pub(super) chunks: VecDeque<Bytes>,
    pub(super) total: usize,
    /// Fill budget already held for `chunks` (or for the window).
    pub(super) budget: Option<OwnedSemaphorePermit>,
    /// The body may still be stored: keep every chunk.
    pub(super) storing: bool,
}

/// The head of a response that could be stored, with an empty body, as
/// waiters check it before they read the stream.
pub(super) fn stream_head(
    verdict: &ResponseVerdict,
    parts: &http::response::Parts,
    vary: &[(HeaderName, Vec<HeaderValue>)],
    url: CacheKey,
    route: Option<CacheKey>,
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
        route,
        rules: *rules,
        revalidated: false,
        not_stored: None,
        served_head: Default::default(),
    };
    let meta = crate::entry::envelope::EntryMeta::now(*fresh_for, *stale_for, 0);
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
///
/// A body that will not be stored and holds a window of the fill budget
/// streams on in a task of its own ([`pump`]) once this returns: the
/// flight (and its lease) ends, and the transfer, paced by its readers,
/// may outlast `origin_timeout`, which then bounds each origin frame
/// instead of the whole body.
pub(super) async fn stream_rest<ResB: OriginBody>(
    state: &Arc<LayerState>,
    key: CacheKey,
    head: Arc<Stored<CachedResponse>>,
    leader: Option<HandTo<ResB>>,
    mut start: StreamStart,
    mut body: Pin<Box<ResB>>,
) -> Result<Option<Bytes>, BoxError> {
    let stall = state.engine.config.origin_timeout;
    let (shared, writer) = start.open(state, key, head, leader);
    let mut pending = None;
    loop {
        if !start.storing && start.budget.as_ref().is_some_and(|b| b.num_permits() > 0) {
            let budget = start.budget.take();
            tokio::spawn(pump(shared, writer, body, pending, budget, stall));
            return Ok(None);
        }
        if let Some(data) = pending.take() {
            if !feed(&shared, data).await {
                return Ok(None);
            }
        }
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
        start.keep(state, key, &shared, &data);
        pending = Some(data);
    }
    shared.finish();
    drop(writer);
    let StreamStart {
        chunks,
        total,
        storing,
        ..
    } = start;
    Ok(storing.then(|| join(chunks, total)))
}

impl StreamStart {
    /// The shared body, holding what was read so far, offered to the
    /// flight's waiters; the initiator's reader is handed over first, so it
    /// starts at byte 0 whatever happens.
    fn open<ResB>(
        &mut self,
        state: &Arc<LayerState>,
        key: CacheKey,
        head: Arc<Stored<CachedResponse>>,
        leader: Option<HandTo<ResB>>,
    ) -> (Arc<SharedBody>, Writer) {
        let stall = state.engine.config.origin_timeout;
        let shared = SharedBody::new(state.engine.counters.cache_name(), stall);
        if !self.storing {
            shared.to_window(self.budget.as_ref().map_or(0, |b| b.num_permits()));
        }
        for c in &self.chunks {
            shared.push(c.clone());
        }
        if !self.storing {
            // Only the window may keep them now.
            self.chunks.clear();
        }
        let stream = Arc::new(Stream {
            head,
            body: Arc::clone(&shared),
        });
        if let Some(tx) = leader {
            if let Some(reader) = shared.reader(None) {
                let detail = if self.storing {
                    Detail::Streamed
                } else {
                    Detail::TooLarge
                };
                tx.send(Handoff::Streaming(Arc::clone(&stream), reader, detail));
            }
        }
        let writer = Writer {
            body: Arc::clone(&shared),
            _offer: Some(state.streams.register(key, stream)),
        };
        (shared, writer)
    }

    /// Count a frame, and keep it while the body may still be stored.
    fn keep(&mut self, state: &Arc<LayerState>, key: CacheKey, shared: &SharedBody, data: &Bytes) {
        self.total += data.len();
        if !self.storing {
            return;
        }
        let share = u32::try_from(data.len()).ok().and_then(|n| {
            Arc::clone(&state.engine.fill_bytes)
                .try_acquire_many_owned(n)
                .ok()
        });
        match share {
            Some(share) if self.total <= state.http.max_body_bytes => {
                match &mut self.budget {
                    Some(held) => held.merge(share),
                    None => self.budget = Some(share),
                }
                self.chunks.push_back(data.clone());
            }
            // Not storable after all: keep what the budget already
            // pays for as the window, and stop keeping the rest.
            _ => {
                if self.total > state.http.max_body_bytes {
                    state.counters().not_stored(NotStored::TooLarge.label());
                    state.too_large.mark(key);
                }
                self.storing = false;
                self.chunks.clear();
                shared.to_window(self.budget.as_ref().map_or(0, |b| b.num_permits()));
            }
        }
    }
}

/// The rest of a body that will not be stored, on its own task: each
/// origin frame within `stall`, each wait for room bounded by the cut-off
/// rules. `_budget`, the window's share of the fill budget, is held until
/// the body ends, which bounds how many run at once.
async fn pump<ResB: OriginBody>(
    shared: Arc<SharedBody>,
    writer: Writer,
    mut body: Pin<Box<ResB>>,
    mut pending: Option<Bytes>,
    _budget: Option<OwnedSemaphorePermit>,
    stall: Duration,
) {
    loop {
        if let Some(data) = pending.take() {
            if !feed(&shared, data).await {
                return;
            }
        }
        let Ok(next) =
            tokio::time::timeout(stall, poll_fn(|cx| body.as_mut().poll_frame(cx))).await
        else {
            shared.fail("origin body stalled");
            return;
        };
        // Boxed at once, as in `stream_rest`.
        let Some(frame) = next.map(|f| f.map_err(Into::<BoxError>::into)) else {
            break;
        };
        match frame {
            Ok(frame) => pending = frame.into_data().ok(),
            Err(_) => {
                shared.fail("origin body failed");
                return;
            }
        }
    }
    shared.finish();
    drop(writer);
}

/// Push `data` once the readers leave room for it (past the limit they pace
/// the origin, within a window; one far behind the others is cut off).
/// False when nobody reads and nobody can join any more: the origin call
/// is to be dropped. (A body that may still be stored is never abandoned:
/// it keeps its first byte.)
async fn feed(shared: &SharedBody, data: Bytes) -> bool {
    shared.room().await;
    shared.push(data);
    !shared.abandoned()
}

pub(super) fn join(mut chunks: VecDeque<Bytes>, total: usize) -> Bytes {
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
