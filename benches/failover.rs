//! Sentinel failover under load: the primary a Sentinel topology
//! names is SIGKILLed while herdguard instances serve steady load, once with
//! default `RedisOptions` and once with `lease_replicas(1, --wait-ms)`, each
//! row on a topology of its own, the two rows in turn in every run; then the
//! cost of `lease_replicas` per leader fill, both kinds of fill in turn on
//! one topology.
//!
//! ```text
//! cargo bench --bench failover
//! cargo bench --bench failover -- --runs 1 --after-secs 5 --fills 100
//! ```
//! A topology is a primary, 2 replicas and 3 `redis-sentinel` processes
//! (herdguard-testkit's `SentinelSet`: `down-after-milliseconds 500`,
//! `failover-timeout 5000`), all on free loopback ports, stopped by PID when
//! the row ends. `--instances` (3) layers run in this process, each served
//! over loopback HTTP/1.1, with `--loops` (4) keep-alive client loops each.
//! Every `--window-ms` (250) the loops move to a new cold key `/k/{window}`,
//! so every key is asked for by every instance at once; the origin answers
//! after `--origin-delay-ms` (50) with `max-age=60` and notes every call's
//! key and instant. The primary is killed `--steady-secs` (4) into the load,
//! which runs until `--after-secs` (8) after the promotion and never past
//! 60 s; a request without an answer within 10 s counts as an error.
//!
//! Failover table, median [min–max] over `--runs` (3): the promotion after
//! the kill (every sentinel names a replica that says `role:master`, polled
//! every 20 ms); answers and client errors (non-200, socket error, no
//! answer); the longest answer; origin calls per key (= window) before the
//! kill, from the kill to the promotion (windows overlapping that span) and
//! from the promotion until one call per key is back (windows starting in
//! that span; a run without one says so); the first coalesced
//! fill on the new primary (the origin call of the first key, first called
//! after the promotion, that every instance asked for and that cost one
//! call), after the promotion; one call per key again: the start of the
//! first window from which every window cost one call, after the promotion
//! (0 when that was before it); origin calls from the kill until then.
//! Every run of every row also prints its calls per window around the kill
//! (`K`) and the promotion (`P`, before the window it fell in).
//!
//! Fill table: one instance with default options and one with
//! `lease_replicas(1, --wait-ms)` on one topology, `--fills` (300) cold keys
//! each (after 20 not counted), asked one at a time and in turn, the origin
//! answering at once: the mean and quantiles of each miss's time as the
//! client sees it (the lookup-or-lease script, with `lease_replicas` the
//! token-checked `PEXPIRE` and `WAIT`, the origin, the fenced write).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, Uri};
use axum::Router;
use bytes::Bytes;
use herdguard::{CacheLayer, RedisOptions};
use herdguard_testkit::sentinel::SentinelSet;
use tokio::task::JoinHandle;

use common::args::Args;
use common::loadgen::Conn;
use common::{ms, quantile};

const USAGE: &str = "cargo bench --bench failover -- [--runs 3] [--instances 3] [--loops 4] \
[--window-ms 250] [--origin-delay-ms 50] [--steady-secs 4] [--after-secs 8] [--wait-ms 500] \
[--fills 300]";

const FLAGS: &[&str] = &[
    "runs",
    "instances",
    "loops",
    "window-ms",
    "origin-delay-ms",
    "steady-secs",
    "after-secs",
    "wait-ms",
    "fills",
];

/// No run of a row lasts longer than this, whatever the sentinels do.
const ROW_BOUND: Duration = Duration::from_secs(60);

/// A request without an answer by then is an error.
const ANSWER_BOUND: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy)]
struct Settings {
    runs: usize,
    instances: usize,
    loops: usize,
    window: Duration,
    origin_delay: Duration,
    steady: Duration,
    after: Duration,
    wait: Duration,
    fills: usize,
}

impl Settings {
    fn from_args(args: &Args) -> Self {
        let millis = |name: &str, default: u64| Duration::from_millis(args.get(name, default));
        let secs = |name: &str, default: u64| Duration::from_secs(args.get(name, default));
        Self {
            runs: args.get("runs", 3usize).max(1),
            instances: args.get("instances", 3usize).max(1),
            loops: args.get("loops", 4usize).max(1),
            window: millis("window-ms", 250).max(Duration::from_millis(10)),
            origin_delay: millis("origin-delay-ms", 50),
            steady: secs("steady-secs", 4),
            after: secs("after-secs", 8),
            wait: millis("wait-ms", 500),
            fills: args.get("fills", 300usize),
        }
    }
}

/// The two configurations compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Row {
    Plain,
    LeaseReplicas,
}

impl Row {
    fn name(self, s: &Settings) -> String {
        match self {
            Row::Plain => "default options".to_owned(),
            Row::LeaseReplicas => format!("lease_replicas(1, {} ms)", s.wait.as_millis()),
        }
    }

    fn options(self, set: &SentinelSet, s: &Settings) -> RedisOptions {
        let opts = RedisOptions::sentinel(set.master_name(), set.sentinel_urls())
            .node_url(set.node_url())
            .namespace("bench");
        match self {
            Row::Plain => opts,
            Row::LeaseReplicas => opts.lease_replicas(1, s.wait),
        }
    }
}

/// An origin that notes when each path was called.
#[derive(Debug)]
struct KeyedOrigin {
    delay: Duration,
    calls: Mutex<HashMap<String, Vec<Instant>>>,
}

static BODY: [u8; 512] = [b'x'; 512];

impl KeyedOrigin {
    fn new(delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            delay,
            calls: Mutex::default(),
        })
    }

    /// When `path` was called, in order.
    fn calls(&self, path: &str) -> Vec<Instant> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(path)
            .cloned()
            .unwrap_or_default()
    }
}

async fn answer(
    State(origin): State<Arc<KeyedOrigin>>,
    uri: Uri,
) -> impl axum::response::IntoResponse {
    origin
        .calls
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(uri.path().to_owned())
        .or_default()
        .push(Instant::now());
    if !origin.delay.is_zero() {
        tokio::time::sleep(origin.delay).await;
    }
    (
        [(header::CACHE_CONTROL, "max-age=60")],
        Bytes::from_static(&BODY),
    )
}

/// One instance: `layer` in front of `origin`, served on a loopback port.
struct Instance {
    addr: SocketAddr,
    layer: CacheLayer,
    task: JoinHandle<()>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn instance(origin: &Arc<KeyedOrigin>, opts: RedisOptions) -> Result<Instance, String> {
    let layer = CacheLayer::builder()
        .redis(opts)
        .build()
        .map_err(|e| format!("layer: {e}"))?;
    let router = Router::new()
        .fallback(axum::routing::get(answer))
        .layer(layer.clone())
        .with_state(Arc::clone(origin));
    let (addr, task) = common::origin::serve(router)
        .await
        .map_err(|e| format!("serve: {e}"))?;
    Ok(Instance { addr, layer, task })
}

/// GET `path` on `conn` (connecting first when there is none); whether the
/// answer was a 200 within [`ANSWER_BOUND`]. A connection that failed is
/// dropped so the next request connects again.
async fn ask(conn: &mut Option<Conn>, addr: SocketAddr, path: &str) -> bool {
    let once = async {
        if conn.is_none() {
            *conn = Some(Conn::connect(addr).await?);
        }
        match conn.as_mut() {
            Some(c) => c.get(path).await,
            None => Err(std::io::Error::other("no connection")),
        }
    };
    match tokio::time::timeout(ANSWER_BOUND, once).await {
        Ok(Ok(reply)) => reply.status == 200,
        _ => {
            *conn = None;
            false
        }
    }
}

/// Requests on `addr` until every instance answers from Redis twice in a row
/// (new keys each time, bounded by 20 s).
async fn until_on_redis(instances: &[Instance]) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    for (n, i) in instances.iter().enumerate() {
        let mut conn = None;
        let mut good = 0;
        for k in 0.. {
            ask(&mut conn, i.addr, &format!("/probe/{n}/{k}")).await;
            good = if i.layer.redis_connected() == Some(true) {
                good + 1
            } else {
                0
            };
            if good == 2 {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("instance {n} never reached the primary"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// What one request of the load saw.
#[derive(Debug, Clone, Copy)]
struct Seen {
    window: u64,
    instance: usize,
    ok: bool,
    took: Duration,
}

/// One client loop on instance `instance` until `stop`: each request for the
/// key of the window it is sent in, 10 ms apart.
async fn client(
    addr: SocketAddr,
    instance: usize,
    start: Instant,
    window: Duration,
    stop: Arc<AtomicBool>,
) -> Vec<Seen> {
    let mut conn = None;
    let mut seen = Vec::new();
    while !stop.load(Ordering::SeqCst) && start.elapsed() < ROW_BOUND {
        let w = (start.elapsed().as_nanos() / window.as_nanos()) as u64;
        let sent = Instant::now();
        let ok = ask(&mut conn, addr, &format!("/k/{w}")).await;
        seen.push(Seen {
            window: w,
            instance,
            ok,
            took: sent.elapsed(),
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    seen
}

/// What one row of one run measured.
#[derive(Debug, Clone)]
struct Failover {
    promotion: Duration,
    answers: usize,
    errors: usize,
    longest: Duration,
    /// Origin calls per key (mean) before the kill, from the kill to the
    /// promotion, and from the promotion until one call per key is back
    /// (`None`: no window there).
    before: Option<f64>,
    without_primary: Option<f64>,
    recovering: Option<f64>,
    first_coalesced: Option<Duration>,
    /// From the promotion until one call per key; `None`: never.
    back: Option<Duration>,
    /// Origin calls, and keys, from the kill until then.
    during: usize,
    during_keys: usize,
    timeline: String,
}

fn start_set(replicas: usize) -> Result<SentinelSet, String> {
    std::panic::catch_unwind(|| SentinelSet::start(replicas))
        .map_err(|_| "the Sentinel topology did not start (see the panic above)".to_owned())
}

async fn failover_row(row: Row, s: &Settings) -> Result<Failover, String> {
    let set = tokio::task::spawn_blocking(|| start_set(2))
        .await
        .map_err(|e| e.to_string())??;
    let origin = KeyedOrigin::new(s.origin_delay);
    let mut instances = Vec::with_capacity(s.instances);
    for _ in 0..s.instances {
        instances.push(instance(&origin, row.options(&set, s)).await?);
    }
    until_on_redis(&instances).await?;

    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let loops: Vec<JoinHandle<Vec<Seen>>> = instances
        .iter()
        .enumerate()
        .flat_map(|(n, i)| (0..s.loops).map(move |_| (n, i.addr)))
        .map(|(n, addr)| tokio::spawn(client(addr, n, start, s.window, stop.clone())))
        .collect();
    tokio::time::sleep(s.steady).await;
    let killed = Instant::now();
    let lost = tokio::task::spawn_blocking(move || {
        let mut set = set;
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let old = set.kill_primary();
            set.wait_for_promotion(old, Duration::from_secs(30))
        }));
        (set, outcome)
    })
    .await
    .map_err(|e| e.to_string())?;
    let (set, outcome) = lost;
    let promoted = match outcome {
        Ok((_, at)) => at,
        Err(_) => {
            stop.store(true, Ordering::SeqCst);
            return Err("no promotion within 30 s (see the panic above)".to_owned());
        }
    };
    let end = (promoted + s.after).min(start + ROW_BOUND);
    tokio::time::sleep_until(end.into()).await;
    stop.store(true, Ordering::SeqCst);
    let mut seen = Vec::new();
    for l in loops {
        seen.extend(l.await.map_err(|e| e.to_string())?);
    }
    drop(instances);
    drop(set);
    Ok(summarize(&seen, &origin, s, start, (killed, promoted)))
}

fn summarize(
    seen: &[Seen],
    origin: &KeyedOrigin,
    s: &Settings,
    start: Instant,
    (killed, promoted): (Instant, Instant),
) -> Failover {
    let window_start = |w: u64| start + s.window * w as u32;
    // Every window asked for: the instances that asked, and its calls.
    let mut windows: BTreeMap<u64, (Vec<bool>, Vec<Instant>)> = BTreeMap::new();
    for a in seen {
        let (asked, _) = windows
            .entry(a.window)
            .or_insert_with(|| (vec![false; s.instances], Vec::new()));
        asked[a.instance] = true;
    }
    for (w, (_, calls)) in windows.iter_mut() {
        *calls = origin.calls(&format!("/k/{w}"));
    }
    let n = |w: &u64| windows[w].1.len();
    let mean = |ws: Vec<&u64>| {
        (!ws.is_empty()).then(|| ws.iter().map(|&w| n(w)).sum::<usize>() as f64 / ws.len() as f64)
    };
    // One call per key from `back` on (every window after it cost one).
    let back_w = windows
        .iter()
        .rev()
        .take_while(|(_, (_, calls))| calls.len() == 1)
        .last()
        .map(|(w, _)| *w);
    let back_at = back_w.map(window_start);
    let before: Vec<&u64> = windows
        .keys()
        .filter(|w| window_start(**w + 1) <= killed)
        .collect();
    let without: Vec<&u64> = windows
        .keys()
        .filter(|w| window_start(**w + 1) > killed && window_start(**w) < promoted)
        .collect();
    let recovering: Vec<&u64> = windows
        .keys()
        .filter(|w| window_start(**w) >= promoted && back_at.is_none_or(|b| window_start(**w) < b))
        .collect();
    let during: Vec<&u64> = windows
        .keys()
        .filter(|w| window_start(**w + 1) > killed && back_at.is_none_or(|b| window_start(**w) < b))
        .collect();
    let first_coalesced = windows
        .values()
        .filter(|(asked, calls)| {
            asked.iter().all(|a| *a) && calls.len() == 1 && calls[0] >= promoted
        })
        .map(|(_, calls)| calls[0] - promoted)
        .min();
    let mut timeline = String::new();
    let (mut k, mut p) = (false, false);
    for (w, (_, calls)) in &windows {
        let end = window_start(*w + 1);
        if end + s.window * 4 < killed {
            continue;
        }
        if back_at.is_some_and(|b| window_start(*w) > b + s.window * 4) {
            timeline.push_str(" …");
            break;
        }
        if !k && end > killed {
            timeline.push_str(" K");
            k = true;
        }
        if !p && end > promoted {
            timeline.push_str(" P");
            p = true;
        }
        timeline.push_str(&format!(" {}", calls.len()));
    }
    Failover {
        promotion: promoted - killed,
        answers: seen.len(),
        errors: seen.iter().filter(|a| !a.ok).count(),
        longest: seen.iter().map(|a| a.took).max().unwrap_or_default(),
        before: mean(before),
        without_primary: mean(without),
        recovering: mean(recovering),
        first_coalesced,
        back: back_at.map(|b| b.saturating_duration_since(promoted)),
        during: during.iter().map(|&w| n(w)).sum(),
        during_keys: during.len(),
        timeline: timeline.trim().to_owned(),
    }
}

/// Leader fills in turn on a default instance and a `lease_replicas` one:
/// the client-side time of each, per row.
async fn fill_cost(s: &Settings) -> Result<[Vec<Duration>; 2], String> {
    let set = tokio::task::spawn_blocking(|| start_set(2))
        .await
        .map_err(|e| e.to_string())??;
    let origin = KeyedOrigin::new(Duration::ZERO);
    let rows = [Row::Plain, Row::LeaseReplicas];
    let mut instances = Vec::new();
    for row in rows {
        instances.push(instance(&origin, row.options(&set, s)).await?);
    }
    until_on_redis(&instances).await?;
    let mut conns: Vec<Option<Conn>> = vec![None, None];
    let mut took: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let warm = 20;
    for k in 0..warm + s.fills {
        for turn in 0..2 {
            // Alternate which row goes first.
            let i = (turn + k) % 2;
            let path = format!("/f/{i}/{k}");
            let sent = Instant::now();
            let ok = ask(&mut conns[i], instances[i].addr, &path).await;
            let t = sent.elapsed();
            if !ok || origin.calls(&path).len() != 1 {
                return Err(format!("{path}: not one leader fill"));
            }
            if k >= warm {
                took[i].push(t);
            }
        }
    }
    drop(instances);
    drop(set);
    Ok(took)
}

/// `median [min–max]` of `values`, each shown by `show`.
fn spread<T: Copy + PartialOrd>(values: &[T], show: impl Fn(T) -> String) -> String {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    match v.as_slice() {
        [] => "–".to_owned(),
        [one] => show(*one),
        _ => format!(
            "{} [{}–{}]",
            show(v[v.len() / 2]),
            show(v[0]),
            show(v[v.len() - 1])
        ),
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

/// The lines of the failover table, in order (see [`cell`]).
const CELLS: [&str; 10] = [
    "promotion after the kill s",
    "answers",
    "client errors",
    "longest answer ms",
    "origin calls per key before the kill",
    "… from the kill to the promotion",
    "… after the promotion until one per key",
    "first coalesced fill after the promotion ms",
    "one call per key again after the promotion ms",
    "origin calls from the kill until then (keys)",
];

/// Line `i` of [`CELLS`] over the runs of one row.
fn cell(i: usize, r: &[Failover]) -> String {
    let of = |f: fn(&Failover) -> Option<f64>| {
        let v: Vec<f64> = r.iter().filter_map(f).collect();
        let none = r.len() - v.len();
        let mut out = spread(&v, |x| format!("{x:.1}"));
        if none > 0 {
            out.push_str(&format!(" ({none} without such a key)"));
        }
        out
    };
    let count =
        |f: fn(&Failover) -> usize| spread(&r.iter().map(f).collect::<Vec<_>>(), |n| n.to_string());
    let time = |f: fn(&Failover) -> Option<Duration>| {
        let v: Vec<Duration> = r.iter().filter_map(f).collect();
        let never = r.len() - v.len();
        let mut out = spread(&v, ms);
        if never > 0 {
            out.push_str(&format!(" ({never} never)"));
        }
        out
    };
    match i {
        0 => spread(&r.iter().map(|f| f.promotion).collect::<Vec<_>>(), secs),
        1 => count(|f| f.answers),
        2 => count(|f| f.errors),
        3 => time(|f| Some(f.longest)),
        4 => of(|f| f.before),
        5 => of(|f| f.without_primary),
        6 => of(|f| f.recovering),
        7 => time(|f| f.first_coalesced),
        8 => time(|f| f.back),
        _ => format!("{} ({})", count(|f| f.during), count(|f| f.during_keys)),
    }
}

fn print_failover(s: &Settings, rows: &[(Row, Vec<Failover>)]) {
    println!(
        "\nSentinel failover: {} instances × {} loops, a new key every {} ms, origin {} ms, \
         SIGKILL {} s into the load, {} s after the promotion; {} run(s), median [min–max]\n",
        s.instances,
        s.loops,
        s.window.as_millis(),
        s.origin_delay.as_millis(),
        s.steady.as_secs(),
        s.after.as_secs(),
        s.runs
    );
    let mut header = "| |".to_owned();
    let mut rule = "|---|".to_owned();
    for (row, _) in rows {
        header.push_str(&format!(" {} |", row.name(s)));
        rule.push_str("---|");
    }
    println!("{header}\n{rule}");
    for (i, name) in CELLS.iter().enumerate() {
        let mut line = format!("| {name} |");
        for (_, runs) in rows {
            line.push_str(&format!(" {} |", cell(i, runs)));
        }
        println!("{line}");
    }
    println!("\nOrigin calls per window (= key), K the kill, P the promotion:");
    for (row, runs) in rows {
        for (n, f) in runs.iter().enumerate() {
            println!("  {} run {}: {}", row.name(s), n + 1, f.timeline);
        }
    }
}

fn print_fills(s: &Settings, took: &mut [Vec<Duration>; 2]) {
    println!(
        "\nLeader fill, {} cold keys each, in turn, origin 0 ms (client side, ms):\n",
        s.fills
    );
    println!("| | mean | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|");
    let rows = [Row::Plain, Row::LeaseReplicas];
    let mut medians = Vec::new();
    for (row, samples) in rows.iter().zip(took.iter_mut()) {
        let q =
            |samples: &mut [Duration], at: f64| quantile(samples, at).map_or("–".to_owned(), ms);
        medians.push(quantile(samples, 0.5));
        let mean = samples.iter().sum::<Duration>() / samples.len().max(1) as u32;
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            row.name(s),
            ms(mean),
            q(samples, 0.5),
            q(samples, 0.9),
            q(samples, 0.99),
            q(samples, 1.0)
        );
    }
    if let [Some(a), Some(b)] = medians[..] {
        println!(
            "\nlease_replicas adds {} ms to the median leader fill",
            ms(b.saturating_sub(a))
        );
    }
}

fn main() {
    let args = Args::parse(FLAGS, USAGE);
    let s = Settings::from_args(&args);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut rows = vec![(Row::Plain, Vec::new()), (Row::LeaseReplicas, Vec::new())];
    for run in 0..s.runs {
        for (row, results) in rows.iter_mut() {
            eprintln!("run {} of {}: {}", run + 1, s.runs, row.name(&s));
            match rt.block_on(failover_row(*row, &s)) {
                Ok(f) => results.push(f),
                Err(e) => eprintln!("  failed: {e}"),
            }
        }
    }
    print_failover(&s, &rows);
    match rt.block_on(fill_cost(&s)) {
        Ok(mut took) => print_fills(&s, &mut took),
        Err(e) => eprintln!("leader fill cost: {e}"),
    }
}
