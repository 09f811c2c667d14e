//! [`RequestBody`]: the request body the inner service receives.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The request body the inner service receives: the client's own body,
    /// or empty on a request the cache built.
    ///
    /// The layer sends requests of its own (a flight's call, a background
    /// refresh, a revalidation) and they need a body of the inner service's
    /// type. Requiring `B: Default` would shut out `hyper::body::Incoming`,
    /// which has no empty value, so the inner service gets `RequestBody<B>`:
    /// the client's body where a request goes on as it came (bypasses, unsafe
    /// methods), an empty one on every request the cache builds (those carry
    /// no `Content-Length` or `Transfer-Encoding` either).
    ///
    /// axum's `Router` accepts any body, so with axum this type never shows.
    /// A service of your own names it (with a bare hyper server `B` is
    /// `hyper::body::Incoming`; see `tests/hyper_server.rs`):
    ///
    /// ```
    /// use std::convert::Infallible;
    ///
    /// use http::{Request, Response};
    /// use herdguard::CacheLayer;
    /// use herdguard::service::RequestBody;
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let origin = tower::service_fn(|_req: Request<RequestBody<String>>| async {
    ///     let response = Response::builder()
    ///         .header("cache-control", "max-age=60")
    ///         .body("hello".to_owned());
    ///     Ok::<_, Infallible>(response.expect("static parts are valid"))
    /// });
    /// let service = CacheLayer::new().layer(origin);
    /// let request = Request::get("http://example.com/").body(String::new()).unwrap();
    /// let response = service.oneshot(request).await.unwrap();
    /// assert_eq!(response.status(), 200);
    /// # }
    /// ```
    pub struct RequestBody<B> {
        #[pin]
        inner: Option<B>,
    }
}

impl<B> RequestBody<B> {
    /// The client's own body, forwarded as it came.
    pub const fn new(body: B) -> Self {
        Self { inner: Some(body) }
    }

    /// The client's body, or `None` for a request the cache built.
    pub fn into_inner(self) -> Option<B> {
        self.inner
    }
}

/// An empty body: what requests the cache builds carry.
impl<B> Default for RequestBody<B> {
    fn default() -> Self {
        Self { inner: None }
    }
}

impl<B> fmt::Debug for RequestBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestBody")
            .field("forwarded", &self.inner.is_some())
            .finish()
    }
}

impl<B: Body> Body for RequestBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().inner.as_pin_mut() {
            Some(body) => body.poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}
