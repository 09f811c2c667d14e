//! The request and the origin answer the hit benches (`hot_path`'s `tower`
//! group, `hit_cost`) measure, so both price the same work.

use axum::body::Body;
use axum::http::{header, Request, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};

pub(crate) fn request() -> Request<Body> {
    Request::builder()
        .uri("/k/42?a=1&b=2")
        .header(header::HOST, "bench.local")
        .header(header::ACCEPT, "*/*")
        .body(Body::empty())
        .unwrap_or_else(|e| panic!("request: {e}"))
}

pub(crate) fn origin_response(body: Bytes) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    let h = r.headers_mut();
    h.insert(
        header::CACHE_CONTROL,
        "max-age=3600".parse().unwrap_or_else(|_| unreachable!()),
    );
    h.insert(
        header::CONTENT_TYPE,
        "application/octet-stream"
            .parse()
            .unwrap_or_else(|_| unreachable!()),
    );
    r
}

/// Read the whole body, as a client would; its length.
pub(crate) async fn body_len<B: http_body::Body>(r: Response<B>) -> usize
where
    B::Error: std::fmt::Debug,
{
    let collected = r
        .into_body()
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    collected.to_bytes().len()
}
