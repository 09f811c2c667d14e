//! A counting origin behind an axum router, and request helpers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use std::convert::Infallible;

use axum::response::IntoResponse;
use axum::routing::{get, Route};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_service::Service;

/// An origin whose headers, body tag and delay a test chooses; it counts calls.
#[derive(Clone)]
pub struct Origin {
    pub calls: Arc<AtomicUsize>,
    headers: Arc<Vec<(&'static str, &'static str)>>,
    delay: Duration,
    tag: &'static str,
}

impl Origin {
    pub fn new(headers: &[(&'static str, &'static str)]) -> Self {
        Self {
            calls: Arc::new(AtomicUsize::new(0)),
            headers: Arc::new(headers.to_vec()),
            delay: Duration::ZERO,
            tag: "origin",
        }
    }

    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }

    /// A label in every body, to tell instances' origins apart.
    pub fn tag(mut self, tag: &'static str) -> Self {
        self.tag = tag;
        self
    }

    /// Shares the call counter with `other` (one origin behind several instances).
    pub fn sharing_calls_with(mut self, other: &Origin) -> Self {
        self.calls = other.calls.clone();
        self
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// A router serving every path through `layer` (a `CacheLayer`; any
    /// layer axum accepts).
    pub fn app<L>(&self, layer: L) -> Router
    where
        L: tower_layer::Layer<Route> + Clone + Send + Sync + 'static,
        L::Service: Service<Request<Body>> + Clone + Send + Sync + 'static,
        <L::Service as Service<Request<Body>>>::Response: IntoResponse + 'static,
        <L::Service as Service<Request<Body>>>::Error: Into<Infallible> + 'static,
        <L::Service as Service<Request<Body>>>::Future: Send + 'static,
    {
        Router::new()
            .fallback(get(handler).post(handler))
            .layer(layer)
            .with_state(self.clone())
    }
}

async fn handler(State(o): State<Origin>, uri: Uri, req_headers: HeaderMap) -> Response<Body> {
    let n = o.calls.fetch_add(1, Ordering::SeqCst) + 1;
    if !o.delay.is_zero() {
        tokio::time::sleep(o.delay).await;
    }
    let lang = req_headers
        .get("accept-language")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    let mut r = Response::new(Body::from(format!(
        "{} call={n} lang={lang} uri={uri}",
        o.tag
    )));
    for (k, v) in o.headers.iter() {
        r.headers_mut()
            .append(HeaderName::from_static(k), HeaderValue::from_static(v));
    }
    r
}

pub fn req(method: Method, uri: &str, headers: &[(&'static str, &'static str)]) -> Request<Body> {
    let mut r = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "example.test");
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.body(Body::empty()).expect("valid test request")
}

pub fn get_req(uri: &str) -> Request<Body> {
    req(Method::GET, uri, &[])
}

pub async fn send(app: &Router, r: Request<Body>) -> (StatusCode, HeaderMap, Bytes) {
    let resp = app.clone().oneshot(r).await.expect("router is infallible");
    let (parts, body) = resp.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.expect("body").to_bytes(),
    )
}

pub fn cache_status(h: &HeaderMap) -> &str {
    h.get("cache-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The `call=N` word of a body this origin answered (empty if none).
pub fn call_of(body: &[u8]) -> String {
    String::from_utf8_lossy(body)
        .split_whitespace()
        .find(|w| w.starts_with("call="))
        .unwrap_or_default()
        .to_owned()
}
