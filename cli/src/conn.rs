//! Reaching the Redis nodes an operator names: checks on URLs, node lists
//! and namespaces, connects and calls, each bounded by `--timeout-ms`.
//! Runs no command of its own.

use std::time::Duration;

use deadpool_redis::redis::{self, aio::MultiplexedConnection, AsyncConnectionConfig};

use crate::report::{redact, redact_text, Failure};

pub(crate) async fn connect(
    url: &str,
    timeout: Duration,
) -> Result<MultiplexedConnection, Failure> {
    let client = redis::Client::open(url).map_err(|e| {
        Failure(format!(
            "invalid redis url {}: {}",
            redact(url),
            redact_text(&e.to_string())
        ))
    })?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    // The outer bound covers anything the connection timeout does not.
    match tokio::time::timeout(
        timeout,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(Failure(format!(
            "cannot connect to {}: {}",
            redact(url),
            redact_text(&e.to_string())
        ))),
        Err(_) => Err(Failure(format!(
            "cannot connect to {}: timed out after {timeout:?}",
            redact(url)
        ))),
    }
}

/// A Redis call bounded by `timeout`, its errors redacted.
pub(crate) async fn bounded<T>(
    url: &str,
    timeout: Duration,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Failure(format!(
            "{}: {}",
            redact(url),
            redact_text(&e.to_string())
        ))),
        Err(_) => Err(Failure(format!(
            "{}: no reply within {timeout:?}",
            redact(url)
        ))),
    }
}

pub(crate) fn check_namespace(ns: &str) -> Result<(), Failure> {
    let ok = !ns.is_empty()
        && ns.len() <= 64
        && ns
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Failure(format!(
            "namespace {ns:?} must be 1-64 characters of letters, digits, '_', '-', '.', ':'"
        )))
    }
}

pub(crate) fn check_nodes(nodes: &[String]) -> Result<(), Failure> {
    if nodes.is_empty() || nodes.iter().any(|n| n.trim().is_empty()) {
        return Err(Failure(
            "--nodes needs one or more URLs, comma-separated".to_owned(),
        ));
    }
    Ok(())
}
