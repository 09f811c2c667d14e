//! A caching reverse proxy: herdguard in front of an HTTP API you don't own.
//!
//! ```text
//! cargo run --release --example reverse_proxy -- \
//!     --listen 127.0.0.1:8082 --upstream http://127.0.0.1:8000 \
//!     [--purge-token SECRET] [--redis redis://127.0.0.1:6379] [--grace 60s]
//!     [--redis-cluster redis://127.0.0.1:7000,redis://127.0.0.1:7001,...]
//!     [--trusted-proxies 10.0.0.0/8,127.0.0.1]
//! ```
//!
//! This is `herdguard proxy` (feature `cli`; see its `--help` for TLS,
//! limits, an admin listener and the rest) with a few flags: the proxy's
//! code lives in `src/bin/herdguard/proxy/` and both include it. No peer is
//! trusted to report Forwarded / X-Forwarded-* unless `--trusted-proxies`
//! names it: from anyone else they are replaced or removed, since the cache
//! key does not hold them.

#[path = "../src/bin/herdguard/proxy/mod.rs"]
#[allow(
    dead_code,
    reason = "the example uses part of the proxy's options; the binary uses all"
)]
mod shared;

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Uri};
use axum::Router;
use herdguard::CacheLayer;
use http_body_util::BodyExt;

use shared::body::ProxyBody;
use shared::{Peer, Proxy, ProxyConfig};

/// What the proxy needs to know.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// Scheme and authority of the upstream, e.g. `http://127.0.0.1:8000`.
    pub(crate) upstream: Uri,
    /// Enables PURGE and the tag purge route when set.
    pub(crate) purge_token: Option<String>,
}

impl Config {
    fn shared(self) -> ProxyConfig {
        let mut config = ProxyConfig::new(self.upstream);
        config.purge_token = self.purge_token;
        config
    }
}

/// The proxy as an axum router (serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()`, so X-Forwarded-For
/// knows the client).
///
/// # Panics
/// If the upstream is not `http(s)://host[:port]`.
#[allow(
    dead_code,
    reason = "for the tests that include this file; main runs the proxy's own server"
)]
pub(crate) fn app(config: Config, cache: CacheLayer) -> Router {
    let proxy = Proxy::new(config.shared(), cache).unwrap_or_else(|e| panic!("{e}"));
    Router::new().fallback_service(tower::service_fn(move |req: Request<Body>| {
        let (mut parts, body) = req.into_parts();
        if let Some(ConnectInfo(addr)) = parts.extensions.get::<ConnectInfo<SocketAddr>>() {
            let peer = Peer {
                addr: *addr,
                tls: false,
            };
            parts.extensions.insert(peer);
        }
        let body = ProxyBody::Boxed(body.map_err(Into::into).boxed_unsync());
        let proxy = proxy.clone();
        async move {
            let response = proxy.handle(Request::from_parts(parts, body)).await;
            Ok::<_, Infallible>(response.map(Body::new))
        }
    }))
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
    let listen: SocketAddr = arg_value(&args, "--listen")
        .unwrap_or_else(|| "127.0.0.1:8082".to_owned())
        .parse()?;
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
        builder = builder.grace(shared::parse_duration(&grace)?);
    }
    #[cfg(feature = "redis")]
    if let Some(redis) = arg_value(&args, "--redis") {
        // Every proxy on this Redis shares entries and the single flight.
        builder = builder.redis(herdguard::RedisOptions::new(redis).namespace("proxy"));
    }
    #[cfg(feature = "redis")]
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
    let purge = if purge_token.is_some() { "on" } else { "off" };
    let mut config = Config {
        upstream: upstream.clone(),
        purge_token,
    }
    .shared();
    if let Some(ranges) = arg_value(&args, "--trusted-proxies") {
        config.trusted_proxies = ranges
            .split(',')
            .filter(|r| !r.trim().is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()?;
    }
    let proxy = Proxy::new(config, cache)?;
    let server = shared::server::ServerConfig::new(listen);
    shared::server::run(server, proxy, None, |bound| {
        println!(
            "herdguard reverse proxy on http://{} → {upstream} (purge {purge})",
            bound.listen
        );
    })
    .await?;
    Ok(())
}
