//! The stampede bench's `big` scenario: one large body, N concurrent GETs
//! on one instance, origin calls, time to first byte, checksums and peak
//! RSS against a bound derived from the window.

use std::sync::Arc;
use std::time::{Duration, Instant};

use herdguard::CacheLayer;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::sync::Barrier;

use crate::common::big;
use crate::common::origin::serve;
use crate::common::{ms, quantile, rss_bytes};
use crate::report::opt_ms;
use crate::Config;

/// The `big` scenario's window: the crate's default `max_body_bytes`, set
/// explicitly so the memory bound below is derived from a known number.
pub(crate) const BIG_WINDOW: usize = 8 * 1024 * 1024;
/// hyper's HTTP/1 write buffer cap per connection (`DEFAULT_MAX_BUFFER_SIZE`,
/// 8 KiB + 100 × 4 KiB): the most a connection queues before it stops
/// polling the body. A slow reader's queued chunks may have left the window,
/// so each reader can keep that much alive beyond it.
const HYPER_WRITE_QUEUE: u64 = 8192 + 4096 * 100;
/// Per reader, besides the write queue: the chunk being written, hyper's
/// 8 KiB read buffer and connection state, the reader's cursor (rounded up).
const PER_READER_EXTRA: u64 = (big::CHUNK + 16 * 1024) as u64;

/// One row of the `big` table.
#[derive(Debug, Default)]
pub(crate) struct BigLine {
    size: usize,
    requests: usize,
    origin_calls: u64,
    /// Requests whose `Cache-Status` did not say `collapsed`.
    uncollapsed: usize,
    leader_ttfb: Option<Duration>,
    waiter_ttfb_p50: Option<Duration>,
    waiter_ttfb_p99: Option<Duration>,
    waiter_ttfb_max: Option<Duration>,
    /// Last body complete, from the burst's start.
    last_done: Option<Duration>,
    exact: usize,
    /// A complete body whose hash differs from the origin's.
    mismatches: usize,
    /// Bodies that ended before their length (cut off, or the transport failed).
    incomplete: usize,
    /// Bytes the incomplete bodies had received: fewest, most.
    incomplete_bytes: Option<(u64, u64)>,
    errors: usize,
    rss_base: u64,
    rss_peak: u64,
    bound: u64,
    bound_how: String,
    note: String,
    /// `herdguard_stream_waiter_ttfb_seconds` of this run: p50, p99, count;
    /// readers cut off (`herdguard_stream_readers_cut_off_total`).
    server_ttfb: Option<(Duration, Duration, usize, u64)>,
}

/// The crate's metrics, recorded for the `big` scenario only (installed
/// before its first layer is built; nothing else in the run reads them).
fn metrics_snapshotter() -> &'static Snapshotter {
    static SNAP: std::sync::OnceLock<Snapshotter> = std::sync::OnceLock::new();
    SNAP.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        if recorder.install().is_err() {
            eprintln!("a metrics recorder was already installed; server-side TTFB not read");
        }
        snap
    })
}

/// Server-side waiter TTFB since the last call (the debugging recorder
/// drains histograms on snapshot) and the cut-off counter's total.
fn waiter_ttfb_metric() -> Option<(Duration, Duration, usize, u64)> {
    let mut ttfb: Vec<Duration> = Vec::new();
    let mut cut = 0;
    for (k, _, _, v) in metrics_snapshotter().snapshot().into_vec() {
        match (k.key().name(), v) {
            ("herdguard_stream_waiter_ttfb_seconds", DebugValue::Histogram(h)) => {
                ttfb.extend(h.iter().map(|s| Duration::from_secs_f64(s.0.max(0.0))));
            }
            ("herdguard_stream_readers_cut_off_total", DebugValue::Counter(c)) => cut += c,
            _ => {}
        }
    }
    let count = ttfb.len();
    Some((
        quantile(&mut ttfb, 0.50)?,
        quantile(&mut ttfb, 0.99)?,
        count,
        cut,
    ))
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / 1048576.0)
}

/// N concurrent GETs for one `size`-byte body on one in-memory instance.
pub(crate) async fn run_big(cfg: &Config, size: usize, nonce: u64) -> Result<BigLine, String> {
    // Installs the recorder, and drains what an earlier row recorded.
    let _ = waiter_ttfb_metric();
    let origin = Arc::new(big::BigOrigin::new(
        size,
        cfg.big_rate,
        Duration::from_millis(100),
    ));
    let layer = CacheLayer::builder()
        .max_body_bytes(BIG_WINDOW)
        .build()
        .map_err(|e| e.to_string())?;
    let router = big::router(&origin).layer(layer.clone());
    let (addr, server) = serve(router).await.map_err(|e| format!("bind: {e}"))?;
    let _server = AbortOnDrop(server);
    let n = cfg.big_requests;
    // The clients run on a runtime of their own, as they would in other
    // processes: 200 readers hashing on the server's two worker threads
    // would be measured as the server's delay.
    let clients = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.big_client_threads)
        .thread_name("big-client")
        .enable_all()
        .build()
        .map_err(|e| format!("client runtime: {e}"))?;
    let path = format!("/big/{size}-{nonce}");
    // Generous: every body at a hundredth of the origin's rate, plus 30 s.
    let limit =
        Duration::from_secs_f64(size as f64 / cfg.big_rate * 100.0) + Duration::from_secs(30);
    // Every connection and its read buffer exist before the baseline.
    let connected = Arc::new(Barrier::new(n + 1));
    let barrier = Arc::new(Barrier::new(n + 1));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let connected = Arc::clone(&connected);
        let barrier = Arc::clone(&barrier);
        let path = path.clone();
        tasks.push(clients.spawn(async move {
            let conn =
                tokio::time::timeout(Duration::from_secs(5), big::HashingConn::connect(addr))
                    .await
                    .ok()
                    .and_then(Result::ok);
            // Every task reaches both barriers, connected or not.
            connected.wait().await;
            barrier.wait().await;
            let start = Instant::now();
            let reply = match conn {
                Some(c) => tokio::time::timeout(limit, c.get(&path))
                    .await
                    .unwrap_or_else(|_| Err(std::io::Error::other("timed out"))),
                None => Err(std::io::Error::other("connect failed")),
            };
            (start, reply)
        }));
    }
    connected.wait().await;
    // Peak RSS from here on: the kernel's high-water mark, reset now, and
    // a 5 ms sampler in case the reset is not allowed.
    let reset = big::reset_peak_rss();
    let base = rss_bytes().unwrap_or(0);
    let sampled = Arc::new(std::sync::atomic::AtomicU64::new(base));
    let sampler = {
        let sampled = Arc::clone(&sampled);
        AbortOnDrop(tokio::spawn(async move {
            loop {
                if let Some(r) = rss_bytes() {
                    sampled.fetch_max(r, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }))
    };
    barrier.wait().await;
    let burst_start = Instant::now();
    let mut replies = Vec::with_capacity(n);
    for t in tasks {
        if let Ok(r) = t.await {
            replies.push(r);
        }
    }
    drop(sampler);
    clients.shutdown_background();
    let server_ttfb = waiter_ttfb_metric();
    let peak = sampled
        .load(std::sync::atomic::Ordering::Relaxed)
        .max(if reset {
            big::peak_rss_bytes().unwrap_or(0)
        } else {
            0
        });

    let mut line = BigLine {
        size,
        requests: n,
        origin_calls: origin.calls(),
        rss_base: base,
        rss_peak: peak,
        ..BigLine::default()
    };
    let mut waiters = Vec::with_capacity(n);
    let mut leaders = Vec::new();
    for (start, reply) in &replies {
        let r = match reply {
            Ok(r) => r,
            Err(_) => {
                line.errors += 1;
                continue;
            }
        };
        let done = r.end.saturating_duration_since(burst_start);
        line.last_done = Some(line.last_done.map_or(done, |d| d.max(done)));
        let complete = r.status == 200 && r.error.is_none() && r.len == size as u64;
        if r.status != 200 {
            line.errors += 1;
        } else if !complete {
            line.incomplete += 1;
            line.incomplete_bytes = Some(
                line.incomplete_bytes
                    .map_or((r.len, r.len), |(lo, hi)| (lo.min(r.len), hi.max(r.len))),
            );
        } else if r.hash == origin.checksum() {
            line.exact += 1;
        } else {
            line.mismatches += 1;
        }
        if let Some(fb) = r.first_byte {
            let ttfb = fb.saturating_duration_since(*start);
            if r.collapsed {
                waiters.push(ttfb);
            } else {
                leaders.push((ttfb, r.cache_status.clone()));
            }
        }
        if !r.collapsed {
            line.uncollapsed += 1;
        }
        if r.declared.is_some_and(|d| d != size as u64) {
            line.note = format!("declared length {:?} != {size}", r.declared);
        }
    }
    // The leader: the request that did not read another's fill and got its
    // first byte first (there is exactly one when the origin was called once).
    leaders.sort();
    line.leader_ttfb = leaders.first().map(|(t, _)| *t);
    if let Some((_, cs)) = leaders.first() {
        line.note = format!("leader Cache-Status: {cs}");
    }
    line.waiter_ttfb_p50 = quantile(&mut waiters, 0.50);
    line.waiter_ttfb_p99 = quantile(&mut waiters, 0.99);
    line.waiter_ttfb_max = waiters.last().copied();
    let per_reader = HYPER_WRITE_QUEUE + PER_READER_EXTRA;
    let readers = n as u64;
    if size > BIG_WINDOW {
        line.bound = base + BIG_WINDOW as u64 + big::CHUNK as u64 + readers * per_reader;
        line.bound_how = format!(
            "baseline {} + window {} + one chunk {} + {n} readers x {} KiB (hyper write queue {} KiB + chunk + 16 KiB)",
            mib(base),
            mib(BIG_WINDOW as u64),
            mib(big::CHUNK as u64),
            per_reader / 1024,
            HYPER_WRITE_QUEUE / 1024
        );
    } else {
        // Storable: the fill keeps every chunk, then the stored entry is one
        // joined copy of the body.
        line.bound = base + 2 * size as u64 + readers * per_reader;
        line.bound_how = format!(
            "baseline {} + 2 x body {} (chunks kept for the store + the stored copy) + {n} readers x {} KiB",
            mib(base),
            mib(size as u64),
            per_reader / 1024
        );
    }
    line.server_ttfb = server_ttfb;
    let stats = layer.stats();
    line.note = format!(
        "{}; layer {}h/{}m/{}c/{}b",
        line.note, stats.hits, stats.misses, stats.coalesced, stats.bypasses
    );
    Ok(line)
}

/// Aborts a spawned task when dropped (the `big` scenario's server and sampler).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) fn print_big(label: &str, line: &BigLine) {
    let d = |o: Option<Duration>| opt_ms(o);
    println!(
        "-- {label}: {} MB body, N={}",
        line.size / 1_000_000,
        line.requests
    );
    if !line.note.is_empty() {
        println!("   {}", line.note);
    }
    if let Some((p50, p99, count, cut)) = line.server_ttfb {
        println!(
            "   server-side waiter TTFB (herdguard_stream_waiter_ttfb_seconds, {count} waiters): p50 {} p99 {} ms; readers cut off (counter) {cut}",
            ms(p50),
            ms(p99)
        );
    }
    println!(
        "   origin calls {}   requests not collapsed {}   last body done {} ms",
        line.origin_calls,
        line.uncollapsed,
        d(line.last_done)
    );
    let diff = |w: Option<Duration>| match (w, line.leader_ttfb) {
        (Some(w), Some(l)) => format!("{:+.1}", (w.as_secs_f64() - l.as_secs_f64()) * 1e3),
        _ => "-".to_owned(),
    };
    println!(
        "   TTFB ms (first body byte): leader {}   waiters p50 {} ({}), p99 {} ({}), max {}",
        d(line.leader_ttfb),
        d(line.waiter_ttfb_p50),
        diff(line.waiter_ttfb_p50),
        d(line.waiter_ttfb_p99),
        diff(line.waiter_ttfb_p99),
        d(line.waiter_ttfb_max)
    );
    println!(
        "   bodies: {} exact (blake3 = origin's), {} checksum mismatches, {} incomplete, {} other errors",
        line.exact, line.mismatches, line.incomplete, line.errors
    );
    if let Some((lo, hi)) = line.incomplete_bytes {
        println!(
            "   incomplete bodies ended after {}-{} MiB of {} MiB (cut off by the stream window)",
            mib(lo),
            mib(hi),
            mib(line.size as u64)
        );
    }
    println!(
        "   peak RSS {} MiB (baseline {} MiB, +{} MiB)   bound {} MiB = {}",
        mib(line.rss_peak),
        mib(line.rss_base),
        mib(line.rss_peak.saturating_sub(line.rss_base)),
        mib(line.bound),
        line.bound_how
    );
    let ttfb_ok = match (line.waiter_ttfb_p99, line.leader_ttfb) {
        (Some(w), Some(l)) => w.saturating_sub(l) <= Duration::from_millis(10),
        _ => false,
    };
    let checks = [
        ("origin calls = 1", line.origin_calls == 1),
        ("every body exact", line.exact == line.requests),
        ("waiter TTFB p99 within 10 ms of the leader's", ttfb_ok),
        ("peak RSS within bound", line.rss_peak <= line.bound),
    ];
    let failed: Vec<&str> = checks.iter().filter(|c| !c.1).map(|c| c.0).collect();
    if failed.is_empty() {
        println!("   VERDICT: PASS (origin calls 1, every body exact, TTFB within 10 ms, RSS within bound)");
    } else {
        println!("   VERDICT: FAIL: {}", failed.join("; "));
    }
}
