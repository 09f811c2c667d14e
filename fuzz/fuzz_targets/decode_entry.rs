//! Any bytes found at an entry key: decoding must return (an envelope or an
//! error) without panicking, whatever the input. `decode_envelope` runs both
//! decoders the cache uses (plain values and stored HTTP responses).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = herdguard::inspect::decode_envelope(data);
});
