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
    /// The origin budget had no permit for this call within `max_wait`
    /// (or its queue was full), so the origin was not called.
    OriginBusy,
    /// The origin's breaker is open: recent calls failed in a row, so the
    /// origin was not called. The next probe goes out in `retry_after`.
    OriginDown {
        /// Time until the breaker lets the next probe through.
        retry_after: std::time::Duration,
    },
}

impl Error {
    /// The computation's own error as the type it returned, for
    /// [`Error::Compute`]; `None` for the other variants or another type.
    /// Every waiter of the flight can read it, as with moka's `Arc<E>`.
    ///
    /// The type is the one converted into [`BoxError`]: an error type of
    /// your own (or `std::io::Error`) comes back as itself, while a `String`
    /// or `&str` becomes a private type, readable only as text.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use herdguard::{Cache, CacheKey, Freshness};
    /// use std::time::Duration;
    ///
    /// #[derive(Debug)]
    /// struct NotFound(u32);
    /// impl std::fmt::Display for NotFound {
    ///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    ///         write!(f, "no user {}", self.0)
    ///     }
    /// }
    /// impl std::error::Error for NotFound {}
    ///
    /// let cache: Cache<String> = Cache::builder().build().unwrap();
    /// let err = cache
    ///     .get_or_compute(&CacheKey::new("user:7"), Freshness::new(Duration::from_secs(5)), || async {
    ///         Err::<String, _>(NotFound(7))
    ///     })
    ///     .await
    ///     .unwrap_err();
    /// assert_eq!(err.compute_error::<NotFound>().map(|e| e.0), Some(7));
    /// assert!(err.compute_error::<std::io::Error>().is_none());
    /// # }
    /// ```
    pub fn compute_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            Error::Compute(e) => e.downcast_ref::<E>(),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Compute(_) => f.write_str("computation failed"),
            Error::Panicked => f.write_str("computation panicked"),
            Error::Aborted => f.write_str("computation was aborted before it finished"),
            Error::OriginTimeout => f.write_str("computation exceeded the origin timeout"),
            Error::Overloaded => f.write_str("wait timed out and the fallback cap is exhausted"),
            Error::OriginBusy => f.write_str("the origin budget had no permit in time"),
            Error::OriginDown { .. } => f.write_str("the origin is down (its breaker is open)"),
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
    /// The error a [`Value::decode`](crate::Value::decode) returns for bytes
    /// it cannot read; `reason` says why, in a few lowercase words.
    pub const fn new(reason: &'static str) -> Self {
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
///
/// Branch on the variant to tell a setting of yours from a Redis setup that
/// cannot be used; every message names what to change.
///
/// ```
/// use std::time::Duration;
/// use herdguard::{BuildError, CacheLayer};
///
/// let err = CacheLayer::builder()
///     .origin_timeout(Duration::from_secs(30))
///     .max_wait(Duration::from_secs(10))
///     .build()
///     .unwrap_err();
/// assert!(matches!(err, BuildError::InvalidSetting { setting: "max_wait", .. }));
/// assert_eq!(err.setting(), Some("max_wait"));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// A setting is out of its range, or contradicts another setting.
    #[non_exhaustive]
    InvalidSetting {
        /// The builder method that sets it, such as `"max_wait"` or
        /// `"RedisOptions::namespace"`.
        setting: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// The Redis client could not be set up from the options (an invalid
    /// URL, TLS material that does not load, a pool that cannot be built).
    #[non_exhaustive]
    Redis {
        /// What could not be set up.
        reason: String,
        /// The underlying error, where there is one.
        source: Option<BoxError>,
    },
    /// The configuration needs a cargo feature this build was made without.
    #[non_exhaustive]
    MissingFeature {
        /// The feature to turn on, such as `"tls"`.
        feature: &'static str,
        /// What needed it.
        reason: String,
    },
}

impl BuildError {
    pub(crate) fn invalid(setting: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidSetting {
            setting,
            reason: reason.into(),
        }
    }

    #[cfg_attr(
        not(feature = "redis"),
        allow(dead_code, reason = "made by the Redis store")
    )]
    pub(crate) fn redis(reason: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Redis {
            reason: reason.into(),
            source: Some(source.into()),
        }
    }

    /// A setting's error where no one setting is to blame (kept for
    /// callers that have not named theirs yet; prefer [`Self::invalid`]).
    #[allow(dead_code, reason = "for settings added without a name")]
    pub(crate) fn new(reason: impl Into<String>) -> Self {
        Self::invalid("settings", reason)
    }

    pub(crate) fn missing_feature(feature: &'static str, reason: impl Into<String>) -> Self {
        Self::MissingFeature {
            feature,
            reason: reason.into(),
        }
    }

    /// The setting to change, for [`InvalidSetting`](Self::InvalidSetting).
    pub fn setting(&self) -> Option<&'static str> {
        match self {
            Self::InvalidSetting { setting, .. } => Some(setting),
            _ => None,
        }
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidSetting { setting, reason } => write!(f, "invalid {setting}: {reason}"),
            Self::Redis { reason, .. } => f.write_str(reason),
            Self::MissingFeature { feature, reason } => {
                write!(f, "{reason} needs the `{feature}` feature of herdguard")
            }
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Redis {
                source: Some(source),
                ..
            } => Some(&**source as &(dyn std::error::Error + 'static)),
            _ => None,
        }
    }
}

/// A Redis call that produced no answer: what [`LockError::Store`] and
/// [`PurgeError`](crate::purge::PurgeError) carry, so a caller can branch on
/// [`kind`](Self::kind). Its text has credentials removed.
///
/// [`LockError::Store`]: crate::redlock::LockError::Store
#[derive(Debug, Clone)]
pub struct StoreFailure {
    kind: StoreFailureKind,
    message: String,
}

/// What kind of Redis failure a [`StoreFailure`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreFailureKind {
    /// Redis failed recently and is not asked again until its back-off
    /// ends (the circuit breaker is open).
    Unavailable,
    /// No reply within the configured timeout.
    Timeout,
    /// The connection could not be made or broke (refused, reset, TLS,
    /// authentication).
    Connection,
    /// The server answered with an error: a read-only replica, out of
    /// memory, a value of another type at the key, or a command it refused.
    Server,
    /// The reply did not have the shape the script returns.
    Protocol,
}

impl StoreFailure {
    #[cfg_attr(
        not(feature = "redis"),
        allow(dead_code, reason = "made by the Redis store")
    )]
    pub(crate) fn new(kind: StoreFailureKind, message: String) -> Self {
        Self { kind, message }
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> StoreFailureKind {
        self.kind
    }
}

impl fmt::Display for StoreFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StoreFailure {}
