//! Pacing and cut-off rules: when the writer may take the next origin
//! chunk, and which readers are cut off to make room (see the rules in
//! [`super`]'s docs).

use std::time::Duration;

use tokio::time::Instant as TokioInstant;

use super::buf::{Buf, Wakers};

/// The longest a reader waits at a stretch for slower ones before the
/// readers a window behind are cut off.
pub(crate) const STALL_GRACE: Duration = Duration::from_secs(5);

/// A reader that has started is cut off once half the readers have waited
/// for it `SLOW` times as long as they spent reading: it is less than
/// `1 / (SLOW + 1)` as fast as most readers.
const SLOW: u32 = 3;

impl Buf {
    /// Whether the writer may take the next chunk, making room by the
    /// rules in the module docs; when not, until when to wait at most
    /// before asking again. Also the wakers of readers cut off, so a
    /// parked one learns it now.
    pub(super) fn room(&mut self, window: usize, now: TokioInstant) -> Room {
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
    pub(super) fn cut(&mut self, window: usize) -> Room {
        while self.held >= window && !self.chunks.is_empty() {
            self.cut_front();
        }
        self.pace.cut();
        Room::Ready(std::mem::take(&mut self.wakers))
    }
}

/// What the writer learns from [`Buf::room`].
pub(super) enum Room {
    Ready(Wakers),
    /// No room; ask again at this instant at the latest (readers that
    /// change things wake the writer sooner).
    Wait(Option<TokioInstant>),
}
