//! The admin port's live views of one instance: `/status.json`, one
//! snapshot (counters, the origin gate, Redis, the flights running now,
//! the hot keys), and `/status`, a self-contained page that polls it every
//! second and draws the last minutes (no CDN, no build step: the page is
//! `status.html`, inline script and SVG). `herdguard top` reads the same
//! snapshot.

use std::time::{SystemTime, UNIX_EPOCH};

use herdguard::CacheLayer;
use serde_json::{json, Value};

/// The most flights a snapshot lists (longest running first).
pub const FLIGHTS_SHOWN: usize = 64;

/// The page, served as it is.
pub const PAGE: &str = include_str!("status_view.html");

/// One snapshot of `cache`, as `/status.json` serves it. `instance` names
/// this process (its admin address and pid).
pub fn snapshot(cache: &CacheLayer, instance: &str) -> Value {
    let s = cache.stats();
    let origin = cache.origin_status();
    let redis = match cache.redis_connected() {
        None => "memory-only",
        Some(true) => "connected",
        Some(false) => "unreachable",
    };
    let flights: Vec<Value> = cache
        .flights(FLIGHTS_SHOWN)
        .iter()
        .map(|f| {
            json!({
                "key": f.key.to_hex(),
                "age_ms": millis(f.age),
                "waiters": f.waiters,
                "lease_left_ms": f.lease_left.map(millis),
                "refresh": f.refresh,
            })
        })
        .collect();
    json!({
        "instance": instance,
        "time_ms": SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, millis),
        "stats": {
            "hits": s.hits,
            "stale": s.stale,
            "misses": s.misses,
            "coalesced": s.coalesced,
            "bypasses": s.bypasses,
            "errors": s.errors,
            "origin_calls": s.origin_calls,
            "own_calls": s.own_calls,
            "followers": s.followers,
            "origin_refused": s.origin_refused,
            "refreshes_skipped": s.refreshes_skipped,
            "probes": s.probes,
            "fenced_rejections": s.fenced_rejections,
        },
        "origin": {
            "budget_in_use": origin.budget_in_use,
            "budget_limit": origin.budget_limit,
            "queued": origin.queued,
            "breaker": if origin.down_for.is_some() { "open" } else { "closed" },
            "next_probe_ms": origin.down_for.map(millis),
        },
        "redis": redis,
        "entries": cache.entry_count(),
        "flights": flights,
        "hot_keys": super::server::hot_keys_value(&cache.hot_keys()),
    })
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
