//! An origin's answer as its body is read (for `origin`'s call): buffered
//! up to the limit for storing, streamed to every reader when it spans
//! frames, or handed to its own request alone when it will not be stored.

use super::bounds::OriginBody;
use super::fill::is_error;
use super::returned::HandTo;
use super::returned::Handoff;
use super::streamed::{join, stream_rest, StreamStart};
use crate::engine::Fill;
use crate::error::BoxError;
use crate::http::body::CacheBody;
use crate::http::policy::{self};
use crate::http::response::CachedResponse;
use crate::http::state::LayerState;
use crate::key::CacheKey;
use crate::store::memory::Stored;
use bytes::Bytes;
use http::header::{self};
use http::Response;
use http_body::Body;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::OwnedSemaphorePermit;

/// An answer whose body is being read: buffered for storing, streamed to
/// every reader, or handed to its own request alone.
pub(super) struct Responding<ResB> {
    pub(super) state: Arc<LayerState>,
    pub(super) key: CacheKey,
    pub(super) verdict: policy::ResponseVerdict,
    /// Set while the answer could be stored: it may stream to waiters.
    pub(super) head: Option<Arc<Stored<CachedResponse>>>,
    /// Hands the answer to the request that started the call, if one did.
    pub(super) hand_to: Option<HandTo<ResB>>,
    pub(super) parts: http::response::Parts,
}

pub(super) enum Read {
    /// The body went elsewhere (streamed, handed over): the call's fill.
    Done(Box<Fill<CachedResponse>>),
    /// The whole body, to store or share.
    Whole(http::response::Parts, policy::ResponseVerdict, Bytes),
}

impl<ResB: OriginBody> Responding<ResB> {
    pub(super) async fn read(
        self,
        body: Pin<Box<ResB>>,
        pass_unstored: bool,
    ) -> Result<Read, BoxError> {
        let status = self.parts.status;
        // Under a pass marker, an answer that will not be stored goes to its
        // request as it comes, never buffered: an event stream streams. An
        // error status goes the usual way below (an origin error never
        // replaces what stale-if-error may still serve).
        if pass_unstored && self.head.is_none() && !is_error(status) && self.hand_to.is_some() {
            return Ok(Read::Done(Box::new(self.pass_on(body))));
        }
        let declared = self
            .parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|len| len > self.state.http.max_body_bytes as u64) {
            return self
                .declared_too_large(body)
                .await
                .map(|f| Read::Done(Box::new(f)));
        }
        self.frames(body).await
    }

    /// Hand an answer that will not be stored to its request, unbuffered.
    fn pass_on(mut self, body: Pin<Box<ResB>>) -> Fill<CachedResponse> {
        match &self.verdict {
            policy::ResponseVerdict::Pass(reason) => {
                self.state.counters().not_stored(reason.label())
            }
            policy::ResponseVerdict::Share => self
                .state
                .counters()
                .not_stored(policy::NotStored::NoFreshness.label()),
            policy::ResponseVerdict::Store { .. } => {}
        }
        let fill = self.state.unbuffered_fill(&self.verdict, self.parts.status);
        if let Some(tx) = self.hand_to.take() {
            let response =
                Response::from_parts(self.parts, CacheBody::prefixed(VecDeque::new(), body));
            tx.send(Handoff::Passed(response));
        }
        fill
    }

    /// Too large to store, and not shared: what has been read and the rest
    /// go to the request that started the call, alone.
    fn alone(self, chunks: VecDeque<Bytes>, body: Pin<Box<ResB>>) {
        if let Some(tx) = self.hand_to {
            let response = Response::from_parts(self.parts, CacheBody::prefixed(chunks, body));
            tx.send(Handoff::TooLarge(response));
        }
    }

    /// Stream the rest to every reader from `start`; the whole body when it
    /// was kept for storing.
    async fn stream_on(
        &mut self,
        head: Arc<Stored<CachedResponse>>,
        start: StreamStart,
        body: Pin<Box<ResB>>,
    ) -> Result<Option<Bytes>, BoxError> {
        let leader = self.hand_to.take();
        stream_rest(&self.state, self.key, head, leader, start, body).await
    }

    /// A declared length over `max_body_bytes`.
    async fn declared_too_large(
        mut self,
        body: Pin<Box<ResB>>,
    ) -> Result<Fill<CachedResponse>, BoxError> {
        self.state
            .counters()
            .not_stored(policy::NotStored::TooLarge.label());
        self.state.too_large.mark(self.key);
        let Some(head) = self.head.take() else {
            let fill = self.state.unbuffered_fill(&self.verdict, self.parts.status);
            self.alone(VecDeque::new(), body);
            return Ok(fill);
        };
        // Storable but for its size: the flight ends as soon as the
        // stream is set up (see `stream_rest`), releasing its lease, so
        // instances waiting on it each make one call for their readers.
        // Shared all the same: streamed through a window of
        // `max_body_bytes`, paid for from the fill budget.
        let window = u32::try_from(self.state.http.max_body_bytes)
            .ok()
            .and_then(|n| {
                Arc::clone(&self.state.engine.fill_bytes)
                    .try_acquire_many_owned(n)
                    .ok()
            });
        match window {
            Some(window) => {
                let start = StreamStart {
                    chunks: VecDeque::new(),
                    total: 0,
                    budget: Some(window),
                    storing: false,
                };
                self.stream_on(head, start, body).await?;
            }
            None => self.alone(VecDeque::new(), body),
        }
        // Too large is not uncacheable: no pass marker, so the next
        // request leads a new shared fill.
        Ok(Fill::Unbuffered)
    }

    /// Read the body frame by frame into the fill budget; past one frame it
    /// streams to every reader, past the limit or the budget it goes on
    /// without being stored.
    async fn frames(mut self, mut body: Pin<Box<ResB>>) -> Result<Read, BoxError> {
        let limit = self.state.http.max_body_bytes;
        let mut chunks: VecDeque<Bytes> = VecDeque::new();
        let mut total = 0usize;
        // This fill's share of the layer-wide fill buffer budget, given
        // back once the body is joined (the store accounts for it then).
        let mut buffered: Option<OwnedSemaphorePermit> = None;
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
                Arc::clone(&self.state.engine.fill_bytes)
                    .try_acquire_many_owned(n)
                    .ok()
            });
            chunks.push_back(data);
            let Some(share) = share else {
                // Over budget: stream on to this request alone, store nothing,
                // and mark nothing (the next request may buffer again).
                self.alone(chunks, body);
                return Ok(Read::Done(Box::new(Fill::Unbuffered)));
            };
            match &mut buffered {
                Some(held) => held.merge(share),
                None => buffered = Some(share),
            }
            if total > limit {
                return self.outgrown(chunks, total, buffered, body).await;
            }
            // More than one frame: every reader gets the rest as it arrives
            // (a body in one frame is answered whole).
            if !body.is_end_stream() {
                if let Some(head) = self.head.take() {
                    let start = StreamStart {
                        chunks: std::mem::take(&mut chunks),
                        total,
                        budget: buffered.take(),
                        storing: true,
                    };
                    return Ok(match self.stream_on(head, start, body).await? {
                        Some(whole) => Read::Whole(self.parts, self.verdict, whole),
                        // Too large, over the budget, or abandoned: none
                        // of these makes the response uncacheable.
                        None => Read::Done(Box::new(Fill::Unbuffered)),
                    });
                }
            }
        }
        let whole = join(chunks, total);
        drop(buffered);
        Ok(Read::Whole(self.parts, self.verdict, whole))
    }

    /// A body that outgrew `max_body_bytes` without declaring it: storable
    /// but for its size (then this is its first frame; later ones stream
    /// on), it is shared through a window of `max_body_bytes` like a
    /// declared length, paid from what the frame took. The frame itself
    /// may be larger than the window.
    async fn outgrown(
        mut self,
        chunks: VecDeque<Bytes>,
        total: usize,
        buffered: Option<OwnedSemaphorePermit>,
        body: Pin<Box<ResB>>,
    ) -> Result<Read, BoxError> {
        self.state
            .counters()
            .not_stored(policy::NotStored::TooLarge.label());
        self.state.too_large.mark(self.key);
        let limit = self.state.http.max_body_bytes;
        let storable = self.head.take();
        let window = buffered.and_then(|mut held| held.split(limit));
        if let (Some(head), Some(window)) = (storable, window) {
            let start = StreamStart {
                chunks,
                total,
                budget: Some(window),
                storing: false,
            };
            self.stream_on(head, start, body).await?;
            return Ok(Read::Done(Box::new(Fill::Unbuffered)));
        }
        let fill = self.state.unbuffered_fill(&self.verdict, self.parts.status);
        self.alone(chunks, body);
        Ok(Read::Done(Box::new(fill)))
    }
}
