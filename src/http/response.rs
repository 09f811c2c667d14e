//! The HTTP layer's stored response, [`CachedResponse`], and its payload
//! encoding (inside the engine's entry envelope). The engine must not
//! import this file.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::entry::{Internal, Value};
use crate::error::DecodeError;
use crate::http::policy::StoredRules;
use crate::http::CACHE_STATUS;
use crate::key::CacheKey;

/// Envelope flag: the payload is a [`CachedResponse`], so a diagnostic
/// reader knows a payload that does not decode as one is corrupt.
pub(crate) const FLAG_RESPONSE: u8 = 1;

/// A bit of the encoded rules' flags byte, never set in [`StoredRules`]
/// itself: a route key (16 bytes) follows the flags. An entry without a
/// route key encodes with the flag clear, as entries written without routes do.
const ENCODED_ROUTE: u8 = 0x80;

/// A buffered HTTP response as the layer stores it.
///
/// The body is [`Bytes`]: serving a hit clones a reference count, never the body.
#[derive(Debug, Clone)]
pub(crate) struct CachedResponse {
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
    ///
    /// A head without `Content-Length` gets the stored body's (not for a
    /// status that has no body: 1xx, 204, 304). It is what the answer's
    /// sender would add anyway, hyper on the wire or axum's router into
    /// each answer's head, where the insert grew every hit's copy (about
    /// 1,200 instructions an axum hit). A HEAD then carries the length its
    /// GET would have, as RFC 9110 §9.3.2 asks; a range cut replaces it.
    fn build_served(&self, strip: Strip<'_>) -> HeaderMap {
        // Room for the names, not for every value (repeats live apart): a
        // capacity for all values may be more than a map can be made with.
        let mut h = HeaderMap::try_with_capacity(self.headers.keys_len() + 3).unwrap_or_default();
        h.insert(http::header::AGE, HeaderValue::from_static("0"));
        h.insert(CACHE_STATUS, HeaderValue::from_static("-"));
        for (name, value) in &self.headers {
            if !strip.drops(name) && name != http::header::AGE && name != CACHE_STATUS {
                h.append(name.clone(), served_value(name, value, self.body.len()));
            }
        }
        if !h.contains_key(http::header::CONTENT_LENGTH) && has_body(self.status) {
            let len = crate::http::numbers::number_value(self.body.len() as u64);
            h.insert(http::header::CONTENT_LENGTH, len);
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

/// Bodies this long or shorter are copied when stored (see
/// [`CachedResponse::compact`]); a longer one is kept as it came. Above
/// hyper's largest read buffer (8 KiB + 400 KiB by default).
pub(crate) const COPY_BODY_MAX: usize = 512 * 1024;

impl CachedResponse {
    /// Make the value hold only its own bytes, before it is stored.
    ///
    /// hyper hands out a response's header values, and a body read with its
    /// head, as slices of the connection's read buffer (8 KiB and up), and a
    /// request's header values likewise: kept as they are, a small entry
    /// would keep that whole buffer alive, many times the bytes the store
    /// counts against its capacity. So the header values are copied into
    /// one buffer of their own, each Vary header's values into one more,
    /// and a body of at most [`COPY_BODY_MAX`] bytes is copied. A longer
    /// body is kept: hyper never hands out a frame larger than its read
    /// buffer (at most about 400 KiB unless raised), so it was joined from
    /// several frames into an exact copy already, or came from elsewhere.
    pub(crate) fn compact(&mut self) {
        self.headers = compact_headers(&self.headers);
        for (_, values) in &mut self.vary {
            *values = compact_values(values.iter());
        }
        if self.body.len() <= COPY_BODY_MAX {
            self.body = Bytes::copy_from_slice(&self.body);
        }
    }
}

/// `headers` with every value a slice of one new buffer, names, order and
/// sensitivity as they were.
fn compact_headers(headers: &HeaderMap) -> HeaderMap {
    let mut values = compact_values(headers.values()).into_iter();
    // As `build_served`: room for the names; the map grows as the original did.
    let mut out = HeaderMap::try_with_capacity(headers.keys_len()).unwrap_or_default();
    for (name, value) in headers {
        let copy = values.next().unwrap_or_else(|| value.clone());
        out.append(name.clone(), copy);
    }
    out
}

/// Copies of `values`, each a slice of one new buffer. A value that would
/// not parse again (none should: each was a valid value) is kept as it is.
fn compact_values<'a>(values: impl IntoIterator<Item = &'a HeaderValue>) -> Vec<HeaderValue> {
    let values: Vec<&HeaderValue> = values.into_iter().collect();
    let total = values.iter().map(|v| v.len()).sum();
    let mut buf = BytesMut::with_capacity(total);
    for v in &values {
        buf.extend_from_slice(v.as_bytes());
    }
    let buf = buf.freeze();
    let mut at = 0;
    values
        .into_iter()
        .map(|v| {
            let range = at..at + v.len();
            at = range.end;
            match HeaderValue::from_maybe_shared(buf.slice(range)) {
                Ok(mut copy) => {
                    copy.set_sensitive(v.is_sensitive());
                    copy
                }
                Err(_) => v.clone(),
            }
        })
        .collect()
}

/// Whether a response with this status has a body (RFC 9110 §6.4.1: not
/// 1xx, 204 or 304), so a `Content-Length` may describe it.
fn has_body(status: StatusCode) -> bool {
    !(status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED)
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

/// A stored header value as every hit's copy carries it: the origin's
/// `Content-Length` for the stored body's length as the static text of that
/// number (see [`numbers`](crate::http::numbers)), any other as it is.
fn served_value(name: &HeaderName, value: &HeaderValue, body_len: usize) -> HeaderValue {
    if name == http::header::CONTENT_LENGTH {
        let len = crate::http::numbers::number_value(body_len as u64);
        if len == value {
            return len;
        }
    }
    value.clone()
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

    /// The origin's status, for the breaker (a 5xx counts as a failure).
    fn sealed_origin_status(&self, _: Internal) -> Option<u16> {
        Some(self.status.as_u16())
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

    /// The body, each header's bytes and its slot in a `HeaderMap`, twice
    /// (the served head is a second copy), and the Vary values, each with
    /// its slot. The store adds its own per-entry structure.
    fn weight(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + HEADER_SLOT)
            .sum();
        let vary: usize = self
            .vary
            .iter()
            .map(|(name, values)| {
                let values: usize = values.iter().map(|v| v.len() + VALUE_SLOT).sum();
                name.as_str().len() + values + VALUE_SLOT
            })
            .sum();
        self.body.len() + 2 * headers + vary
    }
}

/// What one header takes in a `HeaderMap` beyond its bytes: its bucket
/// (name, value, hash and links: 104 bytes on 64-bit targets) and its
/// share of the index table.
const HEADER_SLOT: usize = 112;
/// What one value or name takes in a `Vec` beyond its bytes.
const VALUE_SLOT: usize = 40;

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
#[path = "response_tests.rs"]
mod tests;
