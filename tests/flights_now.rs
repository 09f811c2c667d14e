//! The flights running now, as `CacheLayer::flights` lists them: one per
//! key however many wait, each with its age and waiters, and with Redis
//! the time left on the lease its leader holds.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::Duration;

use axum::Router;
use herdguard::{CacheLayer, RedisOptions};
use support::origin::{get_req, send, Origin};
use support::RedisServer;

/// `n` concurrent GETs of `uri`, spawned.
fn burst(app: &Router, uri: &'static str, n: usize) -> Vec<tokio::task::JoinHandle<u16>> {
    (0..n)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, get_req(uri)).await.0.as_u16() })
        })
        .collect()
}

/// Ten requests on one cold key are one flight with nine waiters; it is
/// listed while it runs, with its age, and gone once answered.
#[tokio::test(start_paused = true)]
async fn a_burst_is_one_flight_with_its_waiters() {
    let origin = Origin::new(&[("cache-control", "max-age=60")]).delay(Duration::from_secs(5));
    let layer = CacheLayer::new();
    let app = origin.app(layer.clone());
    let calls = burst(&app, "/slow", 10);
    let other = burst(&app, "/other", 1);
    tokio::time::sleep(Duration::from_secs(2)).await;

    let flights = layer.flights(16);
    assert_eq!(flights.len(), 2, "{flights:?}");
    let slow = layer.key_for(&get_req("/slow"));
    let f = flights
        .iter()
        .find(|f| f.key == slow)
        .expect("/slow's flight");
    assert_eq!(f.waiters, 9, "{f:?}");
    assert_eq!(f.age, Duration::from_secs(2));
    assert_eq!(f.lease_left, None, "no lease in memory");
    assert!(!f.refresh);
    assert_eq!(layer.flights(1).len(), 1, "bounded by the limit");

    for c in calls.into_iter().chain(other) {
        assert_eq!(c.await.unwrap(), 200);
    }
    assert_eq!(origin.calls(), 2);
    assert!(layer.flights(16).is_empty());
}

/// With Redis, the leader's lease shows its time left: taken for the
/// lease TTL and kept alive by the watchdog while the origin works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_lease_shows_its_time_left() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(10);
    let layer = CacheLayer::builder()
        .redis(
            RedisOptions::new(server.url())
                .namespace("flights")
                .lease_ttl(ttl),
        )
        .build()
        .unwrap();
    let origin = Origin::new(&[("cache-control", "max-age=60")]).delay(Duration::from_secs(2));
    let app = origin.app(layer.clone());
    let calls = burst(&app, "/slow", 3);
    let key = layer.key_for(&get_req("/slow"));
    // Bounded: the lease is taken within a few Redis round trips.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let flight = loop {
        let listed = layer.flights(16);
        if let Some(f) = listed
            .into_iter()
            .find(|f| f.key == key && f.lease_left.is_some())
        {
            break f;
        }
        assert!(tokio::time::Instant::now() < deadline, "no lease listed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let left = flight.lease_left.unwrap();
    assert!(left <= ttl && left > ttl / 2, "{left:?} of {ttl:?}");
    for c in calls {
        assert_eq!(c.await.unwrap(), 200);
    }
    assert_eq!(origin.calls(), 1);
    assert!(layer.flights(16).is_empty());
}
