//! PromQL, as far as the dashboard needs it read: the metric names an
//! expression reads, with the functions around each and its matchers, and
//! what is wrong with one against the series a proxy registers.

use super::Exposition;

/// A metric an expression reads: its name, the functions it sits inside
/// (outermost first), and its selector's matchers (`label`, `op`, `value`).
#[derive(Debug, PartialEq)]
pub(super) struct MetricRef {
    pub(super) name: String,
    pub(super) functions: Vec<String>,
    pub(super) matchers: Vec<(String, String, String)>,
}

/// PromQL aggregations: `sum by (le) (x)` puts the `(` after the clause.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// PromQL words between operands, and number words: no metric.
const OPERATORS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
];

/// Keywords whose parenthesis holds label names, not expressions.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Every metric `expr` reads. A small lexer, not a full parser: strings,
/// `[range]`s and `$variables` are skipped, label lists after `by` and the
/// like too, and a word followed by `(` is a function.
pub(super) fn metric_refs(expr: &str) -> Vec<MetricRef> {
    let chars: Vec<char> = expr.chars().collect();
    let mut refs = Vec::new();
    // Open parentheses: the function each belongs to ("" for grouping).
    let mut stack: Vec<String> = Vec::new();
    // An aggregation whose `(` comes after its `by (...)` clause.
    let mut pending: Option<String> = None;
    let mut i = 0;
    let skip_ws = |mut j: usize| {
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        j
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i);
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c == '$' {
            i += 1;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c.is_ascii_digit()
            || (c == '.' && i + 1 < chars.len() && chars[i + 1].is_ascii_digit())
        {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = skip_ws(i);
            if LABEL_LISTS.contains(&word.as_str()) {
                // `by (a, b)`: skip the list.
                if next < chars.len() && chars[next] == '(' {
                    i = next;
                    while i < chars.len() && chars[i] != ')' {
                        i += 1;
                    }
                    i += 1;
                }
            } else if (next < chars.len() && chars[next] == '(')
                || AGGREGATIONS.contains(&word.as_str())
            {
                pending = Some(word);
            } else if OPERATORS.contains(&word.as_str()) {
                // Between operands: nothing to read.
            } else {
                let mut matchers = Vec::new();
                if next < chars.len() && chars[next] == '{' {
                    let (m, end) = selector(&chars, next);
                    matchers = m;
                    i = end;
                }
                refs.push(MetricRef {
                    name: word,
                    functions: stack.iter().filter(|f| !f.is_empty()).cloned().collect(),
                    matchers,
                });
            }
        } else if c == '{' {
            // A selector with no name (`{__name__="x"}`): read its name matcher.
            let (m, end) = selector(&chars, i);
            let name = m
                .iter()
                .find(|(k, op, _)| k == "__name__" && op == "=")
                .map(|(_, _, v)| v.clone())
                .unwrap_or_else(|| panic!("a selector without a fixed name in {expr}"));
            refs.push(MetricRef {
                name,
                functions: stack.iter().filter(|f| !f.is_empty()).cloned().collect(),
                matchers: m,
            });
            i = end;
        } else if c == '(' {
            stack.push(pending.take().unwrap_or_default());
            i += 1;
        } else if c == ')' {
            stack.pop();
            i += 1;
        } else {
            i += 1;
        }
    }
    refs
}

/// The index just past the string literal opening at `start`.
fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() && chars[i] != quote {
        if chars[i] == '\\' && quote != '`' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

/// The matchers of the selector opening at `start` (`{`), and the index past its `}`.
fn selector(chars: &[char], start: usize) -> (Vec<(String, String, String)>, usize) {
    let end = {
        let mut i = start + 1;
        while i < chars.len() && chars[i] != '}' {
            if chars[i] == '"' || chars[i] == '\'' || chars[i] == '`' {
                i = skip_string(chars, i);
            } else {
                i += 1;
            }
        }
        i
    };
    let mut matchers = Vec::new();
    let mut i = start + 1;
    while i < end {
        while i < end && (chars[i].is_whitespace() || chars[i] == ',') {
            i += 1;
        }
        if i >= end {
            break;
        }
        let k0 = i;
        while i < end && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
            i += 1;
        }
        let label: String = chars[k0..i].iter().collect();
        let o0 = i;
        while i < end && matches!(chars[i], '=' | '!' | '~' | ' ') {
            i += 1;
        }
        let op: String = chars[o0..i].iter().filter(|c| **c != ' ').collect();
        let v_end = skip_string(chars, i);
        let value: String = chars[i + 1..v_end - 1].iter().collect();
        matchers.push((label, op, value));
        i = v_end;
    }
    (matchers, end + 1)
}

/// Every query of the dashboard: each panel's targets (rows' panels too)
/// and each query variable's `label_values(metric, label)`, as (where, expr).
pub(super) fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    fn panels(list: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for panel in list.as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?");
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("panel {title:?}: a target with no expr"));
                out.push((format!("panel {title:?}"), expr.to_owned()));
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if var["type"] == "query" {
            let q = var["query"]["query"]
                .as_str()
                .or_else(|| var["query"].as_str())
                .expect("a query variable's query");
            out.push((format!("variable {}", var["name"]), q.to_owned()));
        }
    }
    out
}

/// `label_values(metric, label)` as the selector `metric` and its label.
pub(super) fn label_values(query: &str) -> Option<(String, String)> {
    let args = query.strip_prefix("label_values(")?.strip_suffix(')')?;
    let (metric, label) = args.rsplit_once(',')?;
    Some((metric.trim().to_owned(), label.trim().to_owned()))
}

/// What is wrong with `r` against the registered series, if anything.
pub(super) fn check_ref(r: &MetricRef, exposition: &Exposition) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(kind) = exposition.kind_of(&r.name) else {
        let hint = if exposition.types.get(&r.name).map(String::as_str) == Some("histogram") {
            " (a histogram: query its _bucket, _sum or _count)"
        } else {
            ""
        };
        return vec![format!("{} is not registered{hint}", r.name)];
    };
    let innermost = r.functions.last().map(String::as_str);
    if matches!(innermost, Some("rate" | "irate" | "increase")) && kind == "gauge" {
        problems.push(format!(
            "{} is a gauge inside {}()",
            r.name,
            innermost.unwrap()
        ));
    }
    if r.functions.iter().any(|f| f == "histogram_quantile") && !r.name.ends_with("_bucket") {
        problems.push(format!(
            "{} inside histogram_quantile() is no _bucket",
            r.name
        ));
    }
    for (label, op, value) in &r.matchers {
        if label == "__name__" {
            continue;
        }
        let mut samples = exposition.of(&r.name);
        if !samples.any(|s| s.labels.iter().any(|(k, _)| k == label)) {
            problems.push(format!("{} has no label {label}", r.name));
        } else if op == "=" && !value.starts_with('$') {
            let mut samples = exposition.of(&r.name);
            if !samples.any(|s| s.labels.iter().any(|(k, v)| k == label && v == value)) {
                problems.push(format!("{} has no series with {label}=\"{value}\"", r.name));
            }
        }
    }
    problems
}

/// The lexer finds the metrics of the dashboard's shapes of query, with their functions and matchers, and nothing else.
#[test]
fn promql_metric_names_are_extracted() {
    let refs = metric_refs(
        r#"histogram_quantile(0.99, sum by (le) (rate(herdguard_wait_seconds_bucket{cache=~"$cache"}[$__rate_interval])))"#,
    );
    assert_eq!(
        refs,
        [MetricRef {
            name: "herdguard_wait_seconds_bucket".into(),
            functions: vec!["histogram_quantile".into(), "sum".into(), "rate".into()],
            matchers: vec![("cache".into(), "=~".into(), "$cache".into())],
        }]
    );
    let names = |e: &str| -> Vec<String> { metric_refs(e).into_iter().map(|r| r.name).collect() };
    assert_eq!(
        names(
            r#"sum(rate(a_total{cache=~"$cache",outcome="x{y}"}[5m])) / ignoring (outcome) sum without (cache) (rate(b_total[1m] offset 5m)) > bool 0.5 and on(cache) c"#
        ),
        ["a_total", "b_total", "c"]
    );
    assert_eq!(
        names(r#"min(g) or vector(0) unless {__name__="d"}"#),
        ["g", "d"]
    );
    let offset = metric_refs("rate(h[5m] offset 1h) * on (x) group_left (y) (i)");
    assert_eq!(offset[0].functions, ["rate"]);
    assert_eq!(offset[1].name, "i");
    assert!(offset[1].functions.is_empty(), "{offset:?}");
    assert_eq!(
        names("count by (x) (e) * 1e3 + sum_over_time(f[1h:5m])"),
        ["e", "f"]
    );
}
