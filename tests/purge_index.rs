//! Purge indexes in Redis: bounded by their live entries, and walked in
//! batches, so a purge of a huge tag neither blocks Redis nor trips the
//! breaker. A test binary of its own: the 100k-member purge loads the CPU,
//! and other tests' timings should not share that.
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::Duration;

use axum::Router;
use deadpool_redis::redis;
use herdguard::{CacheLayer, RedisOptions};
use support::origin::{cache_status, get_req, send, Origin};
use support::{until_indexed, RedisServer};

fn layer(server: &RedisServer, backoff: Duration) -> CacheLayer {
    CacheLayer::builder()
        .redis(
            RedisOptions::new(server.url())
                .namespace("p")
                .l1_ttl(Duration::from_secs(30))
                .breaker_backoff(backoff, backoff),
        )
        .build()
        .unwrap()
}

/// Poll `app` for `uri` until it is no longer a hit, at most 5 s.
async fn until_not_hit(app: &Router, uri: &str) {
    let start = tokio::time::Instant::now();
    loop {
        let (_, h, _) = send(app, get_req(uri)).await;
        if !cache_status(&h).contains("; hit") {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the purge never reached this instance"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The index of a tag in Redis, as the layer names it (namespace `p`).
fn tag_index(tag: &str) -> String {
    format!(
        "p:g:{{{}}}",
        herdguard::CacheKey::new(format!("tag:{tag}")).to_hex()
    )
}

/// A group index holds only live entries: members are scored by their entry's expiry, and an expired member is trimmed by the next write to the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_index_members_expire_with_their_entries() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("surrogate-key", "shelf")]);
    let app = origin.app(layer(&server, Duration::from_millis(250)));
    let mut conn = server.connection().await;
    let index = tag_index("shelf");
    // A member whose entry expired 5 s ago, as a write long ago left
    // it: the index kept on by a longer-lived member's expiry.
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    let _: () = redis::cmd("ZADD")
        .arg(&index)
        .arg(now_ms - 5000)
        .arg("0".repeat(32))
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg(&index)
        .arg(30_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    send(&app, get_req("/shelf/1")).await;
    let member = CacheLayer::new().key_for(&get_req("/shelf/1")).to_hex();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(&index)
            .arg(&member)
            .query_async(&mut conn)
            .await
            .unwrap();
        if score.is_some() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never indexed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(&index)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        members.len(),
        1,
        "the expired member was trimmed: {members:?}"
    );
    let expires_in = members[0].1 as u64 - now_ms;
    assert!(
        (55_000..=62_000).contains(&expires_in),
        "scored by the entry's expiry (max-age=60) and a 1 s margin: {expires_in} ms"
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&index)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        pttl > 0 && pttl <= 62_000,
        "the index expires with its last entry: {pttl}"
    );
}

/// A tag with 100k members purges in bounded time, batch by batch: Redis keeps answering other clients meanwhile, the tagged entries are gone, and the breaker never opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_of_a_100k_member_tag_is_batched() {
    const MEMBERS: usize = 100_000;
    let server = RedisServer::start();
    let tagged = Origin::new(&[("cache-control", "max-age=60"), ("surrogate-key", "big")])
        .delay(Duration::from_millis(100));
    // A long back-off: had the purge tripped the breaker, the burst at the
    // end would not coalesce across instances.
    let backoff = Duration::from_secs(30);
    let (la, lb) = (layer(&server, backoff), layer(&server, backoff));
    let (a, b) = (tagged.app(la.clone()), tagged.app(lb));
    let mut conn = server.connection().await;
    let index = tag_index("big");
    for i in 0..3 {
        send(&a, get_req(&format!("/big/{i}"))).await;
    }
    until_indexed(&mut conn, &index, 3).await;
    // The rest of the members written directly, 10k per command.
    let (secs, _): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let score = secs * 1000 + 60_000;
    for chunk in 0..MEMBERS / 10_000 {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(&index);
        for i in 0..10_000 {
            zadd.arg(score)
                .arg(format!("{:032x}", chunk * 10_000 + i + 1));
        }
        let _: i64 = zadd.query_async(&mut conn).await.unwrap();
    }

    // Another client's round trips while the purge runs.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pinger = tokio::spawn({
        let (stop, mut c) = (stop.clone(), server.connection().await);
        async move {
            let mut slowest = Duration::ZERO;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let t = tokio::time::Instant::now();
                let _: String = redis::cmd("PING").query_async(&mut c).await.unwrap();
                slowest = slowest.max(t.elapsed());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            slowest
        }
    });
    let started = tokio::time::Instant::now();
    drop(la.purge_tag("big"));
    loop {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&index)
            .query_async(&mut conn)
            .await
            .unwrap();
        if exists == 0 {
            break;
        }
        // Batched it takes 2-10 s here (debug build, loaded machine); in one
        // go, about a minute.
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the purge did not finish in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let slowest_ping = pinger.await.unwrap();
    println!("purge of {MEMBERS} members: {took:?}; slowest PING meanwhile {slowest_ping:?}");
    assert!(
        slowest_ping < Duration::from_millis(250),
        "Redis was blocked for {slowest_ping:?}"
    );

    until_not_hit(&b, "/big/0").await;
    let before = tagged.calls();
    let mut tasks = Vec::new();
    for app in [&a, &b] {
        for _ in 0..20 {
            let app = app.clone();
            tasks.push(tokio::spawn(
                async move { send(&app, get_req("/after")).await },
            ));
        }
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().0, 200);
    }
    assert_eq!(tagged.calls() - before, 1, "the breaker stayed closed");
}

/// A key of another type under a group index's name (nothing this release writes) does not keep the group's fills out of Redis: the next fill replaces it with the index, is stored, and a tag purge finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_under_an_index_name_is_replaced() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("surrogate-key", "odd")]);
    let (la, lb) = (
        layer(&server, Duration::from_millis(250)),
        layer(&server, Duration::from_millis(250)),
    );
    let (a, b) = (origin.app(la.clone()), origin.app(lb));
    let mut conn = server.connection().await;
    let index = tag_index("odd");
    let _: () = redis::cmd("SADD")
        .arg(&index)
        .arg("not-a-key")
        .query_async(&mut conn)
        .await
        .unwrap();
    send(&a, get_req("/odd")).await;
    until_indexed(&mut conn, &index, 1).await;
    let (_, h, _) = send(&b, get_req("/odd")).await;
    assert!(cache_status(&h).contains("; hit"), "stored: {h:?}");
    assert_eq!(origin.calls(), 1);
    la.purge_tag("odd").await.unwrap();
    until_not_hit(&b, "/odd").await;
    assert_eq!(origin.calls(), 2, "the purge found the fill in the index");
}

/// A refill of an indexed entry (its member already there) still trims the group's expired members and extends the index to the new expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refill_trims_and_extends_the_index() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("surrogate-key", "again")]);
    let app = origin.app(layer(&server, Duration::from_millis(250)));
    let mut conn = server.connection().await;
    let index = tag_index("again");
    let member = CacheLayer::new().key_for(&get_req("/again")).to_hex();
    // As earlier writes left it: this entry's member, scored by its old
    // expiry, beside one that expired; kept 30 s.
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    let _: () = redis::cmd("ZADD")
        .arg(&index)
        .arg(now_ms - 5000)
        .arg("0".repeat(32))
        .arg(now_ms + 30_000)
        .arg(&member)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg(&index)
        .arg(30_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    send(&app, get_req("/again")).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&index)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await
            .unwrap();
        if members.len() == 1 && members[0].1 as u64 > now_ms + 50_000 {
            assert_eq!(members[0].0, member);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not trimmed or not rescored: {members:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&index)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(pttl > 50_000, "extended to the new expiry: {pttl}");
}
