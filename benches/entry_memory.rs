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

use std::time::{Duration, Instant};

use bytes::Bytes;

use common::args::Args;
use common::loadgen::{closed_loop, Load, Paths};
use common::peers::{herdguard_bin, PeerProxy};

const USAGE: &str = "cargo bench --bench entry_memory -- [--capacity-mib 64] [--seconds 20] \
[--body-bytes 512] [--connections 32] [--proxy-bin PATH]";

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / 1048576.0)
}

fn main() {
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
    let capacity = args.get("capacity-mib", 64u64).clamp(1, 4096) * 1048576;
    let seconds = args.get("seconds", 20.0f64).clamp(1.0, 600.0);
    let body = args.get("body-bytes", 512usize).clamp(1, 1 << 20);
    let connections = args.get("connections", 32usize).clamp(1, 1024);
    let bin = herdguard_bin(args.value("proxy-bin")).unwrap_or_else(|e| {
        println!("entry_memory: {e}");
        std::process::exit(0);
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"));
    rt.block_on(async {
        let origin = common::bare::origin(Bytes::from(vec![b'x'; body]))
            .await
            .unwrap_or_else(|e| panic!("bind: {e}"));
        let capacity_flag = capacity.to_string();
        let lifetime = Duration::from_secs_f64(seconds + 60.0);
        let extra = ["--capacity-bytes", capacity_flag.as_str()];
        let proxy = PeerProxy::start_herdguard_with(&bin, origin, lifetime, &extra)
            .await
            .unwrap_or_else(|e| {
                eprintln!("herdguard proxy: {e}");
                std::process::exit(2);
            });
        let bound = capacity + capacity / 4 + 64 * 1048576;
        println!(
            "entry_memory: herdguard proxy at a capacity of {}, distinct {body}-byte entries, \
             {connections} connections, {seconds} s; bound 1.25 x capacity + 64 MiB = {}",
            mib(capacity),
            mib(bound)
        );
        let load = Load {
            addrs: vec![proxy.addr],
            connections,
            duration: Duration::from_secs_f64(seconds),
            max_requests: 20_000_000,
            // Nearly every request is a URL not seen before.
            paths: Paths::Keys {
                prefix: "/e/".to_owned(),
                keys: u32::MAX,
            },
            request_timeout: Duration::from_secs(10),
        };
        let run = tokio::spawn(async move { closed_loop(&load).await });
        let started = Instant::now();
        let mut rss_max = 0;
        println!("{:>7} {:>12} {:>10}", "t (s)", "rss", "÷capacity");
        while !run.is_finished() {
            tokio::time::sleep(Duration::from_secs_f64(seconds / 10.0)).await;
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
                rss as f64 / capacity as f64
            );
        }
        let report = run
            .await
            .unwrap_or_else(|e| panic!("load task failed: {e}"));
        let fed = (report.ok as f64) * body as f64;
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
            rss_max as f64 / capacity as f64,
            mib(bound),
            if ok { "ok" } else { "FAIL" }
        );
        drop(proxy);
        if !ok {
            std::process::exit(1);
        }
    });
}
