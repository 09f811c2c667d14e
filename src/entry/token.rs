//! The lease and fence tokens: what a lease is known by, and what a fenced
//! write carries. The engine and the lock make lease tokens, the
//! store's scripts issue fence tokens, and all three pass both around.
//! Imports nothing of the crate.

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
