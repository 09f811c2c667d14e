//! Any bytes found at an entry key (see `bodies::decode_entry`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../bodies.rs"]
mod bodies;

fuzz_target!(|data: &[u8]| bodies::decode_entry(data));
