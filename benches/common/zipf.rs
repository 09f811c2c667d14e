//! A Zipf law over `/k/{0..keys}`: the probabilities the origin-load bench
//! asks keys with, the floor of origin calls a cache of them must make, and
//! a `wrk` Lua script that draws from the same table.

use std::fmt::Write;
use std::net::SocketAddr;

/// Key `i` (from 0) is asked with probability ∝ 1 / (i + 1)^exponent.
#[derive(Debug, Clone)]
pub(crate) struct Zipf {
    probabilities: Vec<f64>,
}

impl Zipf {
    pub(crate) fn new(keys: u32, exponent: f64) -> Self {
        let weights: Vec<f64> = (1..=keys.max(1))
            .map(|rank| f64::from(rank).powf(-exponent))
            .collect();
        let total: f64 = weights.iter().sum();
        Self {
            probabilities: weights.iter().map(|w| w / total).collect(),
        }
    }

    pub(crate) fn probabilities(&self) -> &[f64] {
        &self.probabilities
    }

    /// Origin calls per 1,000 requests that a cache keeping each answer
    /// exactly `max_age_secs` must make at `rps` requests a second: key i,
    /// asked λᵢ = rps·pᵢ times a second, is fetched λᵢ / (1 + λᵢ·T) times a
    /// second (after each fill, the first request past T fetches again).
    pub(crate) fn floor_per_1000(&self, rps: f64, max_age_secs: f64) -> f64 {
        if rps <= 0.0 {
            return 0.0;
        }
        let fetches: f64 = self
            .probabilities
            .iter()
            .map(|p| {
                let lambda = rps * p;
                lambda / (1.0 + lambda * max_age_secs)
            })
            .sum();
        1000.0 * fetches / rps
    }

    /// A `wrk` script that asks `/k/{i}` with these probabilities (inverse
    /// CDF by binary search over the table written into it), each thread
    /// seeded on its own, threads spread round-robin over `targets` so
    /// several instances share one run (and its percentiles). A thread
    /// stops after `per_thread` requests (wrk still reports its full `-d`).
    pub(crate) fn wrk_script(&self, targets: &[SocketAddr], seed: u64, per_thread: u64) -> String {
        let mut cdf = String::with_capacity(self.probabilities.len() * 20);
        let mut sum = 0.0;
        for (i, p) in self.probabilities.iter().enumerate() {
            sum += p;
            // The last bound is exactly 1 so every draw finds a key.
            let bound = if i + 1 == self.probabilities.len() {
                1.0
            } else {
                sum
            };
            let _ = write!(cdf, "{bound:.17},");
            if i % 8 == 7 {
                cdf.push('\n');
            }
        }
        let ports: Vec<String> = targets.iter().map(|a| a.port().to_string()).collect();
        format!(
            r#"-- Written by benches/origin_load.rs: Zipf keys over /k/0..{n}.
local cdf = {{
{cdf}}}
local n = #cdf
local ports = {{ {ports} }}
local threads = 0
function setup(thread)
  local port = ports[(threads % #ports) + 1]
  thread.addr = wrk.lookup("127.0.0.1", tostring(port))[1]
  threads = threads + 1
  thread:set("seed", {seed} + threads * 7919)
end
function init(args)
  math.randomseed(seed)
end
local sent = 0
function request()
  sent = sent + 1
  if sent > {per_thread} then wrk.thread:stop() end
  local u = math.random()
  local lo, hi = 1, n
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if cdf[mid] < u then lo = mid + 1 else hi = mid end
  end
  return wrk.format("GET", "/k/" .. (lo - 1))
end
"#,
            n = self.probabilities.len(),
            ports = ports.join(", "),
        )
    }
}
