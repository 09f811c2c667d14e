//! `herdguard inspect`: one entry's keys (or any key, as given) read in one
//! pipeline. Reads only: never writes or deletes a key.

use std::time::Duration;

use deadpool_redis::redis;
use herdguard::inspect;
use herdguard::{CacheKey, CacheLayer};
use serde_json::json;

use crate::conn::{bounded, check_namespace, connect};
use crate::report::{now_ms, pttl_json, pttl_text, redact, secs, Failure, Report, Verdict};

/// `herdguard inspect`: an entry by cache key or URL, else a key as given.
pub(crate) async fn inspect(
    target: &str,
    raw: bool,
    redis: &str,
    namespace: &str,
    timeout: Duration,
) -> Result<Report, Failure> {
    let names_entry = inspect::parse_key(target).is_some() || parse_url(target).is_ok();
    if raw {
        inspect_raw(target, redis, timeout).await
    } else if names_entry {
        inspect_entry(target, redis, namespace, timeout).await
    } else {
        inspect_as_given(target, redis, timeout).await
    }
}

/// Where a key came from: given as hex, or derived from a URL.
pub(crate) struct Resolved {
    key: CacheKey,
    url: Option<(String, CacheKey)>,
}

pub(crate) fn resolve_target(target: &str) -> Result<Resolved, Failure> {
    if let Some(key) = inspect::parse_key(target) {
        return Ok(Resolved { key, url: None });
    }
    let uri = parse_url(target)?;
    let layer = CacheLayer::new();
    let request = http::Request::get(uri.clone())
        .body(())
        .map_err(|e| Failure(format!("cannot build a request for {target:?}: {e}")))?;
    Ok(Resolved {
        key: layer.key_for(&request),
        url: Some((uri.to_string(), layer.url_key(&uri))),
    })
}

pub(crate) fn parse_url(target: &str) -> Result<http::Uri, Failure> {
    let bad = || {
        Failure(format!(
            "{target:?} is neither a 32-hex cache key nor an absolute http(s) URL"
        ))
    };
    let uri: http::Uri = target.parse().map_err(|_| bad())?;
    let http_scheme = matches!(uri.scheme_str(), Some("http" | "https"));
    if !http_scheme || uri.host().is_none_or(str::is_empty) {
        return Err(bad());
    }
    Ok(uri)
}

pub(crate) async fn inspect_entry(
    target: &str,
    url: &str,
    namespace: &str,
    timeout: Duration,
) -> Result<Report, Failure> {
    check_namespace(namespace)?;
    let resolved = resolve_target(target)?;
    let names = inspect::entry_keys(namespace, &resolved.key);
    let entry = EntryState::read(url, &names, timeout).await?;
    let problems = entry.problems();
    let verdict = if problems.is_empty() {
        Verdict::Healthy
    } else {
        Verdict::Problem
    };
    let mut json = entry.json(&resolved, &names, &problems);
    json["namespace"] = json!(namespace);
    json["redis"] = json!(redact(url));
    let mut text = entry.text(&resolved, &format!("{} namespace {namespace}", redact(url)));
    for p in &problems {
        text.push_str(&format!("PROBLEM     {p}\n"));
    }
    Ok(Report {
        verdict,
        json,
        text,
    })
}

/// What Redis holds for one entry (its value, lock and fence), as read.
struct EntryState {
    /// The stored bytes, unless they are a pass marker.
    value: Option<Vec<u8>>,
    value_pttl: i64,
    lock_token: Option<String>,
    lock_pttl: i64,
    /// The fence's next token and high-water mark.
    next: Option<u64>,
    hw: Option<u64>,
    /// What is left of a pass marker, -2 when there is none.
    pass_pttl: i64,
    envelope: Option<Result<inspect::Envelope, herdguard::DecodeError>>,
    /// Freshness left: the entry's PTTL past its keep time.
    fresh_pttl: i64,
    status: &'static str,
}

impl EntryState {
    /// One pipeline for the value and the lock, one GET for the fence.
    async fn read(
        url: &str,
        names: &inspect::EntryKeyNames,
        timeout: Duration,
    ) -> Result<Self, Failure> {
        let mut conn = connect(url, timeout).await?;
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(&names.value);
        pipe.cmd("PTTL").arg(&names.value);
        pipe.cmd("GET").arg(&names.lock);
        pipe.cmd("PTTL").arg(&names.lock);
        type Reply = (Option<Vec<u8>>, i64, Option<Vec<u8>>, i64);
        let (value, value_pttl, lock, lock_pttl): Reply =
            bounded(url, timeout, pipe.query_async(&mut conn)).await?;
        // A string; a value of another type (an older release kept a hash
        // there) is an error here, shown as no fence.
        let fence: Result<Option<Vec<u8>>, _> = tokio::time::timeout(
            timeout,
            redis::cmd("GET").arg(&names.fence).query_async(&mut conn),
        )
        .await
        .map_err(|_| ())
        .and_then(|r| r.map_err(|_| ()));
        let (next, hw) = match fence {
            Ok(Some(f)) => inspect::parse_fence(&f),
            _ => (None, None),
        };
        // The pass marker lives in the entry's key; its PTTL is what is left of it.
        let pass = value.as_deref().is_some_and(inspect::is_pass_marker);
        let pass_pttl = if pass { value_pttl } else { -2 };
        let value = if pass { None } else { value };
        let envelope = value.as_deref().map(inspect::decode_envelope);
        let fresh_pttl = match &envelope {
            Some(Ok(e)) if value_pttl >= 0 => (value_pttl - e.kept_ms as i64).max(-2),
            Some(Ok(_)) => value_pttl,
            _ => -2,
        };
        let status = match &envelope {
            None if pass => "pass",
            None => "missing",
            Some(Err(_)) => "corrupt",
            Some(Ok(_)) if fresh_pttl > 0 || fresh_pttl == -1 => "fresh",
            Some(Ok(_)) => "stale",
        };
        Ok(Self {
            value,
            value_pttl,
            lock_token: lock.map(|t| String::from_utf8_lossy(&t).into_owned()),
            lock_pttl,
            next,
            hw,
            pass_pttl,
            envelope,
            fresh_pttl,
            status,
        })
    }

    fn env(&self) -> Option<&inspect::Envelope> {
        self.envelope.as_ref().and_then(|e| e.as_ref().ok())
    }

    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(Err(e)) = &self.envelope {
            problems.push(format!(
                "entry is corrupt ({e}): the cache treats it as a miss and overwrites it"
            ));
        }
        if self.value.is_some() && self.value_pttl == -1 {
            problems.push("entry has no expiry: the layer always sets one".to_owned());
        }
        if self.lock_token.is_some() && self.lock_pttl == -1 {
            problems.push("lock has no expiry: nobody else can ever lead this key".to_owned());
        }
        if let (Some(next), Some(hw)) = (self.next, self.hw) {
            if hw > next {
                problems.push(format!(
                    "fence high-water mark {hw} is above the last issued token {next}"
                ));
            }
        }
        problems
    }

    fn json(
        &self,
        resolved: &Resolved,
        names: &inspect::EntryKeyNames,
        problems: &[String],
    ) -> serde_json::Value {
        let env = self.env();
        json!({
            "key": resolved.key.to_hex(),
            "url": resolved.url.as_ref().map(|(u, _)| u),
            "url_key": resolved.url.as_ref().map(|(_, k)| k.to_hex()),
            "keys": {
                "value": names.value, "lock": names.lock, "fence": names.fence,
            },
            "status": self.status,
            "stored_bytes": self.value.as_ref().map(Vec::len),
            "payload_bytes": env.map(|e| e.payload_bytes),
            "http_status": env.and_then(|e| e.http_status),
            "tags": env.map(|e| &e.tags),
            "stored_at_ms": env.map(|e| e.stored_at_ms),
            "stored_ago_ms": env.map(|e| now_ms().saturating_sub(e.stored_at_ms)),
            "entry_fence": env.map(|e| e.fence),
            "fresh_for_ms": env.map(|e| e.fresh_ms),
            "stale_for_ms": env.map(|e| e.stale_ms),
            "fresh_left_ms": pttl_json(self.fresh_pttl),
            "hard_ttl_ms": pttl_json(self.value_pttl),
            "lock": {
                "held": self.lock_token.is_some(),
                "token": self.lock_token,
                "pttl_ms": pttl_json(self.lock_pttl),
            },
            "fence": { "next": self.next, "hw": self.hw },
            "pass_left_ms": pttl_json(self.pass_pttl),
            "problems": problems,
        })
    }

    /// The report's lines but the problems; `redis`: the server line.
    fn text(&self, resolved: &Resolved, redis: &str) -> String {
        let mut text = String::new();
        let mut line = |k: &str, v: String| text.push_str(&format!("{k:<12}{v}\n"));
        line("key", resolved.key.to_hex());
        if let Some((u, k)) = &resolved.url {
            line("url", format!("GET {u} (url key {})", k.to_hex()));
        }
        line("redis", redis.to_owned());
        line("status", self.status.to_owned());
        if let Some(bytes) = &self.value {
            line("size", size_line(bytes.len(), self.env()));
        }
        if let Some(e) = self.env() {
            line(
                "stored",
                format!(
                    "{} ago by fence {}; fresh for {}, then stale for {}",
                    secs(now_ms().saturating_sub(e.stored_at_ms)),
                    e.fence,
                    secs(e.fresh_ms),
                    secs(e.stale_ms)
                ),
            );
        }
        line("fresh left", pttl_text(self.fresh_pttl));
        line("hard TTL", pttl_text(self.value_pttl));
        line(
            "lock",
            match &self.lock_token {
                Some(t) => format!("held by {t}, {} left", pttl_text(self.lock_pttl)),
                None => "free".to_owned(),
            },
        );
        let num = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
        line(
            "fence",
            format!("next {}, high-water {}", num(self.next), num(self.hw)),
        );
        if self.pass_pttl > 0 {
            line(
                "pass",
                format!("hit-for-pass marker, {} left", pttl_text(self.pass_pttl)),
            );
        }
        text
    }
}

fn size_line(stored: usize, env: Option<&inspect::Envelope>) -> String {
    let mut size = format!("{stored} bytes stored");
    if let Some(e) = env {
        size.push_str(&format!(", {} payload", e.payload_bytes));
        if let Some(s) = e.http_status {
            size.push_str(&format!(", HTTP {s}"));
        }
        if !e.tags.is_empty() {
            size.push_str(&format!(", tags: {}", e.tags.join(" ")));
        }
    }
    size
}

/// A TARGET that is neither a cache key nor a URL: read it as a key if one
/// of that name exists, else it is a usage error.
pub(crate) async fn inspect_as_given(
    target: &str,
    url: &str,
    timeout: Duration,
) -> Result<Report, Failure> {
    let neither = format!("{target:?} is neither a 32-hex cache key nor an absolute http(s) URL");
    let mut conn = connect(url, timeout).await.map_err(|Failure(e)| {
        Failure(format!(
            "{neither}, and whether it names a key is unknown: {e}"
        ))
    })?;
    let kind: String = bounded(
        url,
        timeout,
        redis::cmd("TYPE").arg(target).query_async(&mut conn),
    )
    .await?;
    if kind == "none" {
        return Err(Failure(format!(
            "{neither}, nor a key in {} (--raw reads a key that does not exist yet)",
            redact(url)
        )));
    }
    inspect_raw(target, url, timeout).await
}

/// Longest value printed as text, in characters.
pub(crate) const SHOWN_VALUE_CHARS: usize = 256;

/// Any key, verbatim: its type, PTTL and, for a string, its value (a lock's
/// token) and, when it is one, the entry envelope in it.
pub(crate) async fn inspect_raw(
    key: &str,
    url: &str,
    timeout: Duration,
) -> Result<Report, Failure> {
    let mut conn = connect(url, timeout).await?;
    let mut pipe = redis::pipe();
    pipe.cmd("TYPE").arg(key).cmd("PTTL").arg(key);
    let (kind, pttl): (String, i64) = bounded(url, timeout, pipe.query_async(&mut conn)).await?;
    let value: Option<Vec<u8>> = if kind == "string" {
        bounded(
            url,
            timeout,
            redis::cmd("GET").arg(key).query_async(&mut conn),
        )
        .await?
    } else {
        None
    };
    let text_value = value
        .as_deref()
        .and_then(|v| std::str::from_utf8(v).ok())
        .filter(|v| !v.chars().any(char::is_control));
    let shown = text_value.map(|v| match v.char_indices().nth(SHOWN_VALUE_CHARS) {
        Some((cut, _)) => format!("{}…", &v[..cut]),
        None => v.to_owned(),
    });
    let envelope = value
        .as_deref()
        .and_then(|v| inspect::decode_envelope(v).ok());
    let status = if kind == "none" { "missing" } else { "present" };
    let json = json!({
        "key": key,
        "raw": true,
        "redis": redact(url),
        "status": status,
        "type": kind,
        "pttl_ms": pttl_json(pttl),
        "bytes": value.as_ref().map(Vec::len),
        "value": shown,
        "entry": envelope.as_ref().map(|e| json!({
            "fence": e.fence, "http_status": e.http_status,
            "payload_bytes": e.payload_bytes, "tags": e.tags,
        })),
        "problems": [],
    });
    let mut text = String::new();
    let mut line = |k: &str, v: String| text.push_str(&format!("{k:<12}{v}\n"));
    line("key", format!("{key} (as given)"));
    line("redis", redact(url));
    line("type", kind.clone());
    if let Some(v) = &value {
        let what = match (&shown, &envelope) {
            (_, Some(e)) => format!(
                "herdguard entry: fence {}, {} payload bytes{}",
                e.fence,
                e.payload_bytes,
                e.http_status
                    .map_or_else(String::new, |s| format!(", HTTP {s}"))
            ),
            (Some(t), None) => t.clone(),
            (None, None) => format!("{} binary bytes", v.len()),
        };
        line("value", what);
    }
    line("TTL", pttl_text(pttl));
    Ok(Report {
        verdict: Verdict::Healthy,
        json,
        text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only absolute http(s) URLs with a host are accepted as URLs.
    #[test]
    fn url_targets_need_scheme_and_host() {
        assert!(parse_url("http://example.test/a?b=1").is_ok());
        assert!(parse_url("/a").is_err());
        assert!(parse_url("ftp://example.test/a").is_err());
        assert!(parse_url("not a url").is_err());
    }
}
