//! `herdguard clock-skew`: the spread of the nodes' clocks against a
//! budget, from TIME samples. Sends nothing but TIME.

use std::time::{Duration, Instant};

use deadpool_redis::redis::{self, aio::MultiplexedConnection};
use futures_util::future::join_all;
use serde_json::{json, Value as Json};

use crate::conn::{bounded, check_nodes, connect};
use crate::report::{now_us, redact, Failure, Report, Verdict};

/// The best TIME sample of one node: the shortest round trip.
pub(crate) struct ClockSample {
    offset_us: i128,
    rtt_us: i128,
}

pub(crate) async fn clock_skew(
    nodes: &[String],
    samples: u32,
    budget_ms: u64,
    timeout: Duration,
) -> Result<Report, Failure> {
    check_nodes(nodes)?;
    let conns = join_all(nodes.iter().map(|url| connect(url, timeout))).await;
    let mut conns: Vec<Result<MultiplexedConnection, String>> = conns
        .into_iter()
        .map(|c| c.map_err(|Failure(e)| e))
        .collect();
    let best = sample(nodes, &mut conns, samples, timeout).await;

    let offsets: Vec<i128> = best.iter().flatten().map(|s| s.offset_us).collect();
    let unreachable = conns.iter().filter(|c| c.is_err()).count();
    let spread_us = match (offsets.iter().min(), offsets.iter().max()) {
        (Some(lo), Some(hi)) => hi - lo,
        _ => 0,
    };
    let uncertainty_us = best
        .iter()
        .flatten()
        .map(|s| s.rtt_us / 2)
        .max()
        .unwrap_or(0);
    let budget_us = i128::from(budget_ms) * 1000;
    let over = spread_us > budget_us;
    let verdict = if over {
        Verdict::Problem
    } else if unreachable > 0 || offsets.is_empty() {
        Verdict::Failure
    } else {
        Verdict::Healthy
    };

    let json = json!({
        "nodes": nodes_json(nodes, &best, &conns),
        "samples": samples,
        "spread_ms": ms(spread_us),
        "uncertainty_ms": ms(uncertainty_us),
        "budget_ms": budget_ms,
        "within_budget": !over,
        "unreachable": unreachable,
    });
    let mut text = format!(
        "clock offsets against this host (best of {samples} TIME samples, corrected by rtt/2)\n"
    );
    text.push_str(&nodes_text(nodes, &best, &conns));
    text.push_str(&format!(
        "spread {:.3} ms (± {:.3} ms) against a budget of {budget_ms} ms: {}\n",
        ms(spread_us),
        ms(uncertainty_us),
        if over { "OVER BUDGET" } else { "ok" }
    ));
    if unreachable > 0 {
        text.push_str(&format!(
            "{unreachable} node(s) unreachable: their clocks are unknown\n"
        ));
    }
    Ok(Report {
        verdict,
        json,
        text,
    })
}

/// Milliseconds from microseconds, for display.
fn ms(us: i128) -> f64 {
    us as f64 / 1000.0
}

/// Each node's sample with the shortest round trip, out of `samples`
/// rounds; a node that fails once is marked unreachable in `conns`.
async fn sample(
    nodes: &[String],
    conns: &mut [Result<MultiplexedConnection, String>],
    samples: u32,
    timeout: Duration,
) -> Vec<Option<ClockSample>> {
    let mut best: Vec<Option<ClockSample>> = nodes.iter().map(|_| None).collect();
    // Round robin, one node at a time: concurrent samples would count each
    // other's scheduling delay as round-trip time.
    for _ in 0..samples {
        for (i, url) in nodes.iter().enumerate() {
            let Some(Ok(conn)) = conns.get_mut(i) else {
                continue;
            };
            let sent_us = now_us();
            let start = Instant::now();
            let reply: Result<(i128, i128), Failure> =
                bounded(url, timeout, redis::cmd("TIME").query_async(conn)).await;
            let rtt_us = start.elapsed().as_micros() as i128;
            match reply {
                Ok((secs, micros)) => {
                    let server_us = secs * 1_000_000 + micros;
                    let sample = ClockSample {
                        offset_us: server_us - (sent_us + rtt_us / 2),
                        rtt_us,
                    };
                    if best[i].as_ref().is_none_or(|b| sample.rtt_us < b.rtt_us) {
                        best[i] = Some(sample);
                    }
                }
                Err(Failure(e)) => conns[i] = Err(e),
            }
        }
    }
    best
}

type Conns = [Result<MultiplexedConnection, String>];

fn nodes_json(nodes: &[String], best: &[Option<ClockSample>], conns: &Conns) -> Vec<Json> {
    nodes
        .iter()
        .zip(best)
        .zip(conns)
        .map(|((url, b), c)| match (b, c) {
            (Some(s), Ok(_)) => json!({
                "node": redact(url), "reachable": true,
                "offset_ms": ms(s.offset_us), "rtt_ms": ms(s.rtt_us),
            }),
            (_, Err(e)) => json!({ "node": redact(url), "reachable": false, "error": e }),
            (None, Ok(_)) => {
                json!({ "node": redact(url), "reachable": false, "error": "no sample" })
            }
        })
        .collect()
}

fn nodes_text(nodes: &[String], best: &[Option<ClockSample>], conns: &Conns) -> String {
    let mut text = String::new();
    for ((url, b), c) in nodes.iter().zip(best).zip(conns) {
        let what = match (b, c) {
            (Some(s), Ok(_)) => format!("{:+.3} ms  (rtt {:.3} ms)", ms(s.offset_us), ms(s.rtt_us)),
            (_, Err(e)) => format!("UNREACHABLE ({e})"),
            (None, Ok(_)) => "no sample".to_owned(),
        };
        text.push_str(&format!("  {:<32} {what}\n", redact(url)));
    }
    text
}
