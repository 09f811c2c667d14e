//! Freshness across instances has one clock, Redis's (the entry's PTTL past its stale window): an
//! entry Redis still calls fresh is served as fresh by every instance,
//! whatever its age by the writer's stamp (the write lands after the stamp).
#![cfg(feature = "redis")]

use herdguard_testkit as support;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use deadpool_redis::redis;
use herdguard::{CacheLayer, RedisOptions};
use support::origin::{cache_status, get_req, send, Origin};
use support::RedisServer;

const CACHE_60: &[(&str, &str)] = &[("cache-control", "max-age=60")];

fn layer(server: &RedisServer) -> CacheLayer {
    // Generous timeouts: a slow reply on a loaded machine must not open the
    // breaker (that fail-open path is tested in tests/redis_faults.rs).
    let opts = RedisOptions::new(server.url())
        .namespace("t")
        .response_timeout(Duration::from_secs(2))
        .pool_wait_timeout(Duration::from_secs(2));
    CacheLayer::builder()
        .redis(opts)
        .build()
        .expect("valid layer")
}

/// An entry Redis holds fresh past its stamped age (its write landed late) is a hit on another instance, not an origin call of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_redis_calls_fresh_is_not_refused_for_its_stamped_age() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=1")]);
    let writer = origin.app(layer(&server));
    let (code, _, first) = send(&writer, get_req("/late")).await;
    assert_eq!(code, 200);
    assert_eq!(origin.calls(), 1);

    // As if the fenced write had reached Redis long after the entry was
    // stamped: Redis keeps it fresh for longer than its age allows. (Real
    // time: Redis TTLs do not follow tokio's paused clock.)
    let key = CacheLayer::new().key_for(&get_req("/late")).to_hex();
    let mut conn = server.connection().await;
    // Fresh for 5 s by Redis: the entry's PTTL past its stale window (u64
    // LE at byte 20 of the encoding).
    let stored: Vec<u8> = redis::cmd("GET")
        .arg(format!("t:{{{key}}}:v"))
        .query_async(&mut conn)
        .await
        .expect("get");
    let stale = u64::from_le_bytes(stored[20..28].try_into().expect("an entry"));
    let set: i64 = redis::cmd("PEXPIRE")
        .arg(format!("t:{{{key}}}:v"))
        .arg(5_000 + stale)
        .query_async(&mut conn)
        .await
        .expect("pexpire");
    assert_eq!(set, 1, "the entry exists");
    tokio::time::sleep(Duration::from_millis(1_300)).await; // past max-age by the stamp

    let reader = origin.app(layer(&server));
    let (code, h, body) = send(&reader, get_req("/late")).await;
    assert_eq!(code, 200);
    assert_eq!(origin.calls(), 1, "cache-status: {}", cache_status(&h));
    assert!(cache_status(&h).contains("hit"), "{}", cache_status(&h));
    assert_eq!(body, first);
}

/// A burst of requests that finds an entry with milliseconds of freshness left in Redis shares one refresh: waiters whose copy expires before they look at it join the next flight instead of each calling the origin alone (`fwd=request`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_at_the_end_of_freshness_shares_one_refresh() {
    const BURST: usize = 400;
    /// How long Redis stalls, and how much freshness it has left after.
    const STALL: Duration = Duration::from_millis(100);
    const LEFT: Duration = Duration::from_millis(15);
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    // A fill that answers at once: its age is then all but zero, so the
    // copy's HTTP freshness ends with Redis's `:fresh` key, not a fraction
    // of a second after it.
    let writer_origin = Origin::new(&[("cache-control", "max-age=1")]);
    let origin = Origin::new(CACHE_60)
        .delay(Duration::from_millis(50))
        .sharing_calls_with(&writer_origin);
    let writer = writer_origin.app(layer(&server));
    let (code, _, _) = send(&writer, get_req("/edge")).await;
    assert_eq!(code, 200);
    // No refresh-ahead: the entry must reach its end on the reader.
    let opts = RedisOptions::new(server.url())
        .namespace("t")
        .response_timeout(Duration::from_secs(2))
        .pool_wait_timeout(Duration::from_secs(2));
    let reader = CacheLayer::builder()
        .refresh_ahead(0.0)
        .redis(opts)
        .build()
        .expect("valid layer");
    let reader = origin.app(reader);
    send(&reader, get_req("/warm")).await; // the reader's pool is connected
    assert_eq!(origin.calls(), 2);

    // Redis stalls (as for a fork or a slow command) until the entry has
    // LEFT of freshness: the whole burst then waits on one flight, whose
    // copy ends while its waiters are still being answered. Real time:
    // Redis's clock does not follow tokio's paused one.
    let key = CacheLayer::new().key_for(&get_req("/edge")).to_hex();
    let mut conn = server.connection().await;
    // Freshness left is the entry's PTTL past its stale window (u64 LE at
    // byte 20 of the encoding).
    let (hard, stored): (u64, Vec<u8>) = redis::pipe()
        .cmd("PTTL")
        .arg(format!("t:{{{key}}}:v"))
        .cmd("GET")
        .arg(format!("t:{{{key}}}:v"))
        .query_async(&mut conn)
        .await
        .expect("pttl");
    let stale = u64::from_le_bytes(stored[20..28].try_into().expect("an entry"));
    let left = hard - stale;
    let end = tokio::time::Instant::now() + Duration::from_millis(left);
    assert!(left > 500, "still fresh for a while: {left} ms");
    tokio::time::sleep_until(end - STALL - LEFT).await;
    let mut stall = tokio::net::TcpStream::connect(("127.0.0.1", server.port()))
        .await
        .expect("connect");
    let command = format!("DEBUG SLEEP {}\r\n", STALL.as_secs_f64());
    stall
        .write_all(command.as_bytes())
        .await
        .expect("stall redis");
    // Margin for Redis to read it before the burst's lookup arrives.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let tasks: Vec<_> = (0..BURST)
        .map(|_| {
            let reader = reader.clone();
            tokio::spawn(async move {
                let (code, h, _) = send(&reader, get_req("/edge")).await;
                assert_eq!(code, 200);
                cache_status(&h).to_owned()
            })
        })
        .collect();
    let mut alone = Vec::new();
    for t in tasks {
        let status = t.await.unwrap();
        if status.contains("fwd=request") {
            alone.push(status);
        }
    }
    let mut reply = [0u8; 8];
    let n = stall.read(&mut reply).await.expect("DEBUG SLEEP reply");
    assert_eq!(&reply[..n], b"+OK\r\n", "redis stalled");
    assert!(
        alone.is_empty(),
        "{} calls alone, e.g. {:?}",
        alone.len(),
        alone[0]
    );
    // Past the old entry's end, one more request: it shares the refresh the
    // burst started, or starts it if the burst came too early to see the end.
    tokio::time::sleep_until(end + Duration::from_millis(50)).await;
    send(&reader, get_req("/edge")).await;
    assert_eq!(origin.calls(), 3, "the fill, the warm-up and one refresh");
}

/// An instance without L1 (`l1_ttl` zero) whose own older copy (kept for revalidation) has gone stale, while Redis holds a newer fresh entry another instance stored: after the one stale answer that starts its refresh, it answers the newer entry, not its old copy again for the whole stale window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_l1_an_old_kept_copy_gives_way_to_the_newer_redis_entry() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=4, stale-while-revalidate=30")]);
    let no_l1 = CacheLayer::builder()
        .redis(
            RedisOptions::new(server.url())
                .namespace("t")
                .response_timeout(Duration::from_secs(2))
                .l1_ttl(Duration::ZERO),
        )
        .build()
        .unwrap();
    let b = origin.app(no_l1);
    let a = origin.app(layer(&server));
    let (_, _, body) = send(&b, get_req("/k")).await;
    assert!(body.starts_with(b"origin call=1 "));
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let reload = support::origin::req(
        axum::http::Method::GET,
        "/k",
        &[("cache-control", "no-cache")],
    );
    let (_, _, body) = send(&a, reload).await;
    assert!(body.starts_with(b"origin call=2 "));
    // B's call=1 copy is stale now (age 4.5 s); call=2 in Redis is fresh
    // for 2.5 s more (margins for a loaded machine).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, h, body) = send(&b, get_req("/k")).await;
    assert!(
        body.starts_with(b"origin call=1 ") && cache_status(&h).contains("detail=stale"),
        "the stale copy answers once, and starts the refresh: {}",
        cache_status(&h)
    );
    // The refresh finds call=2 in Redis; from then on B answers it.
    let start = tokio::time::Instant::now();
    loop {
        let (_, h, body) = send(&b, get_req("/k")).await;
        if body.starts_with(b"origin call=2 ") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "B kept answering its old copy: {}",
            cache_status(&h)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..3 {
        let (_, _, body) = send(&b, get_req("/k")).await;
        assert!(body.starts_with(b"origin call=2 "));
    }
    assert_eq!(origin.calls(), 2);
}
