//! Instances on one Redis, for `herdguard top --redis`: a proxy with an
//! admin port and a plain `--redis` URL says every 2 s, in one sorted set
//! (`NAMESPACE:admins`, each member an admin URL scored by Redis' own clock
//! when it was last said), where its admin port answers; a reader takes the
//! members said within the last 10 s. The set is bounded: every write drops
//! the members older than that, and the key expires 10 s after the last
//! write. Commands: `TIME`, `ZADD`, `ZREMRANGEBYSCORE`, `PEXPIRE`, `ZRANGE`
//! (all in the documented ACL line).

use std::time::Duration;

use deadpool_redis::redis::{self, aio::MultiplexedConnection};

use crate::conn::{bounded, connect};
use crate::report::Failure;

/// How often an instance says where it is.
const EVERY: Duration = Duration::from_secs(2);
/// A member not said again for this long is gone.
const LIVE_MS: u64 = 10_000;
/// The most instances a reader takes.
const MOST: isize = 256;

/// The set's key in `namespace`.
pub(crate) fn key(namespace: &str) -> String {
    format!("{namespace}:admins")
}

/// Redis' clock in milliseconds.
async fn now_ms(conn: &mut MultiplexedConnection) -> redis::RedisResult<u64> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
    Ok(secs * 1000 + micros / 1000)
}

/// What a proxy says, if anything: with an admin port and a plain
/// `--redis` URL, `announce` (or `http://` and the admin address it bound)
/// in its namespace. Redis Cluster and Sentinel deployments are not
/// announced (`herdguard top --admin` lists them).
pub(crate) fn start(
    redis_url: Option<&str>,
    namespace: Option<&str>,
    announce: Option<&str>,
    admin: Option<std::net::SocketAddr>,
) {
    let (Some(url), Some(admin)) = (redis_url, admin) else {
        return;
    };
    let said = announce.map_or_else(|| format!("http://{admin}"), str::to_owned);
    let namespace = namespace.unwrap_or(herdguard::RedisOptions::DEFAULT_NAMESPACE);
    spawn(url.to_owned(), namespace.to_owned(), said);
}

/// Say `admin` in `namespace` every 2 s for as long as the process runs;
/// a failed round is logged and tried again at the next.
fn spawn(redis_url: String, namespace: String, admin: String) {
    tokio::spawn(async move {
        let timeout = Duration::from_secs(1);
        let key = key(&namespace);
        let mut conn: Option<MultiplexedConnection> = None;
        let mut tick = tokio::time::interval(EVERY);
        loop {
            tick.tick().await;
            if conn.is_none() {
                conn = connect(&redis_url, timeout).await.ok();
            }
            let Some(c) = conn.as_mut() else { continue };
            let say = async {
                let now = now_ms(c).await?;
                redis::pipe()
                    .cmd("ZADD")
                    .arg(&key)
                    .arg(now)
                    .arg(&admin)
                    .ignore()
                    .cmd("ZREMRANGEBYSCORE")
                    .arg(&key)
                    .arg("-inf")
                    .arg(format!("({}", now.saturating_sub(LIVE_MS)))
                    .ignore()
                    .cmd("PEXPIRE")
                    .arg(&key)
                    .arg(LIVE_MS)
                    .ignore()
                    .query_async::<()>(c)
                    .await
            };
            if let Err(Failure(e)) = bounded(&redis_url, timeout, say).await {
                tracing::debug!(error = %e, "could not say where the admin port is");
                conn = None;
            }
        }
    });
}

/// The admin URLs said in `namespace` within the last 10 s, at most 256.
pub(crate) async fn instances(
    redis_url: &str,
    namespace: &str,
    timeout: Duration,
) -> Result<Vec<String>, Failure> {
    let mut conn = connect(redis_url, timeout).await?;
    let key = key(namespace);
    let read = async {
        let now = now_ms(&mut conn).await?;
        let said: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&key)
            .arg(-MOST)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?;
        Ok(said
            .into_iter()
            .filter(|(_, at)| now.saturating_sub(*at as u64) <= LIVE_MS)
            .map(|(admin, _)| admin)
            .collect())
    };
    bounded(redis_url, timeout, read).await
}
