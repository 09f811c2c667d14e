//! Read-only views of what the cache keeps in Redis: an entry's key names,
//! its fence, and what its envelope says (timing, fence token, status,
//! tags). The `herdguard` diagnostics CLI reads Redis through these; so can
//! any tool of yours. Nothing here writes to Redis: purge through
//! [`CacheLayer::purge_key`](crate::CacheLayer::purge_key) and its kin.
//! [`seal_envelope`] wraps any payload in a current entry, so a fuzzer or
//! a test reaches the decoders of the current format.
//!
//! The layout they describe is versioned with the entry encoding: a
//! release that changes it changes these functions with it, and an entry
//! of another version decodes to a [`DecodeError`], never to a wrong view.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};

use crate::entry::envelope::{
    decode_entry, encode_entry, entry_flags, EntryMeta, KEPT_OFFSET, MAGIC, VERSION,
};
use crate::entry::{Internal, Value};
use crate::error::DecodeError;
use crate::http::response::{CachedResponse, FLAG_RESPONSE};
use crate::key::CacheKey;

/// The Redis key names of one entry (the layout of the Redis store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryKeyNames {
    /// `{ns}:{H}:v`: the encoded entry, its PTTL the hard expiry (the
    /// freshness left is that PTTL past [`Envelope::kept_ms`]); or the
    /// hit-for-pass marker (see [`is_pass_marker`]), its PTTL what is left of it.
    pub value: String,
    /// `{ns}:{H}:lock`: the lease token.
    pub lock: String,
    /// `{ns}:{H}:fence`: the string `<next>:<hw>`, `next` the last token
    /// issued and `hw` the highest write accepted, or raised by a purge
    /// (empty when not known); see [`parse_fence`].
    pub fence: String,
}

/// The fence's `next` and `hw` from what its key holds; `(None, None)` for
/// anything of another shape (an older release kept a hash there).
///
/// ```
/// use herdguard::inspect::parse_fence;
/// assert_eq!(parse_fence(b"17:12"), (Some(17), Some(12)));
/// assert_eq!(parse_fence(b"17:"), (Some(17), None));
/// assert_eq!(parse_fence(b"junk"), (None, None));
/// ```
pub fn parse_fence(stored: &[u8]) -> (Option<u64>, Option<u64>) {
    let text = std::str::from_utf8(stored).unwrap_or("");
    let Some((next, hw)) = text.split_once(':') else {
        return (None, None);
    };
    match next.parse::<u64>() {
        Ok(n) => (Some(n), hw.parse().ok()),
        Err(_) => (None, None),
    }
}

/// Whether the bytes stored in an entry's key are the hit-for-pass marker.
pub fn is_pass_marker(stored: &[u8]) -> bool {
    stored.len() == 7 && stored[..2] == MAGIC[..] && stored[2] == VERSION && &stored[3..] == b"pass"
}

/// The key names of `key` under `namespace`.
pub fn entry_keys(namespace: &str, key: &CacheKey) -> EntryKeyNames {
    let h = key.to_hex();
    let name = |suffix: &str| format!("{namespace}:{{{h}}}:{suffix}");
    EntryKeyNames {
        value: name("v"),
        lock: name("lock"),
        fence: name("fence"),
    }
}

/// A key from its 32-digit hex form (either case); `None` for anything else.
pub fn parse_key(hex: &str) -> Option<CacheKey> {
    CacheKey::from_hex(hex.to_ascii_lowercase().as_bytes())
}

/// What an entry envelope says, without the payload itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// Wall-clock store time, milliseconds since the Unix epoch.
    pub stored_at_ms: u64,
    /// Freshness lifetime at the store, milliseconds.
    pub fresh_ms: u64,
    /// Stale grace after freshness, milliseconds.
    pub stale_ms: u64,
    /// How long a shared store keeps it past freshness, milliseconds: the
    /// stale grace, or the `stale-if-error` window when that is longer.
    /// Freshness left is the entry's PTTL less this.
    pub kept_ms: u64,
    /// Fence token of the write that stored it (0: unfenced).
    pub fence: u64,
    /// Payload bytes after the envelope header.
    pub payload_bytes: usize,
    /// The HTTP status, when the payload is a response stored by the layer
    /// (`None` for values stored through [`Cache`](crate::Cache)).
    pub http_status: Option<u16>,
    /// The response's `Surrogate-Key` tags, when it is a stored response.
    pub tags: Vec<String>,
}

/// Decode the envelope of a stored entry. Never panics.
///
/// # Errors
/// [`DecodeError`] when the bytes are not an entry this version can read:
/// the cache treats such an entry as a miss and overwrites it.
pub fn decode_envelope(bytes: &[u8]) -> Result<Envelope, DecodeError> {
    let bytes = Bytes::copy_from_slice(bytes);
    let (meta, payload) = decode_entry::<Bytes>(bytes.clone())?;
    let kept = kept_past_freshness(&bytes).unwrap_or(meta.stale_for.as_millis() as u64);
    let response = if entry_flags(&bytes) & FLAG_RESPONSE != 0 {
        // Stored by the HTTP layer: a payload that is not a response is corrupt.
        Some(decode_entry::<CachedResponse>(bytes)?.1)
    } else {
        None
    };
    let tags = response
        .as_ref()
        .map(|r| {
            r.headers
                .get_all("surrogate-key")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(str::split_ascii_whitespace)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    Ok(Envelope {
        stored_at_ms: meta.stored_at_ms,
        fresh_ms: meta.fresh_for.as_millis() as u64,
        stale_ms: meta.stale_for.as_millis() as u64,
        kept_ms: kept,
        fence: meta.fence,
        payload_bytes: payload.len(),
        http_status: response.map(|r| r.status.as_u16()),
        tags,
    })
}

/// What an entry's payload is, as its envelope's flags tell a reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    /// A value stored through [`Cache`](crate::Cache): bytes the envelope
    /// does not look into.
    Value,
    /// A response stored by the HTTP layer: [`decode_envelope`] decodes the
    /// payload as one, and a payload that does not decode is corrupt.
    Response,
}

/// `payload` sealed in an entry envelope of the current version, as the
/// cache's own encoder writes one (magic, version, `kind`'s flags, payload
/// length, checksum): what a buggy or hostile writer with access to Redis
/// could store, since only the decoder stands between such bytes and a
/// served response. Stored at the Unix epoch, fresh for a minute, no stale
/// window, unfenced, so the same payload always seals to the same bytes.
///
/// ```
/// use herdguard::inspect::{decode_envelope, seal_envelope, PayloadKind};
///
/// let entry = seal_envelope(PayloadKind::Value, b"hello");
/// let env = decode_envelope(&entry).unwrap();
/// assert_eq!((env.payload_bytes, env.fresh_ms, env.http_status), (5, 60_000, None));
/// // Not a stored response: the entry is corrupt.
/// assert!(decode_envelope(&seal_envelope(PayloadKind::Response, b"hello")).is_err());
/// ```
pub fn seal_envelope(kind: PayloadKind, payload: &[u8]) -> Vec<u8> {
    let meta = EntryMeta {
        stored_at_ms: 0,
        fresh_for: Duration::from_secs(60),
        stale_for: Duration::ZERO,
        fence: 0,
    };
    let payload = Bytes::copy_from_slice(payload);
    match kind {
        PayloadKind::Value => encode_entry(&meta, &payload).to_vec(),
        PayloadKind::Response => encode_entry(&meta, &ResponsePayload(payload)).to_vec(),
    }
}

/// Any bytes under the response flag: the envelope's flags come from the
/// value's type, so [`seal_envelope`] needs a type of its own for them.
#[derive(Debug, Clone)]
struct ResponsePayload(Bytes);

impl Value for ResponsePayload {
    fn sealed_envelope_flags(_: Internal) -> u8 {
        FLAG_RESPONSE
    }

    fn encode(&self, out: &mut BytesMut) {
        out.put_slice(&self.0);
    }

    fn decode(bytes: Bytes) -> Result<Self, DecodeError> {
        Ok(Self(bytes))
    }

    fn weight(&self) -> usize {
        self.0.len()
    }
}

/// The keep time past freshness an intact encoding carries.
fn kept_past_freshness(bytes: &[u8]) -> Option<u64> {
    let raw = bytes.get(KEPT_OFFSET..KEPT_OFFSET + 8)?;
    Some(u64::from_le_bytes(raw.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue, StatusCode};

    use super::*;
    use crate::store::redis::{RedisOptions, RedisStore};

    /// The names here are the ones the Redis store uses.
    #[test]
    fn key_names_match_the_store() {
        let store =
            RedisStore::new(RedisOptions::new("redis://127.0.0.1:1").namespace("ns")).unwrap();
        let key = CacheKey::new("k");
        let ours = entry_keys("ns", &key);
        let theirs = store.keys(&key);
        assert_eq!(
            [ours.value.as_str(), ours.lock.as_str(), ours.fence.as_str()],
            [theirs.value(), theirs.lock(), theirs.fence()]
        );
    }

    /// Hex keys parse in either case; other strings do not.
    #[test]
    fn parse_key_accepts_hex_only() {
        let k = CacheKey::new("x");
        assert_eq!(parse_key(&k.to_hex().to_uppercase()), Some(k));
        assert_eq!(parse_key("not a key"), None);
    }

    /// A 200 `hello` tagged `a b`.
    fn tagged_response() -> CachedResponse {
        let mut headers = HeaderMap::new();
        headers.insert("surrogate-key", HeaderValue::from_static("a b"));
        CachedResponse {
            status: StatusCode::OK,
            headers,
            body: Bytes::from_static(b"hello"),
            vary: Vec::new(),
            initial_age: 0,
            url: CacheKey::new("u"),
            route: None,
            rules: Default::default(),
            revalidated: false,
            not_stored: None,
            served_head: Default::default(),
        }
    }

    /// A stored response's envelope shows its timing, fence, status and tags.
    #[test]
    fn envelope_of_a_stored_response() {
        let meta = EntryMeta::now(Duration::from_secs(5), Duration::from_secs(30), 7);
        let env = decode_envelope(&encode_entry(&meta, &tagged_response())).unwrap();
        assert_eq!((env.fresh_ms, env.stale_ms, env.fence), (5000, 30000, 7));
        assert_eq!(env.http_status, Some(200));
        assert_eq!(env.tags, ["a", "b"]);
    }

    /// A response's payload sealed as one reads back as that response; sealed as a plain value, as bytes.
    #[test]
    fn sealed_payloads_decode_as_their_kind() {
        let mut payload = BytesMut::new();
        tagged_response().encode(&mut payload);
        let env = decode_envelope(&seal_envelope(PayloadKind::Response, &payload)).unwrap();
        assert_eq!(env.http_status, Some(200));
        assert_eq!(env.tags, ["a", "b"]);
        let env = decode_envelope(&seal_envelope(PayloadKind::Value, &payload)).unwrap();
        assert_eq!((env.http_status, env.payload_bytes), (None, payload.len()));
    }

    /// Garbage and truncated envelopes are errors, not panics.
    #[test]
    fn corrupt_envelopes_are_errors() {
        assert!(decode_envelope(b"").is_err());
        assert!(decode_envelope(b"garbage that is long enough to pass the length").is_err());
        let meta = EntryMeta::now(Duration::from_secs(1), Duration::ZERO, 1);
        let ok = encode_entry(&meta, &Bytes::from_static(b"plain value"));
        assert!(decode_envelope(&ok[..10]).is_err());
        let env = decode_envelope(&ok).unwrap();
        assert_eq!((env.payload_bytes, env.http_status), (11, None));
    }
}
