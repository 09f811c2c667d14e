//! Leases and fencing tokens.
//!
//! A Redis lock is a lease, not a mutex: it can expire under a worker that is
//! still running. The lease elects one leader per key cheaply; the fence token
//! issued with it makes a late write from a lapsed leader harmless, because
//! the store rejects any write older than the newest accepted one.
//!
//! Owns the lease and fence token types (this file), Redlock across N
//! masters (`redlock`) and the lease watchdog (`watchdog`). Must not import
//! `http` or `engine`. The store imports the two token types, since a fenced
//! write carries a `FenceToken` and a release compares a `LeaseToken`; this
//! file imports nothing of the store's, so that is no circle.

pub(crate) mod redlock;
pub(crate) mod watchdog;

use std::fmt;

/// A random lease token: only its holder may extend or release the lease.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct LeaseToken(String);

impl LeaseToken {
    pub(crate) fn random() -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let bytes: [u8; 16] = rand::random();
        // Every flight's lookup makes one: written in place, one allocation
        // (formatting each byte allocated sixteen).
        let mut s = String::with_capacity(32);
        for b in bytes {
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
        Self(s)
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 8 characters: enough to correlate logs, useless to forge.
    pub(crate) fn prefix(&self) -> &str {
        &self.0[..8.min(self.0.len())]
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A prefix is enough to correlate logs; the whole token is a capability.
        write!(f, "LeaseToken({}…)", &self.0[..8.min(self.0.len())])
    }
}

/// A monotonically increasing number issued with each lease of one key.
/// Writes carry it; the store accepts a write only if its token is not older
/// than the highest it has accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FenceToken(pub(crate) u64);

use crate::metrics::names;

pub(crate) fn record_acquire(result: &'static str) {
    metrics::counter!(names::LOCK_ACQUIRE, "result" => result).increment(1);
}

/// Register the lease metrics a [`Redlock`](redlock::Redlock) records
/// (without a `cache` label) at 0, so exporters show them before the first
/// election.
pub(crate) fn register_metrics() {
    for result in ["acquired", "contended", "expired_mid_work"] {
        metrics::counter!(names::LOCK_ACQUIRE, "result" => result).increment(0);
    }
    // The handle is dropped: the recorder keeps what it registered.
    let _ = metrics::histogram!(names::LOCK_HELD_SECONDS);
}

pub(crate) fn record_held(seconds: f64) {
    metrics::histogram!(names::LOCK_HELD_SECONDS).record(seconds);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease token is 32 lowercase hex digits (16 random bytes), and two differ.
    #[test]
    fn lease_tokens_are_32_hex_digits() {
        let (a, b) = (LeaseToken::random(), LeaseToken::random());
        for t in [&a, &b] {
            assert_eq!(t.as_str().len(), 32, "{:?}", t.as_str());
            assert!(t
                .as_str()
                .bytes()
                .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')));
        }
        assert_ne!(a.as_str(), b.as_str());
    }
}
