//! Every request the layer handles gets one span with its key hash and
//! outcome; a Redis leader's span also carries its lease prefix and fence,
//! recorded from the spawned task that ran the origin call.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herdguard::{CacheLayer, RedisOptions};
use support::origin::{get_req, send, Origin};
use support::RedisServer;
use tracing_subscriber::fmt::format::FmtSpan;

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A miss span names its key, outcome, lease prefix and fence; a hit span its outcome; a waiter its wait time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_spans_carry_key_outcome_lease_and_fence() {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber)
        .expect("the only subscriber in this test binary");

    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60")]).delay(Duration::from_millis(100));
    let layer = CacheLayer::builder()
        .redis(RedisOptions::new(server.url()).namespace("s"))
        .build()
        .unwrap();
    let key = layer.key_for(&get_req("/traced")).to_hex();
    let app = origin.app(layer);
    let leader = tokio::spawn(tracing::Instrument::in_current_span({
        let app = app.clone();
        async move { send(&app, get_req("/traced")).await }
    }));
    tokio::time::sleep(Duration::from_millis(20)).await;
    send(&app, get_req("/traced")).await; // a waiter
    leader.await.unwrap();
    send(&app, get_req("/traced")).await; // a hit

    let out = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    let closes: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("herdguard{") && l.contains("close"))
        .collect();
    assert_eq!(closes.len(), 3, "one span per request:\n{out}");
    let short = &key[..8];
    assert!(
        closes.iter().all(|l| l.contains(&format!("key={short}"))),
        "{out}"
    );
    assert!(
        closes.iter().any(|l| l.contains("outcome=\"miss\"")
            && l.contains("lease=")
            && l.contains("fence=1")),
        "the leader's span has its lease and fence:\n{out}"
    );
    assert!(
        closes
            .iter()
            .any(|l| l.contains("outcome=\"coalesced\"") && l.contains("wait_ms=")),
        "{out}"
    );
    assert!(
        closes.iter().any(|l| l.contains("outcome=\"hit\"")),
        "{out}"
    );
}
