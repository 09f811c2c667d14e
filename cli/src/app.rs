//! The proxy as an axum `Router` with two options: what the `reverse_proxy`
//! example serves and the tests drive. No peer is trusted to report
//! Forwarded / X-Forwarded-* here: from anyone they are replaced or removed,
//! since the cache key does not hold them.

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Uri};
use axum::Router;
use herdguard::CacheLayer;
use http_body_util::BodyExt;

use crate::proxy::body::ProxyBody;
use crate::proxy::{Peer, Proxy, ProxyConfig};

/// What the proxy needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    /// Scheme and authority of the upstream, e.g. `http://127.0.0.1:8000`.
    pub upstream: Uri,
    /// Enables PURGE and the tag purge route when set.
    pub purge_token: Option<String>,
}

impl Config {
    /// The proxy's own configuration, with defaults for everything else.
    pub fn shared(self) -> ProxyConfig {
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
pub fn app(config: Config, cache: CacheLayer) -> Router {
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
