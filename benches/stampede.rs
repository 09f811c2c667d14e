//! The stampede benchmark: P app instances on loopback in front of one slow
//! origin, real HTTP/1.1 traffic, one table.
//!
//! ```text
//! cargo bench --bench stampede
//! cargo bench --bench stampede -- --instances 4 --requests 1000 --origin-delay-ms 100 \
//!     --clients 64 --seconds 5
//! cargo bench --bench stampede -- --only reload
//! cargo bench --bench stampede -- --only big --budget-seconds 240
//! ```
//! The reload row primes a hot key on every instance, then sends N
//! concurrent `Cache-Control: max-age=0` requests (a browser reload): they
//! share one refresh per key (per cluster with Redis).
//! Each instance has its own `CacheLayer`, as separate processes would; the
//! Redis row shares one redis-server among them: by default one the bench
//! starts on a free loopback port (`--redis URL` to use a running one,
//! `--redis none` to leave the row out).
//!
//! Columns: origin calls; latency p50/p99/max of successful responses;
//! `fwd`, responses that led or waited for an origin call (`Cache-Status:
//! fwd=…`; every request without a cache); waiter release delay, the
//! completion of a forwarded request minus the instant the origin call it
//! waited on returned (same instance, or any instance when they share Redis);
//! `srv p50/p99`, the same release delay measured to the moment the server
//! stack had the response ready (an outermost middleware stamps it), which
//! leaves out the loopback and client costs that dominate the client-side
//! number when N connections share 2 cores (the `floor` row shows those);
//! Redis commands per request (`INFO stats` total_commands_processed delta: client round trips, not commands run inside scripts); errors.
//!
//! Peers: the cold and expired bursts add `herdguard mem, P=1` (one
//! in-memory instance), nginx (`proxy_cache_lock on`) and varnishd rows,
//! each one cache in front of the same origin, when the programs are
//! installed (see `common/peers.rs`); otherwise those rows say they were
//! skipped. They run as their own processes on the same two cores; the
//! herdguard rows share the bench's runtime with the load generator.
//!
//! `big` (only when named in `--only`: it moves N × 50 MB over loopback):
//! N=`--big-requests` (200) concurrent GETs on one in-memory instance for
//! one `--big-mb` (50) body, origin `--big-rate-mbps` (100), first byte
//! after 100 ms, then a storable `--big-stored-mb` (6; 0 leaves it out)
//! body. The clients run on a runtime of their own (`--big-client-threads`,
//! 1). Reports origin calls, time to first body byte of the leader and the
//! waiters (client side, and the crate's `herdguard_stream_waiter_ttfb_seconds`),
//! every body's BLAKE3 against the origin's, bodies cut off, and peak RSS
//! (`VmHWM` reset before the burst, and a 5 ms sampler) against a bound
//! derived from the window, then a verdict line.

mod common;
// The `big` scenario, in a file of its own.
#[path = "stampede/big_run.rs"]
mod big_run;
// The table: samples, summarised lines, printing.
#[path = "stampede/report.rs"]
mod report;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use herdguard::CacheLayer;

use tokio::sync::Barrier;

use common::args::Args;

use big_run::{print_big, run_big, BIG_WINDOW};
use common::loadgen::{Class, Conn};
use common::origin::{spawn_instance, Instance, Origin, Scope};
use common::peers::{Peer, PeerProxy};
use common::redis::{with_redis, RedisTarget, L1};
use report::{print_header, print_line, ready_instant, summarize, Line, Sample};

const USAGE: &str = "cargo bench --bench stampede -- [--instances P=4] [--requests N=1000] \
[--origin-delay-ms 100] [--slow-origin-ms 3000] [--clients C=64] [--seconds T=5] \
[--body-bytes 512] [--only cold,expired,grace,slow,steady,reload,big] [--budget-seconds 110] [--redis spawn|URL|none] \
[--big-mb 50] [--big-stored-mb 6] [--big-requests 200] [--big-rate-mbps 100] [--big-client-threads 1]";

/// The operator grace of the `grace` scenario (as `reverse_proxy --grace 60s`).
const GRACE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
struct Config {
    instances: usize,
    requests: usize,
    delay: Duration,
    slow_delay: Duration,
    clients: usize,
    seconds: Duration,
    body_bytes: usize,
    only: Option<Vec<String>>,
    budget: Duration,
    big_bytes: usize,
    big_stored_bytes: usize,
    big_requests: usize,
    /// Bytes per second.
    big_rate: f64,
    big_client_threads: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Row {
    /// No cache and no origin delay: what a burst of N costs this machine
    /// over loopback, the floor every other row stands on.
    Floor,
    NoCache,
    Memory,
    Redis,
    /// Steady load with refresh-ahead turned off: what expiry costs without it.
    MemoryNoAhead,
    RedisNoAhead,
    /// One in-memory instance: the same shape as the nginx and Varnish rows
    /// (one cache in front of the origin, every request through it).
    MemoryOne,
    Nginx,
    Varnish,
}

impl Row {
    fn name(self) -> &'static str {
        match self {
            Row::Floor => "floor (0 ms origin)",
            Row::NoCache => "no cache",
            Row::Memory => "herdguard in-memory",
            Row::Redis => "herdguard + Redis",
            Row::MemoryNoAhead => "in-memory, no ahead",
            Row::RedisNoAhead => "+ Redis, no ahead",
            Row::MemoryOne => "herdguard mem, P=1",
            Row::Nginx => "nginx cache_lock",
            Row::Varnish => "varnishd",
        }
    }

    fn peer(self) -> Option<Peer> {
        match self {
            Row::Nginx => Some(Peer::Nginx),
            Row::Varnish => Some(Peer::Varnish),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Cold,
    Expired,
    Grace,
    Slow,
    Steady,
    Reload,
}

impl Scenario {
    const ALL: [Scenario; 6] = [
        Scenario::Cold,
        Scenario::Expired,
        Scenario::Grace,
        Scenario::Slow,
        Scenario::Steady,
        Scenario::Reload,
    ];

    fn id(self) -> &'static str {
        match self {
            Scenario::Cold => "cold",
            Scenario::Expired => "expired",
            Scenario::Grace => "grace",
            Scenario::Slow => "slow",
            Scenario::Steady => "steady",
            Scenario::Reload => "reload",
        }
    }

    fn title(self, cfg: &Config) -> String {
        match self {
            Scenario::Cold => format!(
                "cold-key burst: N={} over P={}, origin {} ms, max-age=60",
                cfg.requests,
                cfg.instances,
                cfg.delay.as_millis()
            ),
            Scenario::Expired => format!(
                "expired-key burst with a stale copy: N={}, max-age=1, stale-while-revalidate=30",
                cfg.requests
            ),
            Scenario::Grace => format!(
                "expired-key burst with grace {} s on: N={}, max-age=1, no stale-while-revalidate",
                GRACE.as_secs(),
                cfg.requests
            ),
            Scenario::Slow => format!(
                "origin slower than the lease: N={}, origin {} ms, lease 1 s (Redis row)",
                cfg.requests,
                cfg.slow_delay.as_millis()
            ),
            Scenario::Steady => format!(
                "expiry under steady load: C={} clients for {} s on one key, max-age=1",
                cfg.clients,
                cfg.seconds.as_secs_f64()
            ),
            Scenario::Reload => format!(
                "reload burst: N={} concurrent max-age=0 requests on a hot key over P={}, origin {} ms",
                cfg.requests,
                cfg.instances,
                cfg.delay.as_millis()
            ),
        }
    }

    fn cache_control(self) -> &'static str {
        match self {
            Scenario::Cold | Scenario::Slow | Scenario::Reload => "max-age=60",
            Scenario::Expired => "max-age=1, stale-while-revalidate=30",
            Scenario::Grace | Scenario::Steady => "max-age=1",
        }
    }
}

/// P instances in front of one origin, or one nginx/varnishd in front of a
/// bare origin instance.
struct Cluster {
    instances: Vec<Instance>,
    origin: Arc<Origin>,
    scope: Scope,
    /// The peer cache every request goes to instead of the instances.
    front: Option<PeerProxy>,
}

impl Cluster {
    fn addrs(&self) -> Vec<SocketAddr> {
        match &self.front {
            Some(p) => vec![p.addr],
            None => self.instances.iter().map(|i| i.addr).collect(),
        }
    }
}

async fn cluster(
    scenario: Scenario,
    row: Row,
    cfg: &Config,
    delay: Duration,
    cache_control: &'static str,
    redis: Option<&RedisTarget>,
    lease: Option<Duration>,
) -> Result<Cluster, String> {
    let origin = Arc::new(Origin::new(delay, cache_control, cfg.body_bytes));
    let count = match row {
        Row::MemoryOne | Row::Nginx | Row::Varnish => 1,
        _ => cfg.instances,
    };
    let mut instances = Vec::with_capacity(count);
    for i in 0..count {
        let mut builder = CacheLayer::builder();
        if scenario == Scenario::Grace {
            builder = builder.grace(GRACE);
        }
        if matches!(row, Row::MemoryNoAhead | Row::RedisNoAhead) {
            builder = builder.refresh_ahead(0.0);
        }
        let layer = match row {
            Row::Floor | Row::NoCache | Row::Nginx | Row::Varnish => None,
            Row::Memory | Row::MemoryNoAhead | Row::MemoryOne => {
                Some(builder.build().map_err(|e| e.to_string())?)
            }
            Row::Redis | Row::RedisNoAhead => {
                let target = redis.ok_or_else(|| "skipped: --redis none".to_owned())?;
                let builder = with_redis(builder, &target.url, L1::Default, lease)?;
                Some(builder.build().map_err(|e| e.to_string())?)
            }
        };
        let instance = spawn_instance(&origin, i, layer)
            .await
            .map_err(|e| format!("bind: {e}"))?;
        instances.push(instance);
    }
    let scope = if matches!(row, Row::Redis | Row::RedisNoAhead) {
        Scope::Cluster
    } else {
        Scope::Instance
    };
    let front = match row.peer() {
        Some(peer) => {
            // Bounded even if this process dies: it outlives no run.
            let lifetime = cfg.budget + Duration::from_secs(30);
            Some(PeerProxy::start(peer, instances[0].addr, lifetime).await?)
        }
        None => None,
    };
    Ok(Cluster {
        instances,
        origin,
        scope,
        front,
    })
}

/// `n` requests, all in flight at once: every connection is open before the
/// first request is written.
async fn burst(
    addrs: &[SocketAddr],
    n: usize,
    path: &str,
    headers: &'static str,
    timeout: Duration,
) -> Vec<Sample> {
    let barrier = Arc::new(Barrier::new(n + 1));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let instance = i % addrs.len();
        let addr = addrs[instance];
        let barrier = Arc::clone(&barrier);
        let path = path.to_owned();
        tasks.push(tokio::spawn(async move {
            let conn = tokio::time::timeout(Duration::from_secs(5), Conn::connect(addr)).await;
            // Every task reaches the barrier, connected or not, so it always opens.
            barrier.wait().await;
            let start = Instant::now();
            let reply = match conn {
                Ok(Ok(mut c)) => tokio::time::timeout(timeout, c.get_with(&path, headers))
                    .await
                    .ok(),
                _ => None,
            };
            let end = Instant::now();
            match reply {
                Some(Ok(r)) => Sample {
                    instance,
                    start,
                    end,
                    ok: r.status == 200,
                    class: r.class,
                    ready: ready_instant(r.ready_us),
                    past_max_age: r.age.is_some_and(|a| a >= 1),
                },
                _ => Sample {
                    instance,
                    start,
                    end,
                    ok: false,
                    class: Class::Uncached,
                    ready: None,
                    past_max_age: false,
                },
            }
        }));
    }
    barrier.wait().await;
    let mut samples = Vec::with_capacity(n);
    for t in tasks {
        if let Ok(s) = t.await {
            samples.push(s);
        }
    }
    samples
}

/// `clients` connections looping on `path` until `duration` has passed (at
/// most 2 million requests in all).
async fn steady(
    addrs: &[SocketAddr],
    clients: usize,
    path: &str,
    duration: Duration,
    timeout: Duration,
) -> Vec<Sample> {
    let deadline = Instant::now() + duration;
    let cap = 2_000_000 / clients.max(1);
    let mut tasks = Vec::with_capacity(clients);
    for i in 0..clients {
        let instance = i % addrs.len();
        let addr = addrs[instance];
        let path = path.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(4096);
            let mut conn: Option<Conn> = None;
            while Instant::now() < deadline && samples.len() < cap {
                let start = Instant::now();
                let c = match conn.as_mut() {
                    Some(c) => c,
                    None => match Conn::connect(addr).await {
                        Ok(c) => conn.insert(c),
                        Err(_) => {
                            samples.push(Sample {
                                instance,
                                start,
                                end: Instant::now(),
                                ok: false,
                                class: Class::Uncached,
                                ready: None,
                                past_max_age: false,
                            });
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    },
                };
                let reply = tokio::time::timeout(timeout, c.get(&path)).await;
                let end = Instant::now();
                let (ok, class, ready, age) = match reply {
                    Ok(Ok(r)) => (r.status == 200, r.class, ready_instant(r.ready_us), r.age),
                    _ => {
                        conn = None;
                        (false, Class::Uncached, None, None)
                    }
                };
                samples.push(Sample {
                    instance,
                    start,
                    end,
                    ok,
                    class,
                    ready,
                    past_max_age: age.is_some_and(|a| a >= 1),
                });
            }
            samples
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        if let Ok(s) = t.await {
            all.extend(s);
        }
    }
    all
}

async fn run(
    scenario: Scenario,
    row: Row,
    cfg: &Config,
    redis: Option<&RedisTarget>,
    nonce: u64,
) -> Line {
    let delay = match (row, scenario) {
        (Row::Floor, _) => Duration::ZERO,
        (_, Scenario::Slow) => cfg.slow_delay,
        _ => cfg.delay,
    };
    let lease = (scenario == Scenario::Slow).then_some(Duration::from_secs(1));
    let mut cluster = match cluster(
        scenario,
        row,
        cfg,
        delay,
        scenario.cache_control(),
        redis,
        lease,
    )
    .await
    {
        Ok(c) => c,
        Err(note) => {
            return Line {
                note,
                ..Line::default()
            }
        }
    };
    let addrs = cluster.addrs();
    // A new key per run, so rows sharing one Redis never see each other's entries.
    let path = format!("/k/{}-{}-{nonce}", scenario.id(), row as u8);
    let timeout = delay + Duration::from_secs(10);

    if matches!(
        scenario,
        Scenario::Expired | Scenario::Grace | Scenario::Steady | Scenario::Reload
    ) {
        // Every instance holds the key (steady: the run measures expiry, not
        // the cold fill; reload: the key is hot).
        for addr in &addrs {
            if let Ok(mut c) = Conn::connect(*addr).await {
                let _ = tokio::time::timeout(timeout, c.get(&path)).await;
            }
        }
    }
    if matches!(scenario, Scenario::Expired | Scenario::Grace) {
        // Past max-age=1 (fresh_for is max-age minus the fill's response
        // delay). nginx keeps expiry in whole seconds and calls an entry
        // stale only once that second has passed: up to 2 s after the fill.
        let past = if row == Row::Nginx { 2200 } else { 1200 };
        tokio::time::sleep(Duration::from_millis(past)).await;
    }

    let redis_before = match (row, redis) {
        (Row::Redis | Row::RedisNoAhead, Some(r)) => r.commands().await.ok(),
        _ => None,
    };
    let calls_before = cluster.origin.calls();
    let samples = match scenario {
        Scenario::Cold | Scenario::Expired | Scenario::Grace | Scenario::Slow => {
            burst(&addrs, cfg.requests, &path, "", timeout).await
        }
        Scenario::Reload => {
            let reload = "cache-control: max-age=0\r\n";
            burst(&addrs, cfg.requests, &path, reload, timeout).await
        }
        Scenario::Steady => steady(&addrs, cfg.clients, &path, cfg.seconds, timeout).await,
    };
    if matches!(scenario, Scenario::Expired | Scenario::Grace) {
        // Let the background refreshes land so they are counted.
        tokio::time::sleep(delay + Duration::from_millis(100)).await;
    }
    let origin_calls = cluster.origin.calls() - calls_before;
    let ok = samples.iter().filter(|s| s.ok).map(|s| s.end - s.start);
    let title = scenario.title(cfg);
    common::chart::record(
        scenario.id(),
        &title,
        row.name(),
        cfg.instances,
        ok,
        origin_calls,
    );
    let mut line = summarize(row, &samples, &cluster.origin.fills(), cluster.scope);
    // Stop the peer before the next row starts (its drop waits for the exit).
    drop(cluster.front.take());
    line.origin_calls = origin_calls;
    if let (Some(before), Some(r)) = (redis_before, redis) {
        if let Ok(after) = r.commands().await {
            line.redis_per_request = Some((after - before) as f64 / line.requests.max(1) as f64);
        }
    }
    if let Some(peer) = row.peer() {
        let count = |c: Class| samples.iter().filter(|s| s.ok && s.class == c).count();
        line.note = format!(
            "Cache-Status hit/stale/fwd {}/{}/{}; {}",
            count(Class::Hit),
            count(Class::Stale),
            count(Class::Forwarded) + count(Class::Uncached),
            peer.version().unwrap_or_default()
        );
    } else if row != Row::NoCache && row != Row::Floor {
        let stats: Vec<String> = cluster
            .instances
            .iter()
            .filter_map(|i| i.layer.as_ref())
            .map(|l| {
                let s = l.stats();
                format!(
                    "{}h/{}s/{}m/{}c/{}b",
                    s.hits, s.stale, s.misses, s.coalesced, s.bypasses
                )
            })
            .collect();
        line.note = format!(
            "hit/stale/miss/coalesced/bypass per instance: {}",
            stats.join(" ")
        );
        if scenario == Scenario::Cold {
            let layers = cluster.instances.iter().filter_map(|i| i.layer.as_ref());
            line.note = format!("{}; {}", hot_key_line(layers), line.note);
        }
        if scenario == Scenario::Slow && row == Row::Memory {
            line.note = format!("no lease in memory; {}", line.note);
        }
    }
    if scenario == Scenario::Steady {
        line.note = format!("past max-age {}; {}", line.past_max_age, line.note);
    }
    line
}

/// The burst's key as the hot keys of every instance show it, summed as
/// `herdguard top` sums them: its name, requests, origin calls and waiters.
fn hot_key_line<'a>(layers: impl Iterator<Item = &'a CacheLayer>) -> String {
    let reports: Vec<_> = layers.map(CacheLayer::hot_keys).collect();
    let Some(top) = reports
        .iter()
        .filter_map(|h| h.requests.first())
        .max_by_key(|r| r.count)
    else {
        return "hot keys off".into();
    };
    let sum = |pick: fn(&herdguard::status::HotKeys) -> &Vec<herdguard::status::HotKey>| -> u64 {
        reports
            .iter()
            .flat_map(|h| pick(h).iter())
            .filter(|r| r.key == top.key)
            .map(|r| r.count)
            .sum()
    };
    format!(
        "hot key {} requests/origin calls/waiters {}/{}/{}",
        top.name,
        sum(|h| &h.requests),
        sum(|h| &h.origin_calls),
        sum(|h| &h.waiters)
    )
}

#[tokio::main]
async fn main() {
    let args = Args::parse(
        &[
            "instances",
            "requests",
            "origin-delay-ms",
            "slow-origin-ms",
            "clients",
            "seconds",
            "body-bytes",
            "only",
            "budget-seconds",
            "redis",
            "big-mb",
            "big-stored-mb",
            "big-requests",
            "big-rate-mbps",
            "big-client-threads",
        ],
        USAGE,
    );
    let cfg = Config {
        instances: args.get("instances", 4usize).max(1),
        requests: args.get("requests", 1000usize).clamp(1, 10_000),
        delay: Duration::from_millis(args.get("origin-delay-ms", 100u64)),
        slow_delay: Duration::from_millis(args.get("slow-origin-ms", 3000u64)),
        clients: args.get("clients", 64usize).clamp(1, 1024),
        seconds: Duration::from_secs_f64(args.get("seconds", 5.0f64).clamp(0.1, 600.0)),
        body_bytes: args.get("body-bytes", 512usize),
        only: args
            .value("only")
            .map(|v| v.split(',').map(str::to_owned).collect()),
        budget: Duration::from_secs(args.get("budget-seconds", 110u64)),
        big_bytes: (args.get("big-mb", 50.0f64).clamp(0.0, 1000.0) * 1e6) as usize,
        big_stored_bytes: (args.get("big-stored-mb", 6.0f64).clamp(0.0, 8.0) * 1e6) as usize,
        big_requests: args.get("big-requests", 200usize).clamp(1, 2000),
        big_rate: args.get("big-rate-mbps", 100.0f64).clamp(1.0, 100_000.0) * 1e6,
        big_client_threads: args.get("big-client-threads", 1usize).clamp(1, 16),
    };
    let redis = match RedisTarget::from_args(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("redis: {e}");
            std::process::exit(2);
        }
    };
    let started = Instant::now();
    let _ = common::origin::epoch();
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);

    println!(
        "herdguard stampede bench: P={} N={} origin={} ms, loopback, {} cores",
        cfg.instances,
        cfg.requests,
        cfg.delay.as_millis(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    match &redis {
        Some(r) => match r.commands().await {
            Ok(n) => println!("redis: {} ({n} commands executed so far)", r.url),
            Err(e) => println!("redis: {} (INFO stats failed: {e})", r.url),
        },
        None => println!("redis: none (the Redis row is skipped: --redis none)"),
    }
    common::peers::report().iter().for_each(|l| println!("{l}"));
    for scenario in Scenario::ALL {
        if let Some(only) = &cfg.only {
            if !only.iter().any(|o| o == scenario.id()) {
                continue;
            }
        }
        println!("\n== {}", scenario.title(&cfg));
        print_header();
        // The floor is the same for every burst; once is enough.
        let rows: &[Row] = match scenario {
            Scenario::Cold => &[
                Row::Floor,
                Row::NoCache,
                Row::Memory,
                Row::Redis,
                Row::MemoryOne,
                Row::Nginx,
                Row::Varnish,
            ],
            Scenario::Expired => &[
                Row::NoCache,
                Row::Memory,
                Row::Redis,
                Row::MemoryOne,
                Row::Nginx,
                Row::Varnish,
            ],
            // The floor shows what a burst of N costs this machine alone.
            Scenario::Grace => &[Row::Floor, Row::NoCache, Row::Memory, Row::Redis],
            Scenario::Steady => &[
                Row::NoCache,
                Row::MemoryNoAhead,
                Row::Memory,
                Row::RedisNoAhead,
                Row::Redis,
            ],
            _ => &[Row::NoCache, Row::Memory, Row::Redis],
        };
        for &row in rows {
            let left = cfg.budget.saturating_sub(started.elapsed());
            let line =
                match tokio::time::timeout(left, run(scenario, row, &cfg, redis.as_ref(), nonce))
                    .await
                {
                    Ok(line) => line,
                    Err(_) => Line {
                        note: format!("not run: the {} s budget ran out", cfg.budget.as_secs()),
                        ..Line::default()
                    },
                };
            print_line(row, &line);
        }
    }
    if cfg
        .only
        .as_ref()
        .is_some_and(|o| o.iter().any(|o| o == "big"))
    {
        println!(
            "\n== big body: N={} concurrent GETs on one in-memory instance, origin {:.0} MB/s, first byte after 100 ms, window {} MiB",
            cfg.big_requests,
            cfg.big_rate / 1e6,
            BIG_WINDOW >> 20
        );
        let mut sizes = vec![("too large to store", cfg.big_bytes)];
        if cfg.big_stored_bytes > 0 {
            sizes.push(("storable", cfg.big_stored_bytes));
        }
        for (label, size) in sizes {
            let left = cfg.budget.saturating_sub(started.elapsed());
            match tokio::time::timeout(left, run_big(&cfg, size, nonce)).await {
                Ok(Ok(line)) => print_big(label, &line),
                Ok(Err(e)) => println!("-- {label}: not run: {e}"),
                Err(_) => println!(
                    "-- {label}: not run to the end: the {} s budget ran out",
                    cfg.budget.as_secs()
                ),
            }
        }
    }
    match common::chart::write(&common::chart::dir()) {
        Ok(files) => files
            .iter()
            .for_each(|f| println!("chart: {}", f.display())),
        Err(e) => eprintln!("charts not written: {e}"),
    }
    println!("\ntotal {:.1} s", started.elapsed().as_secs_f64());
}
