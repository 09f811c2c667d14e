//! Distinct keys, each asked exactly once, all at once over many
//! connections (a cold start); and a probe that waits for the first answer
//! of a given body generation (an origin coming back).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::loadgen::{new_histogram, Conn};

/// What a burst measured; latencies of every answer, whatever its status.
#[derive(Debug)]
pub(crate) struct Burst {
    pub(crate) latency_us: Histogram<u64>,
    pub(crate) ok: u64,
    pub(crate) unavailable: u64,
    /// Other statuses than 2xx and 503, transport errors and timeouts.
    pub(crate) other_errors: u64,
    pub(crate) wall: Duration,
}

impl Burst {
    fn new() -> Self {
        Self {
            latency_us: new_histogram(),
            ok: 0,
            unavailable: 0,
            other_errors: 0,
            wall: Duration::ZERO,
        }
    }

    pub(crate) fn q(&self, q: f64) -> Duration {
        Duration::from_micros(self.latency_us.value_at_quantile(q))
    }

    pub(crate) fn max(&self) -> Duration {
        Duration::from_micros(self.latency_us.max())
    }
}

/// Ask `/k/{prefix}{0..keys}` once each over `connections` connections
/// spread round-robin over `addrs`; every request bounded by `timeout`, and
/// no request starts past `deadline` (those keys are not asked at all).
pub(crate) async fn distinct_once(
    addrs: &[SocketAddr],
    prefix: &str,
    keys: u64,
    connections: usize,
    timeout: Duration,
    deadline: Instant,
) -> Burst {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(connections);
    for i in 0..connections.max(1) {
        let addr = addrs[i % addrs.len()];
        let (next, prefix) = (Arc::clone(&next), prefix.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut out = Burst::new();
            let mut conn: Option<Conn> = None;
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= keys || Instant::now() > deadline {
                    return out;
                }
                let start = Instant::now();
                let asked = async {
                    let c = match conn.as_mut() {
                        Some(c) => c,
                        None => conn.insert(Conn::connect(addr).await?),
                    };
                    c.get(&format!("/k/{prefix}{n}")).await
                };
                let answer = tokio::time::timeout(timeout, asked).await;
                out.latency_us
                    .saturating_record(start.elapsed().as_micros().max(1) as u64);
                match answer {
                    Ok(Ok(r)) if (200..300).contains(&r.status) => out.ok += 1,
                    Ok(Ok(r)) if r.status == 503 => out.unavailable += 1,
                    Ok(Ok(_)) => out.other_errors += 1,
                    Ok(Err(_)) | Err(_) => {
                        out.other_errors += 1;
                        conn = None;
                    }
                }
            }
        }));
    }
    let mut all = Burst::new();
    for t in tasks {
        match t.await {
            Ok(b) => {
                let _ = all.latency_us.add(&b.latency_us);
                all.ok += b.ok;
                all.unavailable += b.unavailable;
                all.other_errors += b.other_errors;
            }
            Err(_) => all.other_errors += 1,
        }
    }
    all.wall = started.elapsed();
    all
}

/// From now, ask `/k/0`…`/k/{keys-1}` in turn over one connection (a new
/// one after an error) until a `200` carries a body of `generation`: how
/// long after the call that answer arrived, or `None` within `bound`.
pub(crate) async fn first_of_generation(
    addr: SocketAddr,
    keys: u32,
    generation: u64,
    bound: Duration,
) -> Option<Duration> {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let started = Instant::now();
    let mut key = 0;
    while started.elapsed() < bound {
        let uri = format!("http://{addr}/k/{key}");
        key = (key + 1) % keys.max(1);
        let asked = async {
            let r = client.get(uri.parse().ok()?).await.ok()?;
            let ok = r.status().is_success();
            let body = r.into_body().collect().await.ok()?.to_bytes();
            Some(ok && super::metered::body_generation(&body) == Some(generation))
        };
        if let Ok(Some(true)) = tokio::time::timeout(Duration::from_secs(2), asked).await {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}
