//! Pieces the harness-less benches share: flags, a loopback HTTP/1.1 load
//! generator, the slow origin, and the Redis hook.
//!
//! Each bench includes this with `mod common;` and uses only part of it.
#![allow(dead_code, reason = "each bench binary uses a different part")]

pub(crate) mod args;
pub(crate) mod bare;
pub(crate) mod big;
pub(crate) mod burst;
pub(crate) mod chart;
pub(crate) mod hit;
pub(crate) mod loadgen;
pub(crate) mod metered;
pub(crate) mod origin;
pub(crate) mod peers;
pub(crate) mod redis;
pub(crate) mod timing;
pub(crate) mod wrk;
pub(crate) mod zipf;

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

/// Resident set size of this process in bytes (see [`rss_of`]).
pub(crate) fn rss_bytes() -> Option<u64> {
    rss_of("self")
}

/// Resident set size of process `pid` (`self` for this one) in bytes, from
/// `VmRSS` in `/proc/<pid>/status`: in kB whatever the page size.
pub(crate) fn rss_of(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `bytes` as `12.3 MiB`.
pub(crate) fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / 1048576.0)
}

/// The RSS the memory benches hold an instance to at `capacity` bytes:
/// 1.25 × capacity + 64 MiB, the bound the crate documents.
pub(crate) fn memory_bound(capacity: u64) -> u64 {
    capacity + capacity / 4 + 64 * 1048576
}
