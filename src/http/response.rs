//! The HTTP layer's stored response, [`CachedResponse`], and its payload
//! encoding (inside the engine's entry envelope). The engine must not
//! import this file.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::engine::{Internal, Value};
use crate::error::DecodeError;
use crate::http::policy::StoredRules;
use crate::http::CACHE_STATUS;
use crate::key::CacheKey;

/// Envelope flag: the payload is a [`CachedResponse`], so a diagnostic
/// reader knows a payload that does not decode as one is corrupt.
pub(crate) const FLAG_RESPONSE: u8 = 1;

/// A bit of the encoded rules' flags byte, never set in [`StoredRules`]
/// itself: a route key (16 bytes) follows the flags. An entry without a
/// route key encodes as before this bit existed.
const ENCODED_ROUTE: u8 = 0x80;

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
    /// The route's own key ([`RoutePolicy::key`](crate::RoutePolicy::key)),
    /// when one named the entry: purge by key matches every variant
    /// through it, as through `url`.
    pub(crate) route: Option<CacheKey>,
    /// Freshness and stale permissions, computed once when stored.
    pub(crate) rules: StoredRules,
    /// This value is a stored response refreshed by an origin 304. Not
    /// encoded: it only tells the request that revalidated what happened.
    pub(crate) revalidated: bool,
    /// Why this answer was not stored, when `Cache-Status` can say it more
    /// precisely than `uncacheable` (`no-freshness`). Not encoded: it only
    /// tells the request that led the flight.
    pub(crate) not_stored: Option<crate::http::policy::NotStored>,
    /// The headers as a response served from storage carries them, with
    /// room for `Age` and `Cache-Status` already made, built on the first
    /// hit and cloned on every later one. Not encoded, and not cloned with
    /// the value: a clone may be changed, so it builds its own.
    pub(crate) served_head: ServedHead,
}

/// See [`CachedResponse::served_head`].
#[derive(Debug, Default)]
pub(crate) struct ServedHead(std::sync::OnceLock<Head>);

/// A served head and what it was built without.
#[derive(Debug)]
struct Head {
    surrogate_key: bool,
    name: Option<HeaderName>,
    headers: HeaderMap,
}

/// What a layer takes off every answer on the way out: `Surrogate-Key`
/// (`surrogate_key`) and its own targeted cache-control header (`name`).
/// A served head built for it leaves them out once, when it is built,
/// instead of each answer removing them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Strip<'a> {
    pub(crate) surrogate_key: bool,
    pub(crate) name: Option<&'a HeaderName>,
}

impl Strip<'_> {
    /// Whether `name` is one the answer loses on the way out.
    fn drops(&self, name: &HeaderName) -> bool {
        (self.surrogate_key && name == SURROGATE_KEY) || self.name == Some(name)
    }
}

const SURROGATE_KEY: &str = "surrogate-key";

impl Clone for ServedHead {
    fn clone(&self) -> Self {
        Self::default()
    }
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

    /// The stored headers with `Age` and `Cache-Status` slots (placeholders
    /// the caller overwrites with [`fill_served`]), so a hit's clone never
    /// grows, and without what `strip` takes off on the way out. Built on
    /// the first call; `None` for a caller that strips otherwise (another
    /// layer's settings), or strips `Age` or `Cache-Status` themselves.
    pub(crate) fn served_headers(&self, strip: Strip<'_>) -> Option<&HeaderMap> {
        let head = self.served_head.0.get_or_init(|| Head {
            surrogate_key: strip.surrogate_key,
            name: strip.name.cloned(),
            headers: self.build_served(strip),
        });
        let same = head.surrogate_key == strip.surrogate_key && head.name.as_ref() == strip.name;
        let placeholders_kept = strip
            .name
            .is_none_or(|n| *n != http::header::AGE && *n != CACHE_STATUS);
        (same && placeholders_kept).then_some(&head.headers)
    }

    /// The slots go first, so [`fill_served`] finds both in two steps. The
    /// stored `Age` is left out: a served answer always carries its own.
    fn build_served(&self, strip: Strip<'_>) -> HeaderMap {
        let mut h = HeaderMap::with_capacity(self.headers.len() + 2);
        h.insert(http::header::AGE, HeaderValue::from_static("0"));
        h.insert(CACHE_STATUS, HeaderValue::from_static("-"));
        for (name, value) in &self.headers {
            if !strip.drops(name) && name != http::header::AGE && name != CACHE_STATUS {
                h.append(name.clone(), value.clone());
            }
        }
        h
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
            .all(|(name, values)| crate::http::vary::values_match(name, request, values))
    }
}

/// Write `age` and `status` into the slots of a served head's copy, in
/// place: its first two entries (see `build_served`), where two inserts
/// each hashed a name and probed the map.
pub(crate) fn fill_served(headers: &mut HeaderMap, age: HeaderValue, status: HeaderValue) {
    let (mut age, mut status) = (Some(age), Some(status));
    for (name, value) in headers.iter_mut() {
        if *name == http::header::AGE {
            if let Some(a) = age.take() {
                *value = a;
            }
        } else if *name == CACHE_STATUS {
            if let Some(s) = status.take() {
                *value = s;
            }
        }
        if age.is_none() && status.is_none() {
            return;
        }
    }
    // Not a served head's copy after all: insert as anywhere else.
    if let Some(a) = age {
        headers.insert(http::header::AGE, a);
    }
    if let Some(s) = status {
        headers.insert(CACHE_STATUS, s);
    }
}

/// The longest a shared store keeps an entry past its freshness for
/// `stale-if-error` (a day): a longer window still holds in the memory of an
/// instance that kept its copy, bounded by the memory capacity.
pub(crate) const STALE_IF_ERROR_KEEP_MAX: Duration = Duration::from_secs(24 * 60 * 60);

impl Value for CachedResponse {
    fn sealed_envelope_flags(_: Internal) -> u8 {
        FLAG_RESPONSE
    }

    /// `stale-if-error`, at most [`STALE_IF_ERROR_KEEP_MAX`]: the shared
    /// entry outlives its window, so every instance can answer a failed
    /// origin with it, not only one that kept a copy in memory.
    fn sealed_error_grace(&self, _: Internal) -> Duration {
        Duration::from_secs(u64::from(self.rules.sie)).min(STALE_IF_ERROR_KEEP_MAX)
    }

    /// The URL's group, the route key's (under the same `url:` prefix, so
    /// a purge by key finds it as it finds a URL's: route keys are hashed
    /// apart from URL keys, so none equals one), and one per tag.
    fn sealed_purge_groups(&self, _: Internal) -> Vec<String> {
        let mut groups = vec![format!("url:{}", self.url.to_hex())];
        if let Some(route) = &self.route {
            groups.push(format!("url:{}", route.to_hex()));
        }
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
        match &self.route {
            Some(route) => {
                out.put_u8(self.rules.flags | ENCODED_ROUTE);
                out.put_slice(route.as_bytes());
            }
            None => out.put_u8(self.rules.flags),
        }
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
        out.put_u64_le(self.body.len() as u64);
        out.put_slice(&self.body);
    }

    fn decode(mut b: Bytes) -> Result<Self, DecodeError> {
        let status = StatusCode::from_u16(get_u16(&mut b)?)
            .map_err(|_| DecodeError::new("invalid status"))?;
        let initial_age = get_u32(&mut b)?;
        let raw = take(&mut b, 16)?;
        let mut url = [0u8; 16];
        url.copy_from_slice(&raw);
        let mut rules = StoredRules {
            lifetime: get_u32(&mut b)?,
            swr: get_u32(&mut b)?,
            sie: get_u32(&mut b)?,
            flags: take(&mut b, 1)?[0],
        };
        let route = if rules.has(ENCODED_ROUTE) {
            rules.flags &= !ENCODED_ROUTE;
            let raw = take(&mut b, 16)?;
            let mut route = [0u8; 16];
            route.copy_from_slice(&raw);
            Some(CacheKey::from_bytes(route))
        } else {
            None
        };
        // Counts come from the input: each capacity is bounded by what the
        // bytes left could hold (a header takes at least 7 of them), so no
        // count can allocate beyond the input's length, or panic HeaderMap.
        let n = get_u16(&mut b)? as usize;
        let mut headers = HeaderMap::try_with_capacity(n.min(b.remaining() / 7).min(1024))
            .map_err(|_| DecodeError::new("too many headers"))?;
        for _ in 0..n {
            let name = get_name(&mut b)?;
            let value = get_value(&mut b)?;
            headers
                .try_append(name, value)
                .map_err(|_| DecodeError::new("too many headers"))?;
        }
        let n = get_u16(&mut b)? as usize;
        let mut vary = Vec::with_capacity(n.min(b.remaining() / 5));
        for _ in 0..n {
            let name = get_name(&mut b)?;
            let m = get_u16(&mut b)? as usize;
            let mut values = Vec::with_capacity(m.min(b.remaining() / 4));
            for _ in 0..m {
                values.push(get_value(&mut b)?);
            }
            vary.push((name, values));
        }
        let body_len = get_u64(&mut b)?;
        if body_len != b.remaining() as u64 {
            return Err(DecodeError::new("body length does not match"));
        }
        Ok(Self {
            status,
            headers,
            body: b,
            vary,
            initial_age,
            url: CacheKey::from_bytes(url),
            route,
            rules,
            revalidated: false,
            not_stored: None,
            served_head: ServedHead::default(),
        })
    }

    fn weight(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 32)
            .sum();
        // Twice: the served head is a second copy of them.
        self.body.len() + 2 * headers + 64
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

fn get_u64(b: &mut Bytes) -> Result<u64, DecodeError> {
    if b.remaining() < 8 {
        return Err(DecodeError::new("truncated"));
    }
    Ok(b.get_u64_le())
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
    use crate::engine::envelope::{decode_entry, encode_entry, EntryMeta};

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
            route: None,
            rules: StoredRules {
                lifetime: 60,
                swr: 5,
                sie: 7,
                flags: StoredRules::VALIDATORS,
            },
            revalidated: false,
            not_stored: None,
            served_head: ServedHead::default(),
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

    /// A route key survives the round trip beside the URL key and leaves the rules' flags as they were.
    #[test]
    fn route_key_round_trips() {
        let meta = EntryMeta::now(Duration::from_secs(5), Duration::from_secs(30), 7);
        let mut value = sample();
        value.route = Some(CacheKey::new("report:7"));
        let (_, r): (EntryMeta, CachedResponse) =
            decode_entry(encode_entry(&meta, &value)).unwrap();
        assert_eq!(r.route, Some(CacheKey::new("report:7")));
        assert_eq!(r.url, CacheKey::new("example.test/r"));
        assert_eq!(r.rules, sample().rules);
        assert_eq!(r.body, Bytes::from_static(b"hello"));
        let (_, plain): (EntryMeta, CachedResponse) =
            decode_entry(encode_entry(&meta, &sample())).unwrap();
        assert_eq!(plain.route, None);
    }

    /// Every truncation of a valid entry, and foreign bytes, decode to an error, never a panic.
    #[test]
    fn truncated_or_foreign_bytes_are_errors() {
        let meta = EntryMeta::now(Duration::from_secs(5), Duration::ZERO, 1);
        let full = encode_entry(&meta, &sample());
        for cut in 0..full.len() {
            let r = decode_entry::<CachedResponse>(full.slice(..cut));
            assert!(r.is_err(), "cut at {cut} decoded");
        }
        assert!(decode_entry::<Bytes>(Bytes::from_static(b"\xff\xfe garbage")).is_err());
    }

    /// One flipped bit anywhere in an entry, body included, is caught by the checksum.
    #[test]
    fn every_single_bit_flip_is_caught() {
        let meta = EntryMeta::now(Duration::from_secs(5), Duration::ZERO, 1);
        let full = encode_entry(&meta, &sample()).to_vec();
        for i in 0..full.len() {
            for bit in 0..8 {
                let mut v = full.clone();
                v[i] ^= 1 << bit;
                let r = decode_entry::<CachedResponse>(Bytes::from(v));
                assert!(r.is_err(), "flip of bit {bit} in byte {i} decoded");
            }
        }
    }

    /// An entry of the previous version (2) is an error: the cache treats it as a miss.
    #[test]
    fn older_version_is_an_error() {
        let meta = EntryMeta::now(Duration::from_secs(5), Duration::ZERO, 1);
        let mut v = encode_entry(&meta, &sample()).to_vec();
        v[2] = 2;
        let err = decode_entry::<CachedResponse>(Bytes::from(v)).unwrap_err();
        assert!(err.to_string().contains("version"), "{err}");
    }

    /// Wrap `payload` in an envelope with a correct checksum, as a hostile
    /// writer (or a bug) could.
    fn sealed(payload: &[u8]) -> Bytes {
        let meta = EntryMeta::now(Duration::from_secs(5), Duration::ZERO, 1);
        encode_entry(&meta, &Bytes::copy_from_slice(payload))
    }

    /// A response payload with the structured part up to the header count.
    fn response_prefix(header_count: u16) -> Vec<u8> {
        let mut p = Vec::new();
        p.extend_from_slice(&200u16.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&[0u8; 16]);
        p.extend_from_slice(&[0u8; 12]);
        p.push(0);
        p.extend_from_slice(&header_count.to_le_bytes());
        p
    }

    fn strip<'a>(own: Option<&'a HeaderName>) -> Strip<'a> {
        Strip {
            surrogate_key: true,
            name: own,
        }
    }

    /// A served head leaves out what its layer strips, and keeps the rest after the Age and Cache-Status slots.
    #[test]
    fn served_head_leaves_out_what_the_layer_strips() {
        let own = HeaderName::from_static("edge-cache-control");
        let mut r = sample();
        r.headers
            .insert("surrogate-key", HeaderValue::from_static("a b"));
        r.headers
            .insert(own.clone(), HeaderValue::from_static("max-age=9"));
        let head = r.served_headers(strip(Some(&own))).unwrap();
        let names: Vec<&str> = head.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["age", "cache-status", "content-type", "x-multi"]);
        assert_eq!(head.get_all("x-multi").iter().count(), 2);
    }

    /// A layer that strips otherwise gets no served head built for another.
    #[test]
    fn served_head_is_for_one_strip() {
        let r = sample();
        assert!(r.served_headers(strip(None)).is_some());
        let own = HeaderName::from_static("edge-cache-control");
        assert!(r.served_headers(strip(Some(&own))).is_none());
        let keep = Strip {
            surrogate_key: false,
            name: None,
        };
        assert!(r.served_headers(keep).is_none());
        assert!(r.served_headers(strip(None)).is_some());
    }

    /// Filling a served head's slots in place gives what two inserts gave, order included.
    #[test]
    fn fill_served_matches_inserts() {
        let mut r = sample();
        r.headers
            .insert(http::header::AGE, HeaderValue::from_static("7"));
        let head = r.served_headers(strip(None)).unwrap();
        let (age, status) = (HeaderValue::from(12u64), HeaderValue::from_static("x; hit"));
        let mut filled = head.clone();
        fill_served(&mut filled, age.clone(), status.clone());
        let mut inserted = head.clone();
        inserted.insert(http::header::AGE, age);
        inserted.insert(CACHE_STATUS, status);
        let list = |h: &HeaderMap| -> Vec<(String, Vec<u8>)> {
            h.iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect()
        };
        assert_eq!(list(&filled), list(&inserted));
        assert_eq!(filled.get_all(http::header::AGE).iter().count(), 1);
    }

    /// A header count of 30000 with a valid checksum is an error, not a panic in HeaderMap.
    #[test]
    fn huge_header_count_is_an_error() {
        let r = decode_entry::<CachedResponse>(sealed(&response_prefix(30000)));
        assert!(r.is_err());
    }

    /// 65535 distinct headers (more than a HeaderMap holds) are an error, not a panic.
    #[test]
    fn more_headers_than_a_header_map_holds_is_an_error() {
        let mut distinct = response_prefix(u16::MAX);
        for i in 0..u16::MAX {
            let name = format!("h{i}");
            distinct.extend_from_slice(&(name.len() as u16).to_le_bytes());
            distinct.extend_from_slice(name.as_bytes());
            distinct.extend_from_slice(&0u32.to_le_bytes());
        }
        distinct.extend_from_slice(&0u16.to_le_bytes());
        distinct.extend_from_slice(&0u64.to_le_bytes());
        assert!(decode_entry::<CachedResponse>(sealed(&distinct)).is_err());
    }

    /// A recorded body length that disagrees with the bytes present is an error.
    #[test]
    fn body_length_is_checked() {
        let mut out = BytesMut::new();
        sample().encode(&mut out);
        let short = &out[..out.len() - 1];
        assert!(decode_entry::<CachedResponse>(sealed(short)).is_err());
        assert!(decode_entry::<CachedResponse>(sealed(&out)).is_ok());
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn encoded() -> impl Strategy<Value = Vec<u8>> {
            (
                any::<u64>(),
                proptest::collection::vec(any::<u8>(), 0..64),
                proptest::collection::vec(("[a-z-]{1,12}", "[ -~]{0,16}"), 0..6),
            )
                .prop_map(|(fence, body, headers)| {
                    let mut r = super::sample();
                    r.body = Bytes::from(body);
                    for (n, v) in headers {
                        if let (Ok(n), Ok(v)) = (
                            HeaderName::from_bytes(n.as_bytes()),
                            HeaderValue::from_str(&v),
                        ) {
                            r.headers.append(n, v);
                        }
                    }
                    let meta = EntryMeta::now(Duration::from_secs(1), Duration::ZERO, fence);
                    encode_entry(&meta, &r).to_vec()
                })
        }

        proptest! {
            /// Random bytes never panic either decoder.
            #[test]
            fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                let _ = decode_entry::<CachedResponse>(Bytes::from(bytes.clone()));
                let _ = decode_entry::<Bytes>(Bytes::from(bytes));
            }

            /// Random payloads behind a valid checksum never panic the response decoder.
            #[test]
            fn sealed_random_payloads_never_panic(
                prefix in 0u16..2000,
                tail in proptest::collection::vec(any::<u8>(), 0..512),
            ) {
                let mut p = response_prefix(prefix);
                p.extend_from_slice(&tail);
                let _ = decode_entry::<CachedResponse>(sealed(&p));
            }

            /// Valid encodings round-trip; any mutation of them (a changed
            /// byte, a cut, an insertion) is an error, never a panic.
            #[test]
            fn mutated_encodings_are_errors(
                good in encoded(),
                at in any::<prop::sample::Index>(),
                byte in any::<u8>(),
                kind in 0u8..3,
            ) {
                prop_assert!(decode_entry::<CachedResponse>(Bytes::from(good.clone())).is_ok());
                let i = at.index(good.len());
                let mut bad = good.clone();
                match kind {
                    0 => bad[i] = bad[i].wrapping_add(byte.max(1)),
                    1 => bad.truncate(i),
                    _ => bad.insert(i, byte),
                }
                prop_assert!(decode_entry::<CachedResponse>(Bytes::from(bad)).is_err());
            }
        }
    }
}
