//! The named response future. A hit is `Ready` (no box, no await, and no
//! use of the inner service); every path that asks the origin is boxed, a
//! bypass included: it makes the inner service ready first.

use std::future::{poll_fn, Future};
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_util::future::BoxFuture;
use http::{HeaderName, HeaderValue, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::engine::Caller;
use crate::http::body::CacheBody;
use crate::http::cache_status::CACHE_STATUS;
use crate::http::purge::Invalidation;
use crate::http::range::RangeRequest;

const SURROGATE_KEY: HeaderName = HeaderName::from_static("surrogate-key");

pin_project! {
    /// Response future of [`CacheService`](crate::service::CacheService). `F`, the
    /// inner service's future, only names the type: a call that reaches
    /// the inner service runs in a box of its own.
    pub struct ResponseFuture<F, B, E> {
        kind: Kind<B, E>,
        strip_surrogate_key: bool,
        // A header meant for this cache alone, removed on the way out.
        strip: Option<HeaderName>,
        // Off by default; set once per call, so the hit path pays one branch.
        hide_cache_status: bool,
        // The response was built without the headers stripped on the way
        // out (a served head built for this layer): nothing to remove.
        stripped: bool,
        // The byte range to cut from the cache's answer (never a bypass's).
        range: Option<Box<RangeRequest>>,
        // Counts this request among those that may wait on the origin
        // until it is answered (never a hit: that is answered at once).
        caller: Option<Caller>,
        inner_future: PhantomData<fn() -> F>,
    }
}

enum Kind<B, E> {
    Ready {
        response: Option<Response<CacheBody<B>>>,
    },
    /// The origin's own answer to the request as sent: never cut to a range.
    Bypass {
        fut: BoxFuture<'static, Result<Response<CacheBody<B>>, E>>,
    },
    Boxed {
        fut: BoxFuture<'static, Result<Response<CacheBody<B>>, E>>,
    },
}

impl<F, B, E> std::fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Ready { .. } => "ready",
            Kind::Bypass { .. } => "bypass",
            Kind::Boxed { .. } => "boxed",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    fn of(kind: Kind<B, E>) -> Self {
        Self {
            kind,
            strip_surrogate_key: false,
            strip: None,
            hide_cache_status: false,
            stripped: false,
            range: None,
            caller: None,
            inner_future: PhantomData,
        }
    }

    pub(crate) fn ready(response: Response<CacheBody<B>>) -> Self {
        Self::of(Kind::Ready {
            response: Some(response),
        })
    }

    /// [`Self::ready`] for a response whose head already went without
    /// `Surrogate-Key` and the layer's own cache-control header, as the
    /// layer strips them: the exit skips both.
    pub(crate) fn ready_stripped(response: Response<CacheBody<B>>) -> Self {
        Self {
            stripped: true,
            ..Self::ready(response)
        }
    }

    /// The request past the cache, to `inner` as it is. The cache never
    /// holds the inner service ready between calls (a hit does not use
    /// it), so this makes it ready first. The answer goes out with
    /// `cache_status`, and an unsafe method's `invalidate` runs once its
    /// status is known.
    pub(crate) fn bypass<S, Req>(
        mut inner: S,
        req: Req,
        cache_status: HeaderValue,
        invalidate: Option<Invalidation>,
    ) -> Self
    where
        S: Service<Req, Response = Response<B>, Error = E> + Send + 'static,
        S::Future: Send + 'static,
        Req: Send + 'static,
        B: Send + 'static,
        E: Send + 'static,
    {
        let fut = Box::pin(async move {
            poll_fn(|cx| inner.poll_ready(cx)).await?;
            let (mut parts, body) = inner.call(req).await?.into_parts();
            parts.headers.insert(CACHE_STATUS, cache_status);
            if let Some(invalidation) = invalidate {
                invalidation.apply(parts.status, &parts.headers);
            }
            Ok(Response::from_parts(parts, CacheBody::inner(body)))
        });
        Self::of(Kind::Bypass { fut })
    }

    pub(crate) fn boxed(fut: BoxFuture<'static, Result<Response<CacheBody<B>>, E>>) -> Self {
        Self::of(Kind::Boxed { fut })
    }

    /// What every answer passes on its way out, set once per call in place
    /// (the future is large; a chain of by-value setters moved it each
    /// time): `strip_surrogate_key` removes `Surrogate-Key` (tags are for
    /// the cache, indexed when it stores, not for clients), `strip` the
    /// user's own targeted cache-control header, `hide` takes off
    /// `Cache-Status` (and logs it). `range` is cut from the cache's
    /// answer; a bypass is the origin's own answer to the request as sent,
    /// `Range` and all, and is left alone. A response built without the
    /// stripped headers ([`Self::ready_stripped`]) skips both removals.
    pub(crate) fn set_exit(
        &mut self,
        range: Option<RangeRequest>,
        strip_surrogate_key: bool,
        strip: Option<HeaderName>,
        hide: bool,
    ) {
        if !matches!(self.kind, Kind::Bypass { .. }) {
            self.range = range.map(Box::new);
        }
        if !self.stripped {
            self.strip_surrogate_key = strip_surrogate_key;
            self.strip = strip;
        }
        self.hide_cache_status = hide;
    }

    /// Whether this answer may wait on the origin (anything but an answer
    /// made at once).
    pub(crate) fn may_wait(&self) -> bool {
        !matches!(self.kind, Kind::Ready { .. })
    }

    /// Count the request among the origin's possible callers until it is
    /// answered.
    pub(crate) fn set_caller(&mut self, caller: Caller) {
        self.caller = Some(caller);
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E> {
    type Output = Result<Response<CacheBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(Self::poll_kind(this.kind, cx))?;
        this.caller.take();
        if let Some(range) = this.range.take() {
            response = range.apply(response);
        }
        if *this.strip_surrogate_key {
            response.headers_mut().remove(SURROGATE_KEY);
        }
        if let Some(name) = this.strip.as_ref() {
            response.headers_mut().remove(name);
        }
        if *this.hide_cache_status {
            if let Some(v) = response.headers_mut().remove(CACHE_STATUS) {
                let v = String::from_utf8_lossy(v.as_bytes());
                tracing::info!(target: "herdguard::cache_status", cache_status = %v);
            }
        }
        Poll::Ready(Ok(response))
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    fn poll_kind(
        kind: &mut Kind<B, E>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<CacheBody<B>>, E>> {
        match kind {
            Kind::Ready { response } => match response.take() {
                Some(r) => Poll::Ready(Ok(r)),
                // Polled after completion: a contract violation by the caller.
                None => Poll::Pending,
            },
            Kind::Bypass { fut } | Kind::Boxed { fut } => fut.as_mut().poll(cx),
        }
    }
}
