//! Streamed fills at their edges: a zero-byte window,
//! and a body too large to store whose transfer outlasts `origin_timeout`.
//! The origin is a service whose bodies the test feeds chunk by chunk;
//! tokio time is paused.

use herdguard_testkit::stream as stream_support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use herdguard::service::{CacheBody, RequestBody};
use herdguard::CacheLayer;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tower::{Layer, Service, ServiceExt};

use stream_support::{chunks, concat, settle, ChanBody, Chunk};

/// Counts calls by path; each call's body is fed through the sender it
/// leaves behind. Paths starting with `/big` declare `big_len` bytes.
#[derive(Clone)]
struct Origin {
    calls: Arc<Mutex<Vec<String>>>,
    senders: Arc<Mutex<Vec<mpsc::UnboundedSender<Chunk>>>>,
    big_len: usize,
}

impl Origin {
    fn new(big_len: usize) -> Self {
        Self {
            calls: Arc::default(),
            senders: Arc::default(),
            big_len,
        }
    }

    fn calls_to(&self, path: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|p| *p == path)
            .count()
    }

    /// The body sender of call `n` (0-based, over all paths), taken.
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
        tower::service_fn(move |req: Request<RequestBody<()>>| {
            let o = o.clone();
            async move {
                let path = req.uri().path().to_string();
                let (mut tx, rx) = mpsc::unbounded_channel();
                if path.starts_with("/small") {
                    // Two frames, ready at once: a storable chunked body.
                    for c in chunks(2, 1024) {
                        tx.send(Ok(c)).unwrap();
                    }
                    tx = mpsc::unbounded_channel().0;
                }
                o.senders.lock().unwrap().push(tx);
                let mut r = Response::new(ChanBody(rx));
                r.headers_mut()
                    .insert("cache-control", "max-age=60".parse().unwrap());
                if path.starts_with("/big") {
                    r.headers_mut()
                        .insert("content-length", o.big_len.to_string().parse().unwrap());
                }
                o.calls.lock().unwrap().push(path);
                Ok::<_, Infallible>(r)
            }
        })
    }
}

fn get(path: &str) -> Request<()> {
    Request::builder()
        .uri(format!("http://s.test{path}"))
        .body(())
        .unwrap()
}

type Svc = tower::util::BoxCloneService<Request<()>, Response<CacheBody<ChanBody>>, Infallible>;

fn service(layer: CacheLayer, origin: &Origin) -> Svc {
    tower::util::BoxCloneService::new(layer.layer(origin.service()))
}

fn spawn_get(
    svc: &Svc,
    path: &'static str,
) -> tokio::task::JoinHandle<Response<CacheBody<ChanBody>>> {
    let svc = svc.clone();
    tokio::spawn(async move { svc.oneshot(get(path)).await.unwrap() })
}

/// One GET whose body is read whole: its status and body or error.
fn spawn_read(
    svc: &Svc,
    path: &'static str,
) -> tokio::task::JoinHandle<(StatusCode, Result<Bytes, String>)> {
    let r = spawn_get(svc, path);
    tokio::spawn(async move {
        let (parts, body) = r.await.unwrap().into_parts();
        let body = body
            .collect()
            .await
            .map(|c| c.to_bytes())
            .map_err(|e| e.to_string());
        (parts.status, body)
    })
}

/// A body too large to store with `max_body_bytes(0)`: readers that keep
/// up with the origin are never made to wait for each other (nothing is
/// held once they have read it all), so they finish when the origin does.
#[tokio::test(start_paused = true)]
async fn zero_window_readers_that_keep_up_do_not_wait() {
    let parts = chunks(16, 1024);
    let origin = Origin::new(16 * 1024);
    let svc = service(
        CacheLayer::builder().max_body_bytes(0).build().unwrap(),
        &origin,
    );
    let readers: Vec<_> = (0..3).map(|_| spawn_read(&svc, "/big")).collect();
    settle().await;
    let tx = origin.body(0);
    let start = tokio::time::Instant::now();
    for c in &parts {
        tx.send(Ok(c.clone())).unwrap();
        settle().await;
    }
    drop(tx);
    for r in readers {
        let (status, body) = r.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body.unwrap(), concat(&parts));
    }
    // 16 chunks, 5 ms apart: the origin's own pace, and no more.
    assert!(
        start.elapsed() < Duration::from_millis(200),
        "readers that keep up took {:?}",
        start.elapsed()
    );
    assert_eq!(origin.calls_to("/big"), 1);
}

/// A body too large to store, read by one client at a steady 4 KiB/s from
/// an origin that has it all: nothing stalls, so the client gets every
/// byte, even though the transfer takes longer than `origin_timeout`
/// (a too-large body used to stream through with no such bound, and the
/// docs promise an error only for an origin that stalls that long).
#[tokio::test(start_paused = true)]
async fn steady_reader_of_a_large_body_outlasting_origin_timeout_gets_every_byte() {
    let parts = chunks(64, 1024);
    let origin = Origin::new(64 * 1024);
    let svc = service(
        CacheLayer::builder()
            .max_body_bytes(8 * 1024)
            .origin_timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        &origin,
    );
    let r = spawn_get(&svc, "/big");
    settle().await;
    let tx = origin.body(0);
    for c in &parts {
        tx.send(Ok(c.clone())).unwrap();
    }
    drop(tx);
    let mut body = r.await.unwrap().into_body();
    let mut got = Vec::new();
    let start = tokio::time::Instant::now();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => got.extend_from_slice(&f.into_data().unwrap()),
            Err(e) => panic!(
                "after {:?} and {} of {} bytes: {e}",
                start.elapsed(),
                got.len(),
                64 * 1024
            ),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(got, concat(&parts));
    assert_eq!(origin.calls_to("/big"), 1);
}
