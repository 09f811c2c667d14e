//! The versioned binary envelope around every stored entry (magic, version,
//! timing, fence, checksum) and [`EntryMeta`]. Decoding never panics; the
//! payload inside is the [`Value`]'s own business. The stores read the
//! same offsets (the Lua scripts too), and the engine writes and reads
//! whole entries: both take the format from here. Imports only `key` and
//! `error`.

#![allow(
    dead_code,
    reason = "the shared-store parts are wired in by the Redis store"
)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::value::{Value, ValueMeta};
use crate::error::DecodeError;
use crate::key::CacheKey;

/// The first bytes of every encoded entry; the Lua lookup checks them too.
pub(crate) const MAGIC: &[u8; 2] = b"HG";
/// 2: CachedResponse carries its URL key and stored rules.
/// 3: a checksum and the payload length in the envelope, the body length in
///    a response.
/// 4: the Redis layout is one key per entry: no `:fresh` key (the lookup
///    takes the keep time past freshness, read at [`KEPT_OFFSET`], off the
///    entry's PTTL) and no `:pass` key (the pass marker is `MAGIC VERSION "pass"`
///    in the entry's own key). Older versions decode as a miss and are
///    overwritten.
pub(crate) const VERSION: u8 = 4;
/// Where the stale window (u64 LE, milliseconds) sits.
pub(crate) const STALE_OFFSET: usize = 20;
/// Where the shared store's keep time past freshness (u64 LE, milliseconds)
/// sits: the stale window, or the `stale-if-error` window when that is
/// longer (see `engine::remote::lead::shared_lifetime`). The Lua lookup
/// takes it off the entry's PTTL to tell fresh from stale, so this offset
/// is part of the format.
pub(crate) const KEPT_OFFSET: usize = 36;
/// Where the fence token (u64 LE) sits: the fenced write reads it in Lua
/// when the fence is gone, so this offset is part of the format.
pub(crate) const FENCE_OFFSET: usize = 28;
/// magic, version, flags, stored_at, fresh, stale, fence, kept, payload length, checksum.
const HEADER_LEN: usize = 2 + 1 + 1 + 8 * 5 + 8 + 8;
const CHECKSUM_OFFSET: usize = HEADER_LEN - 8;

/// When an entry was stored and how long it may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EntryMeta {
    /// Wall-clock store time, milliseconds since the Unix epoch (shared across
    /// processes, so it cannot be a monotonic instant).
    pub(crate) stored_at_ms: u64,
    pub(crate) fresh_for: Duration,
    pub(crate) stale_for: Duration,
    /// The fence token of the write that stored it (0 when unfenced).
    pub(crate) fence: u64,
}

impl EntryMeta {
    pub(crate) fn now(fresh_for: Duration, stale_for: Duration, fence: u64) -> Self {
        Self {
            stored_at_ms: unix_ms(SystemTime::now()),
            fresh_for,
            stale_for,
            fence,
        }
    }

    /// Time since the store, by the wall clock (never negative).
    pub(crate) fn elapsed(&self) -> Duration {
        let now = unix_ms(SystemTime::now());
        Duration::from_millis(now.saturating_sub(self.stored_at_ms))
    }
}

pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The checksum of an encoding: BLAKE3 (already our key hash) of everything
/// but the checksum field, cut to 64 bits. It catches truncation and bit
/// flips; it is not a signature (whoever can write Redis can write entries).
fn checksum(header: &[u8], payload: &[u8]) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&header[..CHECKSUM_OFFSET]);
    h.update(payload);
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// The envelope flags of an intact entry (see [`ValueMeta::envelope_flags`]).
pub(crate) fn entry_flags(bytes: &[u8]) -> u8 {
    bytes.get(3).copied().unwrap_or(0)
}

/// Encode an entry envelope around `value`, kept past its freshness for its
/// stale window.
pub(crate) fn encode_entry<V: Value>(meta: &EntryMeta, value: &V) -> Bytes {
    encode_kept(meta, value, meta.stale_for)
}

/// Encode an entry that a shared store keeps for `kept` past its freshness
/// (at least its stale window): what the Lua lookup reads at [`KEPT_OFFSET`].
pub(crate) fn encode_kept<V: Value>(meta: &EntryMeta, value: &V, kept: Duration) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_LEN + value.weight() + 64);
    out.put_slice(MAGIC);
    out.put_u8(VERSION);
    out.put_u8(V::envelope_flags());
    out.put_u64_le(meta.stored_at_ms);
    out.put_u64_le(meta.fresh_for.as_millis() as u64);
    out.put_u64_le(meta.stale_for.as_millis() as u64);
    out.put_u64_le(meta.fence);
    out.put_u64_le(kept.max(meta.stale_for).as_millis() as u64);
    out.put_u64_le(0); // payload length, set below
    out.put_u64_le(0); // checksum, set below
    value.encode(&mut out);
    let payload_len = (out.len() - HEADER_LEN) as u64;
    out[CHECKSUM_OFFSET - 8..CHECKSUM_OFFSET].copy_from_slice(&payload_len.to_le_bytes());
    let sum = checksum(&out[..HEADER_LEN], &out[HEADER_LEN..]);
    out[CHECKSUM_OFFSET..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
    out.freeze()
}

/// The keep time past freshness an encoding carries (at [`KEPT_OFFSET`]),
/// zero when it is too short to hold one. With the entry's PTTL it says,
/// on the store's own clock, how long the entry has been stale.
pub(crate) fn kept_of(bytes: &[u8]) -> Duration {
    bytes
        .get(KEPT_OFFSET..KEPT_OFFSET + 8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(Duration::ZERO, |b| {
            Duration::from_millis(u64::from_le_bytes(b))
        })
}

/// Decode an envelope; never panics on any input. Anything but an intact
/// entry of this version (short, foreign, older, truncated, flipped) is an
/// error, which callers treat as a miss.
pub(crate) fn decode_entry<V: Value>(mut bytes: Bytes) -> Result<(EntryMeta, V), DecodeError> {
    if bytes.len() < HEADER_LEN {
        return Err(DecodeError::new("entry shorter than its header"));
    }
    if &bytes[..2] != MAGIC {
        return Err(DecodeError::new("bad magic"));
    }
    if bytes[2] != VERSION {
        return Err(DecodeError::new("unknown entry version"));
    }
    let sum = checksum(&bytes[..HEADER_LEN], &bytes[HEADER_LEN..]);
    bytes.advance(4);
    let meta = EntryMeta {
        stored_at_ms: bytes.get_u64_le(),
        fresh_for: Duration::from_millis(bytes.get_u64_le()),
        stale_for: Duration::from_millis(bytes.get_u64_le()),
        fence: bytes.get_u64_le(),
    };
    // The keep time is for the store's own clock (the Lua lookup); the
    // engine goes by freshness and the stale window.
    let _kept = bytes.get_u64_le();
    let payload_len = bytes.get_u64_le();
    let stored_sum = bytes.get_u64_le();
    if payload_len != bytes.len() as u64 {
        return Err(DecodeError::new("payload length does not match"));
    }
    if stored_sum != sum {
        return Err(DecodeError::new("checksum does not match"));
    }
    Ok((meta, V::decode(bytes)?))
}

/// Log a corrupt entry found in a shared store: a warning at most once per
/// interval per process (every instance meets the same bad entry until it
/// is overwritten, and a loop of warnings helps nobody). The caller counts it
/// under its own cache name.
pub(crate) fn report_corrupt(key: &CacheKey, error: &DecodeError) {
    const EVERY_MS: u64 = 10_000;
    static LAST_MS: AtomicU64 = AtomicU64::new(0);
    static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
    let now = unix_ms(SystemTime::now()).max(1);
    let last = LAST_MS.load(Ordering::Relaxed);
    let due = last == 0 || now.saturating_sub(last) >= EVERY_MS;
    if due
        && LAST_MS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        let suppressed = SUPPRESSED.swap(0, Ordering::Relaxed);
        tracing::warn!(
            key = %key.short(),
            %error,
            suppressed,
            "corrupt entry in redis: treated as a miss and overwritten by the next fill"
        );
    } else {
        SUPPRESSED.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fence sits where the Lua write reads it.
    #[test]
    fn fence_is_at_its_documented_offset() {
        let meta = EntryMeta::now(Duration::from_secs(5), Duration::ZERO, 0x0102_0304_0506);
        let v = encode_entry(&meta, &Bytes::from_static(b"x"));
        let raw: [u8; 8] = v[FENCE_OFFSET..FENCE_OFFSET + 8].try_into().unwrap();
        assert_eq!(u64::from_le_bytes(raw), 0x0102_0304_0506);
    }

    /// The stale window and the keep time sit at their documented offsets; the keep time is never below the stale window.
    #[test]
    fn stale_window_and_keep_time_are_at_their_documented_offsets() {
        let meta = EntryMeta::now(Duration::from_secs(5), Duration::from_millis(70_001), 1);
        let read = |v: &Bytes, at: usize| u64::from_le_bytes(v[at..at + 8].try_into().unwrap());
        let v = encode_entry(&meta, &Bytes::from_static(b"x"));
        assert_eq!(read(&v, STALE_OFFSET), 70_001);
        assert_eq!(read(&v, KEPT_OFFSET), 70_001);
        let v = encode_kept(&meta, &Bytes::from_static(b"x"), Duration::from_secs(600));
        assert_eq!(read(&v, STALE_OFFSET), 70_001);
        assert_eq!(read(&v, KEPT_OFFSET), 600_000);
        assert_eq!(kept_of(&v), Duration::from_secs(600));
        assert_eq!(kept_of(&v[..KEPT_OFFSET + 7]), Duration::ZERO);
        let v = encode_kept(&meta, &Bytes::from_static(b"x"), Duration::ZERO);
        assert_eq!(read(&v, KEPT_OFFSET), 70_001);
        let (back, _) = decode_entry::<Bytes>(v).unwrap();
        assert_eq!(back, meta);
    }
}
