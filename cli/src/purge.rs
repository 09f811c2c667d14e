//! `herdguard purge`: deletes entries through the library's own purge path
//! (`CacheLayer::purge_key` / `purge_tag`, awaited), never by deleting keys
//! itself; `--soft` marks them stale through the layer's soft purge
//! (`CacheLayer::soft_purge_key` / `soft_purge_tag`), awaited.

use std::time::Duration;

use deadpool_redis::redis;
use herdguard::inspect;
use herdguard::{CacheKey, CacheLayer, RedisOptions};
use serde_json::{json, Value as Json};

use crate::conn::{bounded, check_namespace, connect};
use crate::inspect::parse_url;
use crate::report::{redact, redact_text, source_text, Failure, Report, Verdict};

/// What to purge, and how.
pub(crate) struct Target<'a> {
    /// A URL or a cache key.
    pub(crate) target: Option<&'a str>,
    pub(crate) tag: Option<String>,
    /// Mark stale instead of deleting.
    pub(crate) soft: bool,
}

pub(crate) async fn purge(
    what: Target<'_>,
    url: &str,
    namespace: &str,
    timeout: Duration,
) -> Result<Report, Failure> {
    let Target { target, tag, soft } = what;
    check_namespace(namespace)?;
    let (what, described) = purge_target(target, tag)?;
    let layer = purge_layer(url, namespace, timeout).await?;
    // A purge is a handful of sequential calls, each bounded by `timeout`.
    let bound = timeout * 8;
    let handle = match (what, soft) {
        (Purge::Key(key), false) => layer.purge_key(&key),
        (Purge::Tag(tag), false) => layer.purge_tag(&tag),
        (Purge::Key(key), true) => layer.soft_purge_key(&key),
        (Purge::Tag(tag), true) => layer.soft_purge_tag(&tag),
    };
    let done = async { handle.await.map(|_| ()).map_err(|e| e.to_string()) };
    match tokio::time::timeout(bound, done).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(Failure(format!("{} ({})", redact_text(&e), redact(url)))),
        Err(_) => {
            return Err(Failure(format!(
                "purge at {} did not finish within {bound:?}",
                redact(url)
            )))
        }
    }
    let text = purge_text(&described, soft, url, namespace);
    let json = json!({
        "purged": described,
        "soft": soft,
        "redis": redact(url),
        "namespace": namespace,
        "notice_published": true,
    });
    Ok(Report {
        verdict: Verdict::Healthy,
        json,
        text,
    })
}

/// What to purge: an entry's (or a URL's) key, or a tag.
enum Purge {
    Key(CacheKey),
    Tag(String),
}

/// What the arguments name, and how the report describes it.
fn purge_target(target: Option<&str>, tag: Option<String>) -> Result<(Purge, Json), Failure> {
    match (target, tag) {
        (_, Some(tag)) if tag.is_empty() || tag.contains(char::is_whitespace) => Err(Failure(
            "a tag is one Surrogate-Key token: not empty, no spaces".to_owned(),
        )),
        (_, Some(tag)) => Ok((Purge::Tag(tag.clone()), json!({ "tag": tag }))),
        (Some(t), None) => match inspect::parse_key(t) {
            Some(key) => Ok((Purge::Key(key), json!({ "key": key.to_hex() }))),
            None => {
                let uri = parse_url(t)?;
                let key = CacheLayer::new().url_key(&uri);
                Ok((
                    Purge::Key(key),
                    json!({ "url": uri.to_string(), "url_key": key.to_hex() }),
                ))
            }
        },
        (None, None) => Err(Failure("give a URL, a key or --tag".to_owned())),
    }
}

/// A layer on the server only to purge through it, after a direct PING:
/// the layer's breaker reports any failure as "unavailable", the PING tells
/// the operator why (refused, auth, timeout).
async fn purge_layer(url: &str, namespace: &str, timeout: Duration) -> Result<CacheLayer, Failure> {
    let mut conn = connect(url, timeout).await?;
    let _: String = bounded(url, timeout, redis::cmd("PING").query_async(&mut conn)).await?;
    CacheLayer::builder()
        .redis(
            RedisOptions::new(url)
                .namespace(namespace)
                .connections(1)
                .connect_timeout(timeout)
                .response_timeout(timeout)
                .pool_wait_timeout(timeout),
        )
        .build()
        .map_err(|e| Failure(redact_text(&format!("{e}: {}", source_text(&e)))))
}

fn purge_text(described: &Json, soft: bool, url: &str, namespace: &str) -> String {
    let done = if soft { "soft-purged" } else { "purged" };
    match &described {
        d if d.get("tag").is_some() => format!(
            "{done} every entry tagged {} in {} namespace {namespace}; purge notice published\n",
            d["tag"],
            redact(url)
        ),
        d if d.get("url").is_some() => format!(
            "{done} every variant of {} (url key {}) in {} namespace {namespace}; purge notice published\n",
            d["url"],
            d["url_key"],
            redact(url)
        ),
        d => format!(
            "{done} key {} in {} namespace {namespace}; purge notice published\n",
            d["key"],
            redact(url)
        ),
    }
}
