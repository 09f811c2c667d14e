//! [`lease_replicas`](crate::RedisOptions::lease_replicas): a lease, or a
//! purge, counts only once that many replicas have it. `WAIT` blocks the connection it runs on, so
//! it runs on the connection kept apart for it (see
//! `Connection::apart`), after a write there: replication is one ordered
//! stream, so a replica that has that write has every earlier one, made on
//! any connection.

use std::time::Duration;

use deadpool_redis::redis::{self, aio::MultiplexedConnection};

use super::scripts::{millis, EXTEND};
use super::store::RedisStore;
use crate::entry::LeaseToken;
use crate::key::CacheKey;

impl RedisStore {
    /// With [`lease_replicas`](crate::RedisOptions::lease_replicas): whether the lease `token`
    /// holds on `key` reached that many replicas in time. On the connection
    /// kept apart (`WAIT` blocks the connection it runs on): a token-checked
    /// `PEXPIRE` of the lease, then `WAIT`. Replication is one ordered stream,
    /// so replicas that have the later write have the lease too.
    pub(super) async fn lease_replicated(&self, key: &CacheKey, token: &LeaseToken) -> bool {
        let Some((replicas, timeout)) = self.options.lease_replicas else {
            return true;
        };
        let Some((id, mut conn)) = self.connection.apart().await else {
            return false;
        };
        let k = self.keys(key);
        let mut inv = EXTEND.prepare_invoke();
        inv.key(k.lock())
            .arg(token.as_str())
            .arg(millis(self.options.lease_ttl));
        let reply = self.options.response_timeout;
        let ours = tokio::time::timeout(reply, inv.invoke_async::<i64>(&mut conn)).await;
        match ours {
            Ok(Ok(1)) => {}
            Ok(Ok(_)) => return false,
            _ => {
                self.connection.drop_apart(id);
                return false;
            }
        }
        self.wait_replicas((id, &mut conn), replicas, timeout).await
    }

    /// With [`lease_replicas`](crate::RedisOptions::lease_replicas): whether every write this
    /// store made so far reached that many replicas in time (a mark written
    /// on the connection kept apart, then `WAIT`): a purge that does not is
    /// answered as unconfirmed.
    pub(super) async fn writes_replicated(&self) -> bool {
        let Some((replicas, timeout)) = self.options.lease_replicas else {
            return true;
        };
        let Some((id, mut conn)) = self.connection.apart().await else {
            return false;
        };
        let mut mark = redis::cmd("SET");
        mark.arg(format!("{}:replicated", self.options.namespace))
            .arg(1)
            .arg("PX")
            .arg(1000);
        let reply = self.options.response_timeout;
        if !matches!(
            tokio::time::timeout(reply, mark.query_async::<()>(&mut conn)).await,
            Ok(Ok(()))
        ) {
            self.connection.drop_apart(id);
            return false;
        }
        self.wait_replicas((id, &mut conn), replicas, timeout).await
    }

    /// `WAIT replicas timeout` on connection `id` kept apart: whether they
    /// acknowledged. A failed or late call drops that connection.
    async fn wait_replicas(
        &self,
        (id, conn): (u64, &mut MultiplexedConnection),
        replicas: usize,
        timeout: Duration,
    ) -> bool {
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(millis(timeout).max(1));
        let bound = timeout + self.options.response_timeout;
        // The connection's own reply bound is `response_timeout`, which cut
        // every longer WAIT short; this handle is a clone, so only this call
        // waits longer.
        conn.set_response_timeout(bound);
        match tokio::time::timeout(bound, wait.query_async::<i64>(conn)).await {
            Ok(Ok(acked)) => acked >= replicas as i64,
            _ => {
                self.connection.drop_apart(id);
                false
            }
        }
    }
}
