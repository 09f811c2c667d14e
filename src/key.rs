//! Cache key derivation and the hash tag.
//!
//! A key is a 128-bit BLAKE3 digest of length-prefixed parts, so no two
//! different part lists can produce the same input to the hash, and no request
//! text ever reaches a Redis key name: the hash tag `{H}` is hex of the digest,
//! which no request can steer to a chosen slot or use to break out of braces.

use std::fmt;

/// The identity of one cache entry: a 128-bit digest.
///
/// Build one from your own parts with [`CacheKey::from_parts`] or from a single
/// string with [`CacheKey::new`]; the HTTP layer derives it from the method,
/// authority, path, query and (optionally) configured request headers.
///
/// ```
/// use herdguard::CacheKey;
/// let a = CacheKey::from_parts(&[b"user", b"42"]);
/// let b = CacheKey::from_parts(&[b"user4", b"2"]);
/// assert_ne!(a, b, "parts are length-prefixed, so they cannot run together");
/// assert_eq!(a.to_hex().len(), 32);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheKey([u8; 16]);

impl CacheKey {
    /// The key of a single opaque string or byte string.
    pub fn new(key: impl AsRef<[u8]>) -> Self {
        Self::from_parts(&[key.as_ref()])
    }

    /// The key of an ordered list of parts.
    pub fn from_parts(parts: &[&[u8]]) -> Self {
        let mut h = KeyHasher::new();
        for p in parts {
            h.part(p);
        }
        h.finish()
    }

    /// A key from a digest read back from storage.
    pub(crate) const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Lowercase hex of the digest; this is the `{H}` hash tag in Redis.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(32);
        for b in self.0 {
            s.push(HEX[(b >> 4) as usize] as char);
            s.push(HEX[(b & 0xf) as usize] as char);
        }
        s
    }

    /// Parse the 32-digit lowercase hex form back into a key.
    pub(crate) fn from_hex(hex: &[u8]) -> Option<Self> {
        if hex.len() != 32 {
            return None;
        }
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut out = [0u8; 16];
        for (i, pair) in hex.chunks_exact(2).enumerate() {
            out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(CacheKey(out))
    }

    /// The first 8 hex digits, for logs and spans.
    pub fn short(&self) -> String {
        let mut s = self.to_hex();
        s.truncate(8);
        s
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheKey({})", self.to_hex())
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Incremental, allocation-free key builder. Every part is length-prefixed.
#[derive(Debug)]
pub(crate) struct KeyHasher(blake3::Hasher);

impl KeyHasher {
    pub(crate) fn new() -> Self {
        Self(blake3::Hasher::new())
    }

    pub(crate) fn part(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
        self
    }

    /// A part that may be absent; absence is distinct from an empty part.
    pub(crate) fn opt_part(&mut self, bytes: Option<&[u8]>) -> &mut Self {
        match bytes {
            Some(b) => {
                self.0.update(&[1]);
                self.part(b)
            }
            None => {
                self.0.update(&[0]);
                self
            }
        }
    }

    /// Like [`opt_part`](Self::opt_part), ASCII-lowercased, without allocating.
    pub(crate) fn opt_part_lowercase(&mut self, bytes: Option<&[u8]>) -> &mut Self {
        let Some(bytes) = bytes else {
            return self.opt_part(None);
        };
        self.0.update(&[1]);
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        let mut buf = [0u8; 64];
        for chunk in bytes.chunks(64) {
            let out = &mut buf[..chunk.len()];
            out.copy_from_slice(chunk);
            out.make_ascii_lowercase();
            self.0.update(out);
        }
        self
    }

    pub(crate) fn finish(&self) -> CacheKey {
        let mut out = [0u8; 16];
        let digest = self.0.finalize();
        out.copy_from_slice(&digest.as_bytes()[..16]);
        CacheKey(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Absence and emptiness of an optional part give different keys.
    #[test]
    fn absent_part_differs_from_empty_part() {
        let mut a = KeyHasher::new();
        a.opt_part(None);
        let mut b = KeyHasher::new();
        b.opt_part(Some(b""));
        assert_ne!(a.finish(), b.finish());
    }

    /// The lowercasing part hashes exactly like a lowercase plain part.
    #[test]
    fn lowercase_part_matches_lowercase_input() {
        let long = "Ex".repeat(100);
        let mut a = KeyHasher::new();
        a.opt_part_lowercase(Some(long.as_bytes()));
        let mut b = KeyHasher::new();
        b.opt_part(Some(long.to_lowercase().as_bytes()));
        assert_eq!(a.finish(), b.finish());
    }

    /// Hex round-trips, and malformed hex is refused.
    #[test]
    fn hex_round_trips() {
        let k = CacheKey::new("x");
        assert_eq!(CacheKey::from_hex(k.to_hex().as_bytes()), Some(k));
        assert_eq!(CacheKey::from_hex(b"zz"), None);
        assert_eq!(CacheKey::from_hex(&[b'g'; 32]), None);
    }

    /// The hex form only ever contains [0-9a-f], so it is safe inside a hash tag.
    #[test]
    fn hex_is_brace_free() {
        let k = CacheKey::new("}{ evil {tag} \u{0}\u{ff}");
        assert!(k.to_hex().bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
