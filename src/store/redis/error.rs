//! Why a Redis call failed: [`StoreError`] for callers, [`ErrorClass`] for
//! what the store does about it, and error text with credentials removed.
//! Decides nothing itself: the connection acts on the class.

use deadpool_redis::redis;

use super::options::redact;

/// Why a Redis call did not produce an answer. Callers fail open on any of these.
#[derive(Debug)]
pub(crate) enum StoreError {
    /// The circuit breaker is open: Redis failed recently.
    Unavailable,
    Timeout,
    Redis(redis::RedisError),
    /// The reply did not have the shape our script returns.
    Protocol,
}

impl StoreError {
    /// Redis refused a write for lack of memory (reads still work).
    pub(crate) fn is_oom(&self) -> bool {
        matches!(self, StoreError::Redis(e) if ErrorClass::of(e) == ErrorClass::Oom)
    }

    /// The call surely did nothing in Redis: the breaker is open, the
    /// connection failed, or the server is no writable master. A timeout
    /// is not this: the command may have run.
    pub(crate) fn did_nothing(&self) -> bool {
        match self {
            StoreError::Unavailable => true,
            StoreError::Redis(e) => {
                matches!(ErrorClass::of(e), ErrorClass::Connection | ErrorClass::Role)
                    && !e.is_timeout()
            }
            StoreError::Timeout | StoreError::Protocol => false,
        }
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Unavailable => f.write_str("redis unavailable (circuit open)"),
            StoreError::Timeout => f.write_str("redis call timed out"),
            StoreError::Redis(e) => write!(f, "redis error: {e}"),
            StoreError::Protocol => f.write_str("unexpected reply from redis"),
        }
    }
}

impl From<&StoreError> for crate::error::StoreFailure {
    fn from(e: &StoreError) -> Self {
        use crate::error::StoreFailureKind as Kind;
        let kind = match e {
            StoreError::Unavailable => Kind::Unavailable,
            StoreError::Timeout => Kind::Timeout,
            StoreError::Protocol => Kind::Protocol,
            StoreError::Redis(e) => match ErrorClass::of(e) {
                ErrorClass::Connection => Kind::Connection,
                ErrorClass::Timeout => Kind::Timeout,
                ErrorClass::Role | ErrorClass::Oom | ErrorClass::Foreign | ErrorClass::Other => {
                    Kind::Server
                }
            },
        };
        Self::new(kind, redact_error(e))
    }
}

/// What a failed call says about Redis; it decides what the store does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ErrorClass {
    /// The connection is broken (reset, I/O, unrecoverable): replace it,
    /// open the breaker.
    Connection,
    /// No reply in time. The breaker opens, and every kept connection is
    /// replaced on its next use: a silent path (blackholed after a
    /// failover) would stay silent, while a new connection follows a moved
    /// name or address.
    Timeout,
    /// The server answers but is no writable master: READONLY (demoted by a
    /// failover), LOADING, MASTERDOWN. Every kept connection leads to that
    /// server, so all are replaced: behind a DNS name or a virtual IP the new
    /// connections reach the new master. The breaker opens.
    Role,
    /// Out of memory: writes are refused, reads still work. No breaker trip;
    /// the caller serves from memory.
    Oom,
    /// A value of another type at one of our keys (WRONGTYPE).
    Foreign,
    /// Any other error about one command.
    Other,
}

impl ErrorClass {
    pub(super) fn of(e: &redis::RedisError) -> Self {
        match e.code() {
            Some("READONLY" | "LOADING" | "MASTERDOWN") => return Self::Role,
            Some("OOM") => return Self::Oom,
            Some("WRONGTYPE") => return Self::Foreign,
            _ => {}
        }
        if e.is_timeout() {
            Self::Timeout
        } else if e.is_connection_dropped()
            || e.is_unrecoverable_error()
            || e.is_io_error()
            || e.is_cluster_error()
        {
            Self::Connection
        } else {
            Self::Other
        }
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::Timeout => "timeout",
            Self::Role => "role",
            Self::Oom => "oom",
            Self::Foreign => "foreign",
            Self::Other => "other",
        }
    }
}

/// An error's text without credentials (redis errors may echo the URL).
pub(crate) fn redact_error(e: &dyn std::fmt::Display) -> String {
    let s = e.to_string();
    match s.find("://") {
        Some(_) => s
            .split_whitespace()
            .map(redact)
            .collect::<Vec<_>>()
            .join(" "),
        None => s,
    }
}

/// A redis error for a log line: credentials redacted, and a rejected login
/// said in plain words (the server's own text is terse).
pub(crate) fn describe(e: &redis::RedisError) -> String {
    let text = redact_error(e);
    let rejected = e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"));
    if rejected {
        format!("authentication failed (check the user and password of the redis url): {text}")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Server errors are sorted by what they say about Redis: a demoted or
    /// loading server, a full one, a foreign value, anything else.
    #[test]
    fn server_errors_are_classified() {
        let class = |reply: &[u8]| {
            let err = redis::parse_redis_value(reply)
                .unwrap()
                .extract_error()
                .unwrap_err();
            ErrorClass::of(&err)
        };
        for reply in [
            &b"-READONLY You can't write against a read only replica. script: x\r\n"[..],
            b"-LOADING Redis is loading the dataset in memory\r\n",
            b"-MASTERDOWN Link with MASTER is down\r\n",
        ] {
            assert_eq!(class(reply), ErrorClass::Role);
        }
        assert_eq!(
            class(b"-OOM command not allowed when used memory > 'maxmemory'.\r\n"),
            ErrorClass::Oom
        );
        assert_eq!(
            class(b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"),
            ErrorClass::Foreign
        );
        assert_eq!(class(b"-ERR something else\r\n"), ErrorClass::Other);
    }
}
