//! The fuzz targets' bodies, one function each: `fuzz_targets/` runs them
//! under libFuzzer, and `tests/decoder_fuzz_bodies.rs` on random and
//! mutated input in every test run, so the two cannot drift apart.
//!
//! Entries are built by `herdguard::inspect::seal_envelope`, the codec's own
//! encoder, so a new envelope version reaches these bodies by itself.

#![allow(
    dead_code,
    reason = "each fuzz target is built with both bodies and calls one"
)]

use herdguard::inspect::{decode_envelope, seal_envelope, PayloadKind};

/// Any bytes found at an entry key: decoding returns an envelope or an
/// error, never panics, and an envelope claims no more payload than there
/// are bytes. `decode_envelope` runs both decoders the cache uses (plain
/// values and, under the response flag, stored HTTP responses).
pub(crate) fn decode_entry(data: &[u8]) {
    if let Ok(envelope) = decode_envelope(data) {
        assert!(
            envelope.payload_bytes <= data.len(),
            "an envelope of {} bytes claims a payload of {}",
            data.len(),
            envelope.payload_bytes
        );
    }
}

/// A stored-response payload behind a correct checksum: random bytes never
/// forge one, so this body seals them (as a buggy or hostile writer could)
/// and reaches the response decoder itself, which must return without
/// panicking, and decode nothing but a response.
pub(crate) fn decode_response(payload: &[u8]) {
    if let Ok(envelope) = decode_envelope(&seal_envelope(PayloadKind::Response, payload)) {
        assert!(
            envelope.http_status.is_some(),
            "a payload under the response flag decoded as something else"
        );
        assert_eq!(envelope.payload_bytes, payload.len());
    }
}
