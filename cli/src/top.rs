//! `herdguard top`: a live view of one or more `herdguard proxy` instances,
//! read from each one's admin `/status.json` once a second (like
//! `varnishtop`): per instance the Redis and breaker state, the budget,
//! requests, hit ratio, origin calls, followers and own calls per second;
//! then the hot keys summed over every instance and the flights running
//! now. On a terminal the view redraws in place; otherwise each refresh is
//! printed as plain text, one block after another.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use serde_json::Value;

use crate::report::{redact, Failure};

/// Rows of the hot-key table.
const HOT_ROWS: usize = 10;
/// The hot-key measures, as `/status.json` names them, and their headings.
const MEASURES: [(&str, &str); 6] = [
    ("requests", "requests"),
    ("origin_calls", "origin"),
    ("waiters", "waiters"),
    ("waited_ms", "waited ms"),
    ("stale", "stale"),
    ("passes", "passes"),
];

/// What to watch and for how long.
pub(crate) struct Watch {
    /// Each instance's admin base URL (`http://127.0.0.1:9090`).
    pub(crate) admins: Vec<String>,
    /// Or the Redis (and namespace) where the instances say theirs.
    pub(crate) redis: Option<(String, String)>,
    pub(crate) interval: Duration,
    /// Stop after this many refreshes (`None`: until interrupted).
    pub(crate) count: Option<u64>,
    /// Bound on each `/status.json` read.
    pub(crate) timeout: Duration,
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// Run the view. Fails only when no instance answers the first read.
pub(crate) async fn top(watch: Watch) -> Result<(), Failure> {
    let client: HttpClient =
        Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new());
    let terminal = std::io::stdout().is_terminal();
    let mut before: HashMap<String, Value> = HashMap::new();
    let mut shown = 0u64;
    let mut tick = tokio::time::interval(watch.interval);
    let mut admins = watch.admins.clone();
    loop {
        tick.tick().await;
        if let Some((url, namespace)) = &watch.redis {
            admins = crate::announce::instances(url, namespace, watch.timeout).await?;
        }
        let mut reads = Vec::with_capacity(admins.len());
        for admin in &admins {
            reads.push(read(&client, admin, watch.timeout).await);
        }
        if shown == 0 && reads.iter().all(Result::is_err) {
            let errors: Vec<String> = reads.into_iter().filter_map(Result::err).collect();
            if errors.is_empty() {
                return Err(Failure("no instance says its admin address there".into()));
            }
            return Err(Failure(errors.join("; ")));
        }
        let text = render(&admins, &reads, &before);
        let mut out = std::io::stdout().lock();
        let clear = if terminal { "\x1b[H\x1b[2J" } else { "" };
        let _ = write!(out, "{clear}{text}");
        if !terminal {
            let _ = writeln!(out);
        }
        let _ = out.flush();
        for (admin, read) in admins.iter().zip(reads) {
            if let Ok(snap) = read {
                before.insert(admin.clone(), snap);
            }
        }
        shown += 1;
        if watch.count.is_some_and(|n| shown >= n) {
            return Ok(());
        }
    }
}

/// One instance's snapshot, or why it could not be read.
async fn read(client: &HttpClient, admin: &str, timeout: Duration) -> Result<Value, String> {
    let url = format!("{}/status.json", admin.trim_end_matches('/'));
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{}: {e}", redact(admin)))?;
    let fetch = async {
        let res = client.get(uri).await.map_err(|e| e.to_string())?;
        if !res.status().is_success() {
            return Err(format!("status {}", res.status()));
        }
        let body = res.into_body().collect().await.map_err(|e| e.to_string())?;
        serde_json::from_slice::<Value>(&body.to_bytes()).map_err(|e| e.to_string())
    };
    match tokio::time::timeout(timeout, fetch).await {
        Ok(r) => r.map_err(|e| format!("{}: {e}", redact(admin))),
        Err(_) => Err(format!("{}: no answer in {timeout:?}", redact(admin))),
    }
}

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut at = v;
    for p in path {
        at = &at[*p];
    }
    at.as_f64().unwrap_or(0.0)
}

fn answers(s: &Value) -> f64 {
    ["hits", "stale", "misses", "coalesced", "bypasses", "errors"]
        .iter()
        .map(|k| num(s, &["stats", k]))
        .sum()
}

/// One refresh's text: the instances, the hot keys over all of them, the
/// flights running now.
fn render(
    admins: &[String],
    reads: &[Result<Value, String>],
    before: &HashMap<String, Value>,
) -> String {
    let mut t = String::new();
    let up = reads.iter().filter(|r| r.is_ok()).count();
    let _ = writeln!(
        t,
        "herdguard top: {up} of {} instance(s) answering",
        admins.len()
    );
    let _ = writeln!(
        t,
        "{:<34} {:<12} {:<8} {:>9} {:>9} {:>6} {:>9} {:>11} {:>7} {:>9}",
        "instance",
        "redis",
        "breaker",
        "budget",
        "req/s",
        "hit %",
        "origin/s",
        "followers/s",
        "own/s",
        "requests"
    );
    for (admin, read) in admins.iter().zip(reads) {
        let snap = match read {
            Ok(s) => s,
            Err(e) => {
                let _ = writeln!(t, "{:<34} unreachable: {e}", redact(admin));
                continue;
            }
        };
        instance_row(&mut t, snap, before.get(admin));
    }
    let snaps: Vec<&Value> = reads.iter().filter_map(|r| r.as_ref().ok()).collect();
    hot_keys(&mut t, &snaps);
    flights(&mut t, &snaps);
    t
}

/// One instance's row: its state now, and rates since `prev`, its
/// previous read (hit % since it started, without one).
fn instance_row(t: &mut String, snap: &Value, prev: Option<&Value>) {
    let since = |f: &dyn Fn(&Value) -> f64| f(snap) - prev.map_or(0.0, f);
    let rate = |f: &dyn Fn(&Value) -> f64| -> String {
        let dt = prev.map_or(0.0, |p| {
            (num(snap, &["time_ms"]) - num(p, &["time_ms"])) / 1000.0
        });
        if dt > 0.0 {
            format!("{:.1}", (since(f) / dt).max(0.0))
        } else {
            "–".into()
        }
    };
    let all = since(&answers);
    let hit = if all > 0.0 {
        let served = since(&|s| num(s, &["stats", "hits"]) + num(s, &["stats", "stale"]));
        format!("{:.1}", 100.0 * served / all)
    } else {
        "–".into()
    };
    let _ = writeln!(
        t,
        "{:<34} {:<12} {:<8} {:>9} {:>9} {:>6} {:>9} {:>11} {:>7} {:>9}",
        clip(snap["instance"].as_str().unwrap_or("?"), 34),
        clip(snap["redis"].as_str().unwrap_or("?"), 12),
        clip(snap["origin"]["breaker"].as_str().unwrap_or("?"), 8),
        format!(
            "{}/{}",
            num(snap, &["origin", "budget_in_use"]),
            num(snap, &["origin", "budget_limit"])
        ),
        rate(&answers),
        hit,
        rate(&|s| num(s, &["stats", "origin_calls"])),
        rate(&|s| num(s, &["stats", "followers"])),
        rate(&|s| num(s, &["stats", "own_calls"])),
        answers(snap),
    );
}

/// The hot keys summed over every instance, by requests (then origin calls).
fn hot_keys(t: &mut String, snaps: &[&Value]) {
    // key → (name, one count per measure)
    let mut rows: HashMap<String, (String, [u64; 6])> = HashMap::new();
    let mut window = None;
    for snap in snaps {
        let hot = &snap["hot_keys"];
        if hot.is_null() {
            continue;
        }
        window = window.or(hot["window_secs"].as_u64());
        for (i, (measure, _)) in MEASURES.iter().enumerate() {
            for row in hot[*measure].as_array().into_iter().flatten() {
                let key = row["key"].as_str().unwrap_or("").to_owned();
                let entry = rows
                    .entry(key)
                    .or_insert_with(|| (row["name"].as_str().unwrap_or("").to_owned(), [0; 6]));
                entry.1[i] += row["count"].as_u64().unwrap_or(0);
            }
        }
    }
    let _ = writeln!(t);
    let Some(window) = window else {
        let _ = writeln!(t, "hot keys: off on every instance");
        return;
    };
    let mut rows: Vec<(String, [u64; 6])> = rows.into_values().collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let _ = writeln!(t, "hot keys, last {window} s, all instances");
    let mut head = format!("{:<48}", "key");
    for (_, title) in MEASURES {
        let _ = write!(head, " {title:>9}");
    }
    let _ = writeln!(t, "{head}");
    for (name, counts) in rows.iter().take(HOT_ROWS) {
        let mut line = format!("{:<48}", clip(name, 48));
        for c in counts {
            let _ = write!(line, " {c:>9}");
        }
        let _ = writeln!(t, "{line}");
    }
}

/// The flights running now on every instance, longest first.
fn flights(t: &mut String, snaps: &[&Value]) {
    let mut all: Vec<(u64, String, String, u64, String)> = Vec::new();
    for snap in snaps {
        let names = names(snap);
        let instance = snap["instance"].as_str().unwrap_or("?");
        for f in snap["flights"].as_array().into_iter().flatten() {
            let key = f["key"].as_str().unwrap_or("");
            let lease = f["lease_left_ms"]
                .as_u64()
                .map_or_else(|| "–".to_owned(), |ms| ms.to_string());
            all.push((
                f["age_ms"].as_u64().unwrap_or(0),
                names.get(key).cloned().unwrap_or_else(|| key.to_owned()),
                instance.to_owned(),
                f["waiters"].as_u64().unwrap_or(0),
                lease,
            ));
        }
    }
    all.sort_by_key(|f| std::cmp::Reverse(f.0));
    let _ = writeln!(t);
    let _ = writeln!(t, "flights now: {}", all.len());
    if all.is_empty() {
        return;
    }
    let _ = writeln!(
        t,
        "{:<48} {:<34} {:>8} {:>8} {:>12}",
        "key", "instance", "age ms", "waiters", "lease left ms"
    );
    for (age, name, instance, waiters, lease) in all.iter().take(HOT_ROWS) {
        let _ = writeln!(
            t,
            "{:<48} {:<34} {age:>8} {waiters:>8} {lease:>12}",
            clip(name, 48),
            clip(instance, 34)
        );
    }
}

/// Key digest → name, from an instance's hot-key rows.
fn names(snap: &Value) -> HashMap<String, String> {
    let mut names = HashMap::new();
    for (measure, _) in MEASURES {
        for row in snap["hot_keys"][measure].as_array().into_iter().flatten() {
            if let (Some(k), Some(n)) = (row["key"].as_str(), row["name"].as_str()) {
                names.insert(k.to_owned(), n.to_owned());
            }
        }
    }
    names
}

/// `s` cut to `width` characters, control characters shown as `?`: a
/// name read from an instance never moves the terminal's cursor.
fn clip(s: &str, width: usize) -> String {
    let shown = |c: char| if c.is_control() { '?' } else { c };
    if s.chars().count() <= width {
        return s.chars().map(shown).collect();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).map(shown).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn snap(instance: &str, time_ms: u64, hits: u64, calls: u64, hot: Value) -> Value {
        json!({
            "instance": instance, "time_ms": time_ms, "redis": "connected", "entries": 1,
            "stats": {"hits": hits, "stale": 0, "misses": 1, "coalesced": 0, "bypasses": 0,
                      "errors": 0, "origin_calls": calls, "own_calls": 0},
            "origin": {"budget_in_use": 0, "budget_limit": 64, "queued": 0, "breaker": "closed"},
            "flights": [],
            "hot_keys": hot,
        })
    }

    /// Hot keys from several instances are summed per key; rates come from
    /// the previous read of the same instance.
    #[test]
    fn sums_hot_keys_over_instances_and_rates_per_instance() {
        let hot = |calls: u64, waiters: u64| {
            json!({"window_secs": 60,
                   "requests": [{"name": "/a", "key": "aa", "count": 10}],
                   "origin_calls": [{"name": "/a", "key": "aa", "count": calls}],
                   "waiters": [{"name": "/a", "key": "aa", "count": waiters}]})
        };
        let admins = vec!["http://a".to_owned(), "http://b".to_owned()];
        let mut before = HashMap::new();
        before.insert("http://a".to_owned(), snap("a", 1000, 0, 0, Value::Null));
        let reads = vec![
            Ok(snap("a", 2000, 100, 1, hot(1, 600))),
            Ok(snap("b", 2000, 50, 0, hot(0, 399))),
        ];
        let text = render(&admins, &reads, &before);
        let row = text
            .lines()
            .find(|l| l.starts_with("/a "))
            .expect("the hot key's row");
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(&cells[..4], &["/a", "20", "1", "999"], "{text}");
        let a = text.lines().find(|l| l.starts_with("a ")).expect("a's row");
        assert!(a.contains(" 100.0 "), "requests per second over 1 s: {a}");
    }

    /// A name with control characters (an instance answering with a
    /// terminal escape) is printed without them.
    #[test]
    fn names_never_carry_control_characters() {
        assert_eq!(clip("/a\x1b[2J\n", 48), "/a?[2J?");
        assert_eq!(clip("\x07bell", 3), "?b…");
    }
}
