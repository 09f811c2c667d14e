//! A caching reverse proxy: herdguard in front of an HTTP API you don't own.
//!
//! ```text
//! cargo run --release --example reverse_proxy -- \
//!     --listen 127.0.0.1:8082 --upstream http://127.0.0.1:8000 \
//!     [--purge-token SECRET] [--redis redis://127.0.0.1:6379] [--grace 60s]
//!     [--redis-cluster redis://127.0.0.1:7000,redis://127.0.0.1:7001,...]
//! ```
//!
//! - Every method and every end-to-end header is forwarded; hop-by-hop
//!   headers (RFC 9110 §7.6.1, plus those the Connection header names) are
//!   not, and they are removed before the cache computes its key. Bodies
//!   stream both ways. `Via` is appended both ways, and `X-Forwarded-For` /
//!   `-Proto` / `-Host` are set on the upstream request.
//! - The client's host, lowercased and with its port, is the host in the
//!   cache key and exactly what the upstream is told, in both `Host` and
//!   `X-Forwarded-Host` (so links it builds from either match the key). An
//!   absolute-form target whose authority disagrees with `Host`, or two
//!   `Host` headers, get a 400. A request without a host gets the
//!   upstream's own as `Host`.
//! - GET and HEAD go through one [`CacheLayer`]: one upstream request per key,
//!   RFC 9111 semantics, `Cache-Status` on every response.
//! - Purge is off unless `--purge-token` is given. Then, with the token in
//!   `X-Purge-Token`:
//!   - `PURGE /path?query` (Host header names the site) removes every stored
//!     variant of that URL;
//!   - `POST /.herdguard/purge/tag/{tag}` removes every entry whose response
//!     carried `tag` in `Surrogate-Key` (space separated).
//!
//!   The layer strips `Surrogate-Key` from responses to clients (after
//!   indexing the tags), as it does by default.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Method, Request, Response, StatusCode, Uri};
use axum::Router;
use herdguard::CacheLayer;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{Layer, ServiceExt};

/// What the proxy needs to know.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// Scheme and authority of the upstream, e.g. `http://127.0.0.1:8000`.
    pub(crate) upstream: Uri,
    /// Enables PURGE and the tag purge route when set.
    pub(crate) purge_token: Option<String>,
}

/// Headers that describe one connection, never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

const VIA: &str = "1.1 herdguard";
const PURGE_TAG_PREFIX: &str = "/.herdguard/purge/tag/";

/// The proxy as a router: purge handling, then the cache, then the upstream.
pub(crate) fn app(config: Config, cache: CacheLayer) -> Router {
    let client: Client<HttpConnector, Body> = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build_http();
    let upstream = Arc::new(config.upstream.clone());
    let origin = tower::service_fn(move |req: Request<Body>| {
        let client = client.clone();
        let upstream = Arc::clone(&upstream);
        async move { Ok::<_, std::convert::Infallible>(forward(&client, &upstream, req).await) }
    });
    let cached = cache.layer(origin);
    let config = Arc::new(config);
    Router::new().fallback_service(tower::service_fn(move |req: Request<Body>| {
        let cached = cached.clone();
        let cache = cache.clone();
        let config = Arc::clone(&config);
        async move {
            // The cache must key exactly the request the upstream will see.
            let req = match normalize(req) {
                Ok(req) => req,
                Err(why) => return Ok(status(StatusCode::BAD_REQUEST, why)),
            };
            if let Some(response) = purge(&config, &cache, &req) {
                return Ok::<_, std::convert::Infallible>(response);
            }
            let response = match cached.oneshot(req).await {
                Ok(r) => r.map(Body::new),
                Err(never) => match never {},
            };
            Ok(to_client(response))
        }
    }))
}

/// Make the request the cache sees the one the upstream gets: hop-by-hop
/// and Connection-named headers go first (so they cannot select a Vary
/// variant the upstream never saw), and the one host, lowercased with its
/// port, becomes the `Host` header: the key, the upstream's `Host` and its
/// `X-Forwarded-Host`.
/// Two Host headers, or an absolute-form target whose authority disagrees
/// with Host, are a 400 (RFC 9112 §3.2).
fn normalize(req: Request<Body>) -> Result<Request<Body>, &'static str> {
    let (mut parts, body) = req.into_parts();
    // Transfer-Encoding stays until the upstream request is built: it tells
    // the cache this GET carries a body (which then bypasses it).
    let framing = parts.headers.get(header::TRANSFER_ENCODING).cloned();
    strip_hop_by_hop(&mut parts.headers);
    if let Some(te) = framing {
        parts.headers.insert(header::TRANSFER_ENCODING, te);
    }
    let mut hosts = parts.headers.get_all(header::HOST).iter();
    let host = hosts.next().cloned();
    if hosts.next().is_some() {
        return Err("more than one Host");
    }
    let target = parts.uri.authority().map(|a| a.as_str().to_owned());
    let host = match (target, host) {
        (Some(t), Some(h)) if !t.as_bytes().eq_ignore_ascii_case(h.as_bytes()) => {
            return Err("request target and Host disagree");
        }
        (Some(t), _) => Some(t),
        (None, Some(h)) => match h.to_str() {
            Ok(h) => Some(h.to_owned()),
            Err(_) => return Err("bad Host"),
        },
        (None, None) => None,
    };
    if let Some(host) = host {
        let Ok(value) = HeaderValue::from_str(&host.to_ascii_lowercase()) else {
            return Err("bad Host");
        };
        parts.headers.insert(header::HOST, value);
    }
    if parts.uri.authority().is_some() {
        // Origin form: from here on the Host header is the one host.
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let Ok(uri) = path.parse() else {
            return Err("bad request target");
        };
        parts.uri = uri;
    }
    Ok(Request::from_parts(parts, body))
}

/// Send `req` upstream; an unreachable upstream is a 502, never an error.
async fn forward(
    client: &Client<HttpConnector, Body>,
    upstream: &Uri,
    req: Request<Body>,
) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut uri = upstream.clone().into_parts();
    uri.path_and_query = path.parse().ok();
    let Ok(uri) = Uri::from_parts(uri) else {
        return status(StatusCode::BAD_REQUEST, "bad request target");
    };
    let client_addr = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
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
    if let Some(ip) = client_addr {
        append_list(&mut parts.headers, "x-forwarded-for", &ip.to_string());
    }
    if let Some(host) = original_host {
        parts.headers.insert("x-forwarded-host", host);
    }
    parts
        .headers
        .insert("x-forwarded-proto", HeaderValue::from_static("http"));
    append_list(&mut parts.headers, "via", VIA);
    parts.uri = uri;
    parts.version = axum::http::Version::HTTP_11;
    match client.request(Request::from_parts(parts, body)).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, Body::new(body))
        }
        Err(error) => {
            tracing::warn!(%error, "upstream request failed");
            status(StatusCode::BAD_GATEWAY, "upstream unreachable")
        }
    }
}

/// The last touches on every response to a client.
fn to_client(mut response: Response<Body>) -> Response<Body> {
    append_list(response.headers_mut(), "via", VIA);
    response
}

/// Answer a purge request, if this is one and purging is on.
fn purge(config: &Config, cache: &CacheLayer, req: &Request<Body>) -> Option<Response<Body>> {
    let is_purge = req.method().as_str() == "PURGE";
    let tag = (req.method() == Method::POST)
        .then(|| req.uri().path().strip_prefix(PURGE_TAG_PREFIX))
        .flatten();
    if !is_purge && tag.is_none() {
        return None;
    }
    let Some(token) = &config.purge_token else {
        // Off: PURGE is not a method this proxy knows; the tag route falls
        // through to the upstream like any other path.
        return is_purge.then(|| status(StatusCode::METHOD_NOT_ALLOWED, "purge is disabled"));
    };
    let given = req
        .headers()
        .get("x-purge-token")
        .map(HeaderValue::as_bytes);
    if !given.is_some_and(|g| constant_time_eq(g, token.as_bytes())) {
        return Some(status(StatusCode::FORBIDDEN, "bad purge token"));
    }
    if let Some(tag) = tag {
        let tag = percent_decode(tag);
        if tag.is_empty() || tag.chars().any(char::is_whitespace) {
            return Some(status(StatusCode::BAD_REQUEST, "one tag per request"));
        }
        cache.purge_tag(&tag);
        return Some(status(StatusCode::OK, &format!("purged tag {tag}")));
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
        return Some(status(StatusCode::BAD_REQUEST, "purge needs a Host"));
    };
    cache.purge_url(&url);
    Some(status(StatusCode::OK, &format!("purged {url}")))
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Append to a comma-separated list header (Via, X-Forwarded-For).
fn append_list(headers: &mut HeaderMap, name: &'static str, item: &str) {
    let joined = match headers.get(name).and_then(|v| v.to_str().ok()) {
        Some(existing) if !existing.is_empty() => format!("{existing}, {item}"),
        _ => item.to_owned(),
    };
    if let Ok(v) = HeaderValue::from_str(&joined) {
        headers.insert(name, v);
    }
}

fn status(code: StatusCode, text: &str) -> Response<Body> {
    let mut r = Response::new(Body::from(format!("{text}\n")));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn duration_arg(s: &str) -> Option<Duration> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "" | "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
}

fn arg_value(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let listen = arg_value(&args, "--listen").unwrap_or_else(|| "127.0.0.1:8082".to_owned());
    let upstream: Uri = arg_value(&args, "--upstream")
        .unwrap_or_else(|| "http://127.0.0.1:8000".to_owned())
        .parse()?;
    if upstream.scheme_str() != Some("http") || upstream.authority().is_none() {
        return Err("--upstream must be http://host:port".into());
    }
    let purge_token = arg_value(&args, "--purge-token");
    let mut builder = CacheLayer::builder();
    if let Some(grace) = arg_value(&args, "--grace") {
        // Stale-while-updating on the operator's say-so (`60s`, `500ms`, `2m`).
        builder = builder.grace(duration_arg(&grace).ok_or("--grace takes 60s, 500ms or 2m")?);
    }
    if let Some(redis) = arg_value(&args, "--redis") {
        // Every proxy on this Redis shares entries and the single flight.
        builder = builder.redis(herdguard::RedisOptions::new(redis).namespace("proxy"));
    }
    if let Some(seeds) = arg_value(&args, "--redis-cluster") {
        let urls: Vec<String> = seeds
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        builder = builder.redis(herdguard::RedisOptions::cluster(urls).namespace("proxy"));
    }
    let cache = builder.build()?;
    let app = app(
        Config {
            upstream: upstream.clone(),
            purge_token: purge_token.clone(),
        },
        cache,
    );
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!(
        "herdguard reverse proxy on http://{} → {upstream} (purge {})",
        listener.local_addr()?,
        if purge_token.is_some() { "on" } else { "off" }
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
