//! The layer's hot keys as JSON, for the admin port's `/hot-keys` and
//! `/status.json` (which `/status` and `herdguard top` read).

/// The layer's hot keys as the admin port's `/hot-keys` serves them: the
/// window in seconds, K, and one list per measure of `{name, key, count,
/// overcount}`, count first (K 0 and empty lists when they are off).
pub(crate) fn json(hot: &herdguard::status::HotKeys) -> String {
    // Plain strings and numbers: serializing cannot fail.
    let mut out = serde_json::to_string(&HotKeysDoc::of(hot)).unwrap_or_default();
    out.push('\n');
    out
}

/// The same for `/status.json`'s `hot_keys`, which `/status` and
/// `herdguard top` read: `null` when hot keys are off.
pub(crate) fn value(hot: &herdguard::status::HotKeys) -> serde_json::Value {
    if hot.k == 0 {
        return serde_json::Value::Null;
    }
    serde_json::to_value(HotKeysDoc::of(hot)).unwrap_or_default()
}

/// The shape of [`json`], field order kept.
#[derive(serde::Serialize)]
struct HotKeysDoc<'a> {
    window_secs: u64,
    k: usize,
    requests: Vec<HotKeyRow<'a>>,
    origin_calls: Vec<HotKeyRow<'a>>,
    waiters: Vec<HotKeyRow<'a>>,
    waited_ms: Vec<HotKeyRow<'a>>,
    stale: Vec<HotKeyRow<'a>>,
    passes: Vec<HotKeyRow<'a>>,
}

#[derive(serde::Serialize)]
struct HotKeyRow<'a> {
    name: &'a str,
    key: &'a str,
    count: u64,
    overcount: u64,
}

impl<'a> HotKeysDoc<'a> {
    fn of(hot: &'a herdguard::status::HotKeys) -> Self {
        fn rows(list: &[herdguard::status::HotKey]) -> Vec<HotKeyRow<'_>> {
            list.iter()
                .map(|r| HotKeyRow {
                    name: &r.name,
                    key: &r.key,
                    count: r.count,
                    overcount: r.overcount,
                })
                .collect()
        }
        Self {
            window_secs: hot.window.as_secs(),
            k: hot.k,
            requests: rows(&hot.requests),
            origin_calls: rows(&hot.origin_calls),
            waiters: rows(&hot.waiters),
            waited_ms: rows(&hot.waited_ms),
            stale: rows(&hot.stale),
            passes: rows(&hot.passes),
        }
    }
}
