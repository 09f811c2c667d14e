//! Streaming fills: one origin body feeds the leader's client and every
//! coalesced waiter as it arrives. The origin here is a service
//! whose body the test feeds chunk by chunk, so every assertion is about
//! order and bytes, not about timing; tokio time is paused throughout.

use herdguard_testkit::stream as stream_support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use herdguard::service::{CacheBody, RequestBody};
use herdguard::CacheLayer;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tower::{Layer, Service, ServiceExt};

use stream_support::{chunks, concat, digest, settle, ChanBody, Chunk};

/// Counts calls; each call's body is fed through the sender it leaves behind.
#[derive(Clone)]
struct Origin {
    calls: Arc<AtomicUsize>,
    senders: Arc<Mutex<Vec<mpsc::UnboundedSender<Chunk>>>>,
    headers: Arc<Vec<(&'static str, String)>>,
}

impl Origin {
    fn new(headers: &[(&'static str, &str)]) -> Self {
        Self {
            calls: Arc::new(AtomicUsize::new(0)),
            senders: Arc::default(),
            headers: Arc::new(headers.iter().map(|(k, v)| (*k, v.to_string())).collect()),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The body sender of call `n` (0-based), taken: dropping it ends that body.
    fn body(&self, n: usize) -> mpsc::UnboundedSender<Chunk> {
        let closed = mpsc::unbounded_channel().0;
        std::mem::replace(&mut self.senders.lock().unwrap()[n], closed)
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
                o.calls.fetch_add(1, Ordering::SeqCst);
                let (tx, rx) = mpsc::unbounded_channel();
                o.senders.lock().unwrap().push(tx);
                let mut r = Response::new(ChanBody(rx));
                for (k, v) in o.headers.iter() {
                    r.headers_mut().insert(*k, v.parse().unwrap());
                }
                Ok::<_, Infallible>(r)
            }
        })
    }
}

fn layer(max_body: usize) -> CacheLayer {
    CacheLayer::builder()
        .max_body_bytes(max_body)
        .build()
        .unwrap()
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
    (0..n)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let r = svc.oneshot(get()).await.unwrap();
                let (parts, body) = r.into_parts();
                let body = body
                    .collect()
                    .await
                    .map(|c| c.to_bytes())
                    .map_err(|e| e.to_string());
                (parts.status, parts.headers, body)
            })
        })
        .collect()
}

fn cache_status(h: &HeaderMap) -> &str {
    h.get("cache-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// A storable chunked body: every reader gets exactly the origin's bytes
/// from one call, and the body is stored once complete.
#[tokio::test(start_paused = true)]
async fn stored_chunked_body_reaches_every_waiter_exactly() {
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let svc = layer(1 << 20).layer(origin.service());
    let readers = spawn_reads(&svc, 20);
    settle().await;
    let parts = chunks(8, 1000);
    let tx = origin.body(0);
    for c in &parts {
        tx.send(Ok(c.clone())).unwrap();
        settle().await;
    }
    drop(tx);
    let want = digest(&concat(&parts));
    for r in readers {
        let (status, headers, body) = r.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        let body = body.unwrap();
        assert_eq!(digest(&body), want, "{}", cache_status(&headers));
    }
    assert_eq!(origin.calls(), 1);
    // Stored: the next request is a hit with the same bytes.
    let (status, headers, body) = spawn_reads(&svc, 1).pop().unwrap().await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(
        cache_status(&headers).contains("hit"),
        "{}",
        cache_status(&headers)
    );
    assert_eq!(digest(&body.unwrap()), want);
    assert_eq!(origin.calls(), 1);
}

/// Waiters receive the first chunk while the origin has not sent the rest.
#[tokio::test(start_paused = true)]
async fn waiters_read_first_chunk_before_the_body_ends() {
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let svc = layer(1 << 20).layer(origin.service());
    let mut responses = Vec::new();
    for _ in 0..5 {
        let svc = svc.clone();
        responses.push(tokio::spawn(
            async move { svc.oneshot(get()).await.unwrap() },
        ));
    }
    settle().await;
    let tx = origin.body(0);
    tx.send(Ok(Bytes::from_static(b"first"))).unwrap();
    tx.send(Ok(Bytes::from_static(b"second"))).unwrap();
    settle().await;
    for r in responses {
        let mut body = r.await.unwrap().into_body();
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "first");
    }
    assert_eq!(origin.calls(), 1);
}

/// A shareable body above `max_body_bytes` (declared length): one origin
/// call serves every waiter exactly, and nothing is stored.
#[tokio::test(start_paused = true)]
async fn large_declared_body_is_shared_not_stored() {
    let parts = chunks(16, 4096);
    let len = (16 * 4096).to_string();
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("content-length", &len)]);
    // A window of 16 KiB: readers that keep up never fall out of it.
    let svc = layer(16 * 1024).layer(origin.service());
    let readers = spawn_reads(&svc, 20);
    settle().await;
    let tx = origin.body(0);
    for c in &parts {
        tx.send(Ok(c.clone())).unwrap();
        settle().await;
    }
    drop(tx);
    let want = digest(&concat(&parts));
    for r in readers {
        let (_, headers, body) = r.await.unwrap();
        assert_eq!(digest(&body.unwrap()), want, "{}", cache_status(&headers));
    }
    assert_eq!(origin.calls(), 1);
    // Not stored: the next request calls the origin.
    let next = spawn_reads(&svc, 1).pop().unwrap();
    settle().await;
    drop(origin.body(1));
    let _ = next.await.unwrap();
    assert_eq!(origin.calls(), 2);
}

/// A chunked body that crosses `max_body_bytes` mid-stream goes on to every
/// reader through the window, and is not stored.
#[tokio::test(start_paused = true)]
async fn chunked_body_crossing_the_limit_is_shared_not_stored() {
    let parts = chunks(32, 1024);
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let svc = layer(8 * 1024).layer(origin.service());
    let readers = spawn_reads(&svc, 10);
    settle().await;
    let tx = origin.body(0);
    for c in &parts {
        tx.send(Ok(c.clone())).unwrap();
        settle().await;
    }
    drop(tx);
    let want = digest(&concat(&parts));
    for r in readers {
        assert_eq!(digest(&r.await.unwrap().2.unwrap()), want);
    }
    assert_eq!(origin.calls(), 1);
    let next = spawn_reads(&svc, 1).pop().unwrap();
    settle().await;
    drop(origin.body(1));
    let _ = next.await.unwrap();
    assert_eq!(origin.calls(), 2);
}

/// The origin fails mid-body: every reader's body ends with an error, and
/// nothing is stored (the next request calls the origin again).
#[tokio::test(start_paused = true)]
async fn origin_failure_mid_body_errors_every_reader() {
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let svc = layer(1 << 20).layer(origin.service());
    let readers = spawn_reads(&svc, 10);
    settle().await;
    let tx = origin.body(0);
    tx.send(Ok(Bytes::from_static(b"part one"))).unwrap();
    settle().await;
    tx.send(Ok(Bytes::from_static(b"part two"))).unwrap();
    settle().await;
    tx.send(Err(std::io::Error::other("origin broke"))).unwrap();
    drop(tx);
    for r in readers {
        let (status, _, body) = r.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert!(body.is_err(), "a body cut short must end with an error");
    }
    let next = spawn_reads(&svc, 1).pop().unwrap();
    settle().await;
    assert_eq!(origin.calls(), 2, "a new leader calls the origin");
    let tx = origin.body(1);
    tx.send(Ok(Bytes::from_static(b"whole"))).unwrap();
    drop(tx);
    assert_eq!(next.await.unwrap().2.unwrap(), "whole");
}

/// The origin stalls mid-body past `origin_timeout`: every reader's body
/// ends with an error.
#[tokio::test(start_paused = true)]
async fn origin_stall_mid_body_errors_every_reader() {
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let svc = CacheLayer::builder()
        .origin_timeout(Duration::from_secs(2))
        .max_wait(Duration::from_secs(30))
        .build()
        .unwrap()
        .layer(origin.service());
    let readers = spawn_reads(&svc, 5);
    settle().await;
    let tx = origin.body(0);
    tx.send(Ok(Bytes::from_static(b"a"))).unwrap();
    settle().await;
    tx.send(Ok(Bytes::from_static(b"b"))).unwrap();
    // Keep the sender: the body stalls until the timeout ends the fill.
    for r in readers {
        assert!(r.await.unwrap().2.is_err());
    }
    drop(tx);
    assert_eq!(origin.calls(), 1);
}

/// A reader that reads nothing falls behind the window of a large body and
/// is cut off with an error, while every other reader finishes exactly.
#[tokio::test(start_paused = true)]
async fn slow_reader_is_cut_off_while_others_finish() {
    let parts = chunks(64, 1024);
    let len = (64 * 1024).to_string();
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("content-length", &len)]);
    let svc = layer(8 * 1024).layer(origin.service());
    // The slow reader gets its response but does not read its body yet.
    let slow = {
        let svc = svc.clone();
        tokio::spawn(async move { svc.oneshot(get()).await.unwrap() })
    };
    settle().await;
    let readers = spawn_reads(&svc, 10);
    settle().await;
    let tx = origin.body(0);
    for c in &parts {
        tx.send(Ok(c.clone())).unwrap();
        settle().await;
    }
    drop(tx);
    let want = digest(&concat(&parts));
    for r in readers {
        assert_eq!(digest(&r.await.unwrap().2.unwrap()), want);
    }
    let slow = slow.await.unwrap().into_body().collect().await;
    let err = slow.map(|_| ()).expect_err("the slow reader is cut off");
    assert!(err.to_string().contains("fell behind"), "{err}");
    assert_eq!(origin.calls(), 1);
}

/// The leader's client goes away mid-stream: the fill goes on and every
/// waiter completes with exact bytes.
#[tokio::test(start_paused = true)]
async fn leader_disconnect_mid_stream_keeps_others() {
    let parts = chunks(10, 500);
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let svc = layer(1 << 20).layer(origin.service());
    let leader = {
        let svc = svc.clone();
        tokio::spawn(async move { svc.oneshot(get()).await.unwrap() })
    };
    settle().await;
    let readers = spawn_reads(&svc, 10);
    settle().await;
    let tx = origin.body(0);
    tx.send(Ok(parts[0].clone())).unwrap();
    tx.send(Ok(parts[1].clone())).unwrap();
    settle().await;
    let mut body = leader.await.unwrap().into_body();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        parts[0]
    );
    drop(body);
    for c in &parts[2..] {
        tx.send(Ok(c.clone())).unwrap();
        settle().await;
    }
    drop(tx);
    let want = digest(&concat(&parts));
    for r in readers {
        assert_eq!(digest(&r.await.unwrap().2.unwrap()), want);
    }
    assert_eq!(origin.calls(), 1);
}

/// Every reader of a body too large to store goes away: the origin call is
/// dropped (its body is no longer read) once the window has left the start.
#[tokio::test(start_paused = true)]
async fn all_readers_gone_drop_a_large_origin_call() {
    let len = (1024 * 1024).to_string();
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("content-length", &len)]);
    let svc = layer(4 * 1024).layer(origin.service());
    let r = {
        let svc = svc.clone();
        tokio::spawn(async move { svc.oneshot(get()).await.unwrap() })
    };
    settle().await;
    let tx = origin.body(0);
    tx.send(Ok(Bytes::from(vec![1u8; 1024]))).unwrap();
    settle().await;
    drop(r.await.unwrap());
    let mut sent = 0;
    while tx.send(Ok(Bytes::from(vec![2u8; 1024]))).is_ok() && sent < 1000 {
        sent += 1;
        settle().await;
    }
    assert!(
        tx.is_closed(),
        "the origin body is dropped once nobody reads"
    );
    assert!(sent < 16, "dropped within the window, after {sent} chunks");
}

/// A HEAD waiter on a streamed fill gets the head and no body.
#[tokio::test(start_paused = true)]
async fn head_waiter_gets_no_body() {
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let svc = layer(1 << 20).layer(origin.service());
    let readers = spawn_reads(&svc, 1);
    settle().await;
    let head = {
        let svc = svc.clone();
        tokio::spawn(async move {
            let req = Request::builder()
                .method(Method::HEAD)
                .uri("http://s.test/big")
                .body(())
                .unwrap();
            let r = svc.oneshot(req).await.unwrap();
            let status = r.status();
            (status, r.into_body().collect().await.unwrap().to_bytes())
        })
    };
    settle().await;
    let tx = origin.body(0);
    tx.send(Ok(Bytes::from_static(b"x"))).unwrap();
    tx.send(Ok(Bytes::from_static(b"y"))).unwrap();
    drop(tx);
    let (status, body) = head.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(body.is_empty());
    assert_eq!(
        readers
            .into_iter()
            .next()
            .unwrap()
            .await
            .unwrap()
            .2
            .unwrap(),
        "xy"
    );
    assert_eq!(origin.calls(), 1);
}

/// The next frame's data of `body` (`None` at its end); panics if it stalls
/// for 30 virtual seconds (a reader may wait 5 s for stalled ones), so a
/// stuck stream fails instead of hanging.
async fn next_data(body: &mut CacheBody<ChanBody>) -> Option<Result<Bytes, String>> {
    let frame = tokio::time::timeout(Duration::from_secs(30), body.frame())
        .await
        .expect("the stream stalled");
    frame.map(|f| {
        f.map(|f| f.into_data().unwrap_or_default())
            .map_err(|e| e.to_string())
    })
}

/// Start one GET now and hand back its response.
fn spawn_get<S>(svc: &S) -> tokio::task::JoinHandle<Response<CacheBody<ChanBody>>>
where
    S: Service<Request<()>, Response = Response<CacheBody<ChanBody>>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let svc = svc.clone();
    tokio::spawn(async move { svc.oneshot(get()).await.unwrap() })
}

/// A body too large to store, with the origin running ahead of every
/// reader: a reader that stays half a window behind the fastest one gets
/// every byte exactly, and one that reads nothing is cut off.
#[tokio::test(start_paused = true)]
async fn reader_half_a_window_behind_the_fastest_gets_every_byte() {
    const WINDOW: usize = 8 * 1024;
    let parts = chunks(64, 1024);
    let len = (64 * 1024).to_string();
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("content-length", &len)]);
    let svc = layer(WINDOW).layer(origin.service());
    let fastest = spawn_get(&svc);
    settle().await;
    let behind = spawn_get(&svc);
    let stalled = spawn_get(&svc);
    settle().await;
    // The whole body is ready at the origin: only the window holds the
    // fill back.
    let tx = origin.body(0);
    for c in &parts {
        tx.send(Ok(c.clone())).unwrap();
    }
    drop(tx);
    let mut fastest = fastest.await.unwrap().into_body();
    let mut behind = behind.await.unwrap().into_body();
    let (mut fastest_got, mut behind_got) = (Vec::new(), Vec::new());
    while let Some(c) = next_data(&mut fastest).await {
        fastest_got.extend_from_slice(&c.unwrap());
        settle().await;
        while fastest_got.len() - behind_got.len() > WINDOW / 2 {
            match next_data(&mut behind).await {
                Some(Ok(c)) => behind_got.extend_from_slice(&c),
                other => panic!(
                    "{} bytes behind the fastest reader: {other:?}",
                    fastest_got.len() - behind_got.len()
                ),
            }
        }
    }
    while let Some(c) = next_data(&mut behind).await {
        behind_got.extend_from_slice(&c.unwrap());
    }
    let want = digest(&concat(&parts));
    assert_eq!(digest(&fastest_got), want);
    assert_eq!(digest(&behind_got), want);
    let err = stalled
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .map(|_| ())
        .expect_err("a reader more than a window behind is cut off");
    assert!(err.to_string().contains("fell behind"), "{err}");
    assert_eq!(origin.calls(), 1);
}

/// What a paced reader's body ended with: its digest and end time, or
/// the error.
type SlowEnd = Result<(u64, tokio::time::Instant), String>;

/// One GET whose body is read one frame per `per_chunk`.
fn read_paced<S>(svc: &S, per_chunk: Duration) -> tokio::task::JoinHandle<SlowEnd>
where
    S: Service<Request<()>, Response = Response<CacheBody<ChanBody>>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let r = spawn_get(svc);
    tokio::spawn(async move {
        let mut body = r.await.unwrap().into_body();
        let mut got = Vec::new();
        while let Some(c) = body.frame().await {
            got.extend_from_slice(&c.map_err(|e| e.to_string())?.into_data().unwrap());
            tokio::time::sleep(per_chunk).await;
        }
        Ok((digest(&got), tokio::time::Instant::now()))
    })
}

/// How long (virtual time) five readers that take 1 ms per chunk need to
/// read a 512 KiB body too large to store (64 windows), from the moment
/// the origin has it all; with `slow`, also how the body of a reader
/// taking 50 ms per chunk, the leader, ended.
async fn fast_readers_time(slow: bool) -> (Duration, Option<SlowEnd>) {
    let parts = chunks(512, 1024);
    let len = (512 * 1024).to_string();
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("content-length", &len)]);
    let svc = layer(8 * 1024).layer(origin.service());
    let slow = slow.then(|| read_paced(&svc, Duration::from_millis(50)));
    settle().await;
    let fast: Vec<_> = (0..5)
        .map(|_| read_paced(&svc, Duration::from_millis(1)))
        .collect();
    settle().await;
    let tx = origin.body(0);
    let start = tokio::time::Instant::now();
    for c in &parts {
        tx.send(Ok(c.clone())).unwrap();
    }
    drop(tx);
    let want = digest(&concat(&parts));
    let mut last = start;
    for r in fast {
        let (got, done) = r.await.unwrap().unwrap();
        assert_eq!(got, want);
        last = last.max(done);
    }
    let slow = match slow {
        Some(slow) => Some(slow.await.unwrap()),
        None => None,
    };
    assert_eq!(origin.calls(), 1);
    (last - start, slow)
}

/// A slow reader is cut off, and the others finish within 10% of the time
/// they take with no slow reader.
#[tokio::test(start_paused = true)]
async fn slow_reader_does_not_slow_the_others() {
    let (alone, _) = tokio::time::timeout(Duration::from_secs(60), fast_readers_time(false))
        .await
        .unwrap();
    let (with_slow, slow) = tokio::time::timeout(Duration::from_secs(60), fast_readers_time(true))
        .await
        .unwrap();
    assert!(
        with_slow.as_secs_f64() <= alone.as_secs_f64() * 1.1,
        "{with_slow:?} with a slow reader, {alone:?} without"
    );
    let err = slow.unwrap().expect_err("the slow reader is cut off");
    assert!(err.contains("fell behind"), "{err}");
}

/// Readers that are all slower than the origin, at somewhat different
/// paces, get every byte of a body too large to store from one call: the
/// slowest, two thirds as fast as most, paces the origin and is not cut off
/// (only a reader less than a quarter as fast as most is).
#[tokio::test(start_paused = true)]
async fn readers_slower_than_the_origin_pace_it_and_all_finish() {
    let parts = chunks(64, 1024);
    let len = (64 * 1024).to_string();
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("content-length", &len)]);
    let svc = layer(8 * 1024).layer(origin.service());
    let readers: Vec<_> = [2, 2, 2, 3, 3]
        .into_iter()
        .map(|ms| read_paced(&svc, Duration::from_millis(ms)))
        .collect();
    settle().await;
    let tx = origin.body(0);
    for c in &parts {
        tx.send(Ok(c.clone())).unwrap();
    }
    drop(tx);
    let want = digest(&concat(&parts));
    for r in readers {
        let (got, _) = r.await.unwrap().expect("nobody is cut off");
        assert_eq!(got, want);
    }
    assert_eq!(origin.calls(), 1);
}

/// Requests that arrive once the first byte of a body too large to store
/// has left the window share one new origin call among themselves, instead
/// of each making its own.
#[tokio::test(start_paused = true)]
async fn late_arrivals_share_one_new_call() {
    let parts = chunks(64, 1024);
    let len = (64 * 1024).to_string();
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("content-length", &len)]);
    let svc = layer(8 * 1024).layer(origin.service());
    let first = read_paced(&svc, Duration::from_millis(1));
    settle().await;
    let tx = origin.body(0);
    for c in &parts[..32] {
        tx.send(Ok(c.clone())).unwrap();
    }
    // The first reader is well past the window: the first byte is gone.
    tokio::time::sleep(Duration::from_millis(40)).await;
    let late = spawn_reads(&svc, 5);
    settle().await;
    assert_eq!(origin.calls(), 2, "one new call for the late requests");
    for c in &parts[32..] {
        tx.send(Ok(c.clone())).unwrap();
    }
    drop(tx);
    let tx = origin.body(1);
    for c in &parts {
        tx.send(Ok(c.clone())).unwrap();
    }
    drop(tx);
    let want = digest(&concat(&parts));
    assert_eq!(first.await.unwrap().unwrap().0, want);
    for r in late {
        let (_, headers, body) = r.await.unwrap();
        assert_eq!(digest(&body.unwrap()), want, "{}", cache_status(&headers));
    }
    assert_eq!(origin.calls(), 2);
}

/// Under a pass marker, an uncacheable event stream (`no-store`) reaches its request as it arrives: the first event is read while the origin still holds the rest.
#[tokio::test(start_paused = true)]
async fn an_uncacheable_stream_under_a_pass_marker_streams() {
    let origin = Origin::new(&[
        ("cache-control", "no-store"),
        ("content-type", "text/event-stream"),
    ]);
    let svc = layer(1 << 20).layer(origin.service());
    // The first answer sets the marker.
    let first = spawn_reads(&svc, 1).pop().unwrap();
    settle().await;
    let tx = origin.body(0);
    tx.send(Ok(Bytes::from_static(b"data: 0\n\n"))).unwrap();
    drop(tx);
    let (_, headers, _) = first.await.unwrap();
    assert!(
        cache_status(&headers).contains("uncacheable"),
        "{}",
        cache_status(&headers)
    );

    let next = tokio::spawn(svc.clone().oneshot(get()));
    settle().await;
    assert_eq!(origin.calls(), 2);
    let tx = origin.body(1);
    tx.send(Ok(Bytes::from_static(b"data: 1\n\n"))).unwrap();
    let response = next.await.unwrap().unwrap();
    assert!(
        cache_status(response.headers()).contains("detail=hit-for-pass"),
        "{}",
        cache_status(response.headers())
    );
    let mut body = response.into_body();
    let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("the first event arrives before the stream ends")
        .unwrap()
        .unwrap();
    assert_eq!(
        frame.into_data().unwrap(),
        Bytes::from_static(b"data: 1\n\n")
    );
    tx.send(Ok(Bytes::from_static(b"data: 2\n\n"))).unwrap();
    drop(tx);
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, Bytes::from_static(b"data: 2\n\n"));
    assert_eq!(origin.calls(), 2);
}
