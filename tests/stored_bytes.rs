//! What a stored entry holds: its own bytes, not the buffers the origin's
//! answer and the request arrived in.
//!
//! hyper parses a response head into its connection's read buffer and hands
//! out header values (and a small body read with the head) as slices of it,
//! which keep the whole buffer alive (8 KiB and up). An entry that kept such
//! slices would hold many times the bytes the store counts against its
//! capacity. Here the origin answers with slices of one large buffer, as
//! hyper does, and a hit must point at none of it.

use std::convert::Infallible;
use std::ops::Range;

use bytes::Bytes;
use herdguard::service::RequestBody;
use herdguard::CacheLayer;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{Layer, ServiceExt};

/// As large as a read buffer a hyper connection starts with, and more.
const BUFFER: usize = 64 * 1024;

/// A buffer holding `parts` at its start, then filler; the parts' ranges.
fn buffer_of(parts: &[&[u8]]) -> (Bytes, Vec<Range<usize>>) {
    let mut buf = Vec::with_capacity(BUFFER);
    let mut ranges = Vec::new();
    for p in parts {
        let start = buf.len();
        buf.extend_from_slice(p);
        ranges.push(start..buf.len());
    }
    buf.resize(BUFFER, b'.');
    (Bytes::from(buf), ranges)
}

fn inside(buffer: &Bytes, bytes: &[u8]) -> bool {
    let start = buffer.as_ptr() as usize;
    let at = bytes.as_ptr() as usize;
    at >= start && at < start + buffer.len()
}

fn request() -> Request<axum::body::Body> {
    Request::builder()
        .uri("/item")
        .header("host", "stored.test")
        .header("accept-language", "en")
        .body(axum::body::Body::empty())
        .expect("static request parts")
}

/// A stored response's header values and small body are copies: a hit's
/// point outside the buffer the origin's answer was cut from, and say the
/// same bytes.
#[tokio::test]
async fn a_hit_holds_none_of_the_origin_buffer() {
    let (buffer, ranges) = buffer_of(&[b"max-age=60", b"text/plain", b"lang", b"stored body"]);
    let origin_buffer = buffer.clone();
    let inner = tower::service_fn(move |_req: Request<RequestBody<axum::body::Body>>| {
        let buffer = origin_buffer.clone();
        let ranges = ranges.clone();
        async move {
            let value = |i: usize| {
                http::HeaderValue::from_maybe_shared(buffer.slice(ranges[i].clone()))
                    .expect("a slice of valid header bytes")
            };
            let mut response = Response::new(Full::new(buffer.slice(ranges[3].clone())));
            let headers = response.headers_mut();
            headers.insert("cache-control", value(0));
            headers.insert("content-type", value(1));
            headers.insert("x-tag", value(2));
            headers.insert("vary", http::HeaderValue::from_static("accept-language"));
            Ok::<_, Infallible>(response)
        }
    });
    let cached = CacheLayer::new().layer(inner);

    let first = cached.clone().oneshot(request()).await.unwrap();
    let _ = first.into_body().collect().await.unwrap();
    let hit = cached.clone().oneshot(request()).await.unwrap();
    let status = hit.headers()["cache-status"].to_str().unwrap().to_owned();
    assert!(
        status.contains("hit"),
        "the second request is a hit: {status}"
    );

    let (parts, body) = hit.into_parts();
    for (name, want) in [
        ("cache-control", "max-age=60"),
        ("content-type", "text/plain"),
        ("x-tag", "lang"),
    ] {
        let value = &parts.headers[name];
        assert_eq!(value, want, "{name} is served as the origin said it");
        assert!(
            !inside(&buffer, value.as_bytes()),
            "{name} points into the origin's buffer"
        );
    }
    let body = body.collect().await.unwrap().to_bytes();
    assert_eq!(body, "stored body");
    assert!(
        !inside(&buffer, &body),
        "the body points into the origin's buffer"
    );
}

/// A response with more header values than a `HeaderMap` can be made for
/// at once (an h2 origin may send 16 MiB of headers) is stored and served
/// whole, never a panic: the copies grow as the original did.
#[tokio::test]
async fn a_response_with_thirty_thousand_header_values_is_served_whole() {
    const VALUES: usize = 30_000;
    let inner = tower::service_fn(|_req: Request<RequestBody<axum::body::Body>>| async {
        let mut response = Response::new(Full::new(Bytes::from_static(b"many")));
        let headers = response.headers_mut();
        headers.insert(
            "cache-control",
            http::HeaderValue::from_static("max-age=60"),
        );
        for _ in 0..VALUES {
            headers.append("x-many", http::HeaderValue::from_static("v"));
        }
        Ok::<_, Infallible>(response)
    });
    let cached = CacheLayer::new().layer(inner);
    for round in ["first", "second"] {
        let response = cached.clone().oneshot(request()).await.unwrap();
        assert_eq!(response.status(), 200, "{round} request");
        let n = response.headers().get_all("x-many").iter().count();
        assert_eq!(n, VALUES, "{round} request carries every value");
        if round == "second" {
            let status = response.headers()["cache-status"].to_str().unwrap();
            assert!(status.contains("hit"), "stored, then a hit: {status}");
        }
    }
}
