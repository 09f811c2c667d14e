//! Load from `wrk` (when installed) instead of the in-process generator:
//! a C load generator in its own process, the way the peers are measured
//! (`wrk -t2 -c64 -d4s`), so servers outside this process (nginx, Varnish,
//! `herdguard proxy`) are driven the same way as those inside it.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

/// What one `wrk` run reported.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WrkRun {
    pub(crate) requests: u64,
    pub(crate) secs: f64,
    /// Socket errors plus non-2xx/3xx answers.
    pub(crate) errors: u64,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
}

/// `wrk`'s version line, or `None` when it is not installed.
pub(crate) fn version() -> Option<String> {
    // `wrk -v` prints its version and usage, then exits 1.
    let out = Command::new("wrk").arg("-v").output().ok()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    text.lines()
        .find(|l| l.starts_with("wrk "))
        .map(|l| l.trim().to_owned())
}

/// `wrk -t{threads} -c{connections} -d{secs}s --latency http://{addr}{path}`.
pub(crate) fn run(
    addr: SocketAddr,
    path: &str,
    threads: usize,
    connections: usize,
    secs: u64,
) -> Result<WrkRun, String> {
    let out = Command::new("wrk")
        .arg(format!("-t{threads}"))
        .arg(format!("-c{connections}"))
        .arg(format!("-d{secs}s"))
        .arg("--latency")
        .arg(format!("http://{addr}{path}"))
        .output()
        .map_err(|e| format!("wrk: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse(&text).ok_or_else(|| format!("unreadable wrk output: {text}"))
}

/// A `wrk` run driven by a Lua script (which may pick each thread's
/// server: see `common/zipf.rs`), with its own per-request timeout.
#[derive(Debug, Clone)]
pub(crate) struct ScriptedRun<'a> {
    pub(crate) url: String,
    pub(crate) script: &'a std::path::Path,
    pub(crate) threads: usize,
    pub(crate) connections: usize,
    pub(crate) secs: u64,
    /// A request without an answer this long counts as a socket error.
    pub(crate) timeout: Duration,
}

/// `wrk -s script --timeout T --latency …`; ends by itself after `secs`.
pub(crate) fn run_script(run: &ScriptedRun<'_>) -> Result<WrkRun, String> {
    let out = Command::new("wrk")
        .arg(format!("-t{}", run.threads))
        .arg(format!("-c{}", run.connections.max(run.threads)))
        .arg(format!("-d{}s", run.secs.max(1)))
        .arg(format!("--timeout={}s", run.timeout.as_secs().max(1)))
        .arg("--latency")
        .arg("-s")
        .arg(run.script)
        .arg(&run.url)
        .output()
        .map_err(|e| format!("wrk: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse(&text).ok_or_else(|| {
        let err = String::from_utf8_lossy(&out.stderr);
        format!("unreadable wrk output: {text} {err}")
    })
}

/// Read the numbers out of wrk's report.
fn parse(text: &str) -> Option<WrkRun> {
    let mut run = WrkRun::default();
    let mut seen = false;
    for line in text.lines().map(str::trim) {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("50%"), Some(v)) => run.p50 = latency(v)?,
            (Some("99%"), Some(v)) => run.p99 = latency(v)?,
            // `Latency  avg  stdev  max  +/-stdev` (not `Latency Distribution`).
            (Some("Latency"), Some(avg)) if latency(avg).is_some() => {
                run.max = words.nth(1).and_then(latency).unwrap_or_default();
            }
            (Some(n), Some("requests")) => {
                run.requests = n.parse().ok()?;
                let secs = words.nth(1)?.trim_end_matches(',');
                run.secs = latency(secs)?.as_secs_f64();
                seen = true;
            }
            (Some("Non-2xx"), _) => run.errors += line.rsplit(' ').next()?.parse::<u64>().ok()?,
            (Some("Socket"), Some("errors:")) => {
                for n in line.split(',') {
                    run.errors += n.rsplit(' ').next()?.parse::<u64>().ok()?;
                }
            }
            _ => {}
        }
    }
    seen.then_some(run)
}

/// `230.00us`, `1.20ms`, `4.00s`, `2.00m`.
fn latency(v: &str) -> Option<Duration> {
    let split = v.find(|c: char| c.is_ascii_alphabetic())?;
    let (n, unit) = v.split_at(split);
    let n: f64 = n.parse().ok()?;
    let secs = match unit {
        "us" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        _ => return None,
    };
    Some(Duration::from_secs_f64(secs))
}
