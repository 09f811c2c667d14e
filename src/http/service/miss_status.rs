//! The states a request with no usable entry can be in on its way through
//! [`miss`](super::coalesce::miss): what it may take from its key's flight,
//! and where it stands once it first hears of it.

use std::sync::Arc;

use crate::engine::Resolved;
use crate::http::response::CachedResponse;
use crate::http::stream::Stream;

use super::returned::Handoff;

/// What a request in [`miss`](super::coalesce::miss) takes from its flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wants {
    /// A usable stored entry, or the flight's answer.
    Entry,
    /// Only a refresh: it refuses the stored response (`no-cache`, `max-age` …).
    Refresh,
    /// It met a pass marker in memory, with Redis reachable: the flight
    /// looks in Redis, where another instance's hit-for-miss may have
    /// stored the entry since. While Redis still holds the marker, it is a
    /// request under a marker as in `route()`: never coalesced on an
    /// origin call, never queued for a permit.
    PastMarker,
}

/// Where a request in [`miss`](super::coalesce::miss) stands once it
/// first hears of its flight, named as pingora-cache names a waiter's
/// `LockStatus` and moka its `WaiterValue`. Till then it waits, bounded by
/// the engine.
pub(super) enum MissStatus<ResB> {
    /// Its own call handed its answer over ([`Returned::Handoff`]): it led,
    /// and the answer is its alone.
    ///
    /// [`Returned::Handoff`]: super::returned::Returned::Handoff
    HandedOff(Handoff<ResB>),
    /// Another request's call streams an answer this one may read from its
    /// first byte.
    Streaming(Arc<Stream>),
    /// The flight is over, and [`Resolved`] says how for this request: a
    /// value, nothing shared, failed, its wait ran out (with a fallback
    /// permit), or no flight could start (overloaded).
    Done(Resolved<CachedResponse>),
}
