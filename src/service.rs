//! The Tower service: HTTP request in, HTTP response out. It never produces an
//! error of its own (`type Error = S::Error`); every cache problem fails open.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use tokio::sync::oneshot;
use tower_service::Service;

use crate::body::CacheBody;
use crate::engine::{Compute, ComputeFuture, Fill, Resolved};
use crate::entry::CachedResponse;
use crate::error::{BoxError, Error};
use crate::future::ResponseFuture;
use crate::key::{CacheKey, KeyHasher};
use crate::layer::LayerState;
use crate::metrics::Source;
use crate::policy::{self, Forward, RequestVerdict, ResponseVerdict};
use crate::store::memory::{Probe, Stored};

/// The RFC 9211 response header.
pub(crate) const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// Request headers dropped from the leader's origin request, so the stored
/// response is a complete one rather than a 304 or a fragment.
const CONDITIONAL: [HeaderName; 5] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
];

/// Hop-by-hop and per-response headers never stored with an entry.
const NOT_STORED: [HeaderName; 8] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::TRAILER,
    header::PROXY_AUTHENTICATE,
    header::AGE,
    CACHE_STATUS,
];

/// The caching service produced by [`CacheLayer`](crate::CacheLayer).
#[derive(Debug, Clone)]
pub struct CacheService<S> {
    inner: S,
    state: Arc<LayerState>,
}

impl<S> CacheService<S> {
    pub(crate) fn new(inner: S, state: Arc<LayerState>) -> Self {
        Self { inner, state }
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for CacheService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Default + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<CacheBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The instance that was polled ready is the one we may call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let state = &self.state;

        if let RequestVerdict::Bypass(fwd) = policy::classify_request(req.method(), req.headers()) {
            let invalidate = policy::invalidates(req.method())
                .then(|| (Arc::clone(state), state.keys_for_uri_of(&req)));
            state.engine.counters.record(Source::Bypass);
            let status = state.status_fwd(fwd, None);
            return ResponseFuture::bypass(inner.call(req), status, invalidate);
        }

        let head = req.method() == Method::HEAD;
        let key = state.key_for(&req);
        match state.engine.probe(&key) {
            Probe::Fresh(entry) if entry.value.vary_matches(req.headers()) => {
                state.engine.counters.record(Source::Hit);
                ResponseFuture::ready(state.respond(&entry, head, Source::Hit))
            }
            Probe::Stale(entry) if entry.value.vary_matches(req.headers()) => {
                state.engine.counters.record(Source::Stale);
                let refresh =
                    OriginCall::new(inner, refresh_request(&req), Arc::clone(state), None);
                state.engine.refresh_in_background(key, refresh);
                ResponseFuture::ready(state.respond(&entry, head, Source::Stale))
            }
            Probe::Fresh(_) | Probe::Stale(_) => {
                state.engine.counters.record(Source::Bypass);
                let status = state.status_fwd(Forward::VaryMiss, None);
                ResponseFuture::bypass(inner.call(req), status, None)
            }
            Probe::Pass => {
                state.engine.counters.record(Source::Bypass);
                let status = state.status_fwd(Forward::UriMiss, Some("hit-for-pass"));
                ResponseFuture::bypass(inner.call(req), status, None)
            }
            Probe::Miss => {
                ResponseFuture::boxed(Box::pin(miss(Arc::clone(state), key, head, inner, req)))
            }
        }
    }
}

/// Lead or follow the flight for `key`, then answer from its outcome.
async fn miss<S, ReqB, ResB>(
    state: Arc<LayerState>,
    key: CacheKey,
    head: bool,
    inner: S,
    req: Request<ReqB>,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let request_headers = req.headers().clone();
    let (passthrough_tx, mut passthrough_rx) = oneshot::channel();
    let error_slot = Arc::new(Mutex::new(None));
    let leader = OriginCall::new(
        inner,
        req,
        Arc::clone(&state),
        Some(Initiator {
            passthrough: passthrough_tx,
            error: Arc::clone(&error_slot),
        }),
    );
    let mut compute = Some(leader);
    let resolved = state.engine.resolve(key, &mut compute).await;
    let counters = &state.engine.counters;
    match resolved {
        Resolved::Value { entry, source } => {
            // A follower must never get a variant made for other header values.
            if compute.is_none() || entry.value.vary_matches(&request_headers) {
                counters.record(source);
                Ok(state.respond(&entry, head, source))
            } else {
                direct(&state, compute, state.status_fwd(Forward::VaryMiss, None)).await
            }
        }
        Resolved::Pass(Some(value)) => {
            counters.record(Source::Miss);
            Ok(state.respond_uncached(value, head))
        }
        Resolved::Pass(None) => {
            if let Ok(mut response) = passthrough_rx.try_recv() {
                counters.record(Source::Miss);
                let status = state.status_fwd(Forward::UriMiss, Some("too-large"));
                response.headers_mut().insert(CACHE_STATUS, status);
                return Ok(response);
            }
            direct(
                &state,
                compute,
                state.status_fwd(Forward::UriMiss, Some("uncacheable")),
            )
            .await
        }
        Resolved::Failed(error) => {
            // The inner service's own error goes back to the caller that made it.
            if let Some(e) = error_slot
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
            {
                counters.record_error();
                return Err(e);
            }
            counters.record_error();
            Ok(state.error_response(&error))
        }
        Resolved::WaitTimedOut => {
            let Some(_permit) = state.engine.fallback_permit().await else {
                counters.record_error();
                return Ok(state.error_response(&Error::Overloaded));
            };
            direct(
                &state,
                compute,
                state.status_fwd(Forward::UriMiss, Some("wait-timeout")),
            )
            .await
        }
    }
}

/// Call the origin for this request alone, streaming, storing nothing.
async fn direct<S, ReqB, ResB>(
    state: &LayerState,
    call: Option<OriginCall<S, ReqB, ResB, S::Error>>,
    status: HeaderValue,
) -> Result<Response<CacheBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    let Some(OriginCall { mut inner, req, .. }) = call else {
        // Only the leader has no call left, and a leader always has an outcome.
        state.engine.counters.record_error();
        return Ok(state.error_response(&Error::Aborted));
    };
    state.engine.counters.record(Source::Bypass);
    state.engine.counters.origin_call();
    poll_fn(|cx| inner.poll_ready(cx)).await?;
    let response = inner.call(req).await?;
    let (mut parts, body) = response.into_parts();
    parts.headers.insert(CACHE_STATUS, status);
    Ok(Response::from_parts(parts, CacheBody::inner(body)))
}

/// A GET for a background refresh, rebuilt from the request that found the
/// entry stale (its body, if any, is not needed for GET or HEAD).
fn refresh_request<B: Default>(req: &Request<B>) -> Request<B> {
    let mut r = Request::new(B::default());
    *r.method_mut() = Method::GET;
    *r.uri_mut() = req.uri().clone();
    *r.version_mut() = req.version();
    *r.headers_mut() = req.headers().clone();
    *r.extensions_mut() = req.extensions().clone();
    r
}

/// What only the request that started a flight receives.
struct Initiator<ResB, E> {
    /// A response too large to buffer, streamed to this request alone.
    passthrough: oneshot::Sender<Response<CacheBody<ResB>>>,
    /// The inner service's error, handed back as-is.
    error: Arc<Mutex<Option<E>>>,
}

/// One origin request, run as a flight's computation or directly.
struct OriginCall<S, ReqB, ResB, E> {
    inner: S,
    req: Request<ReqB>,
    state: Arc<LayerState>,
    initiator: Option<Initiator<ResB, E>>,
}

impl<S, ReqB, ResB, E> OriginCall<S, ReqB, ResB, E> {
    fn new(
        inner: S,
        req: Request<ReqB>,
        state: Arc<LayerState>,
        initiator: Option<Initiator<ResB, E>>,
    ) -> Self {
        Self {
            inner,
            req,
            state,
            initiator,
        }
    }
}

/// The origin answered with an error of the inner service's own type.
#[derive(Debug)]
struct OriginFailed;

impl std::fmt::Display for OriginFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the inner service returned an error")
    }
}

impl std::error::Error for OriginFailed {}

impl<S, ReqB, ResB> Compute<CachedResponse> for OriginCall<S, ReqB, ResB, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    fn start(self) -> ComputeFuture<CachedResponse> {
        Box::pin(self.run())
    }
}

impl<S, ReqB, ResB> OriginCall<S, ReqB, ResB, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    async fn run(self) -> Result<Fill<CachedResponse>, BoxError> {
        let OriginCall {
            mut inner,
            mut req,
            state,
            initiator,
        } = self;
        let (passthrough, error_slot) = match initiator {
            Some(i) => (Some(i.passthrough), Some(i.error)),
            None => (None, None),
        };
        // HEAD is filled with a GET so the stored entry can answer both.
        *req.method_mut() = Method::GET;
        for name in &CONDITIONAL {
            req.headers_mut().remove(name);
        }
        let had_authorization = req.headers().contains_key(header::AUTHORIZATION);
        let request_headers = req.headers().clone();

        let request_time = SystemTime::now();
        let result = match poll_fn(|cx| inner.poll_ready(cx)).await {
            Ok(()) => inner.call(req).await,
            Err(e) => Err(e),
        };
        let response = match result {
            Ok(r) => r,
            Err(e) => {
                if let Some(slot) = error_slot {
                    *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
                }
                return Err(Box::new(OriginFailed));
            }
        };
        let response_time = SystemTime::now();
        let (mut parts, body) = response.into_parts();
        let verdict = policy::classify_response(
            &state.http.rules,
            had_authorization,
            parts.status,
            &parts.headers,
            request_time,
            response_time,
        );

        let limit = state.http.max_body_bytes;
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|len| len > limit as u64) {
            if let Some(tx) = passthrough {
                let _ = tx.send(Response::from_parts(parts, CacheBody::inner(body)));
            }
            return Ok(Fill::Pass(None));
        }

        let mut body = Box::pin(body);
        let mut chunks: VecDeque<Bytes> = VecDeque::new();
        let mut total = 0usize;
        while let Some(frame) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            let frame = frame.map_err(Into::into)?;
            // Trailers are not stored; the data is.
            let Ok(data) = frame.into_data() else {
                continue;
            };
            total += data.len();
            chunks.push_back(data);
            if total > limit {
                if let Some(tx) = passthrough {
                    let response = Response::from_parts(parts, CacheBody::prefixed(chunks, body));
                    let _ = tx.send(response);
                }
                return Ok(Fill::Pass(None));
            }
        }
        let body = join(chunks, total);

        let vary = match policy::vary_names(&parts.headers) {
            Some(names) => names
                .into_iter()
                .map(|n| {
                    let values = request_headers.get_all(&n).iter().cloned().collect();
                    (n, values)
                })
                .collect(),
            None => Vec::new(),
        };
        strip_not_stored(&mut parts.headers);
        let mut value = CachedResponse {
            status: parts.status,
            headers: parts.headers,
            body,
            vary,
            initial_age: 0,
        };
        Ok(match verdict {
            ResponseVerdict::Store {
                fresh_for,
                stale_for,
                initial_age,
            } => {
                value.initial_age = initial_age.as_secs().min(u32::MAX as u64) as u32;
                Fill::Store {
                    value,
                    fresh_for,
                    stale_for,
                }
            }
            ResponseVerdict::Share => Fill::Share(value),
            ResponseVerdict::Pass(reason) => {
                tracing::debug!(reason, "response is not cacheable");
                Fill::Pass(Some(value))
            }
        })
    }
}

fn join(mut chunks: VecDeque<Bytes>, total: usize) -> Bytes {
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

fn strip_not_stored(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in NOT_STORED.iter().chain(named.iter()) {
        headers.remove(name);
    }
    headers.remove("keep-alive");
}

impl LayerState {
    /// The cache key of a request: method (HEAD shares GET's entry), host
    /// name (lowercase, without port: instances of one service listen on
    /// different ports but serve the same resources), path and query, whether
    /// it carried Authorization, and the configured key headers.
    pub(crate) fn key_for<B>(&self, req: &Request<B>) -> CacheKey {
        self.key_with_auth(req, req.headers().contains_key(header::AUTHORIZATION))
    }

    fn key_with_auth<B>(&self, req: &Request<B>, authorized: bool) -> CacheKey {
        let uri = effective_uri(req);
        let authority = uri
            .authority()
            .map(|a| a.as_str().as_bytes())
            .or_else(|| req.headers().get(header::HOST).map(HeaderValue::as_bytes));
        let mut h = KeyHasher::new();
        h.part(b"GET")
            .opt_part_lowercase(authority.map(host_name))
            .part(uri.path().as_bytes())
            .opt_part(uri.query().map(str::as_bytes))
            .part(&[u8::from(authorized)]);
        for name in &self.http.key_headers {
            h.part(name.as_str().as_bytes());
            for v in req.headers().get_all(name) {
                h.part(v.as_bytes());
            }
        }
        h.finish()
    }

    /// The entries an unsafe request to this URI invalidates.
    pub(crate) fn keys_for_uri_of<B>(&self, req: &Request<B>) -> Vec<CacheKey> {
        vec![
            self.key_with_auth(req, false),
            self.key_with_auth(req, true),
        ]
    }

    pub(crate) fn invalidate(&self, key: &CacheKey) {
        self.engine.invalidate(key);
    }

    fn status(&self, params: std::fmt::Arguments<'_>) -> HeaderValue {
        let s = format!("{}; {}", self.http.cache_name, params);
        // The cache name is validated as a token when the layer is built.
        HeaderValue::from_str(&s).unwrap_or_else(|_| HeaderValue::from_static("herdguard"))
    }

    pub(crate) fn status_fwd(&self, fwd: Forward, detail: Option<&str>) -> HeaderValue {
        match detail {
            Some(d) => self.status(format_args!("fwd={}; detail={d}", fwd.as_str())),
            None => self.status(format_args!("fwd={}", fwd.as_str())),
        }
    }

    /// A response built from a stored (or shared) entry.
    pub(crate) fn respond<B>(
        &self,
        entry: &Stored<CachedResponse>,
        head: bool,
        source: Source,
    ) -> Response<CacheBody<B>> {
        let value = &entry.value;
        let status = match source {
            Source::Hit => self.status(format_args!("hit; ttl={}", entry.ttl_secs())),
            Source::Stale => {
                self.status(format_args!("hit; ttl={}; detail=stale", entry.ttl_secs()))
            }
            Source::Miss => self.status(format_args!(
                "fwd=uri-miss; fwd-status={}; stored; ttl={}",
                value.status.as_u16(),
                entry.ttl_secs()
            )),
            Source::Coalesced => self.status(format_args!(
                "fwd=uri-miss; fwd-status={}; collapsed",
                value.status.as_u16()
            )),
            Source::Bypass => self.status(format_args!(
                "fwd=uri-miss; fwd-status={}",
                value.status.as_u16()
            )),
        };
        let stored = !entry.meta.fresh_for.is_zero() || !entry.meta.stale_for.is_zero();
        let status = if source == Source::Miss && !stored {
            self.status(format_args!(
                "fwd=uri-miss; fwd-status={}",
                value.status.as_u16()
            ))
        } else {
            status
        };
        let age = u64::from(value.initial_age) + entry.age().as_secs();
        self.build(value, head, status, Some(age))
    }

    /// A response the leader may use but nobody else.
    fn respond_uncached<B>(&self, value: CachedResponse, head: bool) -> Response<CacheBody<B>> {
        let status = self.status(format_args!(
            "fwd=uri-miss; fwd-status={}; detail=uncacheable",
            value.status.as_u16()
        ));
        self.build(&value, head, status, None)
    }

    fn build<B>(
        &self,
        value: &CachedResponse,
        head: bool,
        status: HeaderValue,
        age: Option<u64>,
    ) -> Response<CacheBody<B>> {
        let body = if head {
            CacheBody::empty()
        } else {
            CacheBody::full(value.body.clone())
        };
        let mut response = Response::new(body);
        *response.status_mut() = value.status;
        *response.headers_mut() = value.headers.clone();
        let headers = response.headers_mut();
        if let Some(age) = age {
            headers.insert(header::AGE, HeaderValue::from(age));
        }
        headers.insert(CACHE_STATUS, status);
        response
    }

    /// The answer when a shared computation failed and nothing can be served.
    pub(crate) fn error_response<B>(&self, error: &Error) -> Response<CacheBody<B>> {
        let (code, detail) = match error {
            Error::OriginTimeout => (StatusCode::GATEWAY_TIMEOUT, "origin-timeout"),
            Error::Overloaded => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            Error::Panicked => (StatusCode::BAD_GATEWAY, "origin-panic"),
            Error::Aborted => (StatusCode::BAD_GATEWAY, "origin-aborted"),
            _ => (StatusCode::BAD_GATEWAY, "origin-error"),
        };
        let mut response = Response::new(CacheBody::empty());
        *response.status_mut() = code;
        let status = self.status(format_args!("fwd=uri-miss; collapsed; detail={detail}"));
        response.headers_mut().insert(CACHE_STATUS, status);
        response
    }
}

/// The host name of an authority: no userinfo, no port; `[v6]` kept whole.
fn host_name(authority: &[u8]) -> &[u8] {
    let host = match authority.iter().rposition(|&b| b == b'@') {
        Some(at) => &authority[at + 1..],
        None => authority,
    };
    if host.first() == Some(&b'[') {
        return match host.iter().position(|&b| b == b']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    match host.iter().rposition(|&b| b == b':') {
        Some(colon) => &host[..colon],
        None => host,
    }
}

/// The URI as the client sent it: axum's nested routers strip their prefix,
/// and two nested routes must not share a key.
fn effective_uri<B>(req: &Request<B>) -> &http::Uri {
    #[cfg(feature = "axum")]
    if let Some(original) = req.extensions().get::<axum::extract::OriginalUri>() {
        return &original.0;
    }
    req.uri()
}

#[cfg(test)]
mod tests {
    use super::host_name;

    /// Ports and userinfo are not part of the host; IPv6 brackets are kept.
    #[test]
    fn host_name_strips_port_and_userinfo() {
        assert_eq!(host_name(b"example.com:8080"), b"example.com");
        assert_eq!(host_name(b"user:pw@example.com:1"), b"example.com");
        assert_eq!(host_name(b"[::1]:3000"), b"[::1]");
        assert_eq!(host_name(b"[::1"), b"[::1");
        assert_eq!(host_name(b"plain"), b"plain");
    }
}
