//! The fuzz targets' bodies (fuzz/bodies.rs) on random input in every test
//! run, so the decoders meet hostile bytes even where nobody runs the
//! fuzzer: random bytes, and a real stored response's entry and payload
//! with bytes changed, cut out, inserted or appended. A body panics on a
//! decoder panic and on a decoded envelope that contradicts its input.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::sync::OnceLock;
use std::time::Duration;

use deadpool_redis::redis;
use herdguard::inspect::decode_envelope;
use herdguard::{CacheLayer, RedisOptions};
use proptest::collection::vec;
use proptest::prelude::*;
use support::origin::{req, send, Origin};
use support::RedisServer;

#[path = "../fuzz/bodies.rs"]
mod bodies;

/// The bytes of one entry the layer wrote to a real redis-server (a 200
/// with several headers, Surrogate-Key tags, a Vary value and a body), and
/// its payload: the last `payload_bytes` of them, as the envelope says.
fn stored_entry() -> (&'static [u8], &'static [u8]) {
    static ENTRY: OnceLock<Vec<u8>> = OnceLock::new();
    let entry = ENTRY.get_or_init(|| {
        let redis = RedisServer::start();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        runtime.block_on(async {
            let layer = CacheLayer::builder()
                .redis(RedisOptions::new(redis.url()).namespace("fz"))
                .build()
                .expect("valid layer");
            let origin = Origin::new(&[
                ("cache-control", "max-age=60, stale-while-revalidate=30"),
                ("surrogate-key", "fuzz decoder"),
                ("vary", "accept-language"),
                ("etag", "\"v1\""),
                ("content-type", "text/plain"),
            ]);
            let app = origin.app(layer);
            send(
                &app,
                req(http::Method::GET, "/entry", &[("accept-language", "en")]),
            )
            .await;
            // The write to Redis runs beside the answer: wait for it, bounded.
            let mut c = redis.connection().await;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg("fz:*:v")
                    .query_async(&mut c)
                    .await
                    .expect("KEYS");
                for key in keys {
                    let v: Vec<u8> = redis::cmd("GET")
                        .arg(&key)
                        .query_async(&mut c)
                        .await
                        .expect("GET");
                    if decode_envelope(&v).is_ok_and(|e| e.http_status == Some(200)) {
                        return v;
                    }
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no stored response in redis within 10 s"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    });
    static PAYLOAD_AT: OnceLock<usize> = OnceLock::new();
    let at = PAYLOAD_AT.get_or_init(|| {
        let env = decode_envelope(entry).expect("an intact entry");
        entry.len() - env.payload_bytes
    });
    (entry, &entry[*at..])
}

/// One change to `bytes`: a byte changed, a cut, an insertion or a tail
/// appended.
#[derive(Debug, Clone)]
enum Mutation {
    Change(prop::sample::Index, u8),
    Truncate(prop::sample::Index),
    Insert(prop::sample::Index, u8),
    Extend(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<prop::sample::Index>(), 1u8..).prop_map(|(i, b)| Mutation::Change(i, b)),
        any::<prop::sample::Index>().prop_map(Mutation::Truncate),
        (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        vec(any::<u8>(), 1..64).prop_map(Mutation::Extend),
    ]
}

fn mutate(bytes: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for m in mutations {
        match m {
            Mutation::Change(i, b) if !out.is_empty() => {
                let i = i.index(out.len());
                out[i] = out[i].wrapping_add(*b);
            }
            Mutation::Truncate(i) if !out.is_empty() => out.truncate(i.index(out.len())),
            Mutation::Insert(i, b) => out.insert(i.index(out.len() + 1), *b),
            Mutation::Extend(tail) => out.extend_from_slice(tail),
            _ => {}
        }
    }
    out
}

/// A real entry decodes as the current version, and so does its payload sealed again.
#[test]
fn a_real_entry_and_its_payload_decode() {
    let (entry, payload) = stored_entry();
    let env = decode_envelope(entry).expect("the layer's own entry");
    assert_eq!(env.tags, ["fuzz", "decoder"]);
    let sealed =
        herdguard::inspect::seal_envelope(herdguard::inspect::PayloadKind::Response, payload);
    assert_eq!(
        decode_envelope(&sealed).expect("resealed").http_status,
        Some(200)
    );
}

proptest! {
    // XorShift: ChaCha, the default, took a fifth of the time in a debug
    // build; the rest is mostly the entries' checksums (BLAKE3, unoptimised).
    #![proptest_config(ProptestConfig {
        cases: 10_000,
        rng_algorithm: proptest::test_runner::RngAlgorithm::XorShift,
        ..ProptestConfig::default()
    })]

    /// Random bytes, mostly short, one in five up to 4 KiB, never fail either body.
    #[test]
    fn random_bytes_pass_both_bodies(
        bytes in prop_oneof![
            4 => vec(any::<u8>(), 0..128),
            // Drawn as words: a byte at a time made this test several times slower.
            1 => vec(any::<u64>(), 0..512)
                .prop_map(|w| w.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>()),
        ],
    ) {
        bodies::decode_entry(&bytes);
        bodies::decode_response(&bytes);
    }

    /// A real entry and its payload, each changed one to three times, never fail either body.
    #[test]
    fn mutated_real_entries_pass_both_bodies(mutations in vec(mutation(), 1..4)) {
        let (entry, payload) = stored_entry();
        bodies::decode_entry(&mutate(entry, &mutations));
        bodies::decode_response(&mutate(payload, &mutations));
    }
}
