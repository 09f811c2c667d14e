//! A computation as the engine runs it, and what it produced ([`Fill`]).
//! Plain types: nothing here runs or stores anything.

use std::time::Duration;

use futures_util::future::BoxFuture;

use super::gate::{Priority, Ticket};
use crate::error::BoxError;

/// What a computation produced, and what may be done with it.
#[derive(Debug)]
pub(crate) enum Fill<V> {
    /// Store it and share it with every waiter.
    Store {
        value: V,
        fresh_for: Duration,
        stale_for: Duration,
        /// Further keys the same answer is filed under. Written only after
        /// the fill's own fenced write is accepted, under its fence token
        /// and its purge checks: never outside the fence.
        copies: Vec<AlsoStored>,
    },
    /// Share it with the callers waiting right now, but do not store it.
    Share(V),
    /// Neither store nor share. The initiating caller gets the value (if any);
    /// everyone else goes to the origin on their own, and a short pass marker
    /// stops new callers from queueing behind a fill that will never come,
    /// unless an entry still usable for other callers is stored: a marker
    /// never replaces one.
    Pass(Option<V>),
    /// Uncacheable because of the one request that made it (its credentials,
    /// a `Set-Cookie` made for it): only the initiating caller gets it, the
    /// others go to the origin on their own, and what is stored stays. No
    /// pass marker: one request must not switch caching off for everyone.
    Private(V),
    /// Not buffered: too large to store, or the fill buffer budget was spent.
    /// The initiating caller got the response streamed (and whoever the
    /// caller's own layer shared the stream with); everyone else goes to the
    /// origin on their own. Unlike `Pass` nothing is marked: the next caller
    /// leads a new fill.
    Unbuffered,
}

/// A further key a fill's answer is filed under: the Vary variant learned
/// at fill time, or a URL's base key (which carries the Vary names for
/// instances that have not learned them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AlsoStored {
    pub(crate) key: crate::key::CacheKey,
    /// Also kept in this process's memory (else in Redis only).
    pub(crate) memory: bool,
}

impl<V> Fill<V> {
    /// The value it holds, if any.
    pub(crate) fn value(&self) -> Option<&V> {
        match self {
            Fill::Store { value, .. } | Fill::Share(value) | Fill::Private(value) => Some(value),
            Fill::Pass(value) => value.as_ref(),
            Fill::Unbuffered => None,
        }
    }
}

pub(crate) type ComputeFuture<V> = BoxFuture<'static, Result<Fill<V>, BoxError>>;

/// A computation as the engine runs it: its future, what waits on it (its
/// priority at the origin gate), and the place in the budget it already
/// holds, if any (a background refresh takes one before its flight is made).
pub(crate) struct Work<V> {
    pub(crate) fut: ComputeFuture<V>,
    pub(crate) priority: Priority,
    pub(crate) ticket: Option<Ticket>,
}

impl<V> Work<V> {
    /// Work somebody waits for.
    pub(crate) fn waited(fut: ComputeFuture<V>) -> Self {
        Self {
            fut,
            priority: Priority::Waited,
            ticket: None,
        }
    }

    /// Background work holding its `ticket`.
    pub(crate) fn background(fut: ComputeFuture<V>, priority: Priority, ticket: Ticket) -> Self {
        Self {
            fut,
            priority,
            ticket: Some(ticket),
        }
    }
}

impl<V> std::fmt::Debug for Work<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

/// Something that can start a computation. A trait rather than a closure so a
/// follower that never led can take its inputs back for a fallback.
pub(crate) trait Compute<V> {
    fn start(self) -> ComputeFuture<V>;
}

/// Adapts a closure to [`Compute`].
#[derive(Debug)]
pub(crate) struct FnCompute<F>(pub(crate) F);

impl<V, F: FnOnce() -> ComputeFuture<V>> Compute<V> for FnCompute<F> {
    fn start(self) -> ComputeFuture<V> {
        (self.0)()
    }
}
