//! The response body the layer returns: a stored body, the inner body passed
//! through, or a buffered prefix followed by the rest of the inner body.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::error::BoxError;
use crate::http::stream::StreamReader;

pin_project! {
    /// Response body of [`CacheService`](crate::service::CacheService).
    ///
    /// A hit shares the stored [`Bytes`]; a bypass streams the inner body
    /// unchanged.
    #[derive(Debug)]
    pub struct CacheBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        // A complete body held in memory (a hit, or empty for HEAD).
        Full { data: Option<Bytes> },
        // The inner service's body, passed through.
        Inner { #[pin] body: B },
        // Frames already read while trying to buffer, then the rest.
        Prefixed { prefix: VecDeque<Bytes>, rest: Pin<Box<B>> },
        // One reader of a fill streamed to several requests at once.
        Shared { reader: StreamReader },
        // A byte range of another body: `skip` bytes dropped, then `left` kept.
        Sliced { inner: Pin<Box<CacheBody<B>>>, skip: u64, left: u64 },
    }
}

impl<B> CacheBody<B> {
    pub(crate) fn full(data: Bytes) -> Self {
        Self::of(Kind::Full {
            data: (!data.is_empty()).then_some(data),
        })
    }

    pub(crate) fn empty() -> Self {
        Self::of(Kind::Full { data: None })
    }

    pub(crate) fn inner(body: B) -> Self {
        Self::of(Kind::Inner { body })
    }

    pub(crate) fn prefixed(prefix: VecDeque<Bytes>, rest: Pin<Box<B>>) -> Self {
        Self::of(Kind::Prefixed { prefix, rest })
    }

    pub(crate) fn shared(reader: StreamReader) -> Self {
        Self::of(Kind::Shared { reader })
    }

    /// The length of a body held whole in memory; `None` for one that is
    /// still arriving.
    pub(crate) fn complete_len(&self) -> Option<u64> {
        match &self.kind {
            Kind::Full { data } => Some(data.as_ref().map_or(0, |d| d.len() as u64)),
            _ => None,
        }
    }

    /// Bytes `start..start + len` of this body. A body in memory is cut at
    /// once (no copy); one still arriving is cut as it arrives, and ends in
    /// an error if it stops short of the range.
    pub(crate) fn slice(self, start: u64, len: u64) -> Self {
        match self.kind {
            Kind::Full { data } => {
                let data = data.unwrap_or_default();
                let from = usize::try_from(start).unwrap_or(usize::MAX).min(data.len());
                let to = usize::try_from(start.saturating_add(len))
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                Self::full(data.slice(from..to))
            }
            kind => Self::of(Kind::Sliced {
                inner: Box::pin(Self::of(kind)),
                skip: start,
                left: len,
            }),
        }
    }

    fn of(kind: Kind<B>) -> Self {
        Self { kind }
    }
}

/// The error is boxed: a streamed body's error (origin failed mid-body,
/// reader cut off) is one every reader gets, not the inner body's own.
impl<B> Body for CacheBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            KindProj::Prefixed { prefix, rest } => match prefix.pop_front() {
                Some(chunk) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
                None => rest.as_mut().poll_frame(cx).map_err(Into::into),
            },
            KindProj::Shared { reader } => {
                reader.poll_chunk(cx).map(|c| c.map(|r| r.map(Frame::data)))
            }
            KindProj::Sliced { inner, skip, left } => loop {
                if *left == 0 {
                    return Poll::Ready(None);
                }
                let Some(frame) = std::task::ready!(inner.as_mut().poll_frame(cx)) else {
                    // The whole body was promised by its Content-Length.
                    return Poll::Ready(Some(Err("body ended before its byte range".into())));
                };
                // Trailers describe the whole body, not this range: dropped.
                let Ok(data) = frame?.into_data() else {
                    continue;
                };
                let len = data.len() as u64;
                if *skip >= len {
                    *skip -= len;
                    continue;
                }
                // Both below `len`, a usize: the casts cannot truncate.
                let from = *skip as usize;
                let to = (*skip).saturating_add(*left).min(len) as usize;
                *skip = 0;
                let part = data.slice(from..to);
                *left -= part.len() as u64;
                if !part.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(part))));
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data } => data.is_none(),
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Prefixed { prefix, rest } => prefix.is_empty() && rest.is_end_stream(),
            Kind::Shared { reader } => reader.is_end(),
            Kind::Sliced { left, .. } => *left == 0,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Inner { body } => body.size_hint(),
            Kind::Prefixed { prefix, rest } => {
                let buffered: u64 = prefix.iter().map(|b| b.len() as u64).sum();
                let inner = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower().saturating_add(buffered));
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper.saturating_add(buffered));
                }
                hint
            }
            Kind::Shared { .. } => SizeHint::new(),
            Kind::Sliced { left, .. } => SizeHint::with_exact(*left),
        }
    }
}
