//! The proxy's bodies: one type for requests and upstream responses, one for
//! what goes back to clients. Enums, not boxes, so a hit allocates nothing
//! for its body beyond what the cache already holds. Imports nothing else
//! of the proxy.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use herdguard::service::CacheBody;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body (from hyper or from an embedding axum router) or an
/// upstream response body, or a short local answer.
#[derive(Debug, Default)]
pub enum ProxyBody {
    #[default]
    Empty,
    Full(Option<Bytes>),
    Incoming(hyper::body::Incoming),
    #[allow(dead_code, reason = "the reverse_proxy example's axum bodies")]
    Boxed(UnsyncBoxBody<Bytes, BoxError>),
}

impl ProxyBody {
    pub fn text(text: impl Into<Bytes>) -> Self {
        Self::Full(Some(text.into()))
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::Empty => Poll::Ready(None),
            Self::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Self::Incoming(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            Self::Boxed(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Empty => true,
            Self::Full(data) => data.is_none(),
            Self::Incoming(b) => b.is_end_stream(),
            Self::Boxed(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Empty => SizeHint::with_exact(0),
            Self::Full(data) => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            Self::Incoming(b) => b.size_hint(),
            Self::Boxed(b) => b.size_hint(),
        }
    }
}

pin_project_lite::pin_project! {
    /// What a client gets: the cache's answer, or one the proxy made itself
    /// (a 400, a purge result).
    #[project = ClientBodyProj]
    #[derive(Debug)]
    pub enum ClientBody {
        Cached { #[pin] body: CacheBody<ProxyBody> },
        Local { body: ProxyBody },
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            ClientBodyProj::Cached { body } => body.poll_frame(cx).map_err(Into::into),
            ClientBodyProj::Local { body } => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Cached { body } => body.is_end_stream(),
            Self::Local { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Cached { body } => body.size_hint(),
            Self::Local { body } => body.size_hint(),
        }
    }
}
