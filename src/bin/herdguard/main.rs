//! `herdguard`: diagnostics for the Redis side of a herdguard deployment.
//!
//! ```text
//! herdguard inspect <url-or-key> [--raw] --redis URL [--namespace NS]
//! herdguard locks <lock-key-or-resource> [--raw] --nodes URL,URL,... [--namespace NS]
//! herdguard clock-skew --nodes URL,URL,... [--samples N] [--budget-ms MS]
//! herdguard purge <url-or-key | --tag TAG> --redis URL [--namespace NS]
//! herdguard proxy --upstream URL [--listen ADDR] [--admin ADDR] ...
//! ```
//!
//! `proxy` runs the caching reverse proxy (src/bin/herdguard/proxy/); it
//! runs until SIGTERM or SIGINT and exits 0 after a graceful stop.
//!
//! Exit codes: 0 healthy, 1 problem found, 2 usage or connection error.
//! `--json` prints one JSON object on stdout instead of text. Every Redis
//! call is bounded by `--timeout-ms` (default 1000). Credentials in URLs are
//! never printed.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod proxy;
mod proxy_cmd;

use clap::{ArgGroup, Parser, Subcommand};
use deadpool_redis::redis::{self, aio::MultiplexedConnection, AsyncConnectionConfig};
use futures_util::future::join_all;
use herdguard::inspect::{self, Purge};
use herdguard::{CacheKey, CacheLayer, RedisOptions};
use serde_json::{json, Value as Json};

#[derive(Debug, Parser)]
#[command(
    name = "herdguard",
    version,
    about = "herdguard's caching reverse proxy, and diagnostics for its Redis: entries, locks, clock skew, purges.",
    after_help = "Exit codes: 0 healthy, 1 problem found, 2 usage or connection error."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Print one JSON object instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// Bound on each Redis connect and each command, in milliseconds.
    #[arg(long, global = true, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    timeout_ms: u64,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the caching reverse proxy in front of an HTTP API.
    ///
    /// Every option can also be set by its environment variable or in the
    /// --config file. Logs go to stderr (HERDGUARD_LOG sets the filter,
    /// e.g. `info,herdguard::access=off`); one line on stdout says where it
    /// listens.
    Proxy(Box<proxy_cmd::ProxyArgs>),
    /// One entry's status, size, freshness, hard TTL, lock and fence.
    ///
    /// TARGET is a 32-hex cache key, or an absolute URL turned into the key
    /// the layer derives for a plain GET of it (host and port, path,
    /// query; no Authorization, no key headers, no Vary variant). Anything
    /// else that exists as a Redis key, or any TARGET with `--raw`, is read
    /// as that key: its type, value and PTTL.
    Inspect {
        /// A 32-hex cache key, an http(s) URL, or a Redis key.
        target: String,
        /// Read TARGET as a Redis key, verbatim.
        #[arg(long)]
        raw: bool,
        /// The Redis the layer uses (redis://[user:pass@]host:port[/db]).
        #[arg(long)]
        redis: String,
        /// The layer's Redis namespace.
        #[arg(long, default_value = "herdguard")]
        namespace: String,
    },
    /// The holder of one lock on every node: flags splits and locks held
    /// on fewer than a quorum.
    ///
    /// LOCK is a full key (`ns:{H}:lock`), a 32-hex cache key, or a
    /// resource name as given to `Redlock::acquire` (H = its CacheKey). A
    /// name that exists as a key on some node, such as a lock other clients
    /// made (`lock:rebuild:{42}`), is read as that key; `--raw` always does.
    Locks {
        /// Lock key, cache key, resource name, or any Redis key.
        lock: String,
        /// Read LOCK as a Redis key, verbatim.
        #[arg(long)]
        raw: bool,
        /// Every Redlock node, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<String>,
        /// The lock's namespace.
        #[arg(long, default_value = "herdguard")]
        namespace: String,
    },
    /// Sample TIME on every node, correct for round trips, and compare the
    /// spread of the clocks with a budget.
    ClockSkew {
        /// Every node, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<String>,
        /// TIME samples per node (the one with the shortest round trip counts).
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
        samples: u32,
        /// Largest tolerated spread in ms (default: Redlock's drift allowance,
        /// 10 s TTL × 0.01).
        #[arg(long, default_value_t = 100)]
        budget_ms: u64,
    },
    /// Delete entries from Redis through the layer's own purge path and tell
    /// every instance to drop its memory copies.
    #[command(group(ArgGroup::new("what").required(true).args(["target", "tag"])))]
    Purge {
        /// A URL (every stored variant of it) or a 32-hex cache key.
        target: Option<String>,
        /// Purge every entry tagged with this Surrogate-Key tag.
        #[arg(long)]
        tag: Option<String>,
        /// The Redis the layer uses.
        #[arg(long)]
        redis: String,
        /// The layer's Redis namespace.
        #[arg(long, default_value = "herdguard")]
        namespace: String,
    },
}

/// How a command ended; the process exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    Healthy = 0,
    Problem = 1,
    Failure = 2,
}

/// A usage or connection error: printed, exit 2.
#[derive(Debug)]
struct Failure(String);

/// A command's result: the verdict, the JSON form and the text form.
struct Report {
    verdict: Verdict,
    json: Json,
    text: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = match cli.command {
        Command::Proxy(args) => return proxy_cmd::main(*args),
        other => other,
    };
    let timeout = Duration::from_millis(cli.timeout_ms);
    let as_json = cli.json;
    let result = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(run(command, timeout)),
        Err(e) => Err(Failure(format!("cannot start the runtime: {e}"))),
    };
    let (verdict, json, text) = match result {
        Ok(r) => (r.verdict, r.json, r.text),
        Err(Failure(msg)) => {
            eprintln!("herdguard: {msg}");
            (Verdict::Failure, json!({ "error": msg }), String::new())
        }
    };
    if as_json {
        println!("{json}");
    } else if !text.is_empty() {
        print!("{text}");
    }
    ExitCode::from(verdict as u8)
}

async fn run(command: Command, timeout: Duration) -> Result<Report, Failure> {
    match command {
        Command::Proxy(_) => Err(Failure("the proxy runs from main".into())),
        Command::Inspect {
            target,
            raw,
            redis,
            namespace,
        } => {
            let names_entry = inspect::parse_key(&target).is_some() || parse_url(&target).is_ok();
            if raw {
                inspect_raw(&target, &redis, timeout).await
            } else if names_entry {
                inspect_entry(&target, &redis, &namespace, timeout).await
            } else {
                inspect_as_given(&target, &redis, timeout).await
            }
        }
        Command::Locks {
            lock,
            raw,
            nodes,
            namespace,
        } => locks(&lock, raw, &nodes, &namespace, timeout).await,
        Command::ClockSkew {
            nodes,
            samples,
            budget_ms,
        } => clock_skew(&nodes, samples, budget_ms, timeout).await,
        Command::Purge {
            target,
            tag,
            redis,
            namespace,
        } => purge(target.as_deref(), tag, &redis, &namespace, timeout).await,
    }
}

// ---------------------------------------------------------------- inspect

/// Where a key came from: given as hex, or derived from a URL.
struct Resolved {
    key: CacheKey,
    url: Option<(String, CacheKey)>,
}

fn resolve_target(target: &str) -> Result<Resolved, Failure> {
    if let Some(key) = inspect::parse_key(target) {
        return Ok(Resolved { key, url: None });
    }
    let uri = parse_url(target)?;
    let layer = CacheLayer::new();
    let request = http::Request::get(uri.clone())
        .body(())
        .map_err(|e| Failure(format!("cannot build a request for {target:?}: {e}")))?;
    Ok(Resolved {
        key: layer.key_for(&request),
        url: Some((uri.to_string(), layer.url_key(&uri))),
    })
}

fn parse_url(target: &str) -> Result<http::Uri, Failure> {
    let bad = || {
        Failure(format!(
            "{target:?} is neither a 32-hex cache key nor an absolute http(s) URL"
        ))
    };
    let uri: http::Uri = target.parse().map_err(|_| bad())?;
    let http_scheme = matches!(uri.scheme_str(), Some("http" | "https"));
    if !http_scheme || uri.host().is_none_or(str::is_empty) {
        return Err(bad());
    }
    Ok(uri)
}

async fn inspect_entry(
    target: &str,
    url: &str,
    namespace: &str,
    timeout: Duration,
) -> Result<Report, Failure> {
    check_namespace(namespace)?;
    let resolved = resolve_target(target)?;
    let names = inspect::entry_keys(namespace, &resolved.key);
    let mut conn = connect(url, timeout).await?;
    let mut pipe = redis::pipe();
    pipe.cmd("GET").arg(&names.value);
    pipe.cmd("PTTL").arg(&names.value);
    pipe.cmd("PTTL").arg(&names.fresh);
    pipe.cmd("GET").arg(&names.lock);
    pipe.cmd("PTTL").arg(&names.lock);
    pipe.cmd("HMGET")
        .arg(&names.fence)
        .arg("next")
        .arg("hw")
        .arg("rejected");
    pipe.cmd("PTTL").arg(&names.pass);
    type Reply = (
        Option<Vec<u8>>,
        i64,
        i64,
        Option<Vec<u8>>,
        i64,
        (Option<u64>, Option<u64>, Option<u64>),
        i64,
    );
    let (value, value_pttl, fresh_pttl, lock, lock_pttl, (next, hw, rejected), pass_pttl): Reply =
        bounded(url, timeout, pipe.query_async(&mut conn)).await?;

    let mut problems = Vec::new();
    let envelope = value.as_deref().map(inspect::decode_envelope);
    let status = match &envelope {
        None => "missing",
        Some(Err(_)) => "corrupt",
        Some(Ok(_)) if fresh_pttl > 0 || fresh_pttl == -1 => "fresh",
        Some(Ok(_)) => "stale",
    };
    if let Some(Err(e)) = &envelope {
        problems.push(format!(
            "entry is corrupt ({e}): the cache treats it as a miss and overwrites it"
        ));
    }
    if value.is_some() && value_pttl == -1 {
        problems.push("entry has no expiry: the layer always sets one".to_owned());
    }
    if lock.is_some() && lock_pttl == -1 {
        problems.push("lock has no expiry: nobody else can ever lead this key".to_owned());
    }
    if let (Some(next), Some(hw)) = (next, hw) {
        if hw > next {
            problems.push(format!(
                "fence high-water mark {hw} is above the last issued token {next}"
            ));
        }
    }
    let lock_token = lock
        .as_deref()
        .map(|t| String::from_utf8_lossy(t).into_owned());
    let verdict = if problems.is_empty() {
        Verdict::Healthy
    } else {
        Verdict::Problem
    };

    let env = envelope.as_ref().and_then(|e| e.as_ref().ok());
    let stored_ago_ms = env.map(|e| now_ms().saturating_sub(e.stored_at_ms));
    let json = json!({
        "key": resolved.key.to_hex(),
        "url": resolved.url.as_ref().map(|(u, _)| u),
        "url_key": resolved.url.as_ref().map(|(_, k)| k.to_hex()),
        "namespace": namespace,
        "redis": redact(url),
        "keys": {
            "value": names.value, "fresh": names.fresh, "lock": names.lock,
            "fence": names.fence, "pass": names.pass,
        },
        "status": status,
        "stored_bytes": value.as_ref().map(Vec::len),
        "payload_bytes": env.map(|e| e.payload_bytes),
        "http_status": env.and_then(|e| e.http_status),
        "tags": env.map(|e| &e.tags),
        "stored_at_ms": env.map(|e| e.stored_at_ms),
        "stored_ago_ms": stored_ago_ms,
        "entry_fence": env.map(|e| e.fence),
        "fresh_for_ms": env.map(|e| e.fresh_ms),
        "stale_for_ms": env.map(|e| e.stale_ms),
        "fresh_left_ms": pttl_json(fresh_pttl),
        "hard_ttl_ms": pttl_json(value_pttl),
        "lock": {
            "held": lock_token.is_some(),
            "token": lock_token,
            "pttl_ms": pttl_json(lock_pttl),
        },
        "fence": { "next": next, "hw": hw, "rejected": rejected },
        "pass_left_ms": pttl_json(pass_pttl),
        "problems": problems,
    });

    let mut text = String::new();
    let mut line = |k: &str, v: String| text.push_str(&format!("{k:<12}{v}\n"));
    line("key", resolved.key.to_hex());
    if let Some((u, k)) = &resolved.url {
        line("url", format!("GET {u} (url key {})", k.to_hex()));
    }
    line("redis", format!("{} namespace {namespace}", redact(url)));
    line("status", status.to_owned());
    if let Some(bytes) = &value {
        let mut size = format!("{} bytes stored", bytes.len());
        if let Some(e) = env {
            size.push_str(&format!(", {} payload", e.payload_bytes));
            if let Some(s) = e.http_status {
                size.push_str(&format!(", HTTP {s}"));
            }
            if !e.tags.is_empty() {
                size.push_str(&format!(", tags: {}", e.tags.join(" ")));
            }
        }
        line("size", size);
    }
    if let Some(e) = env {
        line(
            "stored",
            format!(
                "{} ago by fence {}; fresh for {}, then stale for {}",
                secs(stored_ago_ms.unwrap_or(0)),
                e.fence,
                secs(e.fresh_ms),
                secs(e.stale_ms)
            ),
        );
    }
    line("fresh left", pttl_text(fresh_pttl));
    line("hard TTL", pttl_text(value_pttl));
    line(
        "lock",
        match &lock_token {
            Some(t) => format!("held by {t}, {} left", pttl_text(lock_pttl)),
            None => "free".to_owned(),
        },
    );
    let num = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
    line(
        "fence",
        format!(
            "next {}, high-water {}, rejected writes {}",
            num(next),
            num(hw),
            num(rejected)
        ),
    );
    if pass_pttl > 0 {
        line(
            "pass",
            format!("hit-for-pass marker, {} left", pttl_text(pass_pttl)),
        );
    }
    for p in &problems {
        text.push_str(&format!("PROBLEM     {p}\n"));
    }
    Ok(Report {
        verdict,
        json,
        text,
    })
}

// ---------------------------------------------------------------- raw keys

/// A TARGET that is neither a cache key nor a URL: read it as a key if one
/// of that name exists, else it is a usage error.
async fn inspect_as_given(target: &str, url: &str, timeout: Duration) -> Result<Report, Failure> {
    let neither = format!("{target:?} is neither a 32-hex cache key nor an absolute http(s) URL");
    let mut conn = connect(url, timeout).await.map_err(|Failure(e)| {
        Failure(format!(
            "{neither}, and whether it names a key is unknown: {e}"
        ))
    })?;
    let kind: String = bounded(
        url,
        timeout,
        redis::cmd("TYPE").arg(target).query_async(&mut conn),
    )
    .await?;
    if kind == "none" {
        return Err(Failure(format!(
            "{neither}, nor a key in {} (--raw reads a key that does not exist yet)",
            redact(url)
        )));
    }
    inspect_raw(target, url, timeout).await
}

/// Longest value printed as text, in characters.
const SHOWN_VALUE_CHARS: usize = 256;

/// Any key, verbatim: its type, PTTL and, for a string, its value (a lock's
/// token) and, when it is one, the entry envelope in it.
async fn inspect_raw(key: &str, url: &str, timeout: Duration) -> Result<Report, Failure> {
    let mut conn = connect(url, timeout).await?;
    let mut pipe = redis::pipe();
    pipe.cmd("TYPE").arg(key).cmd("PTTL").arg(key);
    let (kind, pttl): (String, i64) = bounded(url, timeout, pipe.query_async(&mut conn)).await?;
    let value: Option<Vec<u8>> = if kind == "string" {
        bounded(
            url,
            timeout,
            redis::cmd("GET").arg(key).query_async(&mut conn),
        )
        .await?
    } else {
        None
    };
    let text_value = value
        .as_deref()
        .and_then(|v| std::str::from_utf8(v).ok())
        .filter(|v| !v.chars().any(char::is_control));
    let shown = text_value.map(|v| match v.char_indices().nth(SHOWN_VALUE_CHARS) {
        Some((cut, _)) => format!("{}…", &v[..cut]),
        None => v.to_owned(),
    });
    let envelope = value
        .as_deref()
        .and_then(|v| inspect::decode_envelope(v).ok());
    let status = if kind == "none" { "missing" } else { "present" };
    let json = json!({
        "key": key,
        "raw": true,
        "redis": redact(url),
        "status": status,
        "type": kind,
        "pttl_ms": pttl_json(pttl),
        "bytes": value.as_ref().map(Vec::len),
        "value": shown,
        "entry": envelope.as_ref().map(|e| json!({
            "fence": e.fence, "http_status": e.http_status,
            "payload_bytes": e.payload_bytes, "tags": e.tags,
        })),
        "problems": [],
    });
    let mut text = String::new();
    let mut line = |k: &str, v: String| text.push_str(&format!("{k:<12}{v}\n"));
    line("key", format!("{key} (as given)"));
    line("redis", redact(url));
    line("type", kind.clone());
    if let Some(v) = &value {
        let what = match (&shown, &envelope) {
            (_, Some(e)) => format!(
                "herdguard entry: fence {}, {} payload bytes{}",
                e.fence,
                e.payload_bytes,
                e.http_status
                    .map_or_else(String::new, |s| format!(", HTTP {s}"))
            ),
            (Some(t), None) => t.clone(),
            (None, None) => format!("{} binary bytes", v.len()),
        };
        line("value", what);
    }
    line("TTL", pttl_text(pttl));
    Ok(Report {
        verdict: Verdict::Healthy,
        json,
        text,
    })
}

// ---------------------------------------------------------------- locks

/// What one node says about the lock.
enum NodeLock {
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

fn lock_key(arg: &str, namespace: &str) -> String {
    if arg.contains('{') && arg.ends_with(":lock") {
        return arg.to_owned();
    }
    let key = inspect::parse_key(arg).unwrap_or_else(|| CacheKey::new(arg));
    inspect::entry_keys(namespace, &key).lock
}

/// Which key names the lock, and how it was chosen.
enum LockArg {
    /// This key exactly: a full lock key, a cache key's lock, or `--raw`.
    Exact(String),
    /// A resource name: its Redlock key, unless the name is itself a key
    /// that exists on some node (a lock another client made).
    Resource { derived: String, as_given: String },
}

fn lock_arg(arg: &str, namespace: &str, raw: bool) -> LockArg {
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
async fn probe_locks(url: &str, keys: &[&str], timeout: Duration) -> Vec<NodeLock> {
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

async fn locks(
    arg: &str,
    raw: bool,
    nodes: &[String],
    namespace: &str,
    timeout: Duration,
) -> Result<Report, Failure> {
    check_namespace(namespace)?;
    check_nodes(nodes)?;
    let (key, form, states) = match lock_arg(arg, namespace, raw) {
        LockArg::Exact(key) => {
            let keys = [key.as_str()];
            let states = join_all(nodes.iter().map(|url| probe_locks(url, &keys, timeout))).await;
            let states: Vec<NodeLock> = states.into_iter().flatten().collect();
            (key, "exact", states)
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
                (true, true) => {
                    return Err(Failure(format!(
                        "ambiguous: both the key {as_given:?} and the resource lock {derived} \
                         exist; pass --raw for the key, or the full lock key"
                    )));
                }
                (true, false) => (as_given, "as_given", given),
                (false, _) => (derived, "resource", ours),
            }
        }
    };

    let n = nodes.len();
    let quorum = n / 2 + 1;
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut unreachable = 0;
    let mut no_expiry = 0;
    let mut not_a_lock = 0;
    for s in &states {
        match s {
            NodeLock::Held { token, pttl } => {
                *counts.entry(token.as_str()).or_default() += 1;
                no_expiry += usize::from(*pttl == -1);
            }
            NodeLock::Free => {}
            NodeLock::NotALock { .. } => not_a_lock += 1,
            NodeLock::Unreachable(_) => unreachable += 1,
        }
    }
    let best = counts
        .iter()
        .max_by_key(|(_, c)| **c)
        .map(|(t, c)| (*t, *c));
    // A problem is reported only when no answer from the unreachable nodes
    // could change it; otherwise the verdict is unknown (exit 2).
    let (state, mut verdict, summary) = match best {
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
        Some((_, c)) if c + unreachable < quorum && counts.len() > 1 => (
            "split",
            Verdict::Problem,
            format!(
                "SPLIT: {} different tokens, none on a quorum of {quorum}/{n} (most: {c})",
                counts.len()
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
                "{} token(s), most on {c}/{n} nodes; {unreachable} unreachable node(s) decide the quorum",
                counts.len()
            ),
        ),
    };
    let mut problems = Vec::new();
    if no_expiry > 0 {
        problems.push(format!(
            "the lock has no expiry on {no_expiry} node(s): it never frees itself"
        ));
        verdict = Verdict::Problem;
    }
    if not_a_lock > 0 {
        problems.push(format!(
            "the key is no string on {not_a_lock} node(s): not a lock token"
        ));
        verdict = Verdict::Problem;
    }
    if matches!(verdict, Verdict::Healthy) && unreachable > 0 {
        verdict = Verdict::Failure;
    }

    let node_json: Vec<Json> = nodes
        .iter()
        .zip(&states)
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
        .collect();
    let json = json!({
        "key": key,
        "key_form": form,
        "nodes": node_json,
        "quorum": quorum,
        "state": state,
        "holders": counts,
        "unreachable": unreachable,
        "problems": problems,
    });
    let given = if form == "as_given" {
        " (key as given)"
    } else {
        ""
    };
    let mut text = format!("lock {key}{given} on {n} node(s), quorum {quorum}\n");
    for (url, s) in nodes.iter().zip(&states) {
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

// ---------------------------------------------------------------- clock-skew

/// The best TIME sample of one node: the shortest round trip.
struct ClockSample {
    offset_us: i128,
    rtt_us: i128,
}

async fn clock_skew(
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
    let ms = |us: i128| us as f64 / 1000.0;

    let node_json: Vec<Json> = nodes
        .iter()
        .zip(&best)
        .zip(&conns)
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
        .collect();
    let json = json!({
        "nodes": node_json,
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
    for ((url, b), c) in nodes.iter().zip(&best).zip(&conns) {
        let what = match (b, c) {
            (Some(s), Ok(_)) => format!("{:+.3} ms  (rtt {:.3} ms)", ms(s.offset_us), ms(s.rtt_us)),
            (_, Err(e)) => format!("UNREACHABLE ({e})"),
            (None, Ok(_)) => "no sample".to_owned(),
        };
        text.push_str(&format!("  {:<32} {what}\n", redact(url)));
    }
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

// ---------------------------------------------------------------- purge

async fn purge(
    target: Option<&str>,
    tag: Option<String>,
    url: &str,
    namespace: &str,
    timeout: Duration,
) -> Result<Report, Failure> {
    check_namespace(namespace)?;
    let (what, described) = match (target, tag) {
        (_, Some(tag)) if tag.is_empty() || tag.contains(char::is_whitespace) => {
            return Err(Failure(
                "a tag is one Surrogate-Key token: not empty, no spaces".to_owned(),
            ))
        }
        (_, Some(tag)) => (Purge::Tag(tag.clone()), json!({ "tag": tag })),
        (Some(t), None) => match inspect::parse_key(t) {
            Some(key) => (Purge::Key(key), json!({ "key": key.to_hex() })),
            None => {
                let uri = parse_url(t)?;
                let key = CacheLayer::new().url_key(&uri);
                (
                    Purge::Key(key),
                    json!({ "url": uri.to_string(), "url_key": key.to_hex() }),
                )
            }
        },
        (None, None) => return Err(Failure("give a URL, a key or --tag".to_owned())),
    };
    // The layer's breaker reports any failure as "unavailable"; a direct
    // PING first tells the operator why (refused, auth, timeout).
    let mut conn = connect(url, timeout).await?;
    let _: String = bounded(url, timeout, redis::cmd("PING").query_async(&mut conn)).await?;
    let layer = CacheLayer::builder()
        .redis(
            RedisOptions::new(url)
                .namespace(namespace)
                .connections(1)
                .connect_timeout(timeout)
                .response_timeout(timeout)
                .pool_wait_timeout(timeout),
        )
        .build()
        .map_err(|e| Failure(redact_text(&format!("{e}: {}", source_text(&e)))))?;
    // A purge is a handful of sequential calls, each bounded by `timeout`.
    let bound = timeout * 8;
    match tokio::time::timeout(bound, inspect::purge_and_wait(&layer, what)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            return Err(Failure(format!(
                "{} ({})",
                redact_text(&e.to_string()),
                redact(url)
            )))
        }
        Err(_) => {
            return Err(Failure(format!(
                "purge at {} did not finish within {bound:?}",
                redact(url)
            )))
        }
    }
    let text = match &described {
        d if d.get("tag").is_some() => format!(
            "purged every entry tagged {} in {} namespace {namespace}; purge notice published\n",
            d["tag"],
            redact(url)
        ),
        d if d.get("url").is_some() => format!(
            "purged every variant of {} (url key {}) in {} namespace {namespace}; purge notice published\n",
            d["url"],
            d["url_key"],
            redact(url)
        ),
        d => format!(
            "purged key {} in {} namespace {namespace}; purge notice published\n",
            d["key"],
            redact(url)
        ),
    };
    let json = json!({
        "purged": described,
        "redis": redact(url),
        "namespace": namespace,
        "notice_published": true,
    });
    Ok(Report {
        verdict: Verdict::Healthy,
        json,
        text,
    })
}

// ---------------------------------------------------------------- helpers

async fn connect(url: &str, timeout: Duration) -> Result<MultiplexedConnection, Failure> {
    let client = redis::Client::open(url).map_err(|e| {
        Failure(format!(
            "invalid redis url {}: {}",
            redact(url),
            redact_text(&e.to_string())
        ))
    })?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    // The outer bound covers anything the connection timeout does not.
    match tokio::time::timeout(
        timeout,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(Failure(format!(
            "cannot connect to {}: {}",
            redact(url),
            redact_text(&e.to_string())
        ))),
        Err(_) => Err(Failure(format!(
            "cannot connect to {}: timed out after {timeout:?}",
            redact(url)
        ))),
    }
}

/// A Redis call bounded by `timeout`, its errors redacted.
async fn bounded<T>(
    url: &str,
    timeout: Duration,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Failure(format!(
            "{}: {}",
            redact(url),
            redact_text(&e.to_string())
        ))),
        Err(_) => Err(Failure(format!(
            "{}: no reply within {timeout:?}",
            redact(url)
        ))),
    }
}

fn check_namespace(ns: &str) -> Result<(), Failure> {
    let ok = !ns.is_empty()
        && ns.len() <= 64
        && ns
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Failure(format!(
            "namespace {ns:?} must be 1-64 characters of letters, digits, '_', '-', '.', ':'"
        )))
    }
}

fn check_nodes(nodes: &[String]) -> Result<(), Failure> {
    if nodes.is_empty() || nodes.iter().any(|n| n.trim().is_empty()) {
        return Err(Failure(
            "--nodes needs one or more URLs, comma-separated".to_owned(),
        ));
    }
    Ok(())
}

/// The URL without credentials.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// Text (an error message) with every URL in it redacted.
fn redact_text(s: &str) -> String {
    if !s.contains("://") {
        return s.to_owned();
    }
    s.split(' ').map(redact).collect::<Vec<_>>().join(" ")
}

fn source_text(e: &dyn std::error::Error) -> String {
    e.source().map(ToString::to_string).unwrap_or_default()
}

fn now_us() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i128)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// PTTL as JSON: milliseconds, `null` for an absent key, `-1` for no expiry.
fn pttl_json(pttl: i64) -> Json {
    match pttl {
        -2 => Json::Null,
        ms => json!(ms),
    }
}

fn pttl_text(pttl: i64) -> String {
    match pttl {
        -2 => "-".to_owned(),
        -1 => "no expiry".to_owned(),
        ms => secs(ms.max(0) as u64),
    }
}

fn secs(ms: u64) -> String {
    format!("{:.3} s", ms as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Credentials never reach output, in URLs or in error text.
    #[test]
    fn credentials_are_redacted() {
        assert_eq!(
            redact("redis://user:pw@127.0.0.1:1/0"),
            "redis://***@127.0.0.1:1/0"
        );
        assert_eq!(redact("redis://127.0.0.1:1"), "redis://127.0.0.1:1");
        assert!(!redact_text("failed at redis://:hunter2@h:1 (x)").contains("hunter2"));
    }

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

    /// Only absolute http(s) URLs with a host are accepted as URLs.
    #[test]
    fn url_targets_need_scheme_and_host() {
        assert!(parse_url("http://example.test/a?b=1").is_ok());
        assert!(parse_url("/a").is_err());
        assert!(parse_url("ftp://example.test/a").is_err());
        assert!(parse_url("not a url").is_err());
    }
}
