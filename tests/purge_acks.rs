//! A purge answers "done everywhere" only once every instance listening for
//! purge notices has dropped its copies: each listener acknowledges the
//! notice it applied, and the purging instance waits (bounded) for one ack
//! per receiver. Real redis-server; a slow path to one instance.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::Duration;

use axum::http::Uri;
use deadpool_redis::redis;
use herdguard::purge::Purged;
use herdguard::{CacheLayer, RedisOptions};
use support::origin::{cache_status, call_of, get_req, send, Origin};
use support::{RedisServer, SlowLink};

const NS: &str = "acks";

fn layer(url: String, reply: Duration) -> CacheLayer {
    CacheLayer::builder()
        .redis(
            RedisOptions::new(url)
                .namespace(NS)
                .l1_ttl(Duration::from_secs(30))
                .response_timeout(reply),
        )
        .build()
        .unwrap()
}

fn url(path: &str) -> Uri {
    format!("http://example.test{path}").parse().unwrap()
}

/// Another instance's notices arrive 300 ms late: the purge answers only after that instance applied it, so right after the answer it no longer serves the purged copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_answers_after_every_listening_instance_dropped_its_copy() {
    let server = RedisServer::start();
    let slow = SlowLink::start(server.port(), Duration::from_millis(300)).await;
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let a = origin.app(layer(slow.url(), Duration::from_secs(3)));
    let lb = layer(server.url(), Duration::from_millis(500));
    let _b = origin.app(lb.clone());
    let (_, _, body) = send(&a, get_req("/x")).await;
    assert_eq!(call_of(&body), "call=1");
    let (_, h, body) = send(&a, get_req("/x")).await;
    assert_eq!(call_of(&body), "call=1");
    assert!(cache_status(&h).contains("hit"), "A holds a copy");
    server.wait_for_subscribers(&format!("{NS}:purge"), 2).await;

    assert_eq!(lb.purge_url(&url("/x")).await.unwrap(), Purged::Redis);
    let (_, h, body) = send(&a, get_req("/x")).await;
    assert_eq!(
        call_of(&body),
        "call=2",
        "A still served its purged copy after the purge answered: {}",
        cache_status(&h)
    );
}

/// A listener that never acknowledges (an older instance, or one gone silent): the purge still runs everywhere it can, and says it is unconfirmed after its bound instead of claiming every copy is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_never_acknowledges_leaves_the_purge_unconfirmed() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let reply = Duration::from_millis(250);
    let lb = layer(server.url(), reply);
    let b = origin.app(lb.clone());
    send(&b, get_req("/y")).await;
    // A bare subscriber: hears notices, acknowledges nothing.
    let mut mute = redis::Client::open(server.admin_url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    mute.subscribe(format!("{NS}:purge")).await.unwrap();
    server.wait_for_subscribers(&format!("{NS}:purge"), 2).await;

    let started = tokio::time::Instant::now();
    assert_eq!(lb.purge_url(&url("/y")).await.unwrap(), Purged::Unconfirmed);
    let took = started.elapsed();
    assert!(
        took >= reply * 4 && took < Duration::from_secs(5),
        "waited its bound, no longer: {took:?}"
    );
    // Purged in Redis and here all the same.
    let (_, _, body) = send(&b, get_req("/y")).await;
    assert_eq!(call_of(&body), "call=2");
}
