//! SVG charts of the stampede bench, drawn with plotters (SVG backend only,
//! no fonts or bitmap code): one latency distribution per scenario, a line
//! per row; and origin calls against the number of instances.
//!
//! Rows are recorded as they finish ([`record`]) and drawn at the end
//! ([`write`]) into `$CARGO_TARGET_DIR/stampede/` (default
//! `target/stampede/`). Origin calls against instances need runs at several
//! `--instances`: every run merges its points into `origin-calls.csv` there
//! and redraws the chart from all of them, so
//! `for p in 1 2 4 8; do cargo bench --bench stampede -- --only cold --instances $p; done`
//! draws the whole curve.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use plotters::prelude::*;

/// One finished row.
struct Row {
    scenario: String,
    title: String,
    row: String,
    instances: usize,
    /// Successful requests' latencies in ms, sorted.
    latencies_ms: Vec<f64>,
    origin_calls: u64,
}

static ROWS: Mutex<Vec<Row>> = Mutex::new(Vec::new());

/// Keep one row's results for the charts.
pub(crate) fn record(
    scenario: &str,
    title: &str,
    row: &str,
    instances: usize,
    latencies: impl Iterator<Item = Duration>,
    origin_calls: u64,
) {
    let mut latencies_ms: Vec<f64> = latencies.map(|d| d.as_secs_f64() * 1e3).collect();
    if latencies_ms.is_empty() {
        return;
    }
    latencies_ms.sort_by(f64::total_cmp);
    ROWS.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(Row {
            scenario: scenario.to_owned(),
            title: title.to_owned(),
            row: row.to_owned(),
            instances,
            latencies_ms,
            origin_calls,
        });
}

/// Where the charts go.
pub(crate) fn dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
    Path::new(&target).join("stampede")
}

/// Draw every chart for the rows recorded so far; returns the files written.
///
/// # Errors
/// A message naming the file that could not be written.
pub(crate) fn write(dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let rows = ROWS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut written = Vec::new();
    let mut scenarios: Vec<&str> = rows.iter().map(|r| r.scenario.as_str()).collect();
    scenarios.dedup();
    for scenario in scenarios {
        let of: Vec<&Row> = rows.iter().filter(|r| r.scenario == scenario).collect();
        let path = dir.join(format!("latency-{scenario}.svg"));
        latency_chart(&path, &of).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
    }
    let csv = dir.join("origin-calls.csv");
    let points = merge_points(&csv, &rows)?;
    if !points.is_empty() {
        let path = dir.join("origin-calls.svg");
        origin_calls_chart(&path, &points).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(csv);
        written.push(path);
    }
    Ok(written)
}

type ChartResult = Result<(), Box<dyn std::error::Error>>;

/// One per row of the largest scenario (the cold burst has 7), so no two
/// lines of one chart share a colour.
const COLORS: [RGBColor; 7] = [
    RGBColor(120, 120, 120),
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
];

/// Cumulative distribution: share of requests answered within x ms, x on a
/// log scale so 1 ms hits and 3 s origins fit one chart.
fn latency_chart(path: &Path, rows: &[&Row]) -> ChartResult {
    let lo = rows
        .iter()
        .filter_map(|r| r.latencies_ms.first())
        .fold(f64::INFINITY, |a, b| a.min(*b))
        .max(0.01);
    let hi = rows
        .iter()
        .filter_map(|r| r.latencies_ms.last())
        .fold(0.0f64, |a, b| a.max(*b))
        .max(lo * 10.0);
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = rows.first().map_or("", |r| r.title.as_str());
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((lo * 0.8..hi * 1.25).log_scale(), 0.0..100.0)?;
    chart
        .configure_mesh()
        .x_desc("latency, ms (log scale)")
        .y_desc("% of requests answered within")
        .draw()?;
    for (i, row) in rows.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let n = row.latencies_ms.len() as f64;
        // At most ~500 points per line: enough for the shape, small files.
        let step = (row.latencies_ms.len() / 500).max(1);
        let points = row
            .latencies_ms
            .iter()
            .enumerate()
            .filter(|(j, _)| j % step == 0 || *j + 1 == row.latencies_ms.len())
            .map(|(j, ms)| (*ms, (j + 1) as f64 * 100.0 / n));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(format!(
                "{} ({} origin call{})",
                row.row,
                row.origin_calls,
                if row.origin_calls == 1 { "" } else { "s" }
            ))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// (scenario, row) → instances → origin calls.
type Points = BTreeMap<(String, String), BTreeMap<usize, u64>>;

/// Points of earlier runs from `csv`, overwritten by this run's, written back.
fn merge_points(csv: &Path, rows: &[Row]) -> Result<Points, String> {
    let mut points = Points::new();
    if let Ok(text) = std::fs::read_to_string(csv) {
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split(',').collect();
            if let [scenario, row, instances, calls] = f[..] {
                if let (Ok(p), Ok(c)) = (instances.parse(), calls.parse()) {
                    points
                        .entry((scenario.to_owned(), row.to_owned()))
                        .or_default()
                        .insert(p, c);
                }
            }
        }
    }
    for r in rows.iter().filter(|r| r.scenario == "cold") {
        points
            .entry((r.scenario.clone(), r.row.replace(',', ";")))
            .or_default()
            .insert(r.instances, r.origin_calls);
    }
    let mut out = String::from("scenario,row,instances,origin_calls\n");
    for ((scenario, row), by) in &points {
        for (p, c) in by {
            out.push_str(&format!("{scenario},{row},{p},{c}\n"));
        }
    }
    std::fs::write(csv, out).map_err(|e| format!("{}: {e}", csv.display()))?;
    Ok(points)
}

fn origin_calls_chart(path: &Path, points: &Points) -> ChartResult {
    let max_p = points
        .values()
        .flat_map(|b| b.keys())
        .copied()
        .max()
        .unwrap_or(1);
    let max_c = points
        .values()
        .flat_map(|b| b.values())
        .copied()
        .filter(|c| *c < 1000)
        .max()
        .unwrap_or(1);
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Cold-key burst: origin calls against instances (rows without a cache are off the top)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0usize..max_p + 1, 0u64..max_c + 2)?;
    chart
        .configure_mesh()
        .x_desc("instances (P)")
        .y_desc("origin calls for one burst")
        .draw()?;
    for (i, ((_, row), by)) in points.iter().enumerate() {
        if by.values().all(|c| *c >= 1000) {
            continue;
        }
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                by.iter().map(|(p, c)| (*p, *c)),
                color.stroke_width(2),
            ))?
            .label(row.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(
            by.iter()
                .map(|(p, c)| Circle::new((*p, *c), 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
