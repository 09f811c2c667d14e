//! Stored entries and their versioned binary encoding.
//!
//! Every stored entry is an envelope (magic, version, timing, fence) around a
//! payload encoded by the [`Value`] trait. Decoding never panics: corrupt bytes
//! or an unknown version are a [`DecodeError`], which the engine treats as a
//! miss and overwrites.

#![allow(
    dead_code,
    reason = "the shared-store parts are wired in by the Redis store"
)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::error::DecodeError;
use crate::key::CacheKey;
use crate::policy::StoredRules;

/// A value the cache can hold: cheap to clone, encodable for a shared store.
///
/// Implemented for [`Bytes`], [`String`], `Vec<u8>` and the HTTP layer's
/// [`CachedResponse`].
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

/// The first bytes of every encoded entry; the Lua lookup checks them too.
pub(crate) const MAGIC: &[u8; 2] = b"HG";
/// 2: CachedResponse carries its URL key and stored rules.
pub(crate) const VERSION: u8 = 2;
const HEADER_LEN: usize = 2 + 1 + 1 + 8 * 4;

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

/// Encode an entry envelope around `value`.
pub(crate) fn encode_entry<V: Value>(meta: &EntryMeta, value: &V) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_LEN + value.weight() + 64);
    out.put_slice(MAGIC);
    out.put_u8(VERSION);
    out.put_u8(0);
    out.put_u64_le(meta.stored_at_ms);
    out.put_u64_le(meta.fresh_for.as_millis() as u64);
    out.put_u64_le(meta.stale_for.as_millis() as u64);
    out.put_u64_le(meta.fence);
    value.encode(&mut out);
    out.freeze()
}

/// Decode an envelope; never panics on any input.
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
    bytes.advance(4);
    let meta = EntryMeta {
        stored_at_ms: bytes.get_u64_le(),
        fresh_for: Duration::from_millis(bytes.get_u64_le()),
        stale_for: Duration::from_millis(bytes.get_u64_le()),
        fence: bytes.get_u64_le(),
    };
    Ok((meta, V::decode(bytes)?))
}

/// A buffered HTTP response as the layer stores it.
///
/// The body is [`Bytes`]: serving a hit clones a reference count, never the body.
#[derive(Debug, Clone)]
pub struct CachedResponse {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// The request's values of each header named by the response's `Vary`.
    pub(crate) vary: Vec<(HeaderName, Vec<HeaderValue>)>,
    /// Corrected initial age (RFC 9111 §4.2.3) at the moment of storing, seconds.
    pub(crate) initial_age: u32,
    /// The key of the URL alone (authority, path, query): purge by URL
    /// matches every variant through it.
    pub(crate) url: CacheKey,
    /// Freshness and stale permissions, computed once when stored.
    pub(crate) rules: StoredRules,
    /// This value is a stored response refreshed by an origin 304. Not
    /// encoded: it only tells the request that revalidated what happened.
    pub(crate) revalidated: bool,
}

impl CachedResponse {
    /// The stored status code.
    pub fn status(&self) -> StatusCode {
        self.status
    }
    /// The stored response headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }
    /// The stored body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// Seconds of age now, given the time it has been resident.
    pub(crate) fn current_age(&self, resident: Duration) -> Duration {
        Duration::from_secs(u64::from(self.initial_age)).saturating_add(resident)
    }

    /// The `Surrogate-Key` tags (space separated) this response carries.
    pub(crate) fn has_tag(&self, tag: &str) -> bool {
        self.headers
            .get_all("surrogate-key")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(str::split_ascii_whitespace)
            .any(|t| t == tag)
    }

    /// Whether `request` carries the same values of every varied header as the
    /// request that produced this response.
    pub(crate) fn vary_matches(&self, request: &HeaderMap) -> bool {
        self.vary
            .iter()
            .all(|(name, values)| crate::vary::values_match(name, request, values))
    }
}

impl Value for CachedResponse {
    fn purge_groups(&self) -> Vec<String> {
        let mut groups = vec![format!("url:{}", self.url.to_hex())];
        let tags = self
            .headers
            .get_all("surrogate-key")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(str::split_ascii_whitespace);
        groups.extend(tags.map(|t| format!("tag:{t}")));
        groups
    }

    fn encode(&self, out: &mut BytesMut) {
        out.put_u16_le(self.status.as_u16());
        out.put_u32_le(self.initial_age);
        out.put_slice(self.url.as_bytes());
        out.put_u32_le(self.rules.lifetime);
        out.put_u32_le(self.rules.swr);
        out.put_u32_le(self.rules.sie);
        out.put_u8(self.rules.flags);
        let n = self.headers.len().min(u16::MAX as usize);
        out.put_u16_le(n as u16);
        for (name, value) in self.headers.iter().take(n) {
            put_str16(out, name.as_str().as_bytes());
            put_str32(out, value.as_bytes());
        }
        let n = self.vary.len().min(u16::MAX as usize);
        out.put_u16_le(n as u16);
        for (name, values) in self.vary.iter().take(n) {
            put_str16(out, name.as_str().as_bytes());
            let m = values.len().min(u16::MAX as usize);
            out.put_u16_le(m as u16);
            for v in values.iter().take(m) {
                put_str32(out, v.as_bytes());
            }
        }
        out.put_slice(&self.body);
    }

    fn decode(mut b: Bytes) -> Result<Self, DecodeError> {
        let status = StatusCode::from_u16(get_u16(&mut b)?)
            .map_err(|_| DecodeError::new("invalid status"))?;
        let initial_age = get_u32(&mut b)?;
        let raw = take(&mut b, 16)?;
        let mut url = [0u8; 16];
        url.copy_from_slice(&raw);
        let rules = StoredRules {
            lifetime: get_u32(&mut b)?,
            swr: get_u32(&mut b)?,
            sie: get_u32(&mut b)?,
            flags: take(&mut b, 1)?[0],
        };
        let n = get_u16(&mut b)?;
        let mut headers = HeaderMap::with_capacity(n as usize);
        for _ in 0..n {
            let name = get_name(&mut b)?;
            let value = get_value(&mut b)?;
            headers.append(name, value);
        }
        let n = get_u16(&mut b)?;
        let mut vary = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let name = get_name(&mut b)?;
            let m = get_u16(&mut b)?;
            let mut values = Vec::with_capacity(m as usize);
            for _ in 0..m {
                values.push(get_value(&mut b)?);
            }
            vary.push((name, values));
        }
        Ok(Self {
            status,
            headers,
            body: b,
            vary,
            initial_age,
            url: CacheKey::from_bytes(url),
            rules,
            revalidated: false,
        })
    }

    fn weight(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 32)
            .sum();
        self.body.len() + headers + 64
    }
}

fn put_str16(out: &mut BytesMut, s: &[u8]) {
    let len = s.len().min(u16::MAX as usize);
    out.put_u16_le(len as u16);
    out.put_slice(&s[..len]);
}

fn put_str32(out: &mut BytesMut, s: &[u8]) {
    let len = s.len().min(u32::MAX as usize);
    out.put_u32_le(len as u32);
    out.put_slice(&s[..len]);
}

fn get_u16(b: &mut Bytes) -> Result<u16, DecodeError> {
    if b.remaining() < 2 {
        return Err(DecodeError::new("truncated"));
    }
    Ok(b.get_u16_le())
}

fn get_u32(b: &mut Bytes) -> Result<u32, DecodeError> {
    if b.remaining() < 4 {
        return Err(DecodeError::new("truncated"));
    }
    Ok(b.get_u32_le())
}

fn take(b: &mut Bytes, len: usize) -> Result<Bytes, DecodeError> {
    if b.remaining() < len {
        return Err(DecodeError::new("truncated"));
    }
    Ok(b.split_to(len))
}

fn get_name(b: &mut Bytes) -> Result<HeaderName, DecodeError> {
    let len = get_u16(b)? as usize;
    let raw = take(b, len)?;
    HeaderName::from_bytes(&raw).map_err(|_| DecodeError::new("invalid header name"))
}

fn get_value(b: &mut Bytes) -> Result<HeaderValue, DecodeError> {
    let len = get_u32(b)? as usize;
    let raw = take(b, len)?;
    HeaderValue::from_maybe_shared(raw).map_err(|_| DecodeError::new("invalid header value"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CachedResponse {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("text/plain"));
        headers.append("x-multi", HeaderValue::from_static("a"));
        headers.append("x-multi", HeaderValue::from_static("b"));
        CachedResponse {
            status: StatusCode::OK,
            headers,
            body: Bytes::from_static(b"hello"),
            vary: vec![(
                HeaderName::from_static("accept-encoding"),
                vec![HeaderValue::from_static("gzip")],
            )],
            initial_age: 3,
            url: CacheKey::new("example.test/r"),
            rules: StoredRules {
                lifetime: 60,
                swr: 5,
                sie: 7,
                flags: StoredRules::VALIDATORS,
            },
            revalidated: false,
        }
    }

    /// A response survives an encode/decode round trip, repeated headers included.
    #[test]
    fn response_round_trips() {
        let meta = EntryMeta::now(Duration::from_secs(5), Duration::from_secs(30), 7);
        let bytes = encode_entry(&meta, &sample());
        let (m, r): (EntryMeta, CachedResponse) = decode_entry(bytes).unwrap();
        assert_eq!(m, meta);
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, Bytes::from_static(b"hello"));
        assert_eq!(r.headers.get_all("x-multi").iter().count(), 2);
        assert_eq!(r.vary.len(), 1);
        assert_eq!(r.initial_age, 3);
        assert_eq!(r.url, CacheKey::new("example.test/r"));
        assert_eq!(r.rules, sample().rules);
    }

    /// Every truncation of a valid entry, and flipped version bytes, decode to an error, never a panic.
    #[test]
    fn truncated_or_foreign_bytes_are_errors() {
        let meta = EntryMeta::now(Duration::from_secs(5), Duration::ZERO, 1);
        let full = encode_entry(&meta, &sample());
        // The body is the tail, so only cuts inside the structured part must fail.
        let body_start = full.len() - 5;
        for cut in 0..body_start {
            let r = decode_entry::<CachedResponse>(full.slice(..cut));
            assert!(r.is_err(), "cut at {cut} decoded");
        }
        let mut v = full.to_vec();
        v[2] = 99;
        assert!(decode_entry::<CachedResponse>(Bytes::from(v)).is_err());
        assert!(decode_entry::<Bytes>(Bytes::from_static(b"\xff\xfe garbage")).is_err());
    }
}
