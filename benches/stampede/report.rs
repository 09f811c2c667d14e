//! The stampede bench's table: one request as the client saw it, one
//! summarised line per row, and how the table is printed.

use std::time::{Duration, Instant};

use crate::common::loadgen::Class;
use crate::common::origin::{self, Scope};
use crate::common::{ms, quantile};
use crate::Row;

/// One request as the client saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub(crate) instance: usize,
    pub(crate) start: Instant,
    pub(crate) end: Instant,
    pub(crate) ok: bool,
    pub(crate) class: Class,
    /// When the server-side stack had the response ready (`x-bench-ready-us`).
    pub(crate) ready: Option<Instant>,
    /// Served at an `Age` of at least its max-age (1 s in these scenarios).
    pub(crate) past_max_age: bool,
}

/// One line of the table.
#[derive(Debug, Default)]
pub(crate) struct Line {
    pub(crate) requests: usize,
    pub(crate) origin_calls: u64,
    pub(crate) p50: Option<Duration>,
    pub(crate) p99: Option<Duration>,
    pub(crate) max: Option<Duration>,
    pub(crate) forwarded: usize,
    pub(crate) release_p50: Option<Duration>,
    pub(crate) release_p99: Option<Duration>,
    pub(crate) server_release_p50: Option<Duration>,
    pub(crate) server_release_p99: Option<Duration>,
    pub(crate) redis_per_request: Option<f64>,
    pub(crate) errors: usize,
    /// Responses served at an age past their max-age.
    pub(crate) past_max_age: usize,
    pub(crate) note: String,
}

pub(crate) fn ready_instant(us: Option<u64>) -> Option<Instant> {
    us.map(|us| origin::epoch() + Duration::from_micros(us))
}

pub(crate) fn summarize(
    row: Row,
    samples: &[Sample],
    fills: &[(usize, Instant)],
    scope: Scope,
) -> Line {
    let mut latencies: Vec<Duration> = samples
        .iter()
        .filter(|s| s.ok)
        .map(|s| s.end - s.start)
        .collect();
    let forwarded: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.ok && matches!(s.class, Class::Forwarded | Class::Uncached))
        .collect();
    // The fill a forwarded request waited on: the latest one in its scope
    // that landed while it was in flight.
    let fill_of = |s: &Sample| {
        fills
            .iter()
            .filter(|(i, _)| scope == Scope::Cluster || *i == s.instance)
            .map(|(_, at)| *at)
            .filter(|at| *at >= s.start && *at <= s.end)
            .max()
    };
    // Without a cache nobody waits for anybody: there is no release delay.
    let waiters: Vec<(&Sample, Instant)> = if matches!(row, Row::Floor | Row::NoCache) {
        Vec::new()
    } else {
        forwarded
            .iter()
            .filter_map(|s| fill_of(s).map(|f| (*s, f)))
            .collect()
    };
    let mut release: Vec<Duration> = waiters.iter().map(|(s, f)| s.end - *f).collect();
    let mut server_release: Vec<Duration> = waiters
        .iter()
        .filter_map(|(s, f)| s.ready.map(|r| r.saturating_duration_since(*f)))
        .collect();
    Line {
        requests: samples.len(),
        p50: quantile(&mut latencies, 0.50),
        p99: quantile(&mut latencies, 0.99),
        max: latencies.last().copied(),
        forwarded: forwarded.len(),
        release_p50: quantile(&mut release, 0.50),
        release_p99: quantile(&mut release, 0.99),
        server_release_p50: quantile(&mut server_release, 0.50),
        server_release_p99: quantile(&mut server_release, 0.99),
        errors: samples.iter().filter(|s| !s.ok).count(),
        past_max_age: samples.iter().filter(|s| s.ok && s.past_max_age).count(),
        ..Line::default()
    }
}

pub(crate) fn opt_ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_owned(), ms)
}

pub(crate) fn print_header() {
    println!(
        "{:<20} {:>6} {:>6} {:>8} {:>8} {:>8} {:>6} {:>8} {:>8} {:>8} {:>8} {:>7} {:>6}  note",
        "row",
        "reqs",
        "origin",
        "p50 ms",
        "p99 ms",
        "max ms",
        "fwd",
        "rel p50",
        "rel p99",
        "srv p50",
        "srv p99",
        "redis/r",
        "errors"
    );
}

pub(crate) fn print_line(row: Row, l: &Line) {
    println!(
        "{:<20} {:>6} {:>6} {:>8} {:>8} {:>8} {:>6} {:>8} {:>8} {:>8} {:>8} {:>7} {:>6}  {}",
        row.name(),
        l.requests,
        l.origin_calls,
        opt_ms(l.p50),
        opt_ms(l.p99),
        opt_ms(l.max),
        l.forwarded,
        opt_ms(l.release_p50),
        opt_ms(l.release_p99),
        opt_ms(l.server_release_p50),
        opt_ms(l.server_release_p99),
        l.redis_per_request
            .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}")),
        l.errors,
        l.note
    );
}
