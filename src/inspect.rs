//! Read-only views of what the cache keeps in Redis: an entry's key names,
//! its fence, and what its envelope says (timing, fence token, status,
//! tags). The `herdguard` diagnostics CLI reads Redis through these; so can
//! any tool of yours. Nothing here writes: purge through
//! [`CacheLayer::purge_key`](crate::CacheLayer::purge_key) and its kin.
//!
//! The layout they describe is versioned with the entry encoding: a
//! release that changes it changes these functions with it, and an entry
//! of another version decodes to a [`DecodeError`], never to a wrong view.

use bytes::Bytes;

use crate::engine::envelope::{decode_entry, entry_flags, KEPT_OFFSET, MAGIC, VERSION};
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

/// The keep time past freshness an intact encoding carries.
fn kept_past_freshness(bytes: &[u8]) -> Option<u64> {
    let raw = bytes.get(KEPT_OFFSET..KEPT_OFFSET + 8)?;
    Some(u64::from_le_bytes(raw.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{HeaderMap, HeaderValue, StatusCode};

    use super::*;
    use crate::engine::envelope::{encode_entry, EntryMeta};
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

    /// A stored response's envelope shows its timing, fence, status and tags.
    #[test]
    fn envelope_of_a_stored_response() {
        let mut headers = HeaderMap::new();
        headers.insert("surrogate-key", HeaderValue::from_static("a b"));
        let response = CachedResponse {
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
        };
        let meta = EntryMeta::now(Duration::from_secs(5), Duration::from_secs(30), 7);
        let env = decode_envelope(&encode_entry(&meta, &response)).unwrap();
        assert_eq!((env.fresh_ms, env.stale_ms, env.fence), (5000, 30000, 7));
        assert_eq!(env.http_status, Some(200));
        assert_eq!(env.tags, ["a", "b"]);
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
