//! Settings that cannot be wrong silently: `build()` refuses contradictory
//! or meaningless values with a `BuildError` that names the setting, instead
//! of quietly changing what the layer does.

use std::time::Duration;

use herdguard::{BuildError, Cache, CacheLayer, CacheLayerBuilder};

/// The setting a refused build names; panics if the build succeeds.
fn refused(builder: CacheLayerBuilder) -> &'static str {
    match builder.build() {
        Ok(_) => panic!("built"),
        Err(BuildError::InvalidSetting { setting, .. }) => setting,
        Err(other) => panic!("not a setting error: {other}"),
    }
}

/// A `max_wait` below `origin_timeout` is refused: waiters would leave a healthy call.
#[test]
fn max_wait_below_origin_timeout_is_refused() {
    let builder = CacheLayer::builder()
        .origin_timeout(Duration::from_secs(10))
        .max_wait(Duration::from_secs(9));
    assert_eq!(refused(builder), "max_wait");
    // The order of the setters does not matter.
    let builder = CacheLayer::builder()
        .max_wait(Duration::from_secs(1))
        .origin_timeout(Duration::from_secs(2));
    assert_eq!(refused(builder), "max_wait");
    // At the origin timeout or above, and the default, are fine.
    for wait in [10, 11] {
        CacheLayer::builder()
            .origin_timeout(Duration::from_secs(10))
            .max_wait(Duration::from_secs(wait))
            .build()
            .unwrap();
    }
    CacheLayer::builder()
        .origin_timeout(Duration::from_secs(600))
        .build()
        .unwrap();
}

/// `refresh_ahead` outside 0 ≤ f < 1, or NaN, is refused, on the layer and on `Cache`.
#[test]
fn refresh_ahead_outside_a_fraction_is_refused() {
    for bad in [-0.1, 1.0, 1.5, f64::NAN, f64::INFINITY] {
        let builder = CacheLayer::builder().refresh_ahead(bad);
        assert_eq!(refused(builder), "refresh_ahead", "{bad}");
        let err = Cache::<String>::builder()
            .refresh_ahead(bad)
            .build()
            .unwrap_err();
        assert_eq!(err.setting(), Some("refresh_ahead"), "{bad}");
    }
    for good in [0.0, 0.25, 0.99] {
        CacheLayer::builder().refresh_ahead(good).build().unwrap();
    }
}

/// A `max_body_bytes` above `fill_buffer_bytes` is refused: such bodies could never be buffered.
#[test]
fn max_body_above_fill_buffer_is_refused() {
    let builder = CacheLayer::builder()
        .fill_buffer_bytes(1024)
        .max_body_bytes(1025);
    assert_eq!(refused(builder), "max_body_bytes");
    // Shrinking the budget below the default body limit is caught too.
    assert_eq!(
        refused(CacheLayer::builder().fill_buffer_bytes(1024 * 1024)),
        "max_body_bytes"
    );
    CacheLayer::builder()
        .fill_buffer_bytes(1024)
        .max_body_bytes(1024)
        .build()
        .unwrap();
}

/// `leader_limit(0)` is refused instead of silently becoming 1.
#[test]
fn zero_leader_limit_is_refused() {
    assert_eq!(
        refused(CacheLayer::builder().leader_limit(0)),
        "leader_limit"
    );
    let err = Cache::<String>::builder()
        .leader_limit(0)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), Some("leader_limit"));
    CacheLayer::builder().leader_limit(1).build().unwrap();
}

/// `fallback_limit(0)` is refused instead of silently becoming 1.
#[test]
fn zero_fallback_limit_is_refused() {
    assert_eq!(
        refused(CacheLayer::builder().fallback_limit(0)),
        "fallback_limit"
    );
    let err = Cache::<String>::builder()
        .fallback_limit(0)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), Some("fallback_limit"));
    CacheLayer::builder().fallback_limit(1).build().unwrap();
}

/// A cache name that is not a token is refused under its own setting name.
#[test]
fn bad_cache_name_names_its_setting() {
    assert_eq!(
        refused(CacheLayer::builder().cache_name("two words")),
        "cache_name"
    );
}

/// An unusable Redis URL is a `Redis` error carrying its source, not a setting error.
#[cfg(feature = "redis")]
#[test]
fn bad_redis_url_is_a_redis_error_with_its_source() {
    use std::error::Error as _;
    let err = CacheLayer::builder()
        .redis(herdguard::RedisOptions::new("redis://user:secret@[::1"))
        .build()
        .unwrap_err();
    assert!(matches!(err, BuildError::Redis { .. }), "{err:?}");
    assert!(err.source().is_some(), "{err:?}");
    assert!(!err.to_string().contains("secret"), "{err}");
    assert_eq!(err.setting(), None);
}
