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

mod buf;
mod pace;
mod reader;
mod registry;
#[cfg(test)]
mod tests;
mod window;

pub(crate) use reader::StreamReader;
pub(crate) use registry::{Stream, Streams, Writer};
pub(crate) use window::SharedBody;
