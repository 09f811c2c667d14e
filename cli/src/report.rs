//! How a command's outcome is shaped: verdict, JSON and text, with every
//! URL redacted. Knows no Redis and no command; every command imports it.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value as Json};

/// How a command ended; the process exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Verdict {
    Healthy = 0,
    Problem = 1,
    Failure = 2,
}

/// A usage or connection error: printed, exit 2.
#[derive(Debug)]
pub(crate) struct Failure(pub(crate) String);

/// A command's result: the verdict, the JSON form and the text form.
pub(crate) struct Report {
    pub(crate) verdict: Verdict,
    pub(crate) json: Json,
    pub(crate) text: String,
}
/// The URL without credentials.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// Text (an error message) with every URL in it redacted.
pub(crate) fn redact_text(s: &str) -> String {
    if !s.contains("://") {
        return s.to_owned();
    }
    s.split(' ').map(redact).collect::<Vec<_>>().join(" ")
}

pub(crate) fn source_text(e: &dyn std::error::Error) -> String {
    e.source().map(ToString::to_string).unwrap_or_default()
}

pub(crate) fn now_us() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i128)
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// PTTL as JSON: milliseconds, `null` for an absent key, `-1` for no expiry.
pub(crate) fn pttl_json(pttl: i64) -> Json {
    match pttl {
        -2 => Json::Null,
        ms => json!(ms),
    }
}

pub(crate) fn pttl_text(pttl: i64) -> String {
    match pttl {
        -2 => "-".to_owned(),
        -1 => "no expiry".to_owned(),
        ms => secs(ms.max(0) as u64),
    }
}

pub(crate) fn secs(ms: u64) -> String {
    format!("{:.3} s", ms as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Credentials never reach output, in URLs or in error text.
    #[test]
    fn credentials_are_redacted() {
        assert_eq!(
            redact("redis://user:pw@127.0.0.1:1/0"),
            "redis://***@127.0.0.1:1/0"
        );
        assert_eq!(redact("redis://127.0.0.1:1"), "redis://127.0.0.1:1");
        assert!(!redact_text("failed at redis://:hunter2@h:1 (x)").contains("hunter2"));
    }
}
