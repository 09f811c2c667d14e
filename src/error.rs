//! Small typed errors. Messages are lowercase and chain their `source()`.

use std::fmt;
use std::sync::Arc;

/// A boxed error, the currency of computations handed to the engine.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why [`Cache::get_or_compute`](crate::Cache::get_or_compute) could not produce a value.
///
/// Cloning is cheap: every waiter of one flight receives the same error.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The computation returned an error. Every waiter of the flight gets this
    /// same error; nobody retries on their behalf.
    Compute(Arc<dyn std::error::Error + Send + Sync + 'static>),
    /// The computation panicked. The next call elects a new leader.
    Panicked,
    /// The leader's task ended before producing an outcome (runtime shutdown).
    Aborted,
    /// The computation ran longer than the configured origin timeout.
    OriginTimeout,
    /// The wait for another caller's result ran out and the fallback
    /// concurrency cap was exhausted, so the origin was not called either.
    Overloaded,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Compute(_) => f.write_str("computation failed"),
            Error::Panicked => f.write_str("computation panicked"),
            Error::Aborted => f.write_str("computation was aborted before it finished"),
            Error::OriginTimeout => f.write_str("computation exceeded the origin timeout"),
            Error::Overloaded => f.write_str("wait timed out and the fallback cap is exhausted"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Compute(e) => Some(&**e),
            _ => None,
        }
    }
}

/// A stored entry could not be decoded (corrupt bytes or an unknown version).
/// Treated as a miss by the engine; the entry is then overwritten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    pub(crate) reason: &'static str,
}

impl DecodeError {
    pub(crate) const fn new(reason: &'static str) -> Self {
        Self { reason }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot decode stored entry: {}", self.reason)
    }
}

impl std::error::Error for DecodeError {}

/// The builder was given a configuration that cannot work.
#[derive(Debug)]
pub struct BuildError {
    message: String,
    source: Option<BoxError>,
}

impl BuildError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            source: None,
        }
    }

    #[allow(dead_code, reason = "used once the Redis store is configured")]
    pub(crate) fn with_source(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
