//! The window and its room: the writer's handle on one fill's body
//! ([`SharedBody`]): pushing chunks, ending the body, and waiting for room
//! by the pacing rules in [`super::pace`]. The state it locks is
//! [`super::buf`]'s.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant as TokioInstant;

use super::buf::{Buf, End, Pace, Wakers};
use super::pace::Room;

/// The body of one fill, shared by all its readers.
#[derive(Debug)]
pub(crate) struct SharedBody {
    buf: Mutex<Buf>,
    /// The layer's `cache` metrics label.
    pub(super) cache: Arc<str>,
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

    pub(super) fn lock(&self) -> MutexGuard<'_, Buf> {
        // A panic mid-push leaves the buffer consistent (a push is one
        // VecDeque operation and counter updates).
        self.buf.lock().unwrap_or_else(PoisonError::into_inner)
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
    pub(super) fn held(&self) -> usize {
        self.lock().held
    }
}

pub(super) fn wake_all(wakers: Wakers) {
    for (_, w) in wakers {
        w.wake();
    }
}
