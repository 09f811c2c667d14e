//! Readers: one cursor per request into a fill's shared body.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;

use super::buf::End;
use super::window::SharedBody;
use crate::error::BoxError;

/// A body error a reader receives.
#[derive(Debug)]
pub(crate) struct StreamError(&'static str);

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for StreamError {}

pub(super) const CUT_OFF: &str = "reader fell behind the shared stream window";

/// One reader's cursor into a [`SharedBody`].
#[derive(Debug)]
pub(crate) struct StreamReader {
    pub(super) body: Arc<SharedBody>,
    pub(super) id: u64,
    pub(super) next: u64,
    pub(super) finished: bool,
    /// For a waiter: when its request arrived, to record its time to first byte.
    pub(super) ttfb_since: Option<Instant>,
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

impl SharedBody {
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
}
