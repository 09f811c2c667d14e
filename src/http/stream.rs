//! Streaming fills: the leader's origin body is read once, by the leader's
//! task, into one shared buffer; the leader's own client and every waiter
//! coalesced on it read that buffer, each with its own cursor.
//!
//! ```text
//! origin body ─► writer (leader's task) ─► chunks: VecDeque<Bytes> ─► reader 1
//!                                          (shared, never copied)  ─► reader 2 …
//! ```
//! - Storable so far (≤ `max_body_bytes`): every chunk is kept, because the
//!   stored entry needs them all anyway; no reader is ever cut off.
//! - Too large to store: a window of `W` bytes is measured back from the
//!   *fastest* reader, the furthest any reader has read (byte offset `F`).
//!   `W` is the fill budget the body holds: `max_body_bytes` for a declared
//!   length, what it had taken so far for a body that outgrows storing.
//!   - a chunk is kept while it starts at most `W` bytes before `F`, so a
//!     reader that lags the fastest by at most `W` bytes is never cut off;
//!   - an older chunk is dropped when the next one arrives, and a reader
//!     that still needs it is cut off with a body error; memory never
//!     grows for it;
//!   - the writer takes the next origin chunk only while fewer than `W`
//!     bytes are held, or once the fastest reader has every chunk; so at
//!     most `W` bytes plus one chunk are held, however far back the
//!     window reaches;
//!   - with no reader left, only the newest `W` bytes are kept (and the
//!     fill, which nobody can join once the start is gone, is dropped).
//!
//!   A request arriving once the window has left the start cannot attach
//!   and makes its own call.
//! - The fastest reader paces the writer; slower readers never do, so a
//!   slow client slows nobody else.
//!
//! The HTTP layer keeps the running streams in [`Streams`], keyed by flight
//! key; the engine knows nothing of them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::Bytes;
use http::StatusCode;
use tokio::sync::watch;

use crate::error::BoxError;
use crate::http::response::CachedResponse;
use crate::key::CacheKey;
use crate::store::memory::Stored;

/// How a stream ended, once it has.
#[derive(Debug, Clone)]
enum End {
    Open,
    Done,
    Failed(&'static str),
}

/// The body of one fill, shared by all its readers.
#[derive(Debug)]
pub(crate) struct SharedBody {
    buf: Mutex<Buf>,
}

/// A std `Mutex`: held for a few pointer moves, never across an `.await`,
/// and wakers are woken after it is released.
#[derive(Debug)]
struct Buf {
    chunks: VecDeque<Bytes>,
    /// Absolute index of `chunks[0]`: readers keep absolute cursors.
    first: u64,
    held: usize,
    /// `None` while the body may still be stored (keep all of it); then
    /// how many bytes a reader may lag behind the fastest one.
    window: Option<usize>,
    end: End,
    /// One waker per waiting reader, by reader id: bounded by the readers.
    wakers: HashMap<u64, Waker>,
    readers: usize,
    next_reader: u64,
    /// The furthest any reader has read (absolute chunk index): the window
    /// is measured back from it, so only readers further behind the
    /// fastest one than the window are cut off.
    furthest: u64,
    /// Bytes held in chunks before `furthest`: how far back the window
    /// reaches now. The rest of `held` is what the fastest reader has yet
    /// to read.
    behind: usize,
    /// The writer, parked while a window is held and the fastest reader
    /// has chunks left to read.
    writer: Option<Waker>,
}

/// A body error a reader receives.
#[derive(Debug)]
pub(crate) struct StreamError(&'static str);

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for StreamError {}

const CUT_OFF: &str = "reader fell behind the shared stream window";

impl SharedBody {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            buf: Mutex::new(Buf {
                chunks: VecDeque::new(),
                first: 0,
                held: 0,
                window: None,
                end: End::Open,
                wakers: HashMap::new(),
                readers: 0,
                next_reader: 0,
                furthest: 0,
                behind: 0,
                writer: None,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Buf> {
        // A panic mid-push leaves the buffer consistent (a push is one
        // VecDeque operation and counter updates).
        self.buf.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A reader from the first byte on; `None` once the window has left it.
    pub(crate) fn reader(self: &Arc<Self>, ttfb_since: Option<Instant>) -> Option<StreamReader> {
        let mut buf = self.lock();
        if buf.first > 0 {
            return None;
        }
        buf.readers += 1;
        let id = buf.next_reader;
        buf.next_reader += 1;
        drop(buf);
        Some(StreamReader {
            body: Arc::clone(self),
            id,
            next: 0,
            finished: false,
            ttfb_since,
        })
    }

    /// Stop keeping the whole body (it will not be stored): from now on a
    /// reader may lag the fastest one by at most `window` bytes.
    pub(crate) fn to_window(&self, window: usize) {
        let wake = {
            let mut buf = self.lock();
            buf.window = Some(window);
            evict(&mut buf)
        };
        wake_all(wake);
    }

    pub(crate) fn push(&self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        let wake = {
            let mut buf = self.lock();
            buf.held += chunk.len();
            buf.chunks.push_back(chunk);
            // Every parked reader has a new chunk (or was evicted past).
            let mut wake = evict(&mut buf);
            wake.extend(std::mem::take(&mut buf.wakers));
            wake
        };
        wake_all(wake);
    }

    pub(crate) fn finish(&self) {
        self.end(End::Done);
    }

    pub(crate) fn fail(&self, why: &'static str) {
        self.end(End::Failed(why));
    }

    fn end(&self, end: End) {
        let wake = {
            let mut buf = self.lock();
            if !matches!(buf.end, End::Open) {
                return;
            }
            buf.end = end;
            std::mem::take(&mut buf.wakers)
        };
        wake_all(wake);
    }

    /// Ready while less than a window is held, or once the fastest reader
    /// has every chunk (always, while the body may be stored or nobody
    /// reads). Together with [`evict`], this keeps the held bytes under a
    /// window plus one chunk, however far behind the fastest the window
    /// reaches.
    pub(crate) fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut buf = self.lock();
        let Some(window) = buf.window else {
            return Poll::Ready(());
        };
        if buf.readers == 0 || buf.held < window || buf.held == buf.behind {
            return Poll::Ready(());
        }
        buf.writer = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Nobody reads and nobody can attach any more: the fill serves no one.
    pub(crate) fn abandoned(&self) -> bool {
        let buf = self.lock();
        buf.readers == 0 && buf.first > 0
    }

    /// Bytes held right now (for tests and the benchmark's bound).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.lock().held
    }
}

/// Drop the chunks that start more than a window before the fastest
/// reader's position; with no reader, those older than the newest window
/// (never the newest chunk).
fn evict(buf: &mut Buf) -> HashMap<u64, Waker> {
    let Some(window) = buf.window else {
        return HashMap::new();
    };
    let mut evicted = false;
    while buf.behind > window {
        // `behind > 0`: the front chunk is before `furthest`.
        let Some(c) = buf.chunks.pop_front() else {
            break;
        };
        buf.held -= c.len();
        buf.behind -= c.len();
        buf.first += 1;
        evicted = true;
    }
    // Nobody paces the writer now (see `poll_room`): bound memory by the
    // newest bytes instead, until the fill sees it is abandoned.
    while buf.readers == 0 && buf.held > window && buf.chunks.len() > 1 {
        let Some(c) = buf.chunks.pop_front() else {
            break;
        };
        buf.held -= c.len();
        if buf.first < buf.furthest {
            buf.behind -= c.len();
        }
        buf.first += 1;
        buf.furthest = buf.furthest.max(buf.first);
        evicted = true;
    }
    // Readers behind the window learn it when polled; wake them so a
    // parked one is cut off now rather than at the end of the body.
    if evicted {
        std::mem::take(&mut buf.wakers)
    } else {
        HashMap::new()
    }
}

fn wake_all(wakers: HashMap<u64, Waker>) {
    for (_, w) in wakers {
        w.wake();
    }
}

/// One reader's cursor into a [`SharedBody`].
#[derive(Debug)]
pub(crate) struct StreamReader {
    body: Arc<SharedBody>,
    id: u64,
    next: u64,
    finished: bool,
    /// For a waiter: when its request arrived, to record its time to first byte.
    ttfb_since: Option<Instant>,
}

impl StreamReader {
    pub(crate) fn poll_chunk(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, BoxError>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        let mut buf = self.body.lock();
        if self.next < buf.first {
            drop(buf);
            self.finished = true;
            crate::metrics::record_stream_cut_off();
            return Poll::Ready(Some(Err(Box::new(StreamError(CUT_OFF)))));
        }
        let at = (self.next - buf.first) as usize;
        if let Some(chunk) = buf.chunks.get(at) {
            let chunk = chunk.clone();
            self.next += 1;
            let writer = if self.next > buf.furthest {
                // `next` moves one chunk at a time: this chunk was the
                // first one the fastest reader had not read.
                buf.furthest = self.next;
                buf.behind += chunk.len();
                buf.writer.take()
            } else {
                None
            };
            drop(buf);
            if let Some(w) = writer {
                w.wake();
            }
            if let Some(since) = self.ttfb_since.take() {
                crate::metrics::record_waiter_ttfb(since.elapsed());
            }
            return Poll::Ready(Some(Ok(chunk)));
        }
        match buf.end {
            End::Done => {
                drop(buf);
                self.finished = true;
                Poll::Ready(None)
            }
            End::Failed(why) => {
                drop(buf);
                self.finished = true;
                Poll::Ready(Some(Err(Box::new(StreamError(why)))))
            }
            End::Open => {
                buf.wakers.insert(self.id, cx.waker().clone());
                Poll::Pending
            }
        }
    }

    pub(crate) fn is_end(&self) -> bool {
        self.finished
    }
}

impl Drop for StreamReader {
    fn drop(&mut self) {
        let writer = {
            let mut buf = self.body.lock();
            buf.readers = buf.readers.saturating_sub(1);
            buf.wakers.remove(&self.id);
            // The pace may have been this reader's: let the writer re-check.
            buf.writer.take()
        };
        if let Some(w) = writer {
            w.wake();
        }
    }
}

/// A fill whose response head has arrived and whose body is streaming:
/// what a waiter needs to answer from it.
#[derive(Debug)]
pub(crate) struct Stream {
    /// Status, headers, Vary values and rules of the response, with an
    /// empty body: checked against each waiter like a stored entry.
    pub(crate) head: Arc<Stored<CachedResponse>>,
    pub(crate) body: Arc<SharedBody>,
}

impl Stream {
    pub(crate) fn status(&self) -> StatusCode {
        self.head.value.status
    }
}

/// The running streams of one layer, by flight key.
#[derive(Debug)]
pub(crate) struct Streams {
    map: Mutex<HashMap<CacheKey, (u64, Arc<Stream>)>>,
    /// Bumped on every registration so waiters re-check the map. One
    /// channel for all keys: a registration wakes waiters of other keys
    /// too, who look once and sleep again.
    registered: watch::Sender<u64>,
    next_id: AtomicU64,
}

impl Streams {
    pub(crate) fn new() -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            registered: watch::Sender::new(0),
            next_id: AtomicU64::new(1),
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<CacheKey, (u64, Arc<Stream>)>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Offer `stream` to the waiters of the flight for `key` until the
    /// returned guard is dropped (when the fill ends).
    pub(crate) fn register(self: &Arc<Self>, key: CacheKey, stream: Arc<Stream>) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.map().insert(key, (id, stream));
        self.registered.send_modify(|n| *n = n.wrapping_add(1));
        Registration {
            streams: Arc::clone(self),
            key,
            id,
        }
    }

    /// Wait until a stream for `key` that `usable` accepts is registered.
    /// Never resolves otherwise: the caller selects it against the flight.
    pub(crate) async fn wait(
        &self,
        key: CacheKey,
        usable: impl Fn(&Stream) -> bool,
    ) -> Arc<Stream> {
        let mut rx = self.registered.subscribe();
        loop {
            let found = self.map().get(&key).map(|(_, s)| Arc::clone(s));
            if let Some(s) = found.filter(|s| usable(s)) {
                return s;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

/// Keeps a stream offered; dropping it withdraws the offer (only its own).
#[derive(Debug)]
pub(crate) struct Registration {
    streams: Arc<Streams>,
    key: CacheKey,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut map = self.streams.map();
        if map.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            map.remove(&self.key);
        }
    }
}

/// The writer's side: ends the body with an error if the fill stops before
/// finishing it (origin error, origin timeout, panic, abort).
#[derive(Debug)]
pub(crate) struct Writer {
    pub(crate) body: Arc<SharedBody>,
    /// Withdrawn together with the writer.
    pub(crate) _offer: Option<Registration>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.body.fail("origin body ended early");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    async fn next(r: &mut StreamReader) -> Option<Result<Bytes, BoxError>> {
        poll_fn(|cx| r.poll_chunk(cx)).await
    }

    /// Every reader gets every chunk, the very same allocation.
    #[tokio::test]
    async fn readers_share_chunks() {
        let body = SharedBody::new();
        let mut a = body.reader(None).unwrap();
        let mut b = body.reader(None).unwrap();
        let chunk = Bytes::from_static(b"hello");
        body.push(chunk.clone());
        body.finish();
        let ga = next(&mut a).await.unwrap().unwrap();
        let gb = next(&mut b).await.unwrap().unwrap();
        assert_eq!(ga.as_ptr(), chunk.as_ptr());
        assert_eq!(gb.as_ptr(), chunk.as_ptr());
        assert!(next(&mut a).await.is_none());
        assert!(next(&mut b).await.is_none());
    }

    fn poll_now(r: &mut StreamReader) -> Poll<Option<Result<Bytes, BoxError>>> {
        r.poll_chunk(&mut Context::from_waker(Waker::noop()))
    }

    fn has_room(body: &SharedBody) -> bool {
        body.poll_room(&mut Context::from_waker(Waker::noop()))
            .is_ready()
    }

    /// The window reaches a full window back from the fastest reader:
    /// a reader exactly that far behind gets every byte, one further
    /// behind is cut off, and no more than a window plus a chunk is held.
    #[test]
    fn window_is_measured_back_from_the_fastest_reader() {
        const WINDOW: usize = 40;
        const CHUNK: usize = 4;
        const CHUNKS: usize = 100;
        let body = SharedBody::new();
        body.to_window(WINDOW);
        let mut fast = body.reader(None).unwrap();
        let mut lagging = body.reader(None).unwrap();
        let mut slow = body.reader(None).unwrap();
        let (mut written, mut fast_read, mut lagging_got) = (0, 0, Vec::new());
        while fast_read < CHUNKS {
            while written < CHUNKS && has_room(&body) {
                body.push(Bytes::from(vec![written as u8; CHUNK]));
                written += 1;
                assert!(body.held() <= WINDOW + CHUNK, "held {}", body.held());
            }
            let Poll::Ready(Some(Ok(_))) = poll_now(&mut fast) else {
                panic!("the fastest reader always has a chunk to read");
            };
            fast_read += 1;
            while (fast_read - lagging_got.len()) * CHUNK > WINDOW {
                let Poll::Ready(Some(Ok(c))) = poll_now(&mut lagging) else {
                    panic!(
                        "cut off {} bytes behind",
                        (fast_read - lagging_got.len()) * CHUNK
                    );
                };
                lagging_got.push(c[0]);
            }
        }
        body.finish();
        while let Poll::Ready(Some(c)) = poll_now(&mut lagging) {
            lagging_got.push(c.unwrap()[0]);
        }
        assert_eq!(lagging_got, (0..CHUNKS as u8).collect::<Vec<_>>());
        let Poll::Ready(Some(Err(e))) = poll_now(&mut slow) else {
            panic!("a reader more than a window behind is cut off");
        };
        assert_eq!(e.to_string(), CUT_OFF);
        assert!(body.reader(None).is_none(), "start has left the window");
        drop((fast, lagging, slow));
        assert!(body.abandoned());
    }

    /// With nobody reading, only the newest window is kept.
    #[test]
    fn no_reader_keeps_the_newest_window() {
        let body = SharedBody::new();
        body.to_window(10);
        for _ in 0..5 {
            assert!(has_room(&body));
            body.push(Bytes::from(vec![0u8; 4]));
        }
        assert!(body.held() <= 12, "held {}", body.held());
        assert!(body.abandoned());
    }

    /// A failed fill ends every reader's body with an error.
    #[tokio::test]
    async fn failure_reaches_readers() {
        let body = SharedBody::new();
        let mut a = body.reader(None).unwrap();
        body.push(Bytes::from_static(b"x"));
        drop(Writer {
            body: Arc::clone(&body),
            _offer: None,
        });
        assert!(next(&mut a).await.unwrap().is_ok());
        assert!(next(&mut a).await.unwrap().is_err());
    }

    /// A registration withdraws only its own offer.
    #[test]
    fn registration_removes_own() {
        let streams = Arc::new(Streams::new());
        let key = CacheKey::new("k");
        let value = CachedResponse {
            status: StatusCode::OK,
            headers: http::HeaderMap::new(),
            body: Bytes::new(),
            vary: Vec::new(),
            initial_age: 0,
            url: key,
            rules: crate::http::policy::StoredRules::default(),
            revalidated: false,
        };
        let head = Arc::new(Stored::new(
            value,
            crate::engine::envelope::EntryMeta::now(Default::default(), Default::default(), 0),
            Default::default(),
            Default::default(),
            Default::default(),
        ));
        let s = || {
            Arc::new(Stream {
                head: Arc::clone(&head),
                body: SharedBody::new(),
            })
        };
        let first = streams.register(key, s());
        let second = streams.register(key, s());
        drop(first);
        assert_eq!(streams.len(), 1);
        drop(second);
        assert_eq!(streams.len(), 0);
    }
}
