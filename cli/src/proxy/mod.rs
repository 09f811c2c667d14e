//! The caching reverse proxy behind `herdguard proxy`, built on herdguard's
//! public API only. The `reverse_proxy` example and the tests run this same
//! code, so there is one proxy. It must not use anything outside `proxy/`
//! (no flags, no diagnostics: those are the binary's).
//!
//! - Every method and every end-to-end header is forwarded; hop-by-hop
//!   headers (RFC 9110 §7.6.1, plus those the Connection header names) are
//!   not, and they are removed before the cache computes its key. Bodies
//!   stream both ways. `Via` is appended both ways.
//! - The client's host, lowercased and with its port, is the host in the
//!   cache key and exactly what the upstream is told, in both `Host` and
//!   `X-Forwarded-Host` (so links it builds from either match the key; an
//!   incoming `X-Forwarded-Host` is never kept, even from a trusted proxy).
//!   A host RFC 9112 §3.2 / RFC 9113 §8.3.1 calls invalid gets a 400:
//!   userinfo (`evil@app.test`, in `Host` or h2 `:authority`), characters or
//!   a port outside the grammar, an empty host, none on HTTP/1.1 or h2, two
//!   `Host` headers, an absolute-form target or `:authority` that disagrees
//!   with `Host`. (The grammar is the layer's own, [`herdguard::service::host_is_valid`], so the
//!   proxy refuses exactly what the layer would pass by.) An HTTP/1.0 request without a
//!   host gets the upstream's own as `Host`.
//! - `Forwarded`, `X-Forwarded-For` / `-Proto`: from a peer in
//!   `trusted_proxies`, the incoming chains are kept (this hop appended) and
//!   the proto kept; from any other peer they are replaced by what this
//!   connection shows, and every other forwarding header (`X-Forwarded-*`,
//!   `X-Host`, `Front-End-Https`, `X-Original-URL`, `X-Rewrite-URL`) is
//!   removed before the cache keys the request.
//! - A request transfer coding other than `chunked` gets a 501 (RFC 9112
//!   §6.1): it is never forwarded under another label.
//! - GET and HEAD go through one [`CacheLayer`]: one upstream request per key,
//!   RFC 9111 semantics, `Cache-Status` on every response, also on the 502
//!   (upstream unreachable) and 504 (upstream too slow) the proxy makes.
//! - Purge is off unless a purge token is set. Then, with the token in
//!   `X-Purge-Token`: `PURGE /path?query` (Host names the site) removes every
//!   stored variant of that URL; `POST /.herdguard/purge/tag/{tag}` removes
//!   every entry whose response carried `tag` in `Surrogate-Key`. With
//!   `Soft-Purge: 1` (Fastly's convention) either marks the entries stale
//!   instead ([`CacheLayer::soft_purge_url`]): one refresh, everyone served
//!   stale meanwhile, within the entry's stale window. The
//!   answer says what happened: 200 when the purge is done everywhere (every
//!   instance acknowledged dropping its copies), 202 when it is done in Redis
//!   but some instance did not acknowledge in time (its copies end with its L1
//!   lifetime), 503
//!   when it is done on this instance only because Redis was unreachable
//!   (retry it), 500 when it failed part-way or its outcome in Redis is
//!   unknown (a timeout; retry it too).

pub mod access_log;
pub mod body;
mod conn;
pub mod forwarded;
mod hot_keys;
mod normalize;
mod origin;
use origin::{Origin, Upstream};
pub mod server;
pub mod status_view;
pub mod upstream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use herdguard::service::CacheService;
use herdguard::CacheLayer;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use tower_layer::Layer;
use tower_service::Service;

use access_log::AccessLog;
use body::{ClientBody, ProxyBody};
pub use forwarded::Peer;
use forwarded::{append_list, Cidr};
use normalize::{Hop, Refusal};
use upstream::{Connector, UpstreamOptions};

const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

const VIA: &str = "1.1 herdguard";
const PURGE_TAG_PREFIX: &str = "/.herdguard/purge/tag/";

/// What the proxy does with requests (the server's own settings are in
/// [`server::ServerConfig`]).
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Scheme and authority of the upstream, e.g. `http://127.0.0.1:8000`.
    pub upstream: Uri,
    /// Enables PURGE and the tag purge route when set.
    pub purge_token: Option<String>,
    /// Peers whose X-Forwarded-For / -Proto are kept.
    pub trusted_proxies: Vec<Cidr>,
    pub upstream_options: UpstreamOptions,
    /// One line per request through this handle (see [`access_log`]); off
    /// when None.
    pub access_log: Option<AccessLog>,
}

impl ProxyConfig {
    /// Defaults for everything but the upstream: no purge, no trusted proxies.
    pub fn new(upstream: Uri) -> Self {
        Self {
            upstream,
            purge_token: None,
            trusted_proxies: Vec::new(),
            upstream_options: UpstreamOptions::default(),
            access_log: None,
        }
    }
}

/// Where the upstream call made for a request notes how long it took: in
/// the request's extensions, which the cache copies onto the requests it
/// builds, since a stored response is rebuilt without the upstream's
/// extensions. Only made when the access log is on. Microseconds + 1; 0 is
/// "no upstream call" (a hit, or a waiter served by another's call).
#[derive(Debug, Clone, Default)]
struct UpstreamClock(Arc<std::sync::atomic::AtomicU64>);

/// What `Origin` needs to know about a request beyond its head, put in its
/// extensions (the cache copies them onto the requests it builds): one
/// value, so one insert.
#[derive(Debug, Clone)]
struct Sent {
    peer: Option<Peer>,
    clock: Option<UpstreamClock>,
}

/// The proxy: normalize, purge, cache, upstream. Cheap to clone (Arcs).
#[derive(Debug, Clone)]
pub struct Proxy {
    cached: CacheService<Origin>,
    cache: CacheLayer,
    purge_token: Option<Arc<str>>,
    access_log: Option<AccessLog>,
    trusted: Arc<[Cidr]>,
}

impl Proxy {
    /// # Errors
    /// The upstream is not `http(s)://host[:port]`, or its TLS setup failed.
    pub fn new(config: ProxyConfig, cache: CacheLayer) -> Result<Self, String> {
        let scheme = config.upstream.scheme_str();
        if !matches!(scheme, Some("http" | "https")) || config.upstream.authority().is_none() {
            return Err("the upstream must be http://host[:port] or https://host[:port]".into());
        }
        let connector = Connector::new(&config.upstream, &config.upstream_options)?;
        if config.access_log.is_some() {
            access_log::register_metric();
        }
        let client = Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(config.upstream_options.idle_timeout)
            .pool_max_idle_per_host(config.upstream_options.max_idle)
            .pool_timer(hyper_util::rt::TokioTimer::new())
            .build(connector);
        let trusted: Arc<[Cidr]> = config.trusted_proxies.into();
        let origin = Origin(Arc::new(Upstream {
            client,
            upstream: config.upstream,
            trusted: Arc::clone(&trusted),
            response_timeout: config.upstream_options.response_timeout,
        }));
        Ok(Self {
            cached: cache.layer(origin),
            cache,
            purge_token: config.purge_token.map(Into::into),
            access_log: config.access_log,
            trusted,
        })
    }

    /// The layer this proxy caches with.
    pub fn cache(&self) -> &CacheLayer {
        &self.cache
    }

    /// Answer one request; never fails (upstream trouble is a 502/504).
    /// The client is the [`Peer`] in its extensions, if any.
    pub async fn handle(self, req: Request<ProxyBody>) -> Response<ClientBody> {
        let peer = req.extensions().get::<Peer>().copied();
        self.session(peer).handle(req).await
    }

    /// What every request on one connection from `peer` shares: worked out
    /// once (trust, scheme), not per request.
    pub fn session(self, peer: Option<Peer>) -> Session {
        let hop = Hop {
            trusted: forwarded::is_trusted(peer, &self.trusted),
            proto: peer.map(forwarded::scheme),
        };
        Session {
            proxy: self,
            peer,
            hop,
        }
    }
}

/// One client connection's view of the proxy (see [`Proxy::session`]).
#[derive(Debug)]
pub struct Session {
    proxy: Proxy,
    peer: Option<Peer>,
    hop: Hop,
}

impl Session {
    /// Answer one request on this connection; never fails (upstream
    /// trouble is a 502/504).
    pub async fn handle(&self, mut req: Request<ProxyBody>) -> Response<ClientBody> {
        let start = Instant::now();
        // Copies for the log line only when it will be written.
        let clock = self
            .proxy
            .access_log
            .as_ref()
            .map(|_| UpstreamClock::default());
        // The path only: a whole `Uri` costs more to drop.
        let logged = clock.as_ref().map(|clock| {
            let path = req.uri().path_and_query().cloned();
            (req.method().clone(), path, clock.clone())
        });
        if self.peer.is_some() || clock.is_some() {
            let peer = self.peer;
            req.extensions_mut().insert(Sent { peer, clock });
        }
        let response = self.answer(req).await;
        if let (Some((method, path, clock)), Some(log)) = (logged, &self.proxy.access_log) {
            let upstream_us = match clock.0.load(std::sync::atomic::Ordering::Relaxed) {
                0 => None,
                us => Some(us - 1),
            };
            log.record(&access_log::Entry {
                method: method.as_str(),
                // As `Uri::path`: empty for an authority-form target.
                path: path.as_ref().map_or("", |p| p.path()),
                status: response.status().as_u16(),
                cache_status: response
                    .headers()
                    .get(&CACHE_STATUS)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-"),
                upstream_us,
                total_us: u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX),
            });
        }
        response
    }

    async fn answer(&self, req: Request<ProxyBody>) -> Response<ClientBody> {
        // The cache must key exactly the request the upstream will see.
        let req = match normalize(req, self.hop) {
            Ok(req) => req,
            Err((code, why)) => return local(status(code, why)),
        };
        let purge = self.proxy.purge(&req);
        match purge {
            None => {}
            Some(PurgeAnswer::Now(response)) => return local(response),
            Some(PurgeAnswer::Wait(handle, done, what)) => {
                return local(purge_status(handle.await, done, &what))
            }
        }
        // `call` takes `&mut`: a clone (two reference counts). No
        // `poll_ready` first: `CacheService` is always ready.
        let response = match self.proxy.cached.clone().call(req).await {
            Ok(r) => r.map(|body| ClientBody::Cached { body }),
            Err(never) => match never {},
        };
        to_client(response)
    }
}

impl Proxy {
    /// Answer a purge request, if this is one and purging is on.
    fn purge(&self, req: &Request<ProxyBody>) -> Option<PurgeAnswer> {
        let is_purge = req.method().as_str() == "PURGE";
        let tag = (req.method() == Method::POST)
            .then(|| req.uri().path().strip_prefix(PURGE_TAG_PREFIX))
            .flatten();
        if !is_purge && tag.is_none() {
            return None;
        }
        let Some(token) = &self.purge_token else {
            // Off: PURGE is not a method this proxy knows; the tag route falls
            // through to the upstream like any other path.
            return is_purge.then(|| {
                PurgeAnswer::Now(status(StatusCode::METHOD_NOT_ALLOWED, "purge is disabled"))
            });
        };
        let given = req
            .headers()
            .get("x-purge-token")
            .map(HeaderValue::as_bytes);
        if !given.is_some_and(|g| constant_time_eq(g, token.as_bytes())) {
            return Some(PurgeAnswer::Now(status(
                StatusCode::FORBIDDEN,
                "bad purge token",
            )));
        }
        // Fastly's convention: `Soft-Purge: 1` marks stale instead of removing.
        let soft = req
            .headers()
            .get("soft-purge")
            .is_some_and(|v| v.as_bytes().trim_ascii() == b"1");
        let done = if soft { "soft-purged" } else { "purged" };
        if let Some(tag) = tag {
            let tag = percent_decode(tag);
            if tag.is_empty() || tag.chars().any(char::is_whitespace) {
                return Some(PurgeAnswer::Now(status(
                    StatusCode::BAD_REQUEST,
                    "one tag per request",
                )));
            }
            let handle = if soft {
                self.cache.soft_purge_tag(&tag)
            } else {
                self.cache.purge_tag(&tag)
            };
            return Some(PurgeAnswer::Wait(handle, done, format!("tag {tag}")));
        }
        let host = req
            .uri()
            .authority()
            .map(|a| a.as_str().to_owned())
            .or_else(|| {
                req.headers()
                    .get(header::HOST)?
                    .to_str()
                    .ok()
                    .map(str::to_owned)
            });
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let Some(url) = host.and_then(|h| format!("http://{h}{path}").parse::<Uri>().ok()) else {
            return Some(PurgeAnswer::Now(status(
                StatusCode::BAD_REQUEST,
                "purge needs a Host",
            )));
        };
        let handle = if soft {
            self.cache.soft_purge_url(&url)
        } else {
            self.cache.purge_url(&url)
        };
        Some(PurgeAnswer::Wait(handle, done, url.to_string()))
    }
}

/// Make the request the cache sees the one the upstream gets (see
/// [`normalize::headers`]), and the one host, lowercased with its port,
/// becomes the `Host` header: the key, the upstream's `Host` and its
/// `X-Forwarded-Host`. An invalid host is a 400 (RFC 9112 §3.2).
fn normalize(req: Request<ProxyBody>, hop: Hop) -> Result<Request<ProxyBody>, Refusal> {
    let bad = |why| (StatusCode::BAD_REQUEST, why);
    let (mut parts, body) = req.into_parts();
    let hosts = normalize::headers(&mut parts, hop)?;
    if hosts.count > 1 {
        return Err(bad("more than one Host"));
    }
    if hosts.plain && parts.uri.authority().is_none() {
        // The common case, decided at once: one lowercase Host, origin form.
        return Ok(Request::from_parts(parts, body));
    }
    let host = parts.headers.get(header::HOST);
    // HTTP/2 clients name the host in :authority, which hyper puts in the
    // target; HTTP/1.1 clients send origin form plus Host.
    let target = parts.uri.authority().map(|a| a.as_str());
    let host = match (target, host) {
        (Some(t), Some(h)) if !t.as_bytes().eq_ignore_ascii_case(h.as_bytes()) => {
            return Err(bad("request target and Host disagree"));
        }
        (Some(t), _) => Some(t),
        (None, Some(h)) => match h.to_str() {
            Ok(h) => Some(h),
            Err(_) => return Err(bad("bad Host")),
        },
        (None, None) => None,
    };
    if !herdguard::service::host_is_valid(parts.version, &parts.uri, &parts.headers) {
        return Err(bad(match host {
            None => "missing Host",
            Some(_) => "bad Host",
        }));
    }
    let rewrite = match (target, &host) {
        // The one Host header, already lowercase: keep it (no copy on hits).
        (None, Some(h)) => h.bytes().any(|b| b.is_ascii_uppercase()),
        _ => true,
    };
    if let Some(host) = host.filter(|_| rewrite) {
        let Some(value) = normalize::lowercase_host(host) else {
            return Err(bad("bad Host"));
        };
        parts.headers.insert(header::HOST, value);
    }
    if parts.uri.authority().is_some() {
        // Origin form: from here on the Host header is the one host.
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let Ok(uri) = path.parse() else {
            return Err(bad("bad request target"));
        };
        parts.uri = uri;
    }
    Ok(Request::from_parts(parts, body))
}

/// The last touches on every response to a client. An upstream's answer,
/// fresh or stored, got this hop's `Via` from `Origin::forward` before the
/// cache saw it, so a hit adds nothing; an answer the cache made itself (a
/// 504 while waiting) has none yet, and one stored by an older version may
/// carry only the upstream's.
fn to_client(mut response: Response<ClientBody>) -> Response<ClientBody> {
    let headers = response.headers_mut();
    match headers.get(header::VIA) {
        Some(via) if via.as_bytes().ends_with(VIA.as_bytes()) => {}
        Some(_) => append_list(headers, "via", VIA),
        None => {
            headers.insert(header::VIA, HeaderValue::from_static(VIA));
        }
    }
    response
}

fn append_via(headers: &mut HeaderMap) {
    if headers.contains_key(header::VIA) {
        append_list(headers, "via", VIA);
    } else {
        headers.insert(header::VIA, HeaderValue::from_static(VIA));
    }
}

/// A purge request's answer: now (refused, malformed), or once the purge
/// says how far it reached.
enum PurgeAnswer {
    Now(Response<ProxyBody>),
    /// The handle, `purged` or `soft-purged`, and what it names.
    Wait(herdguard::purge::PurgeHandle, &'static str, String),
}

/// The status of a purge that ran: 200 done everywhere, 202 done in Redis
/// but not every instance confirmed dropping its copies (they go within
/// their L1 lifetime), 503 done on this instance only (Redis unreachable),
/// 500 failed part-way or unknown.
fn purge_status(
    outcome: Result<herdguard::purge::Purged, herdguard::purge::PurgeError>,
    done: &str,
    what: &str,
) -> Response<ProxyBody> {
    match outcome {
        Ok(herdguard::purge::Purged::Unconfirmed) => status(
            StatusCode::ACCEPTED,
            &format!("{done} {what} in redis; not every instance confirmed it yet (their copies end with their L1 lifetime)"),
        ),
        Ok(_) => status(StatusCode::OK, &format!("{done} {what}")),
        Err(e) if e.local_only() => status(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("{done} {what} on this instance only: {e}"),
        ),
        Err(e) => status(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("{} of {what} failed: {e}", done.trim_end_matches('d')),
        ),
    }
}

fn local(response: Response<ProxyBody>) -> Response<ClientBody> {
    response.map(|body| ClientBody::Local { body })
}

pub fn status(code: StatusCode, text: &str) -> Response<ProxyBody> {
    let mut r = Response::new(ProxyBody::text(format!("{text}\n")));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Equal without a timing that tells how many leading bytes matched (the
/// length still shows).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

/// `%XX` decoded; a `%` not followed by two hex digits stays as it is, and
/// bytes that are not UTF-8 become U+FFFD.
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// A duration as people write it (`60s`, `500ms`, `2m`, `1h 30m`, see
/// `humantime`), or bare seconds (`60`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration (60s, 500ms, 2m): {e}"))
}
