//! A stored-response payload behind a correct checksum: the raw target can
//! never forge one, so this one seals the fuzzer's bytes (as a buggy or
//! hostile writer could) and reaches the response decoder itself. It must
//! return without panicking, whatever the payload.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|payload: &[u8]| {
    // The v3 envelope of src/entry.rs: magic, version, flags (1: response),
    // stored_at, fresh, stale, fence, payload length, checksum.
    let mut v = b"HG\x03\x01".to_vec();
    for field in [0u64, 60_000, 0, 1, payload.len() as u64] {
        v.extend_from_slice(&field.to_le_bytes());
    }
    let mut h = blake3::Hasher::new();
    h.update(&v);
    h.update(payload);
    v.extend_from_slice(&h.finalize().as_bytes()[..8]);
    v.extend_from_slice(payload);
    let _ = herdguard::inspect::decode_envelope(&v);
});
