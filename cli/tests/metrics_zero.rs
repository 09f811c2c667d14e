//! Every metric a layer records is on `/metrics` at 0 as soon as the layer
//! is built, before any request: scraped through the Prometheus exporter.
//! One test: the recorder is global to this binary.

use herdguard_testkit as support;

use herdguard::metrics::names;
use herdguard::{CacheLayer, RedisOptions};
use metrics_exporter_prometheus::PrometheusBuilder;
use support::RedisServer;

/// The sample of `name` whose labels include `cache="{cache}"` (and
/// `extra`, when given): its value, or None when there is no such line.
fn sample(text: &str, name: &str, cache: &str, extra: Option<&str>) -> Option<f64> {
    let label = format!("cache=\"{cache}\"");
    text.lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (n, labels) = series.split_once('{')?;
        let wanted = n == name
            && labels.split(',').any(|l| l.trim_end_matches('}') == label)
            && extra.is_none_or(|e| labels.split(',').any(|l| l.trim_end_matches('}') == e));
        wanted.then(|| value.parse().expect("a number"))
    })
}

/// Before any request, each metric of a Redis-backed layer reads 0 under its name; a memory-only layer shows the same but none of the Redis ones.
#[tokio::test]
async fn every_metric_is_at_zero_before_the_first_request() {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this binary");
    let redis = RedisServer::start();
    let _shared = CacheLayer::builder()
        .cache_name("shared")
        .redis(RedisOptions::new(redis.url()).namespace("zero"))
        .build()
        .unwrap();
    let _memory = CacheLayer::builder().cache_name("memory").build().unwrap();
    let text = handle.render();

    let counters = [
        (names::REQUESTS, Some("outcome=\"hit\"")),
        (names::REQUESTS, Some("outcome=\"stale\"")),
        (names::REQUESTS, Some("outcome=\"miss\"")),
        (names::REQUESTS, Some("outcome=\"coalesced\"")),
        (names::REQUESTS, Some("outcome=\"bypass\"")),
        (names::REQUESTS, Some("outcome=\"error\"")),
        (names::ORIGIN_CALLS, None),
        (names::NOT_STORED, Some("reason=\"no-freshness\"")),
        (names::NOT_STORED, Some("reason=\"set-cookie\"")),
        (names::NOT_STORED, Some("reason=\"other\"")),
        (names::STREAM_READERS_CUT_OFF, None),
    ];
    let histograms = [
        names::WAIT_SECONDS,
        names::ENTRY_BYTES,
        names::STREAM_WAITER_TTFB,
    ];
    let redis_counters = [
        (names::FENCED_REJECTED, None),
        (names::CORRUPT_ENTRIES, None),
        (names::REDIS_ERRORS, None),
        (names::LOCK_ACQUIRE, Some("result=\"acquired\"")),
        (names::LOCK_ACQUIRE, Some("result=\"contended\"")),
        (names::LOCK_ACQUIRE, Some("result=\"expired_mid_work\"")),
    ];
    let redis_histograms = [names::LEASE_REMAINING, names::LOCK_HELD_SECONDS];

    for cache in ["shared", "memory"] {
        for (name, extra) in counters {
            assert_eq!(
                sample(&text, name, cache, extra),
                Some(0.0),
                "{cache} {name} {extra:?}\n{text}"
            );
        }
        for name in histograms {
            let count = format!("{name}_count");
            assert_eq!(
                sample(&text, &count, cache, None),
                Some(0.0),
                "{cache} {name}\n{text}"
            );
        }
    }
    for (name, extra) in redis_counters {
        assert_eq!(
            sample(&text, name, "shared", extra),
            Some(0.0),
            "{name} {extra:?}\n{text}"
        );
        assert_eq!(
            sample(&text, name, "memory", extra),
            None,
            "{name}: memory only\n{text}"
        );
    }
    for name in redis_histograms {
        let count = format!("{name}_count");
        assert_eq!(
            sample(&text, &count, "shared", None),
            Some(0.0),
            "{name}\n{text}"
        );
        assert_eq!(
            sample(&text, &count, "memory", None),
            None,
            "{name}: memory only\n{text}"
        );
    }
    assert_eq!(
        sample(&text, names::REDIS_AVAILABLE, "shared", None),
        Some(1.0),
        "{text}"
    );
}
