//! Byte ranges served from the cache: a `Range` request is
//! answered with its slice of the complete 200 the cache stores or is
//! filling, one origin call for a cold URL whatever mix of plain and range
//! requests asks for it, and plain requests never see a 206. Memory-only
//! tests pause tokio time; the Redis one runs on real time against a real
//! redis-server.

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
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use tokio::sync::mpsc;
use tower::{Layer, Service, ServiceExt};

use stream_support::{chunks, concat, settle, ChanBody, Chunk};

type OriginBody = BoxBody<Bytes, std::io::Error>;

/// The origin's body: given whole (one frame, after `delay`), or fed by the
/// test chunk by chunk (the head after `delay`).
#[derive(Clone)]
enum Feed {
    Whole(Bytes, Duration),
    Fed(Duration),
}

/// Counts calls and records the `Range` each call carried.
#[derive(Clone)]
struct Origin {
    calls: Arc<AtomicUsize>,
    ranges: Arc<Mutex<Vec<Option<String>>>>,
    senders: Arc<Mutex<Vec<mpsc::UnboundedSender<Chunk>>>>,
    headers: Arc<Vec<(&'static str, String)>>,
    feed: Feed,
}

impl Origin {
    fn new(headers: &[(&'static str, &str)], feed: Feed) -> Self {
        Self {
            calls: Arc::new(AtomicUsize::new(0)),
            ranges: Arc::default(),
            senders: Arc::default(),
            headers: Arc::new(headers.iter().map(|(k, v)| (*k, v.to_string())).collect()),
            feed,
        }
    }

    /// A cacheable origin answering `body` whole after `delay`.
    fn whole(body: &'static [u8], delay: Duration) -> Self {
        Self::new(
            &[
                ("cache-control", "max-age=60"),
                ("etag", "\"v1\""),
                ("content-length", &body.len().to_string()),
            ],
            Feed::Whole(Bytes::from_static(body), delay),
        )
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The `Range` header of every call so far, in call order.
    fn ranges(&self) -> Vec<Option<String>> {
        self.ranges.lock().unwrap().clone()
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
        Response = Response<OriginBody>,
        Error = Infallible,
        Future: Send,
    > + Clone
           + Send
           + 'static {
        let o = self.clone();
        tower::service_fn(move |req: Request<RequestBody<()>>| {
            let o = o.clone();
            async move {
                o.calls.fetch_add(1, Ordering::SeqCst);
                let range = req
                    .headers()
                    .get("range")
                    .map(|v| v.to_str().unwrap().to_owned());
                o.ranges.lock().unwrap().push(range.clone());
                let mut status = StatusCode::OK;
                let mut content_range = None;
                let body = match &o.feed {
                    Feed::Whole(bytes, delay) => {
                        tokio::time::sleep(*delay).await;
                        // Like a real origin, it answers `bytes=a-b` with a 206.
                        let mut bytes = bytes.clone();
                        if let Some((a, b)) = range.as_deref().and_then(closed_range) {
                            content_range = Some(format!("bytes {a}-{b}/{}", bytes.len()));
                            status = StatusCode::PARTIAL_CONTENT;
                            bytes = bytes.slice(a..=b);
                        }
                        Full::new(bytes).map_err(|e| match e {}).boxed()
                    }
                    Feed::Fed(delay) => {
                        tokio::time::sleep(*delay).await;
                        let (tx, rx) = mpsc::unbounded_channel();
                        o.senders.lock().unwrap().push(tx);
                        ChanBody(rx).boxed()
                    }
                };
                let mut r = Response::new(body);
                for (k, v) in o.headers.iter() {
                    r.headers_mut().insert(*k, v.parse().unwrap());
                }
                if let Some(cr) = content_range {
                    *r.status_mut() = status;
                    let len = http_body::Body::size_hint(r.body()).exact().unwrap();
                    r.headers_mut().insert("content-range", cr.parse().unwrap());
                    r.headers_mut().insert("content-length", len.into());
                }
                Ok::<_, Infallible>(r)
            }
        })
    }
}

/// `bytes=a-b` within a body of `BODY`'s length, as the test origin reads it.
fn closed_range(v: &str) -> Option<(usize, usize)> {
    let (a, b) = v.strip_prefix("bytes=")?.split_once('-')?;
    let (a, b) = (a.parse().ok()?, b.parse::<usize>().ok()?);
    (a <= b && b < BODY.len()).then_some((a, b))
}

const BODY: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";

fn get(headers: &[(&'static str, &str)]) -> Request<()> {
    request(Method::GET, headers)
}

fn request(method: Method, headers: &[(&'static str, &str)]) -> Request<()> {
    let mut r = Request::builder()
        .method(method)
        .uri("http://r.test/object");
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.body(()).unwrap()
}

/// What one request ended with: status, headers, and the whole body.
type Read = (StatusCode, HeaderMap, Bytes);

async fn read<S>(svc: &S, req: Request<()>) -> Read
where
    S: Service<Request<()>, Response = Response<CacheBody<OriginBody>>, Error = Infallible> + Clone,
{
    let r = svc.clone().oneshot(req).await.unwrap();
    let (parts, body) = r.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (parts.status, parts.headers, body)
}

fn spawn_read<S>(svc: &S, req: Request<()>) -> tokio::task::JoinHandle<Read>
where
    S: Service<Request<()>, Response = Response<CacheBody<OriginBody>>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let svc = svc.clone();
    tokio::spawn(async move {
        let (parts, body) = svc.oneshot(req).await.unwrap().into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        (parts.status, parts.headers, body)
    })
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

fn memory() -> CacheLayer {
    CacheLayer::builder().build().unwrap()
}

/// Assert a 206 carrying exactly bytes `start..=end` of `whole`.
fn assert_part(r: &Read, whole: &[u8], start: usize, end: usize) {
    let (status, h, body) = r;
    assert_eq!(*status, StatusCode::PARTIAL_CONTENT, "{h:?}");
    assert_eq!(
        header(h, "content-range"),
        format!("bytes {start}-{end}/{}", whole.len())
    );
    assert_eq!(header(h, "content-length"), (end - start + 1).to_string());
    assert!(
        body[..] == whole[start..=end],
        "{} bytes, not bytes {start}-{end}",
        body.len()
    );
}

/// Assert the complete 200.
fn assert_whole(r: &Read, whole: &[u8]) {
    let (status, h, body) = r;
    assert_eq!(*status, StatusCode::OK, "{h:?}");
    assert!(!h.contains_key("content-range"));
    assert!(
        body[..] == *whole,
        "{} bytes, not the whole body",
        body.len()
    );
}

/// The cold case, in either order: one `Range: bytes=0-9` and two plain
/// GETs at once cost 1 origin call that asks for the whole object, the
/// range gets exactly its 10 bytes and the plain ones the whole 200.
#[tokio::test(start_paused = true)]
async fn cold_range_and_plain_gets_share_one_whole_object_call() {
    for range_first in [true, false] {
        let origin = Origin::whole(BODY, Duration::from_millis(100));
        let svc = memory().layer(origin.service());
        let mut plain = Vec::new();
        if !range_first {
            plain.push(spawn_read(&svc, get(&[])));
            settle().await;
        }
        let ranged = spawn_read(&svc, get(&[("range", "bytes=0-9")]));
        settle().await;
        while plain.len() < 2 {
            plain.push(spawn_read(&svc, get(&[])));
        }
        assert_part(&ranged.await.unwrap(), BODY, 0, 9);
        for p in plain {
            assert_whole(&p.await.unwrap(), BODY);
        }
        assert_eq!(origin.calls(), 1, "range first: {range_first}");
        assert_eq!(origin.ranges(), vec![None], "the fill asks for everything");
        // What was stored is the whole 200.
        let (_, h, _) = read(&svc, get(&[])).await;
        assert!(header(&h, "cache-status").contains("hit"), "{h:?}");
        assert_whole(&read(&svc, get(&[])).await, BODY);
        assert_eq!(origin.calls(), 1);
    }
}

/// On a stored 200: a suffix range, an open range and a closed one past the
/// end each get their 206; `Cache-Status` says hit and `Age` is set, as on
/// a plain hit.
#[tokio::test(start_paused = true)]
async fn suffix_open_and_clamped_ranges_from_a_stored_entry() {
    let origin = Origin::whole(BODY, Duration::ZERO);
    let svc = memory().layer(origin.service());
    assert_whole(&read(&svc, get(&[])).await, BODY);
    tokio::time::advance(Duration::from_secs(3)).await;

    let suffix = read(&svc, get(&[("range", "bytes=-4")])).await;
    assert_part(&suffix, BODY, BODY.len() - 4, BODY.len() - 1);
    let open = read(&svc, get(&[("range", "bytes=30-")])).await;
    assert_part(&open, BODY, 30, BODY.len() - 1);
    let clamped = read(&svc, get(&[("range", "bytes=20-1000")])).await;
    assert_part(&clamped, BODY, 20, BODY.len() - 1);
    for (_, h, _) in [&suffix, &open, &clamped] {
        assert!(header(h, "cache-status").contains("hit"), "{h:?}");
        assert_eq!(header(h, "age"), "3");
        assert_eq!(header(h, "etag"), "\"v1\"");
    }
    assert_eq!(origin.calls(), 1);
}

/// `If-Range` with the stored strong ETag gets the 206; a different tag or a
/// weak one gets the whole 200 (RFC 9110 §13.1.5).
#[tokio::test(start_paused = true)]
async fn if_range_mismatch_or_weak_gets_the_whole_200() {
    let origin = Origin::whole(BODY, Duration::ZERO);
    let svc = memory().layer(origin.service());
    read(&svc, get(&[])).await;
    let asking = |v: &'static str| get(&[("range", "bytes=0-3"), ("if-range", v)]);
    assert_part(&read(&svc, asking("\"v1\"")).await, BODY, 0, 3);
    assert_whole(&read(&svc, asking("\"v0\"")).await, BODY);
    assert_whole(&read(&svc, asking("W/\"v1\"")).await, BODY);
    assert_eq!(origin.calls(), 1);
}

/// A range starting past the end gets 416 with `Content-Range: bytes */len`
/// and no body; the stored entry is unharmed.
#[tokio::test(start_paused = true)]
async fn unsatisfiable_range_gets_416_with_the_length() {
    let origin = Origin::whole(BODY, Duration::ZERO);
    let svc = memory().layer(origin.service());
    read(&svc, get(&[])).await;
    let (status, h, body) = read(&svc, get(&[("range", "bytes=36-40")])).await;
    assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(header(&h, "content-range"), "bytes */36");
    assert!(body.is_empty());
    assert!(header(&h, "cache-status").contains("hit"), "{h:?}");
    assert!(!h.contains_key("cache-control"), "{h:?}");
    assert_whole(&read(&svc, get(&[])).await, BODY);
    assert_eq!(origin.calls(), 1);
}

/// Several ranges, invalid syntax and another unit are ignored: the whole
/// 200. HEAD with Range is a plain HEAD. If-None-Match wins over Range (304).
#[tokio::test(start_paused = true)]
async fn ignored_ranges_head_and_if_none_match() {
    let origin = Origin::whole(BODY, Duration::ZERO);
    let svc = memory().layer(origin.service());
    read(&svc, get(&[])).await;
    for v in ["bytes=0-1,4-5", "bytes=5-2", "bytes=x-", "items=0-1"] {
        assert_whole(&read(&svc, get(&[("range", v)])).await, BODY);
    }
    let (status, h, body) = read(&svc, request(Method::HEAD, &[("range", "bytes=0-1")])).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!h.contains_key("content-range"));
    assert!(body.is_empty());
    let (status, _, _) = read(
        &svc,
        get(&[("range", "bytes=0-1"), ("if-none-match", "\"v1\"")]),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);
    assert_eq!(origin.calls(), 1);
}

/// A streamed fill (several frames, declared length): a range waiter's 206
/// is complete as soon as its bytes have arrived, before the origin body
/// ends; a plain waiter gets the whole body; 1 call.
#[tokio::test(start_paused = true)]
async fn range_of_a_streamed_fill_ends_with_its_bytes() {
    let parts = chunks(4, 1000);
    let whole = concat(&parts);
    let len = whole.len().to_string();
    let origin = Origin::new(
        &[("cache-control", "max-age=60"), ("content-length", &len)],
        Feed::Fed(Duration::ZERO),
    );
    let svc = memory().layer(origin.service());
    let plain = spawn_read(&svc, get(&[]));
    settle().await;
    let early = spawn_read(&svc, get(&[("range", "bytes=990-1009")]));
    let late = spawn_read(&svc, get(&[("range", "bytes=-10")]));
    settle().await;
    let tx = origin.body(0);
    for c in &parts[..2] {
        tx.send(Ok(c.clone())).unwrap();
        settle().await;
    }
    assert!(early.is_finished(), "its bytes have all arrived");
    assert!(!late.is_finished());
    for c in &parts[2..] {
        tx.send(Ok(c.clone())).unwrap();
        settle().await;
    }
    drop(tx);
    assert_part(&early.await.unwrap(), &whole, 990, 1009);
    assert_part(&late.await.unwrap(), &whole, 3990, 3999);
    assert_whole(&plain.await.unwrap(), &whole);
    assert_eq!(origin.calls(), 1);
    assert_eq!(origin.ranges(), vec![None]);
}

/// A body too large to store, led by a range request: each range reader
/// on the stream (leader and waiter) gets exactly its slice, never the whole
/// body dressed as one, and the plain waiter the whole body, from 1 call.
#[tokio::test(start_paused = true)]
async fn too_large_fill_gives_a_range_waiter_only_its_slice() {
    let parts = chunks(8, 1024);
    let whole = concat(&parts);
    let len = whole.len().to_string();
    // The head comes late, so every request waits on the flight before the
    // cache learns the body is too large.
    let origin = Origin::new(
        &[("cache-control", "max-age=60"), ("content-length", &len)],
        Feed::Fed(Duration::from_millis(100)),
    );
    let svc = CacheLayer::builder()
        .max_body_bytes(4096)
        .build()
        .unwrap()
        .layer(origin.service());
    let ranged = spawn_read(&svc, get(&[("range", "bytes=100-199")]));
    settle().await;
    let plain = spawn_read(&svc, get(&[]));
    let waiter = spawn_read(&svc, get(&[("range", "bytes=-10")]));
    tokio::time::sleep(Duration::from_millis(150)).await;
    let tx = origin.body(0);
    for c in &parts {
        tx.send(Ok(c.clone())).unwrap();
        settle().await;
    }
    drop(tx);
    assert_part(&ranged.await.unwrap(), &whole, 100, 199);
    assert_part(&waiter.await.unwrap(), &whole, 8182, 8191);
    assert_whole(&plain.await.unwrap(), &whole);
    assert_eq!(origin.calls(), 1);
}

/// Once a fill found the body too large to store, the next range request
/// goes to the origin with its `Range` (it would not be stored anyway),
/// while a plain GET still leads a whole-object fill.
#[tokio::test(start_paused = true)]
async fn range_for_a_known_too_large_body_goes_to_the_origin() {
    let parts = chunks(8, 1024);
    let len = concat(&parts).len().to_string();
    let origin = Origin::new(
        &[("cache-control", "max-age=60"), ("content-length", &len)],
        Feed::Fed(Duration::ZERO),
    );
    let svc = CacheLayer::builder()
        .max_body_bytes(4096)
        .build()
        .unwrap()
        .layer(origin.service());
    let feed = |n: usize| {
        let tx = origin.body(n);
        for c in &parts {
            tx.send(Ok(c.clone())).unwrap();
        }
    };
    let first = spawn_read(&svc, get(&[("range", "bytes=0-9")]));
    settle().await;
    feed(0);
    assert_eq!(first.await.unwrap().0, StatusCode::PARTIAL_CONTENT);

    let second = spawn_read(&svc, get(&[("range", "bytes=10-19")]));
    settle().await;
    feed(1);
    let (_, h, _) = second.await.unwrap();
    assert!(
        header(&h, "cache-status").contains("fwd=request; detail=too-large"),
        "{h:?}"
    );
    let plain = spawn_read(&svc, get(&[]));
    settle().await;
    feed(2);
    assert_eq!(plain.await.unwrap().0, StatusCode::OK);
    assert_eq!(
        origin.ranges(),
        vec![None, Some("bytes=10-19".to_owned()), None],
        "whole fill, the range's own call, whole fill"
    );
}

/// A body too large to store, of unknown length (chunked): the range
/// request gets the whole 200, which RFC 9110 §14.2 allows, not a 206.
#[tokio::test(start_paused = true)]
async fn too_large_fill_of_unknown_length_answers_range_whole() {
    let parts = chunks(8, 1024);
    let whole = concat(&parts);
    let origin = Origin::new(
        &[("cache-control", "max-age=60")],
        Feed::Fed(Duration::ZERO),
    );
    let svc = CacheLayer::builder()
        .max_body_bytes(4096)
        .build()
        .unwrap()
        .layer(origin.service());
    let ranged = spawn_read(&svc, get(&[("range", "bytes=100-199")]));
    settle().await;
    let tx = origin.body(0);
    for c in &parts {
        tx.send(Ok(c.clone())).unwrap();
        settle().await;
    }
    drop(tx);
    assert_whole(&ranged.await.unwrap(), &whole);
    assert_eq!(origin.calls(), 1);
}

/// An answer the cache may not share (`private`): the leader's range is cut
/// from its own answer; a waiter released to call alone sends its `Range`
/// to the origin. Nothing is stored, and a plain GET still gets the 200.
#[tokio::test(start_paused = true)]
async fn uncacheable_answer_lets_range_through_to_the_origin() {
    let origin = Origin::new(
        &[
            ("cache-control", "private"),
            ("content-length", &BODY.len().to_string()),
        ],
        Feed::Whole(Bytes::from_static(BODY), Duration::from_millis(100)),
    );
    let svc = memory().layer(origin.service());
    let leader = spawn_read(&svc, get(&[("range", "bytes=0-9")]));
    settle().await;
    let waiter = spawn_read(&svc, get(&[("range", "bytes=5-6")]));
    assert_part(&leader.await.unwrap(), BODY, 0, 9);
    assert_part(&waiter.await.unwrap(), BODY, 5, 6);
    assert_eq!(
        origin.ranges(),
        vec![None, Some("bytes=5-6".to_owned())],
        "the fill, then the released waiter's own call"
    );
    assert_whole(&read(&svc, get(&[])).await, BODY);
}

#[cfg(feature = "redis")]
mod redis_instances {
    use super::*;

    use herdguard::RedisOptions;

    use crate::support::RedisServer;

    fn instance(server: &RedisServer, namespace: &str) -> CacheLayer {
        CacheLayer::builder()
            .redis(
                RedisOptions::new(server.url())
                    .namespace(namespace)
                    .response_timeout(Duration::from_secs(2))
                    .pool_wait_timeout(Duration::from_secs(2)),
            )
            .build()
            .unwrap()
    }

    /// Wait (at most 10 s) until `origin` has been called.
    async fn called(origin: &Origin) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while origin.calls() == 0 {
            assert!(tokio::time::Instant::now() < deadline, "no origin call");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The cold case across two instances on one redis-server: a range
    /// request on one, two plain GETs on the other, 1 origin call for the
    /// whole object, every body byte-exact for its range.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cold_range_across_two_instances_costs_one_call() {
        let server = RedisServer::start();
        let origin = Origin::whole(BODY, Duration::from_millis(1500));
        let a = instance(&server, "lead").layer(origin.service());
        let b = instance(&server, "lead").layer(origin.service());
        let ranged = spawn_read(&a, get(&[("range", "bytes=0-9")]));
        // The range request leads: its call has started before the others come.
        called(&origin).await;
        let plain: Vec<_> = (0..2).map(|_| spawn_read(&b, get(&[]))).collect();
        assert_part(&ranged.await.unwrap(), BODY, 0, 9);
        for p in plain {
            assert_whole(&p.await.unwrap(), BODY);
        }
        assert_eq!(origin.calls(), 1);
        assert_eq!(origin.ranges(), vec![None]);
        // The entry on Redis is the whole 200: a range on b is cut from it.
        let suffix = read(&b, get(&[("range", "bytes=-3")])).await;
        assert_part(&suffix, BODY, BODY.len() - 3, BODY.len() - 1);
        assert_eq!(origin.calls(), 1);
    }

    /// On the instance that did not fill (its answers come from the entry in
    /// Redis, not a copy of its own): a suffix range, an open range, an
    /// `If-Range` mismatch and a range past the end each answer as RFC 9110
    /// §14 says, and the origin is called once in all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ranges_from_the_entry_in_redis_on_another_instance() {
        let server = RedisServer::start();
        let origin = Origin::whole(BODY, Duration::ZERO);
        let a = instance(&server, "rfc").layer(origin.service());
        let b = instance(&server, "rfc").layer(origin.service());
        assert_whole(&read(&a, get(&[])).await, BODY);

        let suffix = read(&b, get(&[("range", "bytes=-4")])).await;
        assert_part(&suffix, BODY, BODY.len() - 4, BODY.len() - 1);
        assert!(
            header(&suffix.1, "cache-status").contains("hit"),
            "{:?}",
            suffix.1
        );
        let open = read(&b, get(&[("range", "bytes=30-")])).await;
        assert_part(&open, BODY, 30, BODY.len() - 1);
        let mismatch = get(&[("range", "bytes=0-3"), ("if-range", "\"v0\"")]);
        assert_whole(&read(&b, mismatch).await, BODY);
        let (status, h, body) = read(&b, get(&[("range", "bytes=36-")])).await;
        assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE);
        assert_eq!(header(&h, "content-range"), "bytes */36");
        assert!(body.is_empty());
        assert_eq!(origin.calls(), 1);
    }

    /// The same the other way round: a plain GET leads on one instance, and a
    /// range request and a plain GET wait on the other: 1 call, exact bodies.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn range_waiting_on_another_instance_gets_its_slice() {
        let server = RedisServer::start();
        let origin = Origin::whole(BODY, Duration::from_millis(1500));
        let a = instance(&server, "wait").layer(origin.service());
        let b = instance(&server, "wait").layer(origin.service());
        let leader = spawn_read(&a, get(&[]));
        called(&origin).await;
        let ranged = spawn_read(&b, get(&[("range", "bytes=3-12")]));
        let plain = spawn_read(&b, get(&[]));
        assert_whole(&leader.await.unwrap(), BODY);
        assert_part(&ranged.await.unwrap(), BODY, 3, 12);
        assert_whole(&plain.await.unwrap(), BODY);
        assert_eq!(origin.calls(), 1);
    }
}
