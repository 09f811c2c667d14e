//! Plain hyper servers on 127.0.0.1:0 for the hit benches: the origin
//! answering at once (no axum, no middleware), and the same origin behind
//! `CacheLayer`, with nothing else in between.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;

use axum::http::{Request, Response};
use bytes::Bytes;
use herdguard::service::RequestBody;
use herdguard::CacheLayer;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::Layer as _;

use super::hit::origin_response;

/// Serve `service` over HTTP/1.1 keep-alive, one task per connection, until
/// the process ends.
async fn serve<S, B>(service: S) -> io::Result<SocketAddr>
where
    S: tower::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service);
                let _ = conn.await;
            });
        }
    });
    Ok(addr)
}

/// The bare origin: every request answered at once with `body`
/// (`Cache-Control: max-age=3600`), whatever its path.
pub(crate) async fn origin(body: Bytes) -> io::Result<SocketAddr> {
    serve(tower::service_fn(move |_req: Request<Incoming>| {
        let body = body.clone();
        async move { Ok::<_, Infallible>(origin_response(body)) }
    }))
    .await
}

/// The same origin behind `layer`, in the same bare hyper server.
pub(crate) async fn cached_origin(body: Bytes, layer: CacheLayer) -> io::Result<SocketAddr> {
    let inner = tower::service_fn(move |_req: Request<RequestBody<Incoming>>| {
        let body = body.clone();
        async move { Ok::<Response<Full<Bytes>>, Infallible>(origin_response(body)) }
    });
    serve(layer.layer(inner)).await
}
