//! Any payload sealed as a stored response (see `bodies::decode_response`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../bodies.rs"]
mod bodies;

fuzz_target!(|payload: &[u8]| bodies::decode_response(payload));
