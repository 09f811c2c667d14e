//! The upstream as the cache layer's inner service: what a forwarded
//! request carries (no hop-by-hop fields, the forwarding headers, `Via`)
//! and how a failed or slow upstream answers (502, 504, never an error).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use herdguard::service::RequestBody;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use tower_service::Service;

use super::body::ProxyBody;
use super::forwarded::{self, Cidr};
use super::normalize::strip_hop_by_hop;
use super::upstream::{self, Connector};
use super::{append_via, status, Sent, X_FORWARDED_HOST};

/// The upstream as a Tower service, the cache layer's inner service.
/// Cloned on every request (each request clones the layer's service, and
/// the layer clones this for each call that reaches the upstream), so it
/// is one `Arc`: a hyper `Client` clone is a dozen reference counts, which
/// the profile of an L1 hit showed. Always ready.
#[derive(Debug, Clone)]
pub struct Origin(pub Arc<Upstream>);

#[derive(Debug)]
pub struct Upstream {
    pub client: Client<Connector, ProxyBody>,
    pub upstream: Uri,
    pub trusted: Arc<[Cidr]>,
    pub response_timeout: Duration,
}

type OriginFuture = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

impl Service<Request<RequestBody<ProxyBody>>> for Origin {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    // Boxed: only misses and bypasses get here, and each costs a round trip.
    type Future = OriginFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The pool queues; the cache layer bounds how many calls run.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<RequestBody<ProxyBody>>) -> Self::Future {
        // A request the cache built has an empty body: ProxyBody's default.
        let req = req.map(|b| b.into_inner().unwrap_or_default());
        let origin = self.clone();
        Box::pin(async move { Ok(origin.forward(req).await) })
    }
}

impl Origin {
    /// Send `req` upstream; an unreachable upstream is a 502, a slow one a
    /// 504, never an error.
    async fn forward(&self, req: Request<ProxyBody>) -> Response<ProxyBody> {
        let this = &*self.0;
        let (mut parts, body) = req.into_parts();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut uri = Uri::clone(&this.upstream).into_parts();
        uri.path_and_query = path.parse().ok();
        let Ok(uri) = Uri::from_parts(uri) else {
            return status(StatusCode::BAD_REQUEST, "bad request target");
        };
        let (peer, clock) = match parts.extensions.remove::<Sent>() {
            Some(sent) => (sent.peer, sent.clock),
            None => (None, None),
        };
        let original_host = parts.headers.get(header::HOST).cloned();
        let chunked = parts.headers.contains_key(header::TRANSFER_ENCODING);
        strip_hop_by_hop(&mut parts.headers);
        if chunked && !parts.headers.contains_key(header::CONTENT_LENGTH) {
            // The client re-frames the body, but assumes a GET of unknown length
            // has none: say it has one, or the body would be dropped.
            parts.headers.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
        }
        forwarded::apply(
            &mut parts.headers,
            peer,
            &this.trusted,
            original_host.as_ref(),
        );
        match original_host {
            Some(host) => parts.headers.insert(X_FORWARDED_HOST, host),
            // No host of our own to tell: never pass on a client's claim.
            None => parts.headers.remove(&X_FORWARDED_HOST),
        };
        append_via(&mut parts.headers);
        parts.uri = uri;
        parts.version = http::Version::HTTP_11;
        let start = Instant::now();
        let sent = this.client.request(Request::from_parts(parts, body));
        let result = tokio::time::timeout(this.response_timeout, sent).await;
        if let Some(clock) = clock {
            let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX - 1);
            clock.0.store(us + 1, std::sync::atomic::Ordering::Relaxed);
        }
        match result {
            Ok(Ok(response)) => {
                let (mut parts, body) = response.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                // Before the cache stores it: a hit then carries this hop
                // already (see `to_client`).
                append_via(&mut parts.headers);
                Response::from_parts(parts, ProxyBody::Incoming(body))
            }
            Ok(Err(error)) => {
                tracing::warn!(error = %error_chain(&error), "upstream request failed");
                if upstream::is_timeout(&error) {
                    status(StatusCode::GATEWAY_TIMEOUT, "upstream connect timed out")
                } else {
                    status(StatusCode::BAD_GATEWAY, "upstream unreachable")
                }
            }
            Err(_) => {
                tracing::warn!(timeout = ?this.response_timeout, "upstream response timed out");
                status(StatusCode::GATEWAY_TIMEOUT, "upstream timed out")
            }
        }
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}
