//! Kept connections of a standalone link (one Redis, or the primary behind
//! Sentinel): where they come from ([`Connector`]) and one slot's connect,
//! run in its own task and shared by everyone waiting for it. Knows no
//! breaker and no command.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_redis::redis::{aio::MultiplexedConnection, AsyncConnectionConfig};
use deadpool_redis::Pool;
use futures_util::future::{BoxFuture, FutureExt, Shared};

use super::error::{describe, redact_error};
use super::sentinel::SentinelMaster;

/// Where a standalone link's connections come from.
#[derive(Clone)]
pub(super) enum Connector {
    /// One Redis at a fixed address: deadpool builds the connections.
    Pool(Pool),
    /// The primary the sentinels name now, asked on every connect.
    Sentinel(Arc<SentinelMaster>, AsyncConnectionConfig),
}

impl Connector {
    /// A new multiplexed connection (the caller bounds the wait).
    async fn open(&self) -> Result<MultiplexedConnection, Arc<str>> {
        match self {
            Connector::Pool(pool) => match pool.get().await {
                Ok(pooled) => Ok(deadpool_redis::Connection::take(pooled)),
                Err(deadpool_redis::PoolError::Backend(e)) => Err(Arc::from(describe(&e))),
                Err(other) => Err(Arc::from(redact_error(&other))),
            },
            Connector::Sentinel(master, config) => {
                master.connect(config, false).await.map(|(_, conn)| conn)
            }
        }
    }
}

/// A connect that runs in its own task, shared by everyone waiting for it.
pub(super) type PendingConnect = Shared<BoxFuture<'static, Result<Kept, Arc<str>>>>;

/// A kept connection and its id, so a failure replaces the connection it
/// happened on and not a newer one made meanwhile.
pub(super) type Kept = (u64, MultiplexedConnection);

/// One kept connection and its (re)connect.
#[derive(Default)]
pub(super) struct Slot {
    /// A std `Mutex`: only held to clone or replace a handle, never across `.await`.
    conn: Mutex<Option<Kept>>,
    /// The connect under way. Its own task drives it, so a caller that stops
    /// waiting (its bound ran out) does not cancel it: a later call finds the
    /// connection ready instead of starting over against a slow server.
    connecting: Mutex<Option<PendingConnect>>,
}

impl Slot {
    /// The kept connection, unless there is none or it is older than `fresh_from`.
    pub(super) fn current(&self, fresh_from: u64) -> Option<Kept> {
        self.conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|(id, _)| *id >= fresh_from)
            .cloned()
    }

    /// Forget the connections older than `fresh_from` (all: `u64::MAX`).
    pub(super) fn clear_older(&self, fresh_from: u64) {
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        if conn.as_ref().is_some_and(|(id, _)| *id < fresh_from) {
            *conn = None;
        }
    }

    /// Forget connection `id`, if this slot still keeps it.
    pub(super) fn clear(&self, id: u64) {
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        if conn.as_ref().is_some_and(|(kept, _)| *kept == id) {
            *conn = None;
        }
    }

    /// The connect of this slot, started now unless one is under way.
    pub(super) fn connect(
        self: &Arc<Self>,
        connector: &Connector,
        bound: Duration,
        ids: &AtomicU64,
    ) -> PendingConnect {
        let mut pending = self
            .connecting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = pending.as_ref() {
            return p.clone();
        }
        let id = ids.fetch_add(1, Ordering::SeqCst);
        let (slot, connector) = (Arc::clone(self), connector.clone());
        let task = tokio::spawn(async move {
            let result = match tokio::time::timeout(bound, connector.open()).await {
                Ok(Ok(conn)) => {
                    *slot.conn.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some((id, conn.clone()));
                    Ok((id, conn))
                }
                Ok(Err(why)) => Err(why),
                Err(_) => Err(Arc::from("connect timed out")),
            };
            *slot
                .connecting
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = None;
            result
        });
        let shared = async move {
            task.await
                .unwrap_or_else(|_| Err(Arc::from("connect task ended early")))
        }
        .boxed()
        .shared();
        *pending = Some(shared.clone());
        shared
    }
}
