//! The state under a shared body's lock: the chunks held, every reader's
//! position in them, and the clocks of the pace. The rules that change it
//! are in [`super::pace`]; the handles are [`super::window`] and
//! [`super::reader`].

use std::collections::{HashMap, VecDeque};
use std::task::Waker;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant as TokioInstant;

/// How a stream ended, once it has.
#[derive(Debug, Clone)]
pub(super) enum End {
    Open,
    Done,
    Failed(&'static str),
}

/// A std `Mutex`: held for a few pointer moves, never across an `.await`,
/// and wakers are woken after it is released.
#[derive(Debug)]
pub(super) struct Buf {
    pub(super) chunks: VecDeque<Bytes>,
    /// Absolute index of `chunks[0]`: readers keep absolute cursors.
    pub(super) first: u64,
    pub(super) held: usize,
    /// `None` while the body may still be stored (keep all of it); then
    /// the most bytes held while a reader still needs the oldest of them.
    pub(super) window: Option<usize>,
    pub(super) end: End,
    /// One waker per waiting reader, by reader id: bounded by the readers.
    pub(super) wakers: HashMap<u64, Waker>,
    /// Readers not cut off: the ones that pace the writer.
    pub(super) live: usize,
    pub(super) next_reader: u64,
    /// Live readers by position: `at[i]` is how many will read chunk
    /// `first + i` next; the last slot counts those that have read
    /// everything there is. One slot per chunk held, plus one.
    pub(super) at: VecDeque<usize>,
    /// The writer, parked while a window is held for a reader that still
    /// needs its oldest chunk.
    pub(super) writer: Option<Waker>,
    /// How long the fill has been held back, and by whom.
    pub(super) pace: Pace,
}

pub(super) type Wakers = HashMap<u64, Waker>;

impl Buf {
    /// Move one live reader from slot `from` to slot `to`.
    pub(super) fn shift(&mut self, from: usize, to: usize) {
        if let Some(n) = self.at.get_mut(from) {
            *n = n.saturating_sub(1);
        }
        if let Some(n) = self.at.get_mut(to) {
            *n += 1;
        }
    }

    /// Drop the oldest chunk; the live readers that still needed it are
    /// cut off (they learn it when next polled).
    pub(super) fn drop_front(&mut self) {
        let Some(c) = self.chunks.pop_front() else {
            return;
        };
        self.held -= c.len();
        self.first += 1;
        let cut = self.at.pop_front().unwrap_or(0);
        self.live = self.live.saturating_sub(cut);
    }

    /// Drop the oldest chunk for room; whether a live reader was cut off.
    pub(super) fn cut_front(&mut self) -> bool {
        let cut = self.at.front().is_some_and(|n| *n > 0);
        self.drop_front();
        cut
    }
}

/// The clocks behind the cut-off rules, in tokio time (paused in tests).
#[derive(Debug)]
pub(super) struct Pace {
    /// How long a blocked writer waits while no reader waits.
    pub(super) stall: Duration,
    /// When the first byte arrived.
    pub(super) start: Option<TokioInstant>,
    /// Since the writer last found no room while a reader waited.
    pub(super) blocked: Option<TokioInstant>,
    /// Since the writer last found no room at all.
    pub(super) idle: Option<TokioInstant>,
    /// How long half the readers have waited for slower ones since the
    /// first byte (or since the last cut), besides the wait going on now
    /// (since `majority`).
    pub(super) waited: Duration,
    pub(super) majority: Option<TokioInstant>,
}

impl Pace {
    pub(super) fn new(stall: Duration) -> Self {
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
    pub(super) fn unblocked(&mut self, now: TokioInstant) {
        self.blocked = None;
        self.idle = None;
        self.majority_ends(now);
    }

    pub(super) fn majority_ends(&mut self, now: TokioInstant) {
        if let Some(since) = self.majority.take() {
            self.waited += now - since;
        }
    }

    /// Readers were cut off: the next slowest starts with a clean slate.
    pub(super) fn cut(&mut self) {
        self.blocked = None;
        self.idle = None;
        self.start = None;
        self.waited = Duration::ZERO;
        self.majority = None;
    }
}
