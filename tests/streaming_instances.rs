//! Streamed fills too large to store, seen from outside the flight and
//! from other instances: no hit-for-pass after them, a first frame past the
//! limit shared like a declared length, and other instances on one Redis
//! calling the origin once each, as soon as the leader knows the body is too
//! large. The origin's bodies are fed by hand, so assertions are about order
//! and bytes. Memory-only tests pause tokio time; the Redis ones cannot (real
//! server), so they use real time with bounded waits.

#[cfg(feature = "redis")]
use herdguard_testkit as support;

use herdguard_testkit::stream as stream_support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use herdguard::service::{CacheBody, RequestBody};
use herdguard::CacheLayer;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::{mpsc, Semaphore};
use tower::{Layer, Service, ServiceExt};

use stream_support::{chunks, concat, digest, settle, ChanBody, Chunk};

type Head = Vec<(&'static str, String)>;

fn head(fields: &[(&'static str, &str)]) -> Head {
    fields.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// Counts calls; call `n` answers with `heads[n]` (the last one repeats)
/// once it gets a permit of the gate, and its body is fed through the
/// sender it leaves behind.
#[derive(Clone)]
struct Origin {
    calls: Arc<AtomicUsize>,
    senders: Arc<Mutex<Vec<Option<mpsc::UnboundedSender<Chunk>>>>>,
    heads: Arc<Vec<Head>>,
    gate: Arc<Semaphore>,
}

impl Origin {
    /// Answers at once, call `n` with `heads[n]` (the last one repeats).
    fn new(heads: Vec<Head>) -> Self {
        assert!(!heads.is_empty(), "an origin needs a response head");
        Self {
            calls: Arc::new(AtomicUsize::new(0)),
            senders: Arc::default(),
            heads: Arc::new(heads),
            gate: Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)),
        }
    }

    /// Each call holds its response head until [`open`](Self::open) lets it go.
    #[cfg_attr(
        not(feature = "redis"),
        allow(dead_code, reason = "only the Redis tests hold calls back")
    )]
    fn gated(mut self) -> Self {
        self.gate = Arc::new(Semaphore::new(0));
        self
    }

    /// Let `n` more calls answer.
    #[cfg_attr(
        not(feature = "redis"),
        allow(dead_code, reason = "only the Redis tests hold calls back")
    )]
    fn open(&self, n: usize) {
        self.gate.add_permits(n);
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The body sender of call `n` (0-based), once that call has answered;
    /// dropping it ends that body.
    async fn body(&self, n: usize) -> mpsc::UnboundedSender<Chunk> {
        let mut taken = None;
        until(&format!("origin call {n} answers"), || {
            let mut senders = self.senders.lock().unwrap();
            taken = senders.get_mut(n).and_then(Option::take);
            taken.is_some()
        })
        .await;
        taken.unwrap()
    }

    fn service(
        &self,
    ) -> impl Service<
        Request<RequestBody<()>>,
        Response = Response<ChanBody>,
        Error = Infallible,
        Future: Send,
    > + Clone
           + Send
           + 'static {
        let o = self.clone();
        tower::service_fn(move |_req: Request<RequestBody<()>>| {
            let o = o.clone();
            async move {
                let n = o.calls.fetch_add(1, Ordering::SeqCst);
                o.gate.acquire().await.unwrap().forget();
                let (tx, rx) = mpsc::unbounded_channel();
                {
                    let mut senders = o.senders.lock().unwrap();
                    if senders.len() <= n {
                        senders.resize_with(n + 1, || None);
                    }
                    senders[n] = Some(tx);
                }
                let mut r = Response::new(ChanBody(rx));
                let head = &o.heads[n.min(o.heads.len() - 1)];
                for (k, v) in head {
                    r.headers_mut().insert(*k, v.parse().unwrap());
                }
                Ok::<_, Infallible>(r)
            }
        })
    }
}

/// Wait until `cond` holds: at most 10 s (virtual ones under paused time).
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn get() -> Request<()> {
    Request::builder()
        .uri("http://s.test/big")
        .body(())
        .unwrap()
}

/// What one GET ended with: status, headers, and the whole body or its error.
type Read = (StatusCode, HeaderMap, Result<Bytes, String>);

/// Start `n` GETs; each task returns its status, headers and body result.
fn spawn_reads<S>(svc: &S, n: usize) -> Vec<tokio::task::JoinHandle<Read>>
where
    S: Service<Request<()>, Response = Response<CacheBody<ChanBody>>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    spawn_counted_reads(svc, n, &Arc::default())
}

/// [`spawn_reads`], adding to `read` the body bytes each reader has read
/// so far, so a test can wait for every reader to catch up.
fn spawn_counted_reads<S>(
    svc: &S,
    n: usize,
    read: &Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<Read>>
where
    S: Service<Request<()>, Response = Response<CacheBody<ChanBody>>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    (0..n)
        .map(|_| {
            let svc = svc.clone();
            let read = Arc::clone(read);
            tokio::spawn(async move {
                let r = svc.oneshot(get()).await.unwrap();
                let (parts, mut body) = r.into_parts();
                let mut whole = Vec::new();
                let body = loop {
                    match body.frame().await {
                        None => break Ok(Bytes::from(whole)),
                        Some(Err(e)) => break Err(e.to_string()),
                        Some(Ok(frame)) => {
                            if let Ok(data) = frame.into_data() {
                                read.fetch_add(data.len(), Ordering::SeqCst);
                                whole.extend_from_slice(&data);
                            }
                        }
                    }
                };
                (parts.status, parts.headers, body)
            })
        })
        .collect()
}

/// Every read ended 200 with exactly `want`'s bytes.
async fn assert_exact(reads: Vec<tokio::task::JoinHandle<Read>>, want: &[u8]) {
    let want = digest(want);
    for r in reads {
        let (status, headers, body) = tokio::time::timeout(Duration::from_secs(30), r)
            .await
            .expect("a read finishes")
            .unwrap();
        let status_line = headers
            .get("cache-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        assert_eq!(status, StatusCode::OK, "{status_line}");
        let body = body.unwrap_or_else(|e| panic!("body failed: {e} ({status_line})"));
        assert_eq!(digest(&body), want, "{status_line}");
    }
}

/// Send every chunk, letting readers run between them, then end the body.
async fn feed(tx: mpsc::UnboundedSender<Chunk>, parts: &[Bytes]) {
    for c in parts {
        tx.send(Ok(c.clone())).unwrap();
        settle().await;
    }
}

fn memory_layer(max_body: usize) -> CacheLayer {
    CacheLayer::builder()
        .max_body_bytes(max_body)
        .build()
        .unwrap()
}

/// After a too-large shared fill completes, a new burst makes exactly one
/// more origin call: too large is not hit-for-pass.
#[tokio::test(start_paused = true)]
async fn burst_after_a_too_large_fill_is_coalesced_again() {
    const N: usize = 20;
    let parts = chunks(16, 4096);
    let len = (16 * 4096).to_string();
    let origin = Origin::new(vec![head(&[
        ("cache-control", "max-age=60"),
        ("content-length", &len),
    ])]);
    let svc = memory_layer(16 * 1024).layer(origin.service());
    let first = spawn_reads(&svc, N);
    settle().await;
    feed(origin.body(0).await, &parts).await;
    assert_exact(first, &concat(&parts)).await;
    assert_eq!(origin.calls(), 1);

    let second = spawn_reads(&svc, N);
    settle().await;
    assert_eq!(origin.calls(), 2, "one shared call for the whole new burst");
    feed(origin.body(1).await, &parts).await;
    assert_exact(second, &concat(&parts)).await;
    assert_eq!(origin.calls(), 2);
}

/// A body whose first frame alone is over the limit (no Content-Length)
/// reaches every waiter exactly from one origin call.
#[tokio::test(start_paused = true)]
async fn first_frame_over_the_limit_is_shared() {
    const N: usize = 20;
    let mut parts = chunks(1, 20 * 1024);
    parts.extend(chunks(4, 1024));
    let origin = Origin::new(vec![head(&[("cache-control", "max-age=60")])]);
    let svc = memory_layer(8 * 1024).layer(origin.service());
    let reads = spawn_reads(&svc, N);
    settle().await;
    feed(origin.body(0).await, &parts).await;
    assert_eq!(origin.calls(), 1, "no waiter was released to call itself");
    assert_exact(reads, &concat(&parts)).await;
}

#[cfg(feature = "redis")]
mod across_instances {
    use super::support::RedisServer;
    use super::*;
    use deadpool_redis::redis;
    use herdguard::RedisOptions;

    const NS: &str = "si";
    /// The store limit, and so the window of a body too large to store.
    const LIMIT: usize = 64 * 1024;

    /// A body one chunk over the limit: only its last chunk needs room.
    fn large_parts() -> Vec<Bytes> {
        chunks(65, 1024)
    }

    fn large_head() -> Head {
        head(&[
            ("cache-control", "max-age=60"),
            ("content-length", &(65 * 1024).to_string()),
        ])
    }

    /// One instance on `server`. Polls are rarer than any wait here, so a
    /// waiter that moves on was woken by a notification.
    fn instance(server: &RedisServer) -> CacheLayer {
        CacheLayer::builder()
            .max_body_bytes(LIMIT)
            .redis(
                RedisOptions::new(server.url())
                    .namespace(NS)
                    .lease_ttl(Duration::from_secs(30))
                    .poll_interval(Duration::from_secs(30))
                    .response_timeout(Duration::from_secs(5))
                    .pool_wait_timeout(Duration::from_secs(2)),
            )
            .build()
            .unwrap()
    }

    /// Redis holds every write (and every script) for `d`: a release or a
    /// lease asked for meanwhile is answered when the pause ends.
    async fn pause_writes(server: &RedisServer, d: Duration) {
        let mut c = server.connection().await;
        let () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(d.as_millis() as u64)
            .arg("WRITE")
            .query_async(&mut c)
            .await
            .unwrap();
    }

    /// Sharded fill channels some instance subscribes to (a waiter on a lease).
    async fn fill_waiters(server: &RedisServer) -> usize {
        let mut c = server.connection().await;
        let names: Vec<String> = redis::cmd("PUBSUB")
            .arg("SHARDCHANNELS")
            .arg(format!("{NS}:*:fill"))
            .query_async(&mut c)
            .await
            .unwrap();
        names.len()
    }

    /// Wait (at most 10 s) until an instance waits on the key's lease.
    async fn until_waiting(server: &RedisServer) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while fill_waiters(server).await == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no instance ever waited on the lease"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Two instances on one Redis, a body too large to store (`head`), every
    /// request arriving while A's leader streams: exactly 2 origin calls,
    /// exact bytes everywhere, and B's call starts before A's body ends: from
    /// A's head alone when `declared`, else once A's body passes the limit.
    ///
    /// Each body's last chunk (the one that needs room in the window) is
    /// sent only once every reader has read the rest: which readers a full
    /// window may cut off is `streaming.rs`'s business, not this test's.
    async fn each_instance_calls_once(head: Head, declared: bool) {
        const N: usize = 20;
        const M: usize = 20;
        let server = RedisServer::start();
        let origin = Origin::new(vec![head]).gated();
        let a = instance(&server).layer(origin.service());
        let b = instance(&server).layer(origin.service());
        let parts = large_parts();
        let (window, last) = parts.split_at(parts.len() - 1);
        let window_bytes = concat(window).len();

        let (read_a, read_b) = (Arc::new(AtomicUsize::new(0)), Arc::default());
        let on_a = spawn_counted_reads(&a, N, &read_a);
        until("A's leader calls the origin", || origin.calls() == 1).await;
        let on_b = spawn_counted_reads(&b, M, &read_b);
        until_waiting(&server).await;
        // Let B's lookup after subscribing land and its wait begin.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(origin.calls(), 1, "B waits while A holds the lease");

        origin.open(1);
        let a_body = origin.body(0).await;
        let b_calls = || origin.calls() == 2;
        if declared {
            until("B calls the origin when A has the head", b_calls).await;
        }
        for c in window {
            a_body.send(Ok(c.clone())).unwrap();
        }
        until("every reader on A has read up to the limit", || {
            read_a.load(Ordering::SeqCst) == N * window_bytes
        })
        .await;
        if !declared {
            a_body.send(Ok(last[0].clone())).unwrap();
            until("B calls the origin once A passes the limit", b_calls).await;
        }
        assert!(!a_body.is_closed(), "A's stream has not ended");

        origin.open(1);
        let b_body = origin.body(1).await;
        for c in window {
            b_body.send(Ok(c.clone())).unwrap();
        }
        until("every reader on B has read up to the limit", || {
            read_b.load(Ordering::SeqCst) == M * window_bytes
        })
        .await;
        if declared {
            a_body.send(Ok(last[0].clone())).unwrap();
        }
        b_body.send(Ok(last[0].clone())).unwrap();
        drop((a_body, b_body));
        let want = concat(&parts);
        assert_exact(on_a, &want).await;
        assert_exact(on_b, &want).await;
        assert_eq!(origin.calls(), 2);
    }

    /// A declared length over the limit: B calls as soon as A has the head.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_instance_calls_once_from_the_declared_length() {
        each_instance_calls_once(large_head(), true).await;
    }

    /// A chunked body that outgrows the limit mid-stream: B calls as soon as
    /// A has read past the limit (all but the end of its body).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_instance_calls_once_when_the_body_outgrows_the_limit() {
        let chunked = head(&[("cache-control", "max-age=60")]);
        each_instance_calls_once(chunked, false).await;
    }

    /// A storable fill after a too-large one on the same key is waited for:
    /// the too-large fill left nothing behind that sends another instance
    /// to the origin itself. Redis's writes are paused while the too-large
    /// body streams, so that fill's flight on A has not ended (its lease's
    /// release waits) when A's second read arrives: that read follows it,
    /// too late for its stream, and must still lead the next fill under the
    /// lease, not call on its own (which let B lead a third call).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn storable_fill_after_a_too_large_one_is_waited_for() {
        let server = RedisServer::start();
        let small = head(&[("cache-control", "max-age=60")]);
        let origin = Origin::new(vec![large_head(), small]).gated();
        let a = instance(&server).layer(origin.service());
        let b = instance(&server).layer(origin.service());

        // A too-large fill on A, its lease held until Redis takes writes.
        let first = spawn_reads(&a, 1);
        until("A's first fill calls the origin", || origin.calls() == 1).await;
        pause_writes(&server, Duration::from_millis(1500)).await;
        origin.open(1);
        let tx = origin.body(0).await;
        let parts = large_parts();
        for c in &parts {
            tx.send(Ok(c.clone())).unwrap();
        }
        drop(tx);
        assert_exact(first, &concat(&parts)).await;

        // A leads again (the origin holds its answer).
        let second = spawn_reads(&a, 1);
        until("A's second fill calls the origin", || origin.calls() == 2).await;

        // B arrives during that fill: it waits for it, calling nothing.
        let on_b = spawn_reads(&b, 5);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while fill_waiters(&server).await == 0 && origin.calls() == 2 {
            assert!(tokio::time::Instant::now() < deadline, "B never waited");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(origin.calls(), 2, "B waits for the storable fill");

        origin.open(1);
        let body = Bytes::from_static(b"small and storable");
        let tx = origin.body(1).await;
        tx.send(Ok(body.clone())).unwrap();
        drop(tx);
        assert_exact(second, &body).await;
        assert_exact(on_b, &body).await;
        assert_eq!(origin.calls(), 2);
    }
}
