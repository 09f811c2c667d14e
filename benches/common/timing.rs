//! A small wall-clock micro-bench harness: warm up, size a batch, take
//! samples, print the median time per call with the 10th–90th percentile.
//!
//! It stands in for criterion so the library's dev-dependency tree carries
//! no command-line parser. No regression model, no plots: the
//! numbers are compared side by side in one run, as every bench here is.

use std::hint::black_box;
use std::time::{Duration, Instant};

use super::args::Args;

/// Warm-up, measurement and sample count, and the name filters.
#[derive(Debug)]
pub(crate) struct Timing {
    warm_up: Duration,
    measure: Duration,
    samples: usize,
    filters: Vec<String>,
}

/// The flags [`Timing::from_args`] reads; add them to the bench's `known`.
pub(crate) const FLAGS: [&str; 3] = ["warm-up", "measurement-time", "samples"];

/// One bench's result: nanoseconds per call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Measured {
    pub(crate) median_ns: f64,
    pub(crate) p10_ns: f64,
    pub(crate) p90_ns: f64,
}

impl Timing {
    /// `--warm-up SECS` (default 1), `--measurement-time SECS` (default 2),
    /// `--samples N` (default 30); every bare word is a name filter.
    pub(crate) fn from_args(args: &Args) -> Self {
        Self {
            warm_up: Duration::from_secs_f64(args.get("warm-up", 1.0)),
            measure: Duration::from_secs_f64(args.get("measurement-time", 2.0)),
            samples: args.get("samples", 30usize).max(1),
            filters: args.words().to_vec(),
        }
    }

    /// Whether `name` (as `group/bench`) is selected: no filter selects all,
    /// else any filter that is a substring of it. A filter may list
    /// alternatives with `|` (`tower|engine/get_or_compute`); a leading `^`
    /// anchors them at the start, and parentheses are ignored, so the
    /// criterion-style `'^(tower|engine/get_or_compute)'` still works.
    pub(crate) fn selects(&self, name: &str) -> bool {
        self.filters.is_empty()
            || self.filters.iter().any(|f| {
                let anchored = f.starts_with('^');
                let f: String = f
                    .chars()
                    .filter(|c| !matches!(c, '^' | '(' | ')'))
                    .collect();
                f.split('|').any(|alt| {
                    if anchored {
                        name.starts_with(alt)
                    } else {
                        name.contains(alt)
                    }
                })
            })
    }

    /// Time `f` as `name` and print one line; `per` calls of `f` do `per`
    /// units of work (tasks, say), so the line also gives the time per unit.
    /// `None` when the filter leaves it out.
    pub(crate) fn bench<R>(
        &self,
        name: &str,
        per: u64,
        mut f: impl FnMut() -> R,
    ) -> Option<Measured> {
        if !self.selects(name) {
            return None;
        }
        let batch = self.batch_for(&mut f);
        let ns: Vec<f64> = (0..self.samples).map(|_| sample(&mut f, batch)).collect();
        let m = Measured::of(ns);
        let unit = if per > 1 {
            format!(", {} per unit of {per}", time(m.median_ns / per as f64))
        } else {
            String::new()
        };
        m.print(name, self.samples, batch, &unit);
        Some(m)
    }

    /// Time `base` and `other` with their samples taken in turn (a, b, a,
    /// b, …), so a load that comes and goes lands on both alike; print both
    /// and the median of the per-pair ratios `other ÷ base`, which a noisy
    /// machine moves far less than a ratio of two separate runs. `None`
    /// when the filter leaves either out.
    pub(crate) fn pair<R, Q>(
        &self,
        base: (&str, impl FnMut() -> R),
        other: (&str, impl FnMut() -> Q),
    ) -> Option<(Measured, Measured, f64)> {
        let ((a_name, mut a), (b_name, mut b)) = (base, other);
        if !self.selects(a_name) || !self.selects(b_name) {
            return None;
        }
        let (a_batch, b_batch) = (self.batch_for(&mut a), self.batch_for(&mut b));
        let (mut a_ns, mut b_ns, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..self.samples {
            let x = sample(&mut a, a_batch);
            let y = sample(&mut b, b_batch);
            a_ns.push(x);
            b_ns.push(y);
            ratios.push(y / x);
        }
        let (am, bm) = (Measured::of(a_ns), Measured::of(b_ns));
        am.print(a_name, self.samples, a_batch, "");
        bm.print(b_name, self.samples, b_batch, "");
        let r = Measured::of(ratios);
        println!(
            "{:<56} {:>9.2}x  [p10 {:.2}x p90 {:.2}x]  median of per-pair ratios",
            format!("{b_name} ÷ {a_name}"),
            r.median_ns,
            r.p10_ns,
            r.p90_ns
        );
        Some((am, bm, r.median_ns))
    }

    /// Warm `f` up and size a batch to fill one sample's share of the
    /// measurement time.
    fn batch_for<R>(&self, f: &mut impl FnMut() -> R) -> u64 {
        let started = Instant::now();
        let mut calls = 0u64;
        while started.elapsed() < self.warm_up || calls == 0 {
            black_box(f());
            calls += 1;
        }
        let per_call = started.elapsed().as_secs_f64() / calls as f64;
        let slot = self.measure.as_secs_f64() / self.samples as f64;
        ((slot / per_call) as u64).max(1)
    }
}

/// Nanoseconds per call of one batch of `f`.
fn sample<R>(f: &mut impl FnMut() -> R, batch: u64) -> f64 {
    let t = Instant::now();
    for _ in 0..batch {
        black_box(f());
    }
    t.elapsed().as_secs_f64() * 1e9 / batch as f64
}

impl Measured {
    /// Median, p10 and p90 of `ns` (not empty).
    fn of(mut ns: Vec<f64>) -> Self {
        ns.sort_unstable_by(f64::total_cmp);
        let at = |q: f64| ns[((ns.len() - 1) as f64 * q).round() as usize];
        Self {
            median_ns: at(0.5),
            p10_ns: at(0.1),
            p90_ns: at(0.9),
        }
    }

    fn print(&self, name: &str, samples: usize, batch: u64, unit: &str) {
        println!(
            "{name:<56} {:>10}  [p10 {} p90 {}]  {samples} samples x {batch}{unit}",
            time(self.median_ns),
            time(self.p10_ns),
            time(self.p90_ns),
        );
    }
}

/// Nanoseconds as `812 ns`, `1.42 µs` or `3.10 ms`.
pub(crate) fn time(ns: f64) -> String {
    match ns {
        n if n < 1e3 => format!("{n:.1} ns"),
        n if n < 1e6 => format!("{:.3} µs", n / 1e3),
        n => format!("{:.3} ms", n / 1e6),
    }
}
