//! The [`Value`] trait: what the engine can hold, and its impls for plain
//! byte and string types. Knows nothing of HTTP or of any store; imports
//! only `error` (the HTTP response implements it in `http`).

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::DecodeError;

/// A value the cache can hold: cheap to clone, encodable for a shared store.
///
/// Implemented for [`Bytes`], [`String`], `Vec<u8>`, the HTTP layer's
/// stored responses, and, with the `serde`
/// feature, [`Json<T>`](crate::Json) for any serde type (no hand-written
/// encoding). The three methods below are all a value implements.
///
/// ```
/// use bytes::{BufMut, Bytes, BytesMut};
/// use herdguard::{DecodeError, Value};
///
/// #[derive(Clone)]
/// struct Celsius(f64);
///
/// impl Value for Celsius {
///     fn encode(&self, out: &mut BytesMut) {
///         out.put_f64_le(self.0);
///     }
///     fn decode(bytes: Bytes) -> Result<Self, DecodeError> {
///         let raw: [u8; 8] = bytes[..].try_into().map_err(|_| DecodeError::new("not 8 bytes"))?;
///         Ok(Celsius(f64::from_le_bytes(raw)))
///     }
///     fn weight(&self) -> usize {
///         8
///     }
/// }
/// ```
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

    /// The crate's own: its HTTP response overrides it; no other value can
    /// (the argument cannot be named outside this crate).
    #[doc(hidden)]
    fn sealed_envelope_flags(_: sealed::Internal) -> u8 {
        0
    }

    /// The crate's own, as [`sealed_envelope_flags`](Value::sealed_envelope_flags).
    #[doc(hidden)]
    fn sealed_error_grace(&self, _: sealed::Internal) -> Duration {
        Duration::ZERO
    }

    /// The crate's own, as [`sealed_envelope_flags`](Value::sealed_envelope_flags).
    #[doc(hidden)]
    fn sealed_purge_groups(&self, _: sealed::Internal) -> Vec<String> {
        Vec::new()
    }

    /// The crate's own, as [`sealed_envelope_flags`](Value::sealed_envelope_flags).
    #[doc(hidden)]
    fn sealed_origin_status(&self, _: sealed::Internal) -> Option<u16> {
        None
    }
}

pub(crate) mod sealed {
    /// Names the hidden methods of [`Value`](super::Value): only this crate
    /// can name it, so only this crate's values override them.
    #[derive(Debug, Clone, Copy)]
    #[allow(
        unreachable_pub,
        reason = "sealed: pub to appear in Value's signatures, unnameable outside the crate"
    )]
    pub struct Internal;
}

/// What the engine asks of a value beyond [`Value`]'s three methods.
pub(crate) trait ValueMeta: Value {
    /// Flags the stored entry's envelope records, so a diagnostic reader
    /// knows what its payload is (the HTTP response sets one).
    fn envelope_flags() -> u8 {
        Self::sealed_envelope_flags(sealed::Internal)
    }

    /// How long past its freshness a shared store keeps the value so it can
    /// stand in for a failed origin (`stale-if-error`), when that is longer
    /// than its stale grace.
    #[cfg_attr(
        not(feature = "redis"),
        allow(dead_code, reason = "only a shared store keeps entries past freshness")
    )]
    fn error_grace(&self) -> Duration {
        self.sealed_error_grace(sealed::Internal)
    }

    /// Purge groups the value belongs to (a URL, a tag), indexed in a shared
    /// store so a purge by group can find every member.
    fn purge_groups(&self) -> Vec<String> {
        self.sealed_purge_groups(sealed::Internal)
    }

    /// The status the origin answered with, for a value that is an answer
    /// (the HTTP response): the breaker counts 5xx as failures.
    fn origin_status(&self) -> Option<u16> {
        self.sealed_origin_status(sealed::Internal)
    }
}

impl<V: Value> ValueMeta for V {}

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

/// Any serde type as a cache [`Value`], stored as JSON: no encoding to
/// write by hand (feature `serde`). In memory it is held as the value
/// itself; JSON is only what a shared store (Redis) holds, and its length
/// is the value's weight against the memory capacity.
///
/// A value that cannot be serialized (a map with non-string keys) is never
/// served from Redis: its entry does not decode, so it reads as a miss.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use herdguard::{Cache, CacheKey, Freshness, Json};
///
/// #[derive(Clone, serde::Serialize, serde::Deserialize)]
/// struct Profile { name: String, visits: u32 }
///
/// let cache: Cache<Json<Profile>> = Cache::builder().build()?;
/// let key = CacheKey::new("profile:7");
/// let fresh = Freshness::new(Duration::from_secs(60));
/// let found = cache
///     .get_or_compute(&key, fresh, || async {
///         Ok::<_, std::io::Error>(Json(Profile { name: "Ada".into(), visits: 3 }))
///     })
///     .await?;
/// assert_eq!(found.value.name, "Ada");
/// # Ok(()) }
/// ```
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Json<T>(pub T);

#[cfg(feature = "serde")]
impl<T> std::ops::Deref for Json<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

#[cfg(feature = "serde")]
impl<T> Value for Json<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned + Clone + Send + Sync + 'static,
{
    fn encode(&self, out: &mut BytesMut) {
        // A failure leaves bytes that do not decode: read back as a miss.
        let _ = serde_json::to_writer(out.writer(), &self.0);
    }

    fn decode(bytes: Bytes) -> Result<Self, DecodeError> {
        serde_json::from_slice(&bytes)
            .map(Json)
            .map_err(|_| DecodeError::new("not the JSON of this type"))
    }

    fn weight(&self) -> usize {
        /// Counts what serde_json would write, without keeping it.
        struct Count(usize);
        impl std::io::Write for Count {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0 = self.0.saturating_add(buf.len());
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut count = Count(0);
        let _ = serde_json::to_writer(&mut count, &self.0);
        std::mem::size_of::<T>().saturating_add(count.0)
    }
}
