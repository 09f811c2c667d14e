//! The [`Value`] trait: what the engine can hold, and its impls for plain
//! byte and string types. Knows nothing of HTTP or of any store.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::DecodeError;

/// A value the cache can hold: cheap to clone, encodable for a shared store.
///
/// Implemented for [`Bytes`], [`String`], `Vec<u8>` and the HTTP layer's
/// [`CachedResponse`](crate::CachedResponse).
pub trait Value: Clone + Send + Sync + 'static {
    /// Append the value's bytes to `out`.
    fn encode(&self, out: &mut BytesMut);
    /// Rebuild a value from what [`encode`](Value::encode) wrote.
    ///
    /// # Errors
    /// Returns [`DecodeError`] for bytes this version cannot read.
    fn decode(bytes: Bytes) -> Result<Self, DecodeError>;
    /// Approximate bytes held in memory; bounds the in-process cache.
    fn weight(&self) -> usize;

    /// Flags the stored entry's envelope records, so a diagnostic reader
    /// knows what its payload is. Internal: the crate's HTTP response sets
    /// one; other values keep the default.
    #[doc(hidden)]
    const ENVELOPE_FLAGS: u8 = 0;

    /// How long past its freshness a shared store keeps the value so it can
    /// stand in for a failed origin (`stale-if-error`), when that is longer
    /// than its stale grace. Internal: the crate's HTTP response sets it;
    /// other values keep nothing extra.
    #[doc(hidden)]
    fn error_grace(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// Purge groups the value belongs to (a URL, a tag), indexed in a shared
    /// store so a purge by group can find every member. None by default.
    fn purge_groups(&self) -> Vec<String> {
        Vec::new()
    }
}

impl Value for Bytes {
    fn encode(&self, out: &mut BytesMut) {
        out.put_slice(self);
    }
    fn decode(bytes: Bytes) -> Result<Self, DecodeError> {
        Ok(bytes)
    }
    fn weight(&self) -> usize {
        self.len()
    }
}

impl Value for Vec<u8> {
    fn encode(&self, out: &mut BytesMut) {
        out.put_slice(self);
    }
    fn decode(bytes: Bytes) -> Result<Self, DecodeError> {
        Ok(bytes.to_vec())
    }
    fn weight(&self) -> usize {
        self.len()
    }
}

impl Value for String {
    fn encode(&self, out: &mut BytesMut) {
        out.put_slice(self.as_bytes());
    }
    fn decode(bytes: Bytes) -> Result<Self, DecodeError> {
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::new("string is not utf-8"))
    }
    fn weight(&self) -> usize {
        self.len()
    }
}
