//! `herdguard locks`: who holds one lock on every node, and whether that
//! makes a quorum. Reads only: never takes, extends or releases a lock.

use std::collections::BTreeMap;
use std::time::Duration;

use deadpool_redis::redis;
use futures_util::future::join_all;
use herdguard::inspect;
use herdguard::CacheKey;
use serde_json::{json, Value as Json};

use crate::conn::{bounded, check_namespace, check_nodes, connect};
use crate::report::{pttl_json, pttl_text, redact, Failure, Report, Verdict};

/// What one node says about the lock.
pub(crate) enum NodeLock {
    Held {
        token: String,
        pttl: i64,
    },
    Free,
    /// The key exists but is no string, so it holds no token.
    NotALock {
        kind: String,
        pttl: i64,
    },
    Unreachable(String),
}

impl NodeLock {
    fn exists(&self) -> bool {
        matches!(self, NodeLock::Held { .. } | NodeLock::NotALock { .. })
    }
}

pub(crate) fn lock_key(arg: &str, namespace: &str) -> String {
    if arg.contains('{') && arg.ends_with(":lock") {
        return arg.to_owned();
    }
    let key = inspect::parse_key(arg).unwrap_or_else(|| CacheKey::new(arg));
    inspect::entry_keys(namespace, &key).lock
}

/// Which key names the lock, and how it was chosen.
pub(crate) enum LockArg {
    /// This key exactly: a full lock key, a cache key's lock, or `--raw`.
    Exact(String),
    /// A resource name: its Redlock key, unless the name is itself a key
    /// that exists on some node (a lock another client made).
    Resource { derived: String, as_given: String },
}

pub(crate) fn lock_arg(arg: &str, namespace: &str, raw: bool) -> LockArg {
    let own_form =
        inspect::parse_key(arg).is_some() || (arg.contains('{') && arg.ends_with(":lock"));
    if raw {
        LockArg::Exact(arg.to_owned())
    } else if own_form {
        LockArg::Exact(lock_key(arg, namespace))
    } else {
        LockArg::Resource {
            derived: lock_key(arg, namespace),
            as_given: arg.to_owned(),
        }
    }
}

/// Token and PTTL of `keys` on one node: one round trip, plus a GET per string.
pub(crate) async fn probe_locks(url: &str, keys: &[&str], timeout: Duration) -> Vec<NodeLock> {
    let probe = async {
        let mut conn = connect(url, timeout).await?;
        // TYPE first: GET on a key of another type fails the whole pipeline.
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("TYPE").arg(*key).cmd("PTTL").arg(*key);
        }
        let heads: Vec<(String, i64)> = bounded(url, timeout, pipe.query_async(&mut conn)).await?;
        let mut states = Vec::with_capacity(keys.len());
        for (key, (kind, pttl)) in keys.iter().zip(heads) {
            states.push(match kind.as_str() {
                "none" => NodeLock::Free,
                "string" => {
                    let cmd = redis::cmd("GET").arg(*key).to_owned();
                    let token: Option<Vec<u8>> =
                        bounded(url, timeout, cmd.query_async(&mut conn)).await?;
                    match token {
                        Some(t) => NodeLock::Held {
                            token: String::from_utf8_lossy(&t).into_owned(),
                            pttl,
                        },
                        // Expired between TYPE and GET.
                        None => NodeLock::Free,
                    }
                }
                _ => NodeLock::NotALock { kind, pttl },
            });
        }
        Ok::<_, Failure>(states)
    };
    match probe.await {
        Ok(states) => states,
        Err(Failure(e)) => keys
            .iter()
            .map(|_| NodeLock::Unreachable(e.clone()))
            .collect(),
    }
}

/// `replicated`: the nodes are one primary and its replicas (from
/// `--sentinel`), where a lease has one holder, so two tokens are a split
/// whatever their counts (after a failover that lost a lease).
pub(crate) async fn locks(
    arg: &str,
    raw: bool,
    nodes: &[String],
    namespace: &str,
    (timeout, replicated): (Duration, bool),
) -> Result<Report, Failure> {
    check_namespace(namespace)?;
    check_nodes(nodes)?;
    let (key, form, states) = probe_arg(arg, raw, nodes, namespace, timeout).await?;
    let tally = Tally::of(&states);
    let n = nodes.len();
    let quorum = n / 2 + 1;
    let (state, mut verdict, summary) = if replicated && tally.counts.len() > 1 {
        let holders: Vec<String> = tally
            .counts
            .iter()
            .map(|(token, c)| format!("{token} on {c}"))
            .collect();
        (
            "split",
            Verdict::Problem,
            format!(
                "SPLIT: {} holders across the primary and its replicas ({})",
                tally.counts.len(),
                holders.join(", ")
            ),
        )
    } else {
        tally.verdict(n)
    };
    let mut problems = Vec::new();
    if tally.no_expiry > 0 {
        problems.push(format!(
            "the lock has no expiry on {} node(s): it never frees itself",
            tally.no_expiry
        ));
        verdict = Verdict::Problem;
    }
    if tally.not_a_lock > 0 {
        problems.push(format!(
            "the key is no string on {} node(s): not a lock token",
            tally.not_a_lock
        ));
        verdict = Verdict::Problem;
    }
    if matches!(verdict, Verdict::Healthy) && tally.unreachable > 0 {
        verdict = Verdict::Failure;
    }
    let json = json!({
        "key": key,
        "key_form": form,
        "nodes": nodes_json(nodes, &states),
        "quorum": quorum,
        "state": state,
        "holders": tally.counts,
        "unreachable": tally.unreachable,
        "problems": problems,
    });
    let given = if form == "as_given" {
        " (key as given)"
    } else {
        ""
    };
    let mut text = format!("lock {key}{given} on {n} node(s), quorum {quorum}\n");
    text.push_str(&nodes_text(nodes, &states));
    text.push_str(&format!("verdict: {summary}\n"));
    for p in &problems {
        text.push_str(&format!("PROBLEM: {p}\n"));
    }
    Ok(Report {
        verdict,
        json,
        text,
    })
}

/// The key the argument names (see [`LockArg`]), how it was chosen, and
/// what every node says about it.
async fn probe_arg(
    arg: &str,
    raw: bool,
    nodes: &[String],
    namespace: &str,
    timeout: Duration,
) -> Result<(String, &'static str, Vec<NodeLock>), Failure> {
    match lock_arg(arg, namespace, raw) {
        LockArg::Exact(key) => {
            let keys = [key.as_str()];
            let states = join_all(nodes.iter().map(|url| probe_locks(url, &keys, timeout))).await;
            let states: Vec<NodeLock> = states.into_iter().flatten().collect();
            Ok((key, "exact", states))
        }
        LockArg::Resource { derived, as_given } => {
            let keys = [as_given.as_str(), derived.as_str()];
            let both = join_all(nodes.iter().map(|url| probe_locks(url, &keys, timeout))).await;
            let (mut given, mut ours) = (Vec::new(), Vec::new());
            for mut pair in both {
                ours.push(pair.pop().unwrap_or(NodeLock::Free));
                given.push(pair.pop().unwrap_or(NodeLock::Free));
            }
            let given_exists = given.iter().any(NodeLock::exists);
            let ours_exists = ours.iter().any(NodeLock::exists);
            match (given_exists, ours_exists) {
                (true, true) => Err(Failure(format!(
                    "ambiguous: both the key {as_given:?} and the resource lock {derived} \
                     exist; pass --raw for the key, or the full lock key"
                ))),
                (true, false) => Ok((as_given, "as_given", given)),
                (false, _) => Ok((derived, "resource", ours)),
            }
        }
    }
}

/// The nodes' answers, counted.
struct Tally<'a> {
    /// Nodes per token held.
    counts: BTreeMap<&'a str, usize>,
    unreachable: usize,
    no_expiry: usize,
    not_a_lock: usize,
}

impl<'a> Tally<'a> {
    fn of(states: &'a [NodeLock]) -> Self {
        let mut t = Tally {
            counts: BTreeMap::new(),
            unreachable: 0,
            no_expiry: 0,
            not_a_lock: 0,
        };
        for s in states {
            match s {
                NodeLock::Held { token, pttl } => {
                    *t.counts.entry(token.as_str()).or_default() += 1;
                    t.no_expiry += usize::from(*pttl == -1);
                }
                NodeLock::Free => {}
                NodeLock::NotALock { .. } => t.not_a_lock += 1,
                NodeLock::Unreachable(_) => t.unreachable += 1,
            }
        }
        t
    }

    /// State label, verdict and one-line summary over `n` nodes. A problem
    /// is reported only when no answer from the unreachable nodes could
    /// change it; otherwise the verdict is unknown (exit 2).
    fn verdict(&self, n: usize) -> (&'static str, Verdict, String) {
        let quorum = n / 2 + 1;
        let unreachable = self.unreachable;
        let kinds = self.counts.len();
        let best = self
            .counts
            .iter()
            .max_by_key(|(_, c)| **c)
            .map(|(t, c)| (*t, *c));
        match best {
            None if unreachable == 0 => ("free", Verdict::Healthy, "free on every node".to_owned()),
            None => (
                "unknown",
                Verdict::Failure,
                format!("free on every reachable node, {unreachable} unreachable"),
            ),
            Some((token, c)) if c >= quorum => (
                "held",
                Verdict::Healthy,
                format!("held by {token} on {c}/{n} nodes (quorum {quorum})"),
            ),
            Some((_, c)) if c + unreachable < quorum && kinds > 1 => (
                "split",
                Verdict::Problem,
                format!(
                    "SPLIT: {kinds} different tokens, none on a quorum of {quorum}/{n} (most: {c})"
                ),
            ),
            Some((token, c)) if c + unreachable < quorum => (
                "under_quorum",
                Verdict::Problem,
                format!("held by {token} on only {c}/{n} nodes, below the quorum of {quorum}"),
            ),
            Some((_, c)) => (
                "unknown",
                Verdict::Failure,
                format!(
                    "{kinds} token(s), most on {c}/{n} nodes; {unreachable} unreachable node(s) decide the quorum"
                ),
            ),
        }
    }
}

fn nodes_json(nodes: &[String], states: &[NodeLock]) -> Vec<Json> {
    nodes
        .iter()
        .zip(states)
        .map(|(url, s)| match s {
            NodeLock::Held { token, pttl } => json!({
                "node": redact(url), "reachable": true, "token": token, "pttl_ms": pttl_json(*pttl),
            }),
            NodeLock::Free => json!({ "node": redact(url), "reachable": true, "token": null }),
            NodeLock::NotALock { kind, pttl } => json!({
                "node": redact(url), "reachable": true, "token": null, "type": kind, "pttl_ms": pttl_json(*pttl),
            }),
            NodeLock::Unreachable(e) => {
                json!({ "node": redact(url), "reachable": false, "error": e })
            }
        })
        .collect()
}

fn nodes_text(nodes: &[String], states: &[NodeLock]) -> String {
    let mut text = String::new();
    for (url, s) in nodes.iter().zip(states) {
        let what = match s {
            NodeLock::Held { token, pttl } => format!("{token}  {} left", pttl_text(*pttl)),
            NodeLock::Free => "free".to_owned(),
            NodeLock::NotALock { kind, pttl } => {
                format!("NOT A LOCK (a {kind}), {} left", pttl_text(*pttl))
            }
            NodeLock::Unreachable(e) => format!("UNREACHABLE ({e})"),
        };
        text.push_str(&format!("  {:<32} {what}\n", redact(url)));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A resource name maps to the Redlock key, a hex key to its lock, a full key to itself.
    #[test]
    fn lock_argument_forms() {
        let key = CacheKey::new("job");
        let expect = format!("ns:{{{}}}:lock", key.to_hex());
        assert_eq!(lock_key("job", "ns"), expect);
        assert_eq!(lock_key(&key.to_hex(), "ns"), expect);
        assert_eq!(lock_key(&expect, "other"), expect);
    }

    /// `--raw` keeps any name verbatim; without it a foreign name is probed both as given and as a resource.
    #[test]
    fn lock_argument_with_raw_and_foreign_names() {
        let own = lock_key("job", "ns");
        assert!(matches!(lock_arg("job", "ns", true), LockArg::Exact(k) if k == "job"));
        assert!(matches!(lock_arg(&own, "ns", false), LockArg::Exact(k) if k == own));
        assert!(matches!(
            lock_arg("lock:rebuild:{42}", "ns", false),
            LockArg::Resource { derived, as_given } if derived == lock_key("lock:rebuild:{42}", "ns") && as_given == "lock:rebuild:{42}"
        ));
    }
}
