//! What small entries cost in memory behind `herdguard proxy`: the release
//! binary (a child process) in front of the bare hyper origin, fed distinct
//! URLs until far more bytes than its capacity went through it, its RSS read
//! from `/proc` as it goes.
//!
//! ```text
//! cargo build --release -p herdguard-cli && cargo bench --bench entry_memory
//! cargo bench --bench entry_memory -- --capacity-mib 64 --seconds 20 --body-bytes 512
//! ```
//! Every answer is `max-age=3600` (nothing expires), so the capacity alone
//! bounds what is kept. The table shows RSS against the capacity; the run
//! exits 1 when RSS goes above 1.25 × capacity + 64 MiB (the bound the
//! crate documents, as `soak --large` checks for large entries), or any
//! request failed. Linux only (`/proc`).

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::task::JoinHandle;

use common::args::Args;
use common::loadgen::{closed_loop, Load, Paths, Report};
use common::peers::{herdguard_bin, PeerProxy};
use common::{memory_bound, mib};

const USAGE: &str = "cargo bench --bench entry_memory -- [--capacity-mib 64] [--seconds 20] \
[--body-bytes 512] [--connections 32] [--proxy-bin PATH]";

/// What one run does, from its flags.
struct Settings {
    capacity: u64,
    seconds: f64,
    body: usize,
    connections: usize,
    bin: PathBuf,
}

impl Settings {
    fn parse() -> Self {
        let args = Args::parse(
            &[
                "capacity-mib",
                "seconds",
                "body-bytes",
                "connections",
                "proxy-bin",
            ],
            USAGE,
        );
        let bin = herdguard_bin(args.value("proxy-bin")).unwrap_or_else(|e| {
            println!("entry_memory: {e}");
            std::process::exit(0);
        });
        Self {
            capacity: args.get("capacity-mib", 64u64).clamp(1, 4096) * 1048576,
            seconds: args.get("seconds", 20.0f64).clamp(1.0, 600.0),
            body: args.get("body-bytes", 512usize).clamp(1, 1 << 20),
            connections: args.get("connections", 32usize).clamp(1, 1024),
            bin,
        }
    }
}

fn main() {
    let s = Settings::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"));
    let ok = rt.block_on(run(&s));
    if !ok {
        std::process::exit(1);
    }
}

/// Start the origin and the proxy, feed it, and report; whether RSS kept
/// to the bound with no request failing.
async fn run(s: &Settings) -> bool {
    let origin = common::bare::origin(Bytes::from(vec![b'x'; s.body]))
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let capacity_flag = s.capacity.to_string();
    let lifetime = Duration::from_secs_f64(s.seconds + 60.0);
    let extra = ["--capacity-bytes", capacity_flag.as_str()];
    let proxy = PeerProxy::start_herdguard_with(&s.bin, origin, lifetime, &extra)
        .await
        .unwrap_or_else(|e| {
            eprintln!("herdguard proxy: {e}");
            std::process::exit(2);
        });
    let bound = memory_bound(s.capacity);
    println!(
        "entry_memory: herdguard proxy at a capacity of {}, distinct {}-byte entries, \
         {} connections, {} s; bound 1.25 x capacity + 64 MiB = {}",
        mib(s.capacity),
        s.body,
        s.connections,
        s.seconds,
        mib(bound)
    );
    let load = Load {
        addrs: vec![proxy.addr],
        connections: s.connections,
        duration: Duration::from_secs_f64(s.seconds),
        max_requests: 20_000_000,
        // Nearly every request is a URL not seen before.
        paths: Paths::Keys {
            prefix: "/e/".to_owned(),
            keys: u32::MAX,
        },
        request_timeout: Duration::from_secs(10),
    };
    let load = tokio::spawn(async move { closed_loop(&load).await });
    let rss_max = watch(&proxy, &load, s).await;
    let report = load
        .await
        .unwrap_or_else(|e| panic!("load task failed: {e}"));
    report_run(s, &report, rss_max, bound)
}

/// The proxy's RSS every tenth of the run while `load` runs, printed; the
/// largest seen.
async fn watch(proxy: &PeerProxy, load: &JoinHandle<Report>, s: &Settings) -> u64 {
    let started = Instant::now();
    let mut rss_max = 0;
    println!("{:>7} {:>12} {:>10}", "t (s)", "rss", "÷capacity");
    while !load.is_finished() {
        tokio::time::sleep(Duration::from_secs_f64(s.seconds / 10.0)).await;
        let Some(rss) = proxy.server_rss_bytes() else {
            // A bound that cannot be read must not pass.
            eprintln!("entry_memory: cannot read the proxy's RSS from /proc");
            std::process::exit(2);
        };
        rss_max = rss_max.max(rss);
        println!(
            "{:>7.1} {:>12} {:>10.2}",
            started.elapsed().as_secs_f64(),
            mib(rss),
            rss as f64 / s.capacity as f64
        );
    }
    rss_max
}

/// Print the totals; whether the run passed.
fn report_run(s: &Settings, report: &Report, rss_max: u64, bound: u64) -> bool {
    let fed = (report.ok as f64) * s.body as f64;
    let ok = rss_max <= bound && report.errors == 0;
    println!(
        "\nrequests  {} ({:.0}/s), errors {}; about {} of bodies fed through",
        report.ok + report.errors,
        report.rps(),
        report.errors,
        mib(fed as u64)
    );
    println!(
        "rss max   {} = {:.2} x capacity; bound {}  {}",
        mib(rss_max),
        rss_max as f64 / s.capacity as f64,
        mib(bound),
        if ok { "ok" } else { "FAIL" }
    );
    ok
}
