//! The origin-load bench's flags and the settings read from them.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::args::Args;
use crate::common::peers::herdguard_bin;

pub(crate) const USAGE: &str =
    "cargo bench --bench origin_load -- [--only many,outage,cold] [--keys 5000] \
[--zipf 1.1] [--origin-delay-ms 50] [--max-age 1] [--connections 64] [--wrk-threads 2] \
[--seconds 8] [--outage-at 2] [--heal-seconds 4] [--cold-keys 5000] [--cold-connections 256] \
[--cold-knee 32] [--budget 32] [--cold-bound-secs 120] [--instances 4] [--body-bytes 512] \
[--timeout-secs 10] [--max-requests 2000000] [--proxy-bin PATH] [--herdguard-args='--flag value …']";

pub(crate) const FLAGS: &[&str] = &[
    "only",
    "keys",
    "zipf",
    "origin-delay-ms",
    "max-age",
    "connections",
    "wrk-threads",
    "seconds",
    "outage-at",
    "heal-seconds",
    "cold-keys",
    "cold-connections",
    "cold-knee",
    "budget",
    "cold-bound-secs",
    "instances",
    "body-bytes",
    "timeout-secs",
    "max-requests",
    "proxy-bin",
    "herdguard-args",
];

/// The run's settings, from flags.
pub(crate) struct Settings {
    pub(crate) only: Vec<String>,
    pub(crate) keys: u32,
    pub(crate) zipf: f64,
    pub(crate) delay: Duration,
    pub(crate) max_age: u64,
    pub(crate) connections: usize,
    pub(crate) wrk_threads: usize,
    pub(crate) seconds: u64,
    pub(crate) outage_at: u64,
    pub(crate) heal_seconds: u64,
    pub(crate) cold_keys: u64,
    pub(crate) cold_connections: usize,
    pub(crate) cold_knee: u64,
    pub(crate) budget: u64,
    pub(crate) cold_bound: Duration,
    pub(crate) instances: usize,
    pub(crate) body_bytes: usize,
    pub(crate) timeout: Duration,
    /// Per wrk run, a bound beside its duration.
    pub(crate) max_requests: u64,
    pub(crate) bin: Result<PathBuf, String>,
    pub(crate) herdguard_args: Vec<String>,
    /// Where the generated wrk scripts go; removed at the end.
    pub(crate) dir: PathBuf,
}

impl Settings {
    pub(crate) fn from_args(args: &Args) -> Self {
        let seconds = args.get("seconds", 8u64).clamp(1, 600);
        Self {
            only: args
                .value("only")
                .unwrap_or("many,outage,cold")
                .split(',')
                .map(str::to_owned)
                .collect(),
            keys: args.get("keys", 5000u32).clamp(1, 1_000_000),
            zipf: args.get("zipf", 1.1f64),
            delay: Duration::from_millis(args.get("origin-delay-ms", 50u64)),
            max_age: args.get("max-age", 1u64).max(1),
            connections: args.get("connections", 64usize).clamp(1, 4096),
            wrk_threads: args.get("wrk-threads", 2usize).clamp(1, 64),
            seconds,
            outage_at: args.get("outage-at", 2u64).clamp(1, seconds.max(2) - 1),
            heal_seconds: args.get("heal-seconds", 4u64).clamp(1, 600),
            cold_keys: args.get("cold-keys", 5000u64).max(1),
            cold_connections: args.get("cold-connections", 256usize).clamp(1, 4096),
            cold_knee: args.get("cold-knee", 32u64).max(1),
            budget: args.get("budget", 32u64).max(1),
            cold_bound: Duration::from_secs(args.get("cold-bound-secs", 120u64).max(1)),
            instances: args.get("instances", 4usize).clamp(1, 64),
            body_bytes: args.get("body-bytes", 512usize),
            timeout: Duration::from_secs(args.get("timeout-secs", 10u64).max(1)),
            max_requests: args.get("max-requests", 2_000_000u64).max(1),
            bin: herdguard_bin(args.value("proxy-bin")),
            herdguard_args: args
                .value("herdguard-args")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
            dir: std::env::temp_dir().join(format!("herdguard-origin-load-{}", std::process::id())),
        }
    }

    pub(crate) fn selected(&self, scenario: &str) -> bool {
        self.only.iter().any(|o| o == scenario)
    }
}
