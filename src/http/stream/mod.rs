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
//! - Too large to store: at most a window of `W` bytes plus one chunk is
//!   held (`W` is the fill budget the body holds: `max_body_bytes` for a
//!   declared length, what it had taken so far for a body that outgrows
//!   storing).
//!   - The writer takes the next origin chunk only while fewer than `W`
//!     bytes are held, counted from the oldest chunk a reader still needs:
//!     the slowest reader paces the origin. So when the machine or the
//!     network cannot carry the origin's rate to every reader, the origin
//!     is read at their pace instead of every reader being cut off.
//!   - A reader that holds the fill back (it needs the oldest chunk while
//!     `W` are held) is cut off, its chunks dropped and its body ended with
//!     an error, once either
//!     - at least half the readers wait for it and, since the first byte
//!       (or the last cut-off), they have spent three times as long waiting
//!       as reading: it is less than a quarter as fast as most readers
//!       (`SLOW`); only a reader that has read the first byte is judged so; or
//!     - a reader has waited for it `STALL_GRACE` at a stretch (a stalled
//!       client, a stalled majority, a connection that never starts).
//!
//!     So one slow client delays the others by at most three times as long
//!     as they had read, and at most the grace at a stretch; readers at
//!     least a quarter as fast as most set the pace.
//!   - Chunks nobody needs stay until the room is needed, so a request can
//!     attach while the first byte is still held; once it is gone, requests
//!     share a new flight's call. With no reader left, only the newest `W` bytes
//!     are kept (and the fill, which nobody can join once the start is
//!     gone, is dropped).
//!
//! The HTTP layer keeps the running streams in [`Streams`], keyed by flight
//! key; the engine knows nothing of them.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::time::Instant as TokioInstant;

use bytes::Bytes;
use http::StatusCode;
use tokio::sync::watch;

use crate::error::BoxError;
use crate::http::response::CachedResponse;
use crate::key::CacheKey;
use crate::store::memory::Stored;

/// The longest a reader waits at a stretch for slower ones before the
/// readers a window behind are cut off.
pub(crate) const STALL_GRACE: Duration = Duration::from_secs(5);

/// A reader that has started is cut off once half the readers have waited
/// for it `SLOW` times as long as they spent reading: it is less than
/// `1 / (SLOW + 1)` as fast as most readers.
const SLOW: u32 = 3;

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
    /// The layer's `cache` metrics label.
    cache: Arc<str>,
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
    /// the most bytes held while a reader still needs the oldest of them.
    window: Option<usize>,
    end: End,
    /// One waker per waiting reader, by reader id: bounded by the readers.
    wakers: HashMap<u64, Waker>,
    /// Readers not cut off: the ones that pace the writer.
    live: usize,
    next_reader: u64,
    /// Live readers by position: `at[i]` is how many will read chunk
    /// `first + i` next; the last slot counts those that have read
    /// everything there is. One slot per chunk held, plus one.
    at: VecDeque<usize>,
    /// The writer, parked while a window is held for a reader that still
    /// needs its oldest chunk.
    writer: Option<Waker>,
    /// How long the fill has been held back, and by whom.
    pace: Pace,
}

/// The clocks behind the cut-off rules, in tokio time (paused in tests).
#[derive(Debug)]
struct Pace {
    /// How long a blocked writer waits while no reader waits.
    stall: Duration,
    /// When the first byte arrived.
    start: Option<TokioInstant>,
    /// Since the writer last found no room while a reader waited.
    blocked: Option<TokioInstant>,
    /// Since the writer last found no room at all.
    idle: Option<TokioInstant>,
    /// How long half the readers have waited for slower ones since the
    /// first byte (or since the last cut), besides the wait going on now
    /// (since `majority`).
    waited: Duration,
    majority: Option<TokioInstant>,
}

impl Pace {
    fn new(stall: Duration) -> Self {
        Self {
            stall,
            start: None,
            idle: None,
            blocked: None,
            waited: Duration::ZERO,
            majority: None,
        }
    }

    /// The writer has room again.
    fn unblocked(&mut self, now: TokioInstant) {
        self.blocked = None;
        self.idle = None;
        self.majority_ends(now);
    }

    fn majority_ends(&mut self, now: TokioInstant) {
        if let Some(since) = self.majority.take() {
            self.waited += now - since;
        }
    }

    /// Readers were cut off: the next slowest starts with a clean slate.
    fn cut(&mut self) {
        self.blocked = None;
        self.idle = None;
        self.start = None;
        self.waited = Duration::ZERO;
        self.majority = None;
    }
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

type Wakers = HashMap<u64, Waker>;

impl Buf {
    /// Move one live reader from slot `from` to slot `to`.
    fn shift(&mut self, from: usize, to: usize) {
        if let Some(n) = self.at.get_mut(from) {
            *n = n.saturating_sub(1);
        }
        if let Some(n) = self.at.get_mut(to) {
            *n += 1;
        }
    }

    /// Drop the oldest chunk; the live readers that still needed it are
    /// cut off (they learn it when next polled).
    fn drop_front(&mut self) {
        let Some(c) = self.chunks.pop_front() else {
            return;
        };
        self.held -= c.len();
        self.first += 1;
        let cut = self.at.pop_front().unwrap_or(0);
        self.live = self.live.saturating_sub(cut);
    }

    /// Drop the oldest chunk for room; whether a live reader was cut off.
    fn cut_front(&mut self) -> bool {
        let cut = self.at.front().is_some_and(|n| *n > 0);
        self.drop_front();
        cut
    }

    /// Whether the writer may take the next chunk, making room by the
    /// rules in the module docs; when not, until when to wait at most
    /// before asking again. Also the wakers of readers cut off, so a
    /// parked one learns it now.
    fn room(&mut self, window: usize, now: TokioInstant) -> Room {
        if self.live == 0 || self.held < window || self.chunks.is_empty() {
            self.pace.unblocked(now);
            return Room::Ready(Wakers::new());
        }
        while self.held >= window && self.at.front() == Some(&0) && !self.chunks.is_empty() {
            self.drop_front();
        }
        // Nothing held is room even for a window of 0 bytes.
        if self.held < window || self.chunks.is_empty() {
            self.pace.unblocked(now);
            return Room::Ready(Wakers::new());
        }
        // Someone a window behind the newest byte holds the fill back.
        // Readers parked for data wait for it.
        let waiting = self.wakers.len();
        let pace = &mut self.pace;
        // A slow reader sets the pace, but one that makes no progress for
        // `stall` is cut off even if nobody waits (it holds the fill, its
        // budget and the origin call).
        let mut deadline = *pace.idle.get_or_insert(now) + pace.stall;
        if waiting == 0 {
            pace.majority_ends(now);
            pace.blocked = None;
            if now < deadline {
                return Room::Wait(Some(deadline));
            }
            return self.cut(window);
        }
        // No reader waits more than the grace at a stretch.
        deadline = deadline.min(*pace.blocked.get_or_insert(now) + STALL_GRACE);
        // Half the readers wait for readers that have started: cut those
        // off once they have waited half the time since the first byte.
        // One that has not read its first byte yet (a connection slow to
        // start on a busy server) has the grace to start.
        if waiting * 2 >= self.live && self.first > 0 {
            let since = *pace.majority.get_or_insert(now);
            let read = (since - *pace.start.get_or_insert(since)).saturating_sub(pace.waited);
            deadline = deadline.min(since + (read * SLOW).saturating_sub(pace.waited));
        } else {
            pace.majority_ends(now);
        }
        if now < deadline {
            return Room::Wait(Some(deadline));
        }
        self.cut(window)
    }

    /// Drop chunks, oldest first, until there is room: the live readers
    /// that still needed them are cut off.
    fn cut(&mut self, window: usize) -> Room {
        while self.held >= window && !self.chunks.is_empty() {
            self.cut_front();
        }
        self.pace.cut();
        Room::Ready(std::mem::take(&mut self.wakers))
    }
}

/// What the writer learns from [`Buf::room`].
enum Room {
    Ready(Wakers),
    /// No room; ask again at this instant at the latest (readers that
    /// change things wake the writer sooner).
    Wait(Option<TokioInstant>),
}

impl SharedBody {
    /// `cache`: the layer's metrics label; `stall`: how long the writer
    /// waits for room while no reader waits for it (readers that hold the
    /// fill back and make no progress that long are cut off).
    pub(crate) fn new(cache: &str, stall: Duration) -> Arc<Self> {
        Arc::new(Self {
            cache: Arc::from(cache),
            buf: Mutex::new(Buf {
                chunks: VecDeque::new(),
                first: 0,
                held: 0,
                window: None,
                end: End::Open,
                wakers: HashMap::new(),
                live: 0,
                next_reader: 0,
                at: VecDeque::from([0]),
                writer: None,
                pace: Pace::new(stall),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Buf> {
        // A panic mid-push leaves the buffer consistent (a push is one
        // VecDeque operation and counter updates).
        self.buf.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A reader from the first byte on; `None` once the first byte is gone.
    pub(crate) fn reader(self: &Arc<Self>, ttfb_since: Option<Instant>) -> Option<StreamReader> {
        let mut buf = self.lock();
        if buf.first > 0 {
            return None;
        }
        buf.live += 1;
        buf.shift(usize::MAX, 0);
        let id = buf.next_reader;
        buf.next_reader += 1;
        // One more reader to wait for: let a parked writer re-check.
        let writer = buf.writer.take();
        drop(buf);
        if let Some(w) = writer {
            w.wake();
        }
        Some(StreamReader {
            body: Arc::clone(self),
            id,
            next: 0,
            finished: false,
            ttfb_since,
        })
    }

    /// Stop keeping the whole body (it will not be stored): from now on at
    /// most `window` bytes are held for the slowest reader.
    pub(crate) fn to_window(&self, window: usize) {
        self.lock().window = Some(window);
    }

    pub(crate) fn push(&self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        let wake = {
            let mut buf = self.lock();
            buf.held += chunk.len();
            buf.chunks.push_back(chunk);
            buf.pace.start.get_or_insert_with(TokioInstant::now);
            buf.at.push_back(0);
            // Nobody paces the writer: bound memory by the newest bytes
            // instead, until the fill sees it is abandoned.
            if let Some(window) = buf.window {
                while buf.live == 0 && buf.held > window && buf.chunks.len() > 1 {
                    buf.drop_front();
                }
            }
            // Every parked reader has a new chunk.
            std::mem::take(&mut buf.wakers)
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

    /// Ready when the writer may take the next origin chunk (always, while
    /// the body may be stored or nobody reads): see the module docs. Keeps
    /// the held bytes under a window plus one chunk.
    #[cfg(test)]
    pub(crate) fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        match self.check_room(cx) {
            Poll::Ready(None) => Poll::Ready(()),
            _ => Poll::Pending,
        }
    }

    /// Wait for room, by the rules in the module docs: until a reader
    /// wakes the writer, or the latest deadline [`Buf::room`] gave passes.
    pub(crate) async fn room(&self) {
        let mut timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
        std::future::poll_fn(|cx| loop {
            match self.check_room(cx) {
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(deadline)) => {
                    let t =
                        timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                    if t.deadline() != deadline {
                        t.as_mut().reset(deadline);
                    }
                    if t.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // Past the deadline: the next check cuts off.
                }
            }
        })
        .await
    }

    /// `Ready(None)`: room. `Ready(Some(t))`: no room, ask again by `t`.
    /// `Pending`: no room, a reader will wake the writer.
    fn check_room(&self, cx: &mut Context<'_>) -> Poll<Option<TokioInstant>> {
        let (room, wake) = {
            let mut buf = self.lock();
            let Some(window) = buf.window else {
                return Poll::Ready(None);
            };
            match buf.room(window, TokioInstant::now()) {
                Room::Ready(wake) => (Poll::Ready(None), wake),
                Room::Wait(deadline) => {
                    buf.writer = Some(cx.waker().clone());
                    (
                        deadline.map_or(Poll::Pending, |d| Poll::Ready(Some(d))),
                        Wakers::new(),
                    )
                }
            }
        };
        wake_all(wake);
        room
    }

    /// A new reader can still start at the first byte.
    pub(crate) fn attachable(&self) -> bool {
        self.lock().first == 0
    }

    /// Nobody reads and nobody can attach any more: the fill serves no one.
    pub(crate) fn abandoned(&self) -> bool {
        let buf = self.lock();
        buf.live == 0 && buf.first > 0
    }

    /// Bytes held right now (for tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.lock().held
    }
}

fn wake_all(wakers: Wakers) {
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
            crate::metrics::record_stream_cut_off(&self.body.cache);
            return Poll::Ready(Some(Err(Box::new(StreamError(CUT_OFF)))));
        }
        let at = (self.next - buf.first) as usize;
        if let Some(chunk) = buf.chunks.get(at) {
            let chunk = chunk.clone();
            self.next += 1;
            buf.shift(at, at + 1);
            // The writer may have room now: nobody needs the oldest chunk.
            let freed = at == 0 && buf.at.front() == Some(&0);
            let writer = if freed { buf.writer.take() } else { None };
            drop(buf);
            if let Some(w) = writer {
                w.wake();
            }
            if let Some(since) = self.ttfb_since.take() {
                crate::metrics::record_waiter_ttfb(&self.body.cache, since.elapsed());
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
                // One more reader waits: the writer's clocks changed.
                let writer = buf.writer.take();
                drop(buf);
                if let Some(w) = writer {
                    w.wake();
                }
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
            buf.wakers.remove(&self.id);
            // A reader cut off was counted out when its chunk was dropped.
            if self.next >= buf.first {
                let at = (self.next - buf.first) as usize;
                buf.shift(at, usize::MAX);
                buf.live = buf.live.saturating_sub(1);
            }
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
        let body = SharedBody::new("test", Duration::from_secs(60));
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

    const WINDOW: usize = 40;
    const CHUNK: usize = 4;

    fn chunk(i: usize) -> Bytes {
        Bytes::from(vec![i as u8; CHUNK])
    }

    /// Push chunks `from..` while the writer has room; how many it pushed.
    fn fill(body: &SharedBody, from: usize, upto: usize) -> usize {
        let mut i = from;
        while i < upto && has_room(body) {
            body.push(chunk(i));
            i += 1;
            assert!(body.held() <= WINDOW + CHUNK, "held {}", body.held());
        }
        i
    }

    /// Read what `r` can read now; the first byte of each chunk, or the error.
    fn drain(r: &mut StreamReader, got: &mut Vec<u8>) -> Option<String> {
        loop {
            match poll_now(r) {
                Poll::Ready(Some(Ok(c))) => got.push(c[0]),
                Poll::Ready(Some(Err(e))) => return Some(e.to_string()),
                Poll::Ready(None) | Poll::Pending => return None,
            }
        }
    }

    /// Readers that all go slowly pace the writer: it waits for them
    /// instead of cutting them off, and never holds more than a window
    /// plus a chunk.
    #[test]
    fn slow_readers_together_pace_the_writer() {
        const CHUNKS: usize = 100;
        let body = SharedBody::new("test", Duration::from_secs(60));
        body.to_window(WINDOW);
        let mut readers: Vec<_> = (0..3).map(|_| body.reader(None).unwrap()).collect();
        let mut got = vec![Vec::new(); 3];
        let (mut written, mut waits) = (0, 0);
        while got.iter().any(|g| g.len() < CHUNKS) {
            let before = written;
            written = fill(&body, written, CHUNKS);
            if written < CHUNKS && written - before < 2 {
                waits += 1;
            }
            if written == CHUNKS {
                body.finish();
            }
            // One chunk each per round: nobody ever reads everything there is.
            for (r, g) in readers.iter_mut().zip(&mut got) {
                if let Poll::Ready(Some(c)) = poll_now(r) {
                    g.push(c.unwrap()[0]);
                }
            }
        }
        for g in got {
            assert_eq!(g, (0..CHUNKS as u8).collect::<Vec<_>>());
        }
        assert!(
            waits > 50,
            "the writer waited for the readers {waits} times"
        );
    }

    /// Two readers read a window at 1 ms a chunk, then wait for a third that
    /// stalled after `started` chunks: how long after the first byte the
    /// third is cut off (checked: it is, and the two get everything).
    async fn stalled_third_cut_after(started: usize) -> Duration {
        let body = SharedBody::new("test", Duration::from_secs(60));
        body.to_window(WINDOW);
        let mut fast = [body.reader(None).unwrap(), body.reader(None).unwrap()];
        let mut stalled = body.reader(None).unwrap();
        let start = tokio::time::Instant::now();
        let written = fill(&body, 0, 100);
        assert_eq!(written * CHUNK, WINDOW);
        for _ in 0..started {
            assert!(poll_now(&mut stalled).is_ready());
        }
        let mut got = [Vec::new(), Vec::new()];
        for _ in 0..written {
            tokio::time::sleep(Duration::from_millis(1)).await;
            for (r, g) in fast.iter_mut().zip(&mut got) {
                let Poll::Ready(Some(Ok(c))) = poll_now(r) else {
                    panic!("a chunk to read");
                };
                g.push(c[0]);
            }
        }
        // Now they wait for more.
        for r in &mut fast {
            assert!(poll_now(r).is_pending());
        }
        let more = fill(&body, written, 100);
        assert!(
            more - written <= started,
            "the stalled reader holds the fill back"
        );
        for (r, g) in fast.iter_mut().zip(&mut got) {
            assert_eq!(drain(r, g), None);
        }
        tokio::time::timeout(STALL_GRACE * 2, body.room())
            .await
            .expect("the stalled reader is cut off");
        let cut_after = start.elapsed();
        assert_eq!(
            drain(&mut stalled, &mut Vec::new()).as_deref(),
            Some(CUT_OFF)
        );
        let more = fill(&body, more, 100);
        for (r, g) in fast.iter_mut().zip(&mut got) {
            assert_eq!(drain(r, g), None);
            assert_eq!(*g, (0..more as u8).collect::<Vec<_>>());
        }
        assert!(body.reader(None).is_none(), "the first byte is gone");
        cut_after
    }

    /// A reader that has started and is less than a quarter as fast as
    /// most is cut off once they have waited for it three times as long as
    /// they read: 10 ms of reading, 30 ms of waiting.
    #[tokio::test(start_paused = true)]
    async fn reader_less_than_a_quarter_as_fast_as_most_is_cut_off() {
        assert_eq!(stalled_third_cut_after(1).await, Duration::from_millis(40));
    }

    /// A reader that has not read its first byte yet has the grace to start.
    #[tokio::test(start_paused = true)]
    async fn reader_not_started_has_the_grace() {
        let after = stalled_third_cut_after(0).await;
        assert_eq!(after, Duration::from_millis(10) + STALL_GRACE);
    }

    /// One fast reader and two stalled ones: the writer waits for the
    /// majority, until the fast one has waited the grace.
    #[tokio::test(start_paused = true)]
    async fn fast_minority_waits_for_the_slow_majority_at_most_the_grace() {
        let body = SharedBody::new("test", Duration::from_secs(60));
        body.to_window(WINDOW);
        let mut fast = body.reader(None).unwrap();
        let mut stalled = [body.reader(None).unwrap(), body.reader(None).unwrap()];
        let (mut written, mut got) = (fill(&body, 0, 100), Vec::new());
        assert_eq!(drain(&mut fast, &mut got), None);
        assert_eq!(got.len(), written);
        assert!(!has_room(&body), "the majority holds the fill back");
        let start = tokio::time::Instant::now();
        tokio::time::timeout(STALL_GRACE * 3, body.room())
            .await
            .expect("the grace ends the wait");
        assert_eq!(start.elapsed(), STALL_GRACE);
        written = fill(&body, written, 100);
        assert!(written > got.len());
        for r in &mut stalled {
            assert_eq!(drain(r, &mut Vec::new()).as_deref(), Some(CUT_OFF));
        }
        assert_eq!(drain(&mut fast, &mut got), None);
        assert_eq!(got, (0..written as u8).collect::<Vec<_>>());
    }

    /// A reader that holds the fill back and makes no progress is cut off
    /// after the stall bound, even when nobody waits for it.
    #[tokio::test(start_paused = true)]
    async fn idle_reader_is_cut_off_after_the_stall_bound() {
        let body = SharedBody::new("test", Duration::from_secs(60));
        body.to_window(WINDOW);
        let mut idle = body.reader(None).unwrap();
        fill(&body, 0, 100);
        let start = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(120), body.room())
            .await
            .expect("the idle reader is cut off");
        assert_eq!(start.elapsed(), Duration::from_secs(60));
        assert_eq!(drain(&mut idle, &mut Vec::new()).as_deref(), Some(CUT_OFF));
    }

    /// Records that it was woken.
    struct Flag(std::sync::atomic::AtomicBool);

    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A parked writer is woken as soon as the last reader of the oldest
    /// chunk moves on, not only when half the readers have read everything.
    #[test]
    fn freeing_the_oldest_chunk_wakes_the_writer() {
        let body = SharedBody::new("test", Duration::from_secs(60));
        body.to_window(WINDOW);
        let mut readers: Vec<_> = (0..3).map(|_| body.reader(None).unwrap()).collect();
        fill(&body, 0, 100);
        let flag = Arc::new(Flag(Default::default()));
        let waker = Waker::from(Arc::clone(&flag));
        assert!(body
            .poll_room(&mut Context::from_waker(&waker))
            .is_pending());
        for r in &mut readers[..2] {
            assert!(poll_now(r).is_ready());
        }
        assert!(!flag.0.load(Ordering::SeqCst), "a reader still needs it");
        assert!(poll_now(&mut readers[2]).is_ready());
        assert!(
            flag.0.load(Ordering::SeqCst),
            "nobody needs the oldest chunk"
        );
        assert!(has_room(&body));
    }

    /// Readers that leave stop holding the writer back; once all have
    /// left, the fill is abandoned.
    #[test]
    fn leaving_readers_free_the_writer() {
        let body = SharedBody::new("test", Duration::from_secs(60));
        body.to_window(WINDOW);
        let mut fast = body.reader(None).unwrap();
        let stalled = [body.reader(None).unwrap(), body.reader(None).unwrap()];
        let written = fill(&body, 0, 100);
        assert_eq!(drain(&mut fast, &mut Vec::new()), None);
        assert!(!has_room(&body));
        drop(stalled);
        assert!(has_room(&body), "nobody left holds the oldest chunk");
        assert!(fill(&body, written, 100) > written);
        drop(fast);
        assert!(body.abandoned(), "nobody reads, and the start is gone");
    }

    /// A window of 0 bytes (`max_body_bytes(0)`, or a fill whose first frame
    /// was empty when it outgrew storing): once every reader has read
    /// everything there is, nothing is held, so the writer has room at once.
    #[tokio::test(start_paused = true)]
    async fn zero_window_with_every_reader_caught_up_has_room() {
        let body = SharedBody::new("test", Duration::from_secs(60));
        body.to_window(0);
        let mut r = body.reader(None).unwrap();
        let mut got = Vec::new();
        for i in 0..4 {
            let start = tokio::time::Instant::now();
            tokio::time::timeout(STALL_GRACE * 2, body.room())
                .await
                .expect("room");
            assert_eq!(start.elapsed(), Duration::ZERO, "chunk {i} waited");
            body.push(chunk(i));
            tokio::time::sleep(Duration::from_millis(1)).await;
            assert_eq!(drain(&mut r, &mut got), None);
            assert!(poll_now(&mut r).is_pending(), "the reader is parked");
        }
        assert_eq!(got, vec![0, 1, 2, 3]);
    }

    /// With nobody reading, only the newest window is kept.
    #[test]
    fn no_reader_keeps_the_newest_window() {
        let body = SharedBody::new("test", Duration::from_secs(60));
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
        let body = SharedBody::new("test", Duration::from_secs(60));
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
            route: None,
            rules: crate::http::policy::StoredRules::default(),
            revalidated: false,
            not_stored: None,
            served_head: Default::default(),
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
                body: SharedBody::new("test", Duration::from_secs(60)),
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
