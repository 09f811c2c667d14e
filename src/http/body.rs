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
    /// Response body of [`CacheService`](crate::CacheService).
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
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data } => data.is_none(),
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Prefixed { prefix, rest } => prefix.is_empty() && rest.is_end_stream(),
            Kind::Shared { reader } => reader.is_end(),
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
        }
    }
}
