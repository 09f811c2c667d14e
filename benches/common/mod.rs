//! Pieces the harness-less benches share: flags, a loopback HTTP/1.1 load
//! generator, the slow origin, and the Redis hook.
//!
//! Each bench includes this with `mod common;` and uses only part of it.
#![allow(dead_code, reason = "each bench binary uses a different part")]

pub(crate) mod args;
pub(crate) mod bare;
pub(crate) mod big;
pub(crate) mod chart;
pub(crate) mod hit;
pub(crate) mod loadgen;
pub(crate) mod origin;
pub(crate) mod peers;
pub(crate) mod redis;
pub(crate) mod timing;
pub(crate) mod wrk;

use std::time::Duration;

/// Milliseconds with one decimal, for tables.
pub(crate) fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// The `q`-quantile of unsorted samples (sorts them), or `None` when empty.
pub(crate) fn quantile(samples: &mut [Duration], q: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let idx = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
    Some(samples[idx])
}

/// Resident set size of this process in bytes, from /proc/self/statm
/// (assumes 4 KiB pages, as on every x86_64/aarch64 Linux we run on).
pub(crate) fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
