//! The states a request with no usable entry can be in on its way through
//! [`miss`](super::coalesce::miss): what it may take from its key's flight,
//! and where it stands once it first hears of it.

use std::sync::Arc;

use crate::http::stream::Stream;

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

/// What a request in [`miss`](super::coalesce::miss) learns first.
pub(super) enum First<V, H> {
    Resolved(V),
    Handoff(H),
    Stream(Arc<Stream>),
}
