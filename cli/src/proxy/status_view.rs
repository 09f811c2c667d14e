//! The admin port's live views of one instance: `/status.json`, one
//! snapshot (counters, the origin gate, Redis, the flights running now,
//! the hot keys, and the counters' last five minutes, one sample a
//! second), and `/status`, a self-contained page that polls it every
//! second and draws those minutes (no CDN, no build step: the page is
//! `status_view.html`, inline script and SVG). `herdguard top` reads the
//! same snapshot.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use herdguard::CacheLayer;
use serde_json::{json, Value};

/// Samples of the history: five minutes at one a second.
pub const HISTORY: usize = 300;

/// The counters, sampled every second by the admin task: a page opened
/// now draws the last minutes at once. Fixed size ([`HISTORY`] samples).
#[derive(Debug, Clone, Default)]
pub struct History(Arc<Mutex<VecDeque<[u64; 6]>>>);

impl History {
    /// Sample `cache` every second, for as long as the process runs.
    pub fn sample_every_second(&self, cache: CacheLayer) {
        let history = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                history.push(&cache);
            }
        });
    }

    fn push(&self, cache: &CacheLayer) {
        let s = cache.stats();
        let answers = s.hits + s.stale + s.misses + s.coalesced + s.bypasses + s.errors;
        let sample = [
            now_ms(),
            answers,
            s.hits + s.stale,
            s.origin_calls,
            s.followers,
            s.own_calls,
        ];
        let mut samples = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if samples.len() == HISTORY {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// `[time_ms, answers, hits and stale, origin calls, followers, own
    /// calls]`, oldest first: running totals, as in `stats`.
    fn to_json(&self) -> Value {
        let samples = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        Value::from(
            samples
                .iter()
                .map(|s| Value::from(s.to_vec()))
                .collect::<Vec<_>>(),
        )
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
}

/// The most flights a snapshot lists (longest running first).
pub const FLIGHTS_SHOWN: usize = 64;

/// The page, served as it is.
pub const PAGE: &str = include_str!("status_view.html");

/// One snapshot of `cache`, as `/status.json` serves it. `instance` names
/// this process (its admin address and pid).
pub fn snapshot(cache: &CacheLayer, instance: &str, history: &History) -> Value {
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
        "time_ms": now_ms(),
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
        "history": history.to_json(),
        "hot_keys": super::hot_keys::value(&cache.hot_keys()),
    })
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The history keeps its last [`HISTORY`] samples, never more.
    #[test]
    fn history_is_bounded() {
        let history = History::default();
        let cache = CacheLayer::new();
        for _ in 0..HISTORY + 5 {
            history.push(&cache);
        }
        assert_eq!(history.to_json().as_array().unwrap().len(), HISTORY);
    }
}
