//! An echo origin on loopback: it answers with the identity of the request
//! it saw (Cookie, Authorization, Accept, hosts, body framing) as JSON, and
//! takes its response headers from the query string, so a test picks the
//! caching rules per URL:
//!
//! - `cc=` Cache-Control, `vary=` Vary (both percent-encoded);
//! - `setcookie=1` always sets a cookie, `setcookie=if-cookie` only for a
//!   request that sent one;
//! - `delay=` milliseconds before answering.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Request, Response};
use axum::Router;
use http_body_util::BodyExt;

/// A running echo origin and its call counter.
#[derive(Clone)]
pub struct Echo {
    pub addr: SocketAddr,
    calls: Arc<AtomicUsize>,
}

impl Echo {
    pub async fn start() -> Self {
        let calls = Arc::new(AtomicUsize::new(0));
        let app = Router::new().fallback(handler).with_state(calls.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("echo origin serves");
        });
        Self { addr, calls }
    }

    /// Requests the origin has answered (or started answering).
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// What the echo origin reports about the request it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub path: String,
    pub cookie: Option<String>,
    pub authorization: Option<String>,
    pub accept: Option<String>,
    pub host: Option<String>,
    pub forwarded_host: Option<String>,
    pub content_length: Option<String>,
    pub transfer_encoding: Option<String>,
    pub body: String,
    pub call: u64,
}

impl Seen {
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
        Some(Self {
            path: s("path")?,
            cookie: s("cookie"),
            authorization: s("authorization"),
            accept: s("accept"),
            host: s("host"),
            forwarded_host: s("x-forwarded-host"),
            content_length: s("content-length"),
            transfer_encoding: s("transfer-encoding"),
            body: s("body")?,
            call: v.get("call")?.as_u64()?,
        })
    }
}

/// A query parameter, percent-decoded.
pub fn param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| decode(v))
    })
}

/// Percent-encode a value for a query string.
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn handler(State(calls): State<Arc<AtomicUsize>>, req: Request<Body>) -> Response<Body> {
    let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
    let (parts, body) = req.into_parts();
    let query = parts.uri.query().unwrap_or("").to_owned();
    if let Some(ms) = param(&query, "delay").and_then(|d| d.parse::<u64>().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let h = |n: &str| {
        let values: Vec<&str> = parts
            .headers
            .get_all(n)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if values.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::Value::String(values.join(", "))
        }
    };
    let json = serde_json::json!({
        "path": parts.uri.path_and_query().map_or("/", |p| p.as_str()),
        "cookie": h("cookie"),
        "authorization": h("authorization"),
        "accept": h("accept"),
        "host": h("host"),
        "x-forwarded-host": h("x-forwarded-host"),
        "content-length": h("content-length"),
        "transfer-encoding": h("transfer-encoding"),
        "body": String::from_utf8_lossy(&body),
        "call": call,
    });
    let mut r = Response::new(Body::from(json.to_string()));
    let headers = r.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    for (name, header) in [("cc", "cache-control"), ("vary", "vary")] {
        if let Some(v) = param(&query, name).filter(|v| !v.is_empty()) {
            if let Ok(v) = HeaderValue::from_str(&v) {
                headers.insert(header, v);
            }
        }
    }
    let set_cookie = match param(&query, "setcookie").as_deref() {
        Some("1") => true,
        Some("if-cookie") => parts.headers.contains_key("cookie"),
        _ => false,
    };
    if set_cookie {
        headers.insert("set-cookie", HeaderValue::from_static("session=fresh"));
    }
    r
}
