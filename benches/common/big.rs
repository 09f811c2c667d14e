//! The parts of the `big` stampede scenario: an origin that sends one large
//! body at a limited rate, a client that hashes every body it reads, and
//! the process's peak RSS.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The origin writes its body in chunks of this size (a hyper client reads
/// upstream bodies in frames of this order).
pub(crate) const CHUNK: usize = 64 * 1024;
/// The chunks are slices of a pseudo-random pool at offsets that depend on
/// the chunk's index, so a lost, repeated or reordered chunk changes the hash.
const POOL: usize = 1 << 20;
/// The client's read buffer per connection.
pub(crate) const READ_BUF: usize = 64 * 1024;

/// An origin for `/big/{key}`: `size` bytes at `rate` bytes/s, headers after
/// `first_byte`, a declared `Content-Length`, `max-age=60`.
#[derive(Debug)]
pub(crate) struct BigOrigin {
    calls: AtomicU64,
    size: usize,
    rate: f64,
    first_byte: Duration,
    pool: Bytes,
    checksum: blake3::Hash,
}

impl BigOrigin {
    pub(crate) fn new(size: usize, rate: f64, first_byte: Duration) -> Self {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let pool: Vec<u8> = (0..POOL + CHUNK)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut hasher = blake3::Hasher::new();
        for i in 0..size.div_ceil(CHUNK) {
            hasher.update(chunk_of(&pool, i, size));
        }
        Self {
            calls: AtomicU64::new(0),
            size,
            rate: rate.max(1.0),
            first_byte,
            pool: Bytes::from(pool),
            checksum: hasher.finalize(),
        }
    }

    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// The hash of the body every call sends.
    pub(crate) fn checksum(&self) -> blake3::Hash {
        self.checksum
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }
}

fn chunk_of(pool: &[u8], i: usize, size: usize) -> &[u8] {
    let len = CHUNK.min(size - i * CHUNK);
    let off = i.wrapping_mul(7919 * 8) % POOL;
    &pool[off..off + len]
}

async fn handle(State(o): State<Arc<BigOrigin>>) -> Response<Body> {
    o.calls.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(o.first_byte).await;
    let started = Instant::now();
    let origin = Arc::clone(&o);
    let chunks = futures_util::stream::unfold(0usize, move |i| {
        let o = Arc::clone(&origin);
        async move {
            if i * CHUNK >= o.size {
                return None;
            }
            // Paced against the start, so 1 ms timer steps do not slow the rate.
            let due = started + Duration::from_secs_f64((i * CHUNK) as f64 / o.rate);
            if Instant::now() < due {
                tokio::time::sleep_until(due.into()).await;
            }
            // A fresh allocation per chunk, as from a real upstream: the
            // cache's window then holds memory of its own.
            let data = Bytes::copy_from_slice(chunk_of(&o.pool, i, o.size));
            Some((Ok::<_, Infallible>(data), i + 1))
        }
    });
    let mut r = Response::new(Body::from_stream(chunks));
    let h = r.headers_mut();
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(o.size));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("max-age=60"),
    );
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    r
}

/// `/big/{key}` served by `origin`.
pub(crate) fn router(origin: &Arc<BigOrigin>) -> Router {
    Router::new()
        .route("/big/{key}", get(handle))
        .with_state(Arc::clone(origin))
}

/// One GET as the client saw it.
#[derive(Debug)]
pub(crate) struct Hashed {
    pub(crate) status: u16,
    /// `Cache-Status` says `collapsed`: it read another request's fill.
    pub(crate) collapsed: bool,
    pub(crate) cache_status: String,
    pub(crate) first_byte: Option<Instant>,
    pub(crate) end: Instant,
    pub(crate) len: u64,
    pub(crate) declared: Option<u64>,
    pub(crate) hash: blake3::Hash,
    /// Why the body ended before its declared length, if it did.
    pub(crate) error: Option<String>,
}

/// A connection opened ahead of the burst, with its read buffer.
#[derive(Debug)]
pub(crate) struct HashingConn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl HashingConn {
    pub(crate) async fn connect(addr: SocketAddr) -> io::Result<Self> {
        if !addr.ip().is_loopback() {
            return Err(io::Error::other(format!("{addr} is not loopback")));
        }
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: vec![0; READ_BUF],
        })
    }

    /// `GET path`, hashing the body as it arrives (Content-Length bodies).
    pub(crate) async fn get(mut self, path: &str) -> io::Result<Hashed> {
        let req = format!("GET {path} HTTP/1.1\r\nhost: bench.local\r\nconnection: close\r\n\r\n");
        self.stream.write_all(req.as_bytes()).await?;
        let mut filled = 0;
        let (head_len, status, declared, cache_status) = loop {
            let n = self.stream.read(&mut self.buf[filled..]).await?;
            if n == 0 {
                return Err(io::Error::other("closed before the response head"));
            }
            filled += n;
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut resp = httparse::Response::new(&mut headers);
            match resp.parse(&self.buf[..filled]) {
                Ok(httparse::Status::Complete(head_len)) => {
                    let mut declared = None;
                    let mut cache_status = String::new();
                    for h in resp.headers.iter() {
                        if h.name.eq_ignore_ascii_case("content-length") {
                            declared = std::str::from_utf8(h.value)
                                .ok()
                                .and_then(|v| v.trim().parse::<u64>().ok());
                        } else if h.name.eq_ignore_ascii_case("cache-status") {
                            cache_status = String::from_utf8_lossy(h.value).into_owned();
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                            return Err(io::Error::other("chunked responses are not supported"));
                        }
                    }
                    break (head_len, resp.code.unwrap_or(0), declared, cache_status);
                }
                Ok(httparse::Status::Partial) if filled < self.buf.len() => {}
                Ok(httparse::Status::Partial) => return Err(io::Error::other("head too large")),
                Err(e) => return Err(io::Error::other(format!("bad response: {e}"))),
            }
        };
        let mut hasher = blake3::Hasher::new();
        let mut len = (filled - head_len) as u64;
        let mut first_byte = (len > 0).then(Instant::now);
        hasher.update(&self.buf[head_len..filled]);
        let want = declared.unwrap_or(u64::MAX);
        let mut error = None;
        while len < want {
            match self.stream.read(&mut self.buf).await {
                Ok(0) => {
                    if declared.is_some() {
                        error = Some("connection closed mid-body".to_owned());
                    }
                    break;
                }
                Ok(n) => {
                    first_byte.get_or_insert_with(Instant::now);
                    hasher.update(&self.buf[..n]);
                    len += n as u64;
                }
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
        }
        Ok(Hashed {
            status,
            collapsed: cache_status.contains("collapsed"),
            cache_status,
            first_byte,
            end: Instant::now(),
            len,
            declared,
            hash: hasher.finalize(),
            error,
        })
    }
}

/// Peak RSS of this process since the last [`reset_peak_rss`] (`VmHWM`).
pub(crate) fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Reset the kernel's peak-RSS mark to the current RSS (Linux ≥ 4.0);
/// `false` if it could not, in which case only sampled values count.
pub(crate) fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}
