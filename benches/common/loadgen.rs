//! Loopback HTTP/1.1 load generator: keep-alive connections, one request in
//! flight per connection (closed loop), latencies into an HDR histogram.
//!
//! Hand-rolled on tokio TCP rather than a hyper client so the client side
//! costs as little CPU as possible: on a 2-core machine the generator shares
//! the cores with the server it measures.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a response's `Cache-Status` says about where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// No `Cache-Status`: the request never passed through herdguard.
    Uncached,
    Hit,
    Stale,
    /// `fwd=…`: this request led or waited for an origin call.
    Forwarded,
}

/// One response, reduced to what the benches look at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body_len: usize,
    pub(crate) class: Class,
    /// `x-bench-ready-us`: when the server-side stack had the response ready,
    /// in µs since [`super::origin::epoch`] (stampede stamps it; others don't).
    pub(crate) ready_us: Option<u64>,
    /// The `Age` header, seconds.
    pub(crate) age: Option<u64>,
}

/// A keep-alive HTTP/1.1 connection to a loopback server.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    req: Vec<u8>,
    pub(crate) addr: SocketAddr,
}

impl Conn {
    /// Connect; refuses anything but loopback so no bench can load a real host.
    pub(crate) async fn connect(addr: SocketAddr) -> io::Result<Self> {
        if !addr.ip().is_loopback() {
            return Err(io::Error::other(format!("{addr} is not loopback")));
        }
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: BytesMut::with_capacity(16 * 1024),
            req: Vec::with_capacity(256),
            addr,
        })
    }

    /// `GET path` and read the whole response (Content-Length bodies only:
    /// axum and herdguard always know the length of what these benches serve).
    pub(crate) async fn get(&mut self, path: &str) -> io::Result<Reply> {
        self.get_with(path, "").await
    }

    /// `GET path` with extra header lines (each ending in `\r\n`).
    pub(crate) async fn get_with(&mut self, path: &str, headers: &str) -> io::Result<Reply> {
        self.req.clear();
        self.req.extend_from_slice(b"GET ");
        self.req.extend_from_slice(path.as_bytes());
        self.req
            .extend_from_slice(b" HTTP/1.1\r\nhost: bench.local\r\n");
        self.req.extend_from_slice(headers.as_bytes());
        self.req.extend_from_slice(b"\r\n");
        self.stream.write_all(&self.req).await?;
        loop {
            if let Some((head_len, mut reply, close)) = parse_head(&self.buf)? {
                let total = head_len + reply.body_len;
                while self.buf.len() < total {
                    self.fill().await?;
                }
                self.buf.advance(total);
                if close {
                    return Err(io::Error::other("server closed the connection"));
                }
                reply.body_len = total - head_len;
                return Ok(reply);
            }
            self.fill().await?;
        }
    }

    async fn fill(&mut self) -> io::Result<()> {
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(16 * 1024);
        }
        if self.stream.read_buf(&mut self.buf).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed mid-response",
            ));
        }
        Ok(())
    }
}

/// `Some((head length, reply, connection: close))` once the head is complete.
fn parse_head(buf: &[u8]) -> io::Result<Option<(usize, Reply, bool)>> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(io::Error::other(format!("bad response: {e}"))),
    };
    let mut reply = Reply {
        status: resp.code.unwrap_or(0),
        body_len: 0,
        class: Class::Uncached,
        ready_us: None,
        age: None,
    };
    let mut close = false;
    let mut have_length = false;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            reply.body_len = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| io::Error::other("bad content-length"))?;
            have_length = true;
        } else if h.name.eq_ignore_ascii_case("cache-status") {
            reply.class = classify(h.value);
        } else if h.name.eq_ignore_ascii_case("x-bench-ready-us") {
            reply.ready_us = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.parse().ok());
        } else if h.name.eq_ignore_ascii_case("age") {
            reply.age = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok());
        } else if h.name.eq_ignore_ascii_case("connection") {
            close = h.value.eq_ignore_ascii_case(b"close");
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(io::Error::other("chunked responses are not supported"));
        }
    }
    if !have_length && reply.status != 204 && reply.status != 304 {
        return Err(io::Error::other("response without content-length"));
    }
    Ok(Some((head_len, reply, close)))
}

fn classify(v: &[u8]) -> Class {
    let has = |needle: &[u8]| v.windows(needle.len()).any(|w| w == needle);
    if has(b"detail=stale") || has(b"detail=grace") {
        Class::Stale
    } else if has(b"fwd=") {
        Class::Forwarded
    } else if has(b"hit") {
        Class::Hit
    } else {
        Class::Uncached
    }
}

/// Which path each request of a closed loop asks for.
#[derive(Debug, Clone)]
pub(crate) enum Paths {
    /// The same path every time.
    Fixed(String),
    /// `{prefix}{n}` with `n` uniform in `0..keys` (xorshift per connection).
    Keys { prefix: String, keys: u32 },
}

/// A closed-loop run: `connections` connections spread round-robin over
/// `addrs`, each sending its next request as soon as the last one completed,
/// until `duration` has passed or `max_requests` were sent.
#[derive(Debug, Clone)]
pub(crate) struct Load {
    pub(crate) addrs: Vec<SocketAddr>,
    pub(crate) connections: usize,
    pub(crate) duration: Duration,
    pub(crate) max_requests: u64,
    pub(crate) paths: Paths,
    /// Per-request bound; a request slower than this counts as an error.
    pub(crate) request_timeout: Duration,
}

/// What a closed-loop run measured.
#[derive(Debug)]
pub(crate) struct Report {
    /// Latency in microseconds of successful (2xx) responses.
    pub(crate) latency_us: Histogram<u64>,
    pub(crate) ok: u64,
    /// Transport errors, timeouts and non-2xx responses.
    pub(crate) errors: u64,
    pub(crate) elapsed: Duration,
    pub(crate) forwarded: u64,
    pub(crate) hits: u64,
    pub(crate) stale: u64,
}

impl Report {
    /// An empty report to merge runs into.
    pub(crate) fn new() -> Self {
        Self {
            latency_us: new_histogram(),
            ok: 0,
            errors: 0,
            elapsed: Duration::ZERO,
            forwarded: 0,
            hits: 0,
            stale: 0,
        }
    }

    /// Successful responses per second.
    pub(crate) fn rps(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Add another run's numbers (elapsed times add up: runs are sequential).
    pub(crate) fn merge(&mut self, other: &Report) {
        // Both histograms share bounds, so adding cannot fail.
        let _ = self.latency_us.add(&other.latency_us);
        self.ok += other.ok;
        self.errors += other.errors;
        self.elapsed += other.elapsed;
        self.forwarded += other.forwarded;
        self.hits += other.hits;
        self.stale += other.stale;
    }

    /// Quantile latency as a duration.
    pub(crate) fn q(&self, q: f64) -> Duration {
        Duration::from_micros(self.latency_us.value_at_quantile(q))
    }
}

/// 1 µs to 60 s at 3 significant figures.
pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3)
        .unwrap_or_else(|_| unreachable!("constant bounds are valid"))
}

/// Run a closed loop and merge every connection's numbers.
pub(crate) async fn closed_loop(load: &Load) -> Report {
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + load.duration;
    let mut tasks = Vec::with_capacity(load.connections);
    for i in 0..load.connections {
        let addr = load.addrs[i % load.addrs.len()];
        let load = load.clone();
        let sent = Arc::clone(&sent);
        tasks.push(tokio::spawn(async move {
            connection_loop(addr, i as u64, &load, &sent, deadline).await
        }));
    }
    let mut report = Report::new();
    for t in tasks {
        match t.await {
            Ok(r) => report.merge(&r),
            Err(_) => report.errors += 1,
        }
    }
    report.elapsed = started.elapsed();
    report
}

async fn connection_loop(
    addr: SocketAddr,
    seed: u64,
    load: &Load,
    sent: &AtomicU64,
    deadline: Instant,
) -> Report {
    let mut report = Report::new();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (seed.wrapping_mul(0xA24B_AED4_963E_E407) | 1);
    let mut path = String::with_capacity(64);
    let mut conn: Option<Conn> = None;
    while Instant::now() < deadline && sent.fetch_add(1, Ordering::Relaxed) < load.max_requests {
        path.clear();
        match &load.paths {
            Paths::Fixed(p) => path.push_str(p),
            Paths::Keys { prefix, keys } => {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                use std::fmt::Write;
                let _ = write!(path, "{prefix}{}", rng % u64::from(*keys));
            }
        }
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match Conn::connect(addr).await {
                Ok(c) => conn.insert(c),
                Err(_) => {
                    report.errors += 1;
                    // Bounded back-off; the loop itself is bounded by the deadline.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let start = Instant::now();
        match tokio::time::timeout(load.request_timeout, c.get(&path)).await {
            Ok(Ok(reply)) if (200..300).contains(&reply.status) => {
                let us = start.elapsed().as_micros().max(1) as u64;
                report.latency_us.saturating_record(us);
                report.ok += 1;
                match reply.class {
                    Class::Forwarded | Class::Uncached => report.forwarded += 1,
                    Class::Hit => report.hits += 1,
                    Class::Stale => report.stale += 1,
                }
            }
            Ok(Ok(_non_2xx)) => report.errors += 1,
            Ok(Err(_)) | Err(_) => {
                report.errors += 1;
                conn = None;
            }
        }
    }
    report
}
