//! Settings that cannot be wrong silently: `build()` refuses contradictory
//! or meaningless values with a `BuildError` that names the setting, instead
//! of quietly changing what the layer does. And the layer-wide forms of the
//! route settings (`max_ttl`, `ignore_origin_cache_control`).

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

// ------------------------------------------------ layer-wide freshness rules

/// A layer whose handler answers with `cache_control`; `/n` counts calls.
fn origin_app(
    layer: CacheLayer,
    cache_control: &'static str,
) -> (axum::Router, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&calls);
    let app = axum::Router::new()
        .route(
            "/n",
            axum::routing::get(move || {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                async move { ([("cache-control", cache_control)], format!("call {n}")) }
            }),
        )
        .layer(layer);
    (app, calls)
}

async fn cache_status_of(app: &axum::Router) -> String {
    use tower::ServiceExt;
    let req = axum::http::Request::get("/n")
        .header("host", "example.test")
        .body(axum::body::Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    res.headers()["cache-status"].to_str().unwrap().to_owned()
}

/// The layer-wide `max_ttl` caps the origin's `max-age`: past the cap the entry is no longer a hit.
#[tokio::test(start_paused = true)]
async fn layer_max_ttl_caps_the_origin_freshness() {
    let layer = CacheLayer::builder()
        .max_ttl(Duration::from_secs(10))
        .refresh_ahead(0.0) // no refresh before the cap ends
        .build()
        .unwrap();
    let (app, calls) = origin_app(layer, "max-age=3600");
    cache_status_of(&app).await;
    tokio::time::advance(Duration::from_secs(9)).await;
    assert!(cache_status_of(&app).await.contains("hit"));
    tokio::time::advance(Duration::from_secs(2)).await;
    let status = cache_status_of(&app).await;
    assert!(!status.contains("hit"), "{status}");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// The layer-wide `ignore_origin_cache_control` stores an answer the origin marked `max-age=0` for `default_ttl`.
#[tokio::test(start_paused = true)]
async fn layer_can_ignore_the_origin_cache_control() {
    let layer = CacheLayer::builder()
        .ignore_origin_cache_control()
        .default_ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let (app, calls) = origin_app(layer, "max-age=0");
    cache_status_of(&app).await;
    let status = cache_status_of(&app).await;
    assert!(status.contains("hit"), "{status}");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
}
