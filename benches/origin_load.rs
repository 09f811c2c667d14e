//! Origin load: what the origin feels, summed over many keys,
//! behind each front, one after another in one run on the same origin.
//!
//! ```text
//! cargo build --release -p herdguard-cli && cargo bench --bench origin_load
//! cargo bench --bench origin_load -- --only many --seconds 4
//! cargo bench --bench origin_load -- --only outage --seconds 8 --outage-at 2 --heal-seconds 4
//! cargo bench --bench origin_load -- --only cold --cold-keys 5000 --cold-connections 256
//! cargo bench --bench origin_load -- --herdguard-args='--max-wait 2s'
//! ```
//! The origin is an axum handler in this process (its own runtime) that
//! answers `/k/{key}` after `--origin-delay-ms` (50) and counts its calls
//! and the calls in flight (with their peak). Fronts, each started fresh
//! for its row and stopped after it: no cache (wrk straight at the origin),
//! nginx (`proxy_cache_lock on`, `proxy_cache_use_stale updating`, background
//! update) and Varnish when installed, `herdguard proxy` (the release binary:
//! build it first, or `--proxy-bin PATH`) in memory with its defaults and
//! with `--grace 10s`, and `--instances` (4) `herdguard proxy` on one
//! redis-server the bench starts for the row. Each proxy runs under
//! `timeout`; every run ends by itself. `--herdguard-args='…'` (with `=`)
//! appends its words to every `herdguard proxy` command line.
//!
//! - `many`: wrk (`--wrk-threads` 2, `--connections` 64, `--seconds` 8;
//!   several instances get one wrk thread each) asks `--keys` (5,000) keys
//!   under a Zipf law (`--zipf` 1.1), drawn in a generated Lua script;
//!   answers `public, max-age=--max-age` (1). Columns: req/s, p50/p99,
//!   origin calls, calls per 1,000 requests, the floor for that row's req/s
//!   (key i asked λᵢ = rps·pᵢ a second must be fetched λᵢ/(1+λᵢT) a second,
//!   T the max-age), the ratio to it, origin peak concurrency, client errors
//!   (non-2xx/3xx and socket errors, wrk `--timeout` 10 s). A wrk run
//!   also stops after `--max-requests` (2,000,000); the row then says so.
//! - `outage`: the same with `stale-if-error=60`; `--outage-at` (2) s into a
//!   `--seconds` (8) run the origin answers `503 no-store`, then it heals
//!   for `--heal-seconds` (4), each phase its own wrk run. Columns: req/s
//!   over the run and during the outage, origin calls and peak concurrency
//!   during the outage, client errors, and the time from healing to the
//!   first answer of the new body generation seen by a probe client asking
//!   the 8 hottest keys in turn.
//! - `cold`: `--cold-keys` (5,000) distinct keys asked once each, at once
//!   over `--cold-connections` (256) from this process (own runtime),
//!   against an origin whose delay grows as 50 ms × inflight / `--cold-knee`
//!   (32) past the knee; herdguard with `--origin-budget` (`--budget`, 32),
//!   and on Redis with `--cluster-origin-budget` too. A proxy that refuses
//!   a flag at start-up gives a `skipped` row. Columns: origin peak
//!   concurrency, p50/p99/max latency of every answer, 503s, other errors,
//!   wall time. No request starts after `--cold-bound-secs` (120).

mod common;
// Flags and what the run reads from them.
#[path = "origin_load/settings.rs"]
mod settings;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;

use common::args::Args;
use common::burst::{distinct_once, first_of_generation, Burst};
use common::metered::{self, MeteredOrigin};
use common::ms;
use common::peers::{free_port, Peer, PeerProxy};
use common::redis::RedisServer;
use common::wrk::{self, ScriptedRun, WrkRun};
use common::zipf::Zipf;
use settings::{Settings, FLAGS, USAGE};

/// What stands between the clients and the origin in one row.
#[derive(Debug, Clone)]
enum Front {
    Direct,
    Peer(Peer),
    /// `instances` proxies with these flags; on one Redis when more than one.
    Herdguard {
        flags: Vec<String>,
        instances: usize,
    },
}

struct Row {
    name: String,
    front: Front,
}

/// A started front: where clients connect, and what keeps it running.
struct Running {
    addrs: Vec<SocketAddr>,
    _proxies: Vec<PeerProxy>,
    _redis: Option<RedisServer>,
}

fn start(
    front: &Front,
    origin: SocketAddr,
    s: &Settings,
    rt: &Runtime,
    lifetime: Duration,
) -> Result<Running, String> {
    let peer = |proxy: PeerProxy| Running {
        addrs: vec![proxy.addr],
        _proxies: vec![proxy],
        _redis: None,
    };
    match front {
        Front::Direct => Ok(Running {
            addrs: vec![origin],
            _proxies: Vec::new(),
            _redis: None,
        }),
        // Nginx logs to a buffered file, as herdguard proxy logs to a file.
        Front::Peer(p) => rt
            .block_on(PeerProxy::start_logging(*p, origin, lifetime, true))
            .map(peer),
        Front::Herdguard { flags, instances } => {
            start_herdguards(flags, *instances, origin, s, rt, lifetime)
        }
    }
}

fn start_herdguards(
    flags: &[String],
    instances: usize,
    origin: SocketAddr,
    s: &Settings,
    rt: &Runtime,
    lifetime: Duration,
) -> Result<Running, String> {
    let bin = s.bin.clone()?;
    let redis = if instances > 1 {
        Some(RedisServer::start().map_err(|e| format!("redis-server: {e}"))?)
    } else {
        None
    };
    let mut proxies = Vec::with_capacity(instances);
    for _ in 0..instances {
        let mut extra = vec!["--admin".to_owned(), format!("127.0.0.1:{}", free_port()?)];
        if let Some(r) = &redis {
            extra.extend(["--redis".to_owned(), format!("redis://{}/", r.addr)]);
        }
        extra.extend(flags.iter().chain(&s.herdguard_args).cloned());
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let proxy = rt
            .block_on(PeerProxy::start_herdguard_with(
                &bin, origin, lifetime, &extra,
            ))
            .map_err(|e| refused_flag(&e).unwrap_or(e))?;
        proxies.push(proxy);
    }
    Ok(Running {
        addrs: proxies.iter().map(|p| p.addr).collect(),
        _proxies: proxies,
        _redis: redis,
    })
}

/// clap's `unexpected argument '--x' found`, as the row's note.
fn refused_flag(error: &str) -> Option<String> {
    let rest = error.split("unexpected argument '").nth(1)?;
    let flag = rest.split('\'').next()?;
    Some(format!(
        "skipped: herdguard proxy does not accept {flag} yet"
    ))
}

fn herdguard(name: &str, flags: &[&str], instances: usize) -> Row {
    Row {
        name: name.to_owned(),
        front: Front::Herdguard {
            flags: flags.iter().map(|f| (*f).to_owned()).collect(),
            instances,
        },
    }
}

/// The fronts of the many-keys and outage scenarios.
fn cached_rows(s: &Settings) -> Vec<Row> {
    let fixed = |name: &str, front| Row {
        name: name.to_owned(),
        front,
    };
    vec![
        fixed("no cache", Front::Direct),
        fixed("nginx (lock, use_stale updating)", Front::Peer(Peer::Nginx)),
        fixed("Varnish", Front::Peer(Peer::Varnish)),
        herdguard("herdguard proxy, memory", &[], 1),
        herdguard(
            "herdguard proxy --grace 10s, memory",
            &["--grace", "10s"],
            1,
        ),
        herdguard(
            &format!("{} × herdguard proxy, one Redis", s.instances),
            &[],
            s.instances,
        ),
    ]
}

/// Wait (at most 10 s) until no origin call of the last row is in flight,
/// so its tail does not land in the next row's numbers.
fn settle(origin: &MeteredOrigin) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while origin.inflight() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A wrk run of `secs` over `addrs` with the Zipf script for them.
fn zipf_run(s: &Settings, zipf: &Zipf, addrs: &[SocketAddr], secs: u64) -> Result<WrkRun, String> {
    // One wrk thread per instance at least, so each gets its share.
    let threads = s.wrk_threads.max(addrs.len());
    let per_thread = s.max_requests.div_ceil(threads as u64);
    let script = s.dir.join(format!("zipf-{}.lua", addrs[0].port()));
    std::fs::write(&script, zipf.wrk_script(addrs, 43, per_thread))
        .map_err(|e| format!("{}: {e}", script.display()))?;
    let run = wrk::run_script(&ScriptedRun {
        url: format!("http://{}/", addrs[0]),
        script: &script,
        threads,
        connections: s.connections,
        secs,
        timeout: s.timeout,
    })?;
    // Stopped threads leave wrk's req/s meaningless: no row from it.
    if run.requests + s.connections as u64 >= s.max_requests {
        return Err(format!("stopped at --max-requests {}", s.max_requests));
    }
    Ok(run)
}

/// One row of the many-keys table.
struct ManyLine {
    run: WrkRun,
    calls: u64,
    peak: u64,
}

fn many_row(
    s: &Settings,
    zipf: &Zipf,
    origin: &MeteredOrigin,
    addrs: &[SocketAddr],
) -> Result<ManyLine, String> {
    origin.take_peak();
    let before = origin.calls();
    let run = zipf_run(s, zipf, addrs, s.seconds)?;
    Ok(ManyLine {
        run,
        calls: origin.calls() - before,
        peak: origin.take_peak(),
    })
}

fn rps(run: &WrkRun) -> f64 {
    run.requests as f64 / run.secs.max(1e-9)
}

fn print_many_line(s: &Settings, zipf: &Zipf, name: &str, line: &ManyLine) {
    let rps = rps(&line.run);
    let per_1000 = 1000.0 * line.calls as f64 / line.run.requests.max(1) as f64;
    let floor = zipf.floor_per_1000(rps, s.max_age as f64);
    println!(
        "| {name} | {rps:.0} | {} | {} | {} | {per_1000:.0} | {floor:.0} | {:.2} | {} | {} |",
        ms(line.run.p50),
        ms(line.run.p99),
        line.calls,
        per_1000 / floor.max(1e-9),
        line.peak,
        line.run.errors
    );
}

/// A row that did not run: its reason in the first column of numbers.
fn skipped(name: &str, columns: usize, note: &str) {
    println!("| {name} | {note} |{}", " - |".repeat(columns - 2));
}

fn many(s: &Settings, rt: &Runtime) {
    let zipf = Zipf::new(s.keys, s.zipf);
    let cc = format!("public, max-age={}", s.max_age);
    let origin = Arc::new(MeteredOrigin::new(s.delay, &cc, s.body_bytes));
    let addr = rt
        .block_on(metered::serve(&origin))
        .unwrap_or_else(|e| panic!("origin: {e}"));
    println!(
        "\n## many keys: {} keys, Zipf {}, `{cc}`, origin {} ms, {} connections, {} s\n",
        s.keys,
        s.zipf,
        s.delay.as_millis(),
        s.connections,
        s.seconds
    );
    println!(
        "| front | req/s | p50 ms | p99 ms | origin calls | per 1,000 req | floor per 1,000 \
         | ÷ floor | origin peak | client errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let lifetime = Duration::from_secs(s.seconds + 60);
    for row in cached_rows(s) {
        settle(&origin);
        let line = start(&row.front, addr, s, rt, lifetime)
            .and_then(|front| many_row(s, &zipf, &origin, &front.addrs));
        match line {
            Ok(line) => print_many_line(s, &zipf, &row.name, &line),
            Err(e) => skipped(&row.name, 10, &e),
        }
    }
    println!(
        "\nfloor: 1000·Σᵢ λᵢ/(1+λᵢ·{}) / rps, λᵢ = rps·pᵢ, at the row's own req/s",
        s.max_age
    );
}

/// The three phases of one outage row.
struct OutageLine {
    healthy: WrkRun,
    outage: WrkRun,
    healed: WrkRun,
    outage_calls: u64,
    outage_peak: u64,
    fresh_after: Option<Duration>,
}

fn outage_row(
    s: &Settings,
    zipf: &Zipf,
    origin: &MeteredOrigin,
    addrs: &[SocketAddr],
    clients: &Runtime,
) -> Result<OutageLine, String> {
    let healthy = zipf_run(s, zipf, addrs, s.outage_at)?;
    origin.fail();
    origin.take_peak();
    let before = origin.calls();
    let outage = zipf_run(s, zipf, addrs, s.seconds - s.outage_at);
    let (outage_calls, outage_peak) = (origin.calls() - before, origin.take_peak());
    let generation = origin.heal();
    let outage = outage?;
    let heal = Duration::from_secs(s.heal_seconds);
    let (healed, fresh_after) = std::thread::scope(|scope| {
        let load = scope.spawn(|| zipf_run(s, zipf, addrs, s.heal_seconds));
        let fresh = clients.block_on(first_of_generation(addrs[0], 8, generation, heal));
        let healed = load
            .join()
            .unwrap_or_else(|_| Err("wrk thread panicked".into()));
        (healed, fresh)
    });
    Ok(OutageLine {
        healthy,
        outage,
        healed: healed?,
        outage_calls,
        outage_peak,
        fresh_after,
    })
}

fn print_outage_line(name: &str, l: &OutageLine) {
    let requests = l.healthy.requests + l.outage.requests;
    let secs = l.healthy.secs + l.outage.secs;
    let fresh = l.fresh_after.map_or_else(|| "none".to_owned(), ms);
    println!(
        "| {name} | {:.0} | {:.0} | {} | {:.0} | {} | {} | {} | {fresh} | {:.0} | {} |",
        requests as f64 / secs.max(1e-9),
        rps(&l.outage),
        l.outage_calls,
        l.outage_calls as f64 / l.outage.secs.max(1e-9),
        l.outage_peak,
        l.healthy.errors + l.outage.errors,
        l.outage.errors,
        rps(&l.healed),
        l.healed.errors,
    );
}

fn outage(s: &Settings, rt: &Runtime, clients: &Runtime) {
    let zipf = Zipf::new(s.keys, s.zipf);
    let cc = format!("public, max-age={}, stale-if-error=60", s.max_age);
    let origin = Arc::new(MeteredOrigin::new(s.delay, &cc, s.body_bytes));
    let addr = rt
        .block_on(metered::serve(&origin))
        .unwrap_or_else(|e| panic!("origin: {e}"));
    println!(
        "\n## outage: `{cc}`; `503 no-store` from {} s to {} s, then healed for {} s\n",
        s.outage_at, s.seconds, s.heal_seconds
    );
    println!(
        "| front | req/s | req/s outage | origin calls outage | calls/s outage | origin peak outage \
         | client errors | errors outage | first fresh after heal ms | req/s healed | errors healed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let lifetime = Duration::from_secs(s.seconds + s.heal_seconds + 60);
    for row in cached_rows(s) {
        settle(&origin);
        let line = start(&row.front, addr, s, rt, lifetime)
            .and_then(|front| outage_row(s, &zipf, &origin, &front.addrs, clients));
        match line {
            Ok(line) => print_outage_line(&row.name, &line),
            Err(e) => skipped(&row.name, 11, &e),
        }
    }
    println!(
        "\nfirst fresh: a probe client asks /k/0…/k/7 in turn from the heal on, until a 200 \
         carries a body made after it"
    );
}

fn cold_rows(s: &Settings) -> Vec<Row> {
    let budget = s.budget.to_string();
    let n = s.instances;
    vec![
        Row {
            name: "no cache".to_owned(),
            front: Front::Direct,
        },
        herdguard("herdguard proxy, memory (defaults)", &[], 1),
        herdguard(
            &format!("herdguard proxy --origin-budget {budget}, memory"),
            &["--origin-budget", &budget],
            1,
        ),
        herdguard(
            &format!("{n} × herdguard proxy, one Redis, budget {budget}, cluster {budget}"),
            &[
                "--origin-budget",
                &budget,
                "--cluster-origin-budget",
                &budget,
            ],
            n,
        ),
    ]
}

fn print_cold_line(name: &str, b: &Burst, calls: u64, peak: u64, keys: u64) {
    let asked = b.ok + b.unavailable + b.other_errors;
    let note = if asked < keys {
        format!("{} keys not asked: --cold-bound-secs", keys - asked)
    } else {
        String::new()
    };
    println!(
        "| {name} | {peak} | {calls} | {} | {} | {} | {} | {} | {:.2} | {note} |",
        ms(b.q(0.5)),
        ms(b.q(0.99)),
        ms(b.max()),
        b.unavailable,
        b.other_errors,
        b.wall.as_secs_f64()
    );
}

fn cold(s: &Settings, rt: &Runtime, clients: &Runtime) {
    let origin = Arc::new(
        MeteredOrigin::new(s.delay, "public, max-age=60", s.body_bytes).with_knee(s.cold_knee),
    );
    let addr = rt
        .block_on(metered::serve(&origin))
        .unwrap_or_else(|e| panic!("origin: {e}"));
    println!(
        "\n## cold start: {} distinct keys once each over {} connections; origin {} ms × \
         max(1, inflight/{})\n",
        s.cold_keys,
        s.cold_connections,
        s.delay.as_millis(),
        s.cold_knee
    );
    println!(
        "| front | origin peak | origin calls | p50 ms | p99 ms | max ms | 503s | other errors \
         | wall s | note |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let lifetime = s.cold_bound + Duration::from_secs(90);
    for (i, row) in cold_rows(s).into_iter().enumerate() {
        settle(&origin);
        let front = match start(&row.front, addr, s, rt, lifetime) {
            Ok(front) => front,
            Err(e) => {
                skipped(&row.name, 10, &e);
                continue;
            }
        };
        origin.take_peak();
        let before = origin.calls();
        let deadline = Instant::now() + s.cold_bound;
        // A key prefix per row: the origin sees every row's keys as new.
        let burst = clients.block_on(distinct_once(
            &front.addrs,
            &format!("cold{i}-"),
            s.cold_keys,
            s.cold_connections,
            Duration::from_secs(30),
            deadline,
        ));
        let (calls, peak) = (origin.calls() - before, origin.take_peak());
        print_cold_line(&row.name, &burst, calls, peak, s.cold_keys);
    }
}

fn runtime(threads: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"))
}

fn header(s: &Settings) {
    println!(
        "# origin load: loopback, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let wrk = wrk::version().unwrap_or_else(|| "wrk: not installed".to_owned());
    println!("- {wrk}");
    for p in [Peer::Nginx, Peer::Varnish] {
        let v = p
            .version()
            .unwrap_or_else(|| "not installed: rows skipped".into());
        println!("- {}: {v}", p.program());
    }
    match &s.bin {
        Ok(bin) => println!("- herdguard: {}", bin.display()),
        Err(e) => println!("- herdguard: {e}"),
    }
    if !s.herdguard_args.is_empty() {
        println!(
            "- every herdguard proxy also gets: {}",
            s.herdguard_args.join(" ")
        );
    }
}

fn main() {
    let args = Args::parse(FLAGS, USAGE);
    let s = Settings::from_args(&args);
    if wrk::version().is_none() && (s.selected("many") || s.selected("outage")) {
        eprintln!("the many and outage scenarios need wrk");
        std::process::exit(2);
    }
    std::fs::create_dir_all(&s.dir).unwrap_or_else(|e| panic!("{}: {e}", s.dir.display()));
    // The origin has two threads of its own; the cold burst's and the
    // outage probe's client one more.
    let origin_rt = runtime(2);
    let clients = runtime(1);
    header(&s);
    if s.selected("many") {
        many(&s, &origin_rt);
    }
    if s.selected("outage") {
        outage(&s, &origin_rt, &clients);
    }
    if s.selected("cold") {
        cold(&s, &origin_rt, &clients);
    }
    let _ = std::fs::remove_dir_all(&s.dir);
}
