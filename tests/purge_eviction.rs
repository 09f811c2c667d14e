//! A purge holds on a Redis that evicts keys: an index
//! evicted while the entries it lists are still read must not let a purge
//! miss them. Eviction is made exact here by deleting the index key, as an
//! LRU policy does to an index nobody reads while its entries stay hot; the
//! server runs with an evicting policy so the layer knows eviction can
//! happen. On a server that cannot evict, the check costs nothing.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::Duration;

use axum::http::Uri;
use deadpool_redis::redis;
use herdguard::purge::Purged;
use herdguard::{CacheKey, CacheLayer, RedisOptions};
use support::origin::{cache_status, call_of, get_req, req, send, Origin};
use support::{until_indexed, Monitor, RedisServer};

const NS: &str = "evict";

/// An evicting server: a memory bound far above what the test stores, so
/// nothing is evicted but what the test deletes.
fn evicting() -> RedisServer {
    RedisServer::start_with(&["--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru"])
}

fn layer(server: &RedisServer) -> CacheLayer {
    CacheLayer::builder()
        .redis(
            RedisOptions::new(server.url())
                .namespace(NS)
                .l1_ttl(Duration::from_secs(30)),
        )
        .build()
        .unwrap()
}

/// The Redis name of a purge group's index (as the layer names it).
fn index_of(group: &str) -> String {
    format!("{NS}:g:{{{}}}", CacheKey::new(group).to_hex())
}

fn url_index(path: &str) -> String {
    let url: Uri = format!("http://example.test{path}").parse().unwrap();
    index_of(&format!("url:{}", CacheLayer::new().url_key(&url).to_hex()))
}

async fn evict(conn: &mut redis::aio::MultiplexedConnection, key: &str) {
    let n: i64 = redis::cmd("DEL").arg(key).query_async(conn).await.unwrap();
    assert_eq!(n, 1, "{key} was there to evict");
}

/// A tag purge after the tag's index was evicted: the tagged entry Redis still holds is not served to an instance that reads it afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_whose_tag_index_was_evicted_is_not_served_after_a_tag_purge() {
    let server = evicting();
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("surrogate-key", "shelf")]);
    let a = origin.app(layer(&server));
    let (_, _, body) = send(&a, get_req("/t")).await;
    assert_eq!(call_of(&body), "call=1");
    let mut conn = server.connection().await;
    until_indexed(&mut conn, &index_of("tag:shelf"), 1).await;
    evict(&mut conn, &index_of("tag:shelf")).await;

    let lb = layer(&server);
    assert_eq!(lb.purge_tag("shelf").await.unwrap(), Purged::Redis);
    // A third instance, with nothing in memory: what it gets is what Redis
    // holds for the URL.
    let c = origin.app(layer(&server));
    let (_, headers, body) = send(&c, get_req("/t")).await;
    assert_eq!(
        call_of(&body),
        "call=2",
        "the purged answer was served: {}",
        cache_status(&headers)
    );
    assert_eq!(origin.calls(), 2);
}

/// A URL purge after the URL's index was evicted: a Vary variant Redis still holds is not served once the URL is filled again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_variant_whose_url_index_was_evicted_is_not_served_after_a_url_purge() {
    let server = evicting();
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("vary", "accept-language")]);
    let lang = |l: &'static str| req(axum::http::Method::GET, "/v", &[("accept-language", l)]);
    let a = origin.app(layer(&server));
    let (_, _, body) = send(&a, lang("de")).await;
    assert_eq!(call_of(&body), "call=1");
    let mut conn = server.connection().await;
    // The variant and the URL's own key.
    until_indexed(&mut conn, &url_index("/v"), 2).await;
    evict(&mut conn, &url_index("/v")).await;

    let lb = layer(&server);
    let url: Uri = "http://example.test/v".parse().unwrap();
    assert_eq!(lb.purge_url(&url).await.unwrap(), Purged::Redis);
    let c = origin.app(layer(&server));
    // Another language fills the URL's key again (the purge deleted it) ...
    let (_, _, body) = send(&c, lang("fr")).await;
    assert_eq!(call_of(&body), "call=2");
    // ... and the `de` variant from before the purge is not served.
    let (_, headers, body) = send(&c, lang("de")).await;
    assert_eq!(
        call_of(&body),
        "call=3",
        "the purged variant was served: {}",
        cache_status(&headers)
    );
    assert_eq!(origin.calls(), 3);
}

/// Only an evicting server pays for the check: a Redis hit asks each of the entry's indexes once there (URL and tag: 2 ZSCORE), and none on a server that cannot evict. A user that may not run INFO cannot tell, so it checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_evicting_server_pays_for_the_index_check() {
    let no_info = RedisServer::start();
    let blind = no_info
        .acl_user("blind", &["~*", "&*", "+@all", "-info"])
        .await;
    let cases = [
        (evicting(), None, 2),
        (RedisServer::start(), None, 0),
        (no_info, Some(blind), 2),
    ];
    for (server, user, expected) in cases {
        let origin = Origin::new(&[("cache-control", "max-age=60"), ("surrogate-key", "shelf")]);
        let url = user.unwrap_or_else(|| server.url());
        let layer = |url: &str| {
            CacheLayer::builder()
                .redis(RedisOptions::new(url).namespace(NS))
                .build()
                .unwrap()
        };
        let a = origin.app(layer(&url));
        send(&a, get_req("/t")).await;
        let mut conn = server.connection().await;
        until_indexed(&mut conn, &index_of("tag:shelf"), 1).await;
        let monitor = Monitor::start(&server);
        // A second instance reads the entry from Redis: a Redis hit.
        let b = origin.app(layer(&url));
        let (_, headers, _) = send(&b, get_req("/t")).await;
        assert!(cache_status(&headers).contains("hit"), "{headers:?}");
        let zscores = monitor
            .client_commands()
            .iter()
            .filter(|c| *c == "ZSCORE")
            .count();
        assert_eq!(zscores, expected, "index checks on this server");
        assert_eq!(origin.calls(), 1);
    }
}

/// An entry its indexes still list is served from Redis as before on an evicting server: the check refuses only what a purge could have missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_entry_is_a_hit_on_an_evicting_server() {
    let server = evicting();
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("vary", "accept-language")]);
    let lang = |l: &'static str| req(axum::http::Method::GET, "/v", &[("accept-language", l)]);
    let a = origin.app(layer(&server));
    send(&a, lang("de")).await;
    let mut conn = server.connection().await;
    until_indexed(&mut conn, &url_index("/v"), 2).await;
    let b = origin.app(layer(&server));
    let (_, headers, body) = send(&b, lang("de")).await;
    assert_eq!(call_of(&body), "call=1");
    assert!(cache_status(&headers).contains("hit"), "{headers:?}");
    assert_eq!(origin.calls(), 1);
}
