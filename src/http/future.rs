//! The named response future. A hit is `Ready` (no box, no await); a bypass
//! wraps the inner future; only the miss path is boxed.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_util::future::BoxFuture;
use http::{HeaderName, HeaderValue, Response};
use pin_project_lite::pin_project;

use crate::http::body::CacheBody;
use crate::http::cache_status::CACHE_STATUS;
use crate::http::purge::Invalidation;
use crate::http::range::RangeRequest;

const SURROGATE_KEY: HeaderName = HeaderName::from_static("surrogate-key");

pin_project! {
    /// Response future of [`CacheService`](crate::CacheService).
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        kind: Kind<F, B, E>,
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
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B, E> {
        Ready { response: Option<Response<CacheBody<B>>> },
        Bypass {
            #[pin]
            fut: F,
            cache_status: Option<HeaderValue>,
            invalidate: Option<Invalidation>,
        },
        Boxed { fut: BoxFuture<'static, Result<Response<CacheBody<B>>, E>> },
    }
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
    pub(crate) fn ready(response: Response<CacheBody<B>>) -> Self {
        Self {
            kind: Kind::Ready {
                response: Some(response),
            },
            strip_surrogate_key: false,
            strip: None,
            hide_cache_status: false,
            stripped: false,
            range: None,
        }
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

    pub(crate) fn bypass(
        fut: F,
        cache_status: HeaderValue,
        invalidate: Option<Invalidation>,
    ) -> Self {
        Self {
            kind: Kind::Bypass {
                fut,
                cache_status: Some(cache_status),
                invalidate,
            },
            strip_surrogate_key: false,
            strip: None,
            hide_cache_status: false,
            stripped: false,
            range: None,
        }
    }

    pub(crate) fn boxed(fut: BoxFuture<'static, Result<Response<CacheBody<B>>, E>>) -> Self {
        Self {
            kind: Kind::Boxed { fut },
            strip_surrogate_key: false,
            strip: None,
            hide_cache_status: false,
            stripped: false,
            range: None,
        }
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
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<CacheBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(Self::poll_kind(this.kind, cx))?;
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

impl<F, B, E> ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    fn poll_kind(
        kind: Pin<&mut Kind<F, B, E>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<CacheBody<B>>, E>> {
        match kind.project() {
            KindProj::Ready { response } => match response.take() {
                Some(r) => Poll::Ready(Ok(r)),
                // Polled after completion: a contract violation by the caller.
                None => Poll::Pending,
            },
            KindProj::Bypass {
                fut,
                cache_status,
                invalidate,
            } => {
                let response = ready!(fut.poll(cx))?;
                let (mut parts, body) = response.into_parts();
                if let Some(v) = cache_status.take() {
                    parts.headers.insert(CACHE_STATUS, v);
                }
                if let Some(invalidation) = invalidate.take() {
                    invalidation.apply(parts.status, &parts.headers);
                }
                Poll::Ready(Ok(Response::from_parts(parts, CacheBody::inner(body))))
            }
            KindProj::Boxed { fut } => fut.as_mut().poll(cx),
        }
    }
}
