//! `herdguard`: the caching reverse proxy, and diagnostics for the Redis
//! side of a herdguard deployment. This file owns the flags and the dispatch
//! only; each subcommand lives in its own module, and none of them imports
//! this file.
//!
//! ```text
//! herdguard inspect <url-or-key> [--raw] --redis URL [--namespace NS]
//! herdguard locks <lock-key-or-resource> [--raw] --nodes URL,URL,... [--namespace NS]
//! herdguard clock-skew --nodes URL,URL,... [--samples N] [--budget-ms MS]
//! herdguard purge <url-or-key | --tag TAG> [--soft] --redis URL [--namespace NS]
//! herdguard proxy --upstream URL [--listen ADDR] [--admin ADDR] ...
//! herdguard top (--admin URL,URL,... | --redis URL [--namespace NS]) [--interval-ms MS] [--count N]
//! ```
//!
//! `proxy` runs the caching reverse proxy (the `herdguard_cli::proxy` library, cli/src/proxy/); it
//! runs until SIGTERM or SIGINT and exits 0 after a graceful stop.
//!
//! Exit codes: 0 healthy, 1 problem found, 2 usage or connection error.
//! `--json` prints one JSON object on stdout instead of text. Every Redis
//! call is bounded by `--timeout-ms` (default 1000). Credentials in URLs are
//! never printed.
//!
//! Modules: `inspect`, `locks`, `clock_skew`, `purge` (one per diagnostic)
//! over `conn` (bounded Redis calls) and `report` (verdict and output);
//! `proxy_cmd` (the proxy's flags) over `proxy/` (the proxy itself, shared
//! with `cli/examples/reverse_proxy.rs`); `top` (the live view, over the
//! admin ports' `/status.json`) and `announce` (where a proxy's admin port
//! answers, said in Redis for `top --redis`).

use std::process::ExitCode;
use std::time::Duration;

mod clock_skew;
mod conn;
mod inspect;
mod locks;
use herdguard_cli::proxy;
mod announce;
mod proxy_cmd;
mod proxy_help;
mod proxy_values;
mod purge;
mod report;
mod sentinel_nodes;
mod top;

use clap::error::ErrorKind;
use clap::{ArgGroup, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use serde_json::json;

use report::{Failure, Report, Verdict};

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
    /// Still accepted before the subcommand; each diagnostic lists it.
    #[arg(long, hide = true)]
    json: bool,
    /// Still accepted before the subcommand; each diagnostic lists it.
    #[arg(long, hide = true, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    timeout_ms: Option<u64>,
}

/// Options of every diagnostic, not of the proxy: they are flattened into
/// each diagnostic so that `proxy --help` does not list them.
#[derive(Debug, Clone, Copy, Args)]
struct Diagnostic {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Bound on each Redis connect and each command, in milliseconds [default: 1000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    timeout_ms: Option<u64>,
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
    /// A live view of running proxies, read from each one's admin port
    /// (`/status.json`) every second: Redis and breaker state, budget,
    /// requests, hit ratio, origin calls, followers and own calls per
    /// second, the hot keys summed over every instance, and the flights
    /// running now. Redraws in place on a terminal; plain text otherwise.
    Top {
        /// Each instance's admin address (`http://127.0.0.1:9090`),
        /// comma-separated: all instances on one Redis for the cluster's view.
        #[arg(
            long,
            value_delimiter = ',',
            required_unless_present = "redis",
            conflicts_with = "redis"
        )]
        admin: Vec<String>,
        /// Instead of --admin: every proxy that says its admin address in
        /// this Redis (a proxy with --admin and --redis does, every 2 s;
        /// re-read at each refresh).
        #[arg(long)]
        redis: Option<String>,
        /// The proxies' Redis namespace.
        #[arg(long, default_value = herdguard::RedisOptions::DEFAULT_NAMESPACE)]
        namespace: String,
        /// Time between refreshes, in milliseconds.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
        interval_ms: u64,
        /// Stop after N refreshes [default: until interrupted].
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
    },
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
        #[arg(long, default_value = herdguard::RedisOptions::DEFAULT_NAMESPACE)]
        namespace: String,
        #[command(flatten)]
        diagnostic: Diagnostic,
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
        #[arg(
            long,
            value_delimiter = ',',
            required_unless_present = "sentinel",
            conflicts_with = "sentinel"
        )]
        nodes: Vec<String>,
        /// Instead of --nodes: sentinels (comma-separated) that name the
        /// nodes, every primary they name and every replica they know (with
        /// --master-name): a lease held twice after a failover shows.
        #[arg(long, value_delimiter = ',', requires = "master_name")]
        sentinel: Vec<String>,
        /// The master name the sentinels monitor.
        #[arg(long)]
        master_name: Option<String>,
        /// With --sentinel, the data nodes' scheme, credentials and database
        /// as a URL whose host is replaced by each node's [default: redis://].
        #[arg(long)]
        node_url: Option<String>,
        /// The lock's namespace.
        #[arg(long, default_value = herdguard::RedisOptions::DEFAULT_NAMESPACE)]
        namespace: String,
        #[command(flatten)]
        diagnostic: Diagnostic,
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
        #[command(flatten)]
        diagnostic: Diagnostic,
    },
    /// Delete entries from Redis through the layer's own purge path and tell
    /// every instance to drop its memory copies (with --soft: mark them
    /// stale instead, so one refresh runs while they are served stale).
    #[command(group(ArgGroup::new("what").required(true).args(["target", "tag"])))]
    Purge {
        /// A URL (every stored variant of it) or a 32-hex cache key.
        target: Option<String>,
        /// Purge every entry tagged with this Surrogate-Key tag.
        #[arg(long)]
        tag: Option<String>,
        /// Soft purge: keep the entries, stale from now on, on every
        /// instance (as `CacheLayer::soft_purge_url` / `soft_purge_key` /
        /// `soft_purge_tag`); entries that may not be served stale
        /// (must-revalidate, no-cache, no stale window) are deleted.
        #[arg(long)]
        soft: bool,
        /// The Redis the layer uses.
        #[arg(long)]
        redis: String,
        /// The layer's Redis namespace.
        #[arg(long, default_value = herdguard::RedisOptions::DEFAULT_NAMESPACE)]
        namespace: String,
        #[command(flatten)]
        diagnostic: Diagnostic,
    },
}

fn main() -> ExitCode {
    // The proxy's `[default: …]` help comes from the values its code uses.
    let matches = Cli::command()
        .mut_subcommand("proxy", proxy_help::show_defaults)
        .get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let diagnostic = match &cli.command {
        Command::Proxy(_) if cli.json || cli.timeout_ms.is_some() => Cli::command()
            .error(
                ErrorKind::ArgumentConflict,
                "--json and --timeout-ms are options of the diagnostics, not of proxy",
            )
            .exit(),
        Command::Proxy(_) | Command::Top { .. } => None,
        Command::Inspect { diagnostic, .. }
        | Command::Locks { diagnostic, .. }
        | Command::ClockSkew { diagnostic, .. }
        | Command::Purge { diagnostic, .. } => Some(*diagnostic),
    };
    let command = match cli.command {
        Command::Proxy(args) => return proxy_cmd::main(*args),
        Command::Top {
            admin,
            redis,
            namespace,
            interval_ms,
            count,
        } => {
            return run_top(top::Watch {
                admins: admin,
                redis: redis.map(|url| (url, namespace)),
                interval: Duration::from_millis(interval_ms),
                count,
                timeout: Duration::from_millis(cli.timeout_ms.unwrap_or(1000)),
            })
        }
        other => other,
    };
    // After the subcommand wins over before it.
    let timeout_ms = diagnostic
        .and_then(|d| d.timeout_ms)
        .or(cli.timeout_ms)
        .unwrap_or(1000);
    let timeout = Duration::from_millis(timeout_ms);
    let as_json = cli.json || diagnostic.is_some_and(|d| d.json);
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

/// `top` until its count or Ctrl-C: exit 0, or 2 when no instance answers.
fn run_top(watch: top::Watch) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("herdguard: cannot start the runtime: {e}");
            return ExitCode::from(Verdict::Failure as u8);
        }
    };
    let result = rt.block_on(async {
        tokio::select! {
            r = top::top(watch) => r,
            _ = tokio::signal::ctrl_c() => Ok(()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(msg)) => {
            eprintln!("herdguard: {msg}");
            ExitCode::from(Verdict::Failure as u8)
        }
    }
}

async fn run(command: Command, timeout: Duration) -> Result<Report, Failure> {
    match command {
        Command::Proxy(_) | Command::Top { .. } => {
            Err(Failure("the proxy and top run from main".into()))
        }
        Command::Inspect {
            target,
            raw,
            redis,
            namespace,
            ..
        } => inspect::inspect(&target, raw, &redis, &namespace, timeout).await,
        Command::Locks {
            lock,
            raw,
            mut nodes,
            sentinel,
            master_name,
            node_url,
            namespace,
            ..
        } => {
            let replicated = !sentinel.is_empty();
            if let Some(master) = master_name.filter(|_| replicated) {
                nodes = sentinel_nodes::sentinel_nodes(
                    &sentinel,
                    &master,
                    node_url.as_deref(),
                    timeout,
                )
                .await?;
            }
            locks::locks(&lock, raw, &nodes, &namespace, (timeout, replicated)).await
        }
        Command::ClockSkew {
            nodes,
            samples,
            budget_ms,
            ..
        } => clock_skew::clock_skew(&nodes, samples, budget_ms, timeout).await,
        Command::Purge {
            target,
            tag,
            soft,
            redis,
            namespace,
            ..
        } => {
            let what = purge::Target {
                target: target.as_deref(),
                tag,
                soft,
            };
            purge::purge(what, &redis, &namespace, timeout).await
        }
    }
}
