//! `herdguard locks --sentinel`: the data nodes of a Sentinel setup as its
//! sentinels name them now: every primary any of them names (right after a
//! failover, the old one and the new one) and every replica they know, down
//! ones too, so a lease held twice shows on the nodes that hold it.

use std::collections::HashMap;
use std::time::Duration;

use deadpool_redis::redis;

use crate::conn::{bounded, connect};
use crate::report::{redact, Failure};

/// The node URLs for `master` from every sentinel that answers, primaries
/// first, each once. `node_url` gives the scheme, credentials and database
/// (host and port are the node's); without it, `redis://` and no credentials.
pub(crate) async fn sentinel_nodes(
    sentinels: &[String],
    master: &str,
    node_url: Option<&str>,
    timeout: Duration,
) -> Result<Vec<String>, Failure> {
    let (mut primaries, mut replicas) = (Vec::new(), Vec::new());
    let mut why = Vec::new();
    for sentinel in sentinels {
        match ask(sentinel, master, timeout).await {
            Ok((primary, known)) => {
                primaries.push(primary);
                replicas.extend(known);
            }
            Err(e) => why.push(e.0),
        }
    }
    if primaries.is_empty() {
        return Err(Failure(format!(
            "no sentinel named a primary for {master:?}: {}",
            why.join("; ")
        )));
    }
    let mut nodes: Vec<(String, u16)> = Vec::new();
    for node in primaries.into_iter().chain(replicas) {
        if !nodes.contains(&node) {
            nodes.push(node);
        }
    }
    let template = node_url.unwrap_or("redis://localhost");
    nodes
        .into_iter()
        .map(|(host, port)| node(template, &host, port))
        .collect()
}

/// What one sentinel says: the primary, and the replicas it knows.
async fn ask(
    sentinel: &str,
    master: &str,
    timeout: Duration,
) -> Result<((String, u16), Vec<(String, u16)>), Failure> {
    let mut c = connect(sentinel, timeout).await?;
    let mut cmd = redis::cmd("SENTINEL");
    cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(master);
    let primary: Option<(String, u16)> =
        bounded(sentinel, timeout, cmd.query_async(&mut c)).await?;
    let primary = primary
        .ok_or_else(|| Failure(format!("{}: no master named {master:?}", redact(sentinel))))?;
    let mut cmd = redis::cmd("SENTINEL");
    cmd.arg("REPLICAS").arg(master);
    let known: Vec<HashMap<String, String>> =
        bounded(sentinel, timeout, cmd.query_async(&mut c)).await?;
    let replicas = known
        .iter()
        .filter_map(|r| Some((r.get("ip")?.clone(), r.get("port")?.parse().ok()?)))
        .collect();
    Ok((primary, replicas))
}

/// `template` with its host and port replaced by `host:port`.
fn node(template: &str, host: &str, port: u16) -> Result<String, Failure> {
    let invalid = || Failure(format!("invalid --node-url {}", redact(template)));
    let mut url = redis::parse_redis_url(template).ok_or_else(invalid)?;
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    url.set_host(Some(&host)).map_err(|_| invalid())?;
    url.set_port(Some(port)).map_err(|()| invalid())?;
    Ok(url.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node's URL keeps the template's credentials and database.
    #[test]
    fn node_urls_keep_credentials_and_database() {
        let url = node("rediss://u:p@primary/2", "10.0.0.7", 6380).unwrap();
        assert_eq!(url, "rediss://u:p@10.0.0.7:6380/2");
        assert_eq!(
            node("redis://localhost", "::1", 7000).unwrap(),
            "redis://[::1]:7000"
        );
    }
}
