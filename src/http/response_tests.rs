//! Unit tests of the stored response: its codec and its served head.

use super::*;
use crate::entry::envelope::{decode_entry, encode_entry, EntryMeta};

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
    let (_, r): (EntryMeta, CachedResponse) = decode_entry(encode_entry(&meta, &value)).unwrap();
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
    assert_eq!(
        names,
        [
            "age",
            "cache-status",
            "content-type",
            "x-multi",
            "content-length"
        ]
    );
    assert_eq!(head.get_all("x-multi").iter().count(), 2);
}

/// A served head states the stored body's length when the origin did not,
/// keeps the origin's own, and states none for a status without a body.
#[test]
fn served_head_states_the_body_length() {
    let length = |r: &CachedResponse| {
        let head = r.served_headers(strip(None)).unwrap();
        head.get_all("content-length")
            .iter()
            .map(|v| v.as_bytes().to_vec())
            .collect::<Vec<_>>()
    };
    assert_eq!(length(&sample()), [b"5".to_vec()]);
    let mut own = sample();
    own.headers
        .insert("content-length", HeaderValue::from_static("5"));
    assert_eq!(length(&own), [b"5".to_vec()]);
    // Either way every hit's copy carries the static text of the number.
    for r in [sample(), own] {
        let head = r.served_headers(strip(None)).unwrap();
        assert!(crate::http::numbers::is_static(&head["content-length"]));
    }
    // A length the origin stated that is not the stored body's stays its own.
    let mut other = sample();
    other
        .headers
        .insert("content-length", HeaderValue::from_static("7"));
    assert_eq!(length(&other), [b"7".to_vec()]);
    for status in [StatusCode::NO_CONTENT, StatusCode::NOT_MODIFIED] {
        let mut r = sample();
        r.status = status;
        r.body = Bytes::new();
        assert!(length(&r).is_empty(), "{status}");
    }
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

/// `compact` keeps every header (order, repeats, sensitivity) and Vary
/// value as it was, each now outside the buffer it was cut from; a small
/// body is copied, a long one kept.
#[test]
fn compact_copies_out_of_the_arrival_buffer() {
    let buffer = Bytes::from(vec![b'v'; COPY_BODY_MAX + 1024]);
    let inside = |b: &[u8]| {
        let (start, at) = (buffer.as_ptr() as usize, b.as_ptr() as usize);
        at >= start && at < start + buffer.len()
    };
    let cut = |r: std::ops::Range<usize>| HeaderValue::from_maybe_shared(buffer.slice(r)).unwrap();
    let mut value = sample();
    value.headers.append("x-multi", cut(0..3));
    let mut secret = cut(3..5);
    secret.set_sensitive(true);
    value.headers.insert("x-secret", secret);
    value.vary[0].1 = vec![cut(5..9), cut(9..10)];
    value.body = buffer.slice(10..20);
    let before: Vec<(HeaderName, HeaderValue)> = value
        .headers
        .iter()
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    let vary_before = value.vary.clone();

    value.compact();
    let after: Vec<(HeaderName, HeaderValue)> = value
        .headers
        .iter()
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    assert_eq!(after, before, "names, values and order are kept");
    assert!(value.headers["x-secret"].is_sensitive());
    assert!(after.iter().all(|(_, v)| !inside(v.as_bytes())));
    assert_eq!(value.vary, vary_before);
    assert!(value.vary[0].1.iter().all(|v| !inside(v.as_bytes())));
    assert_eq!(value.body, buffer.slice(10..20));
    assert!(!inside(&value.body), "a small body is copied");

    let long = buffer.slice(..COPY_BODY_MAX + 1);
    value.body = long.clone();
    value.compact();
    assert_eq!(value.body.as_ptr(), long.as_ptr(), "a long body is kept");
}

/// A header weighs its `HeaderMap` bucket (104 bytes on 64-bit targets),
/// twice (the served head), not only its bytes: small headers are most of
/// a small entry.
#[test]
fn weight_counts_each_header_slot() {
    let mut value = sample();
    value.body = Bytes::new();
    value.vary.clear();
    value.headers.clear();
    for name in NAMES {
        value
            .headers
            .insert(HeaderName::from_static(name), HeaderValue::from_static("1"));
    }
    assert!(value.weight() >= 10 * 2 * 104, "weighs {}", value.weight());
}

const NAMES: [&str; 10] = ["h0", "h1", "h2", "h3", "h4", "h5", "h6", "h7", "h8", "h9"];
