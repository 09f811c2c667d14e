//! Purges across instances: group indexes in Redis (URL and `Surrogate-Key`
//! tags) and a broadcast channel every instance listens on to clear its L1.
//!
//! A purge deletes the entries from Redis, then publishes a notice; every
//! instance (the sender too) applies it to its own memory. If an instance
//! misses the notice (its listener was reconnecting) answers fresh from its
//! copy for at most the L1 lifetime (1 s by default): that is the bound on
//! the delay. A stale answer from the copy starts a refresh, which finds the
//! entry gone in Redis and replaces the copy.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};
use std::time::Duration;

use deadpool_redis::redis::{self, Script};
use futures_util::future::join_all;
use futures_util::StreamExt;
use tokio::sync::watch;

use crate::key::CacheKey;
use crate::store::redis::{RedisStore, StoreError};

/// Applies a purge notice (raw payload) to this process.
pub(crate) type PurgeHandler = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// The listening side, shared with its background task.
#[derive(Default)]
pub(crate) struct PurgeBus {
    /// A std `Mutex`: only cloned out or replaced, never held across `.await`.
    handler: Mutex<Option<PurgeHandler>>,
    started: AtomicBool,
}

impl std::fmt::Debug for PurgeBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PurgeBus")
            .field("started", &self.started.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl PurgeBus {
    pub(crate) fn set_handler(&self, handler: PurgeHandler) {
        *self.handler.lock().unwrap_or_else(PoisonError::into_inner) = Some(handler);
    }

    fn apply(&self, payload: &[u8]) {
        let handler = self
            .handler
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(h) = handler {
            h(payload);
        }
    }
}

static INDEX: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS: group set; ARGV: member ttl_ms
redis.call('SADD', KEYS[1], ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
",
    )
});

impl RedisStore {
    fn group_key(&self, group: &str) -> String {
        // Hashed: no request or tag text reaches a key name or picks a slot.
        format!(
            "{}:g:{{{}}}",
            self.options.namespace,
            CacheKey::new(group).to_hex()
        )
    }

    fn purge_channel(&self) -> String {
        format!("{}:purge", self.options.namespace)
    }

    /// Record `key` as a member of each group, kept at least `ttl`.
    pub(crate) async fn index_groups(&self, key: &CacheKey, groups: &[String], ttl: Duration) {
        let member = key.to_hex();
        let ttl_ms = ttl.as_millis().clamp(1, u64::MAX as u128) as u64;
        join_all(groups.iter().map(|g| {
            let mut inv = INDEX.prepare_invoke();
            inv.key(self.group_key(g)).arg(&member).arg(ttl_ms);
            async move {
                let _: Result<i64, _> = self.invoke("index", &inv).await;
            }
        }))
        .await;
    }

    /// Delete every entry indexed under `group`, then the index itself.
    pub(crate) async fn purge_group(&self, group: &str) -> Result<(), StoreError> {
        let set = self.group_key(group);
        let mut members_cmd = redis::cmd("SMEMBERS");
        members_cmd.arg(&set);
        let members: Vec<Vec<u8>> = self.query("purge_group", &members_cmd).await?;
        let deletions = members
            .iter()
            .filter_map(|m| CacheKey::from_hex(m))
            .map(|k| async move { self.purge(&k).await });
        for r in join_all(deletions).await {
            r?;
        }
        let mut del = redis::cmd("DEL");
        del.arg(&set);
        let _: i64 = self.query("purge_group", &del).await?;
        Ok(())
    }

    /// Tell every instance (this one too) to apply `payload` to its memory.
    pub(crate) async fn publish_purge(&self, payload: &[u8]) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(self.purge_channel()).arg(payload);
        let _: i64 = self.query("publish_purge", &cmd).await?;
        Ok(())
    }

    /// Install what applies purge notices here, and start listening.
    pub(crate) fn set_purge_handler(&self, handler: PurgeHandler) {
        self.purge_bus.set_handler(handler);
        self.ensure_purge_listener();
    }

    /// Start the listener task once, when inside a runtime.
    pub(crate) fn ensure_purge_listener(&self) {
        if self.purge_bus.started.load(Ordering::Relaxed)
            || tokio::runtime::Handle::try_current().is_err()
        {
            return;
        }
        if !self.purge_bus.started.swap(true, Ordering::SeqCst) {
            let client = match self.pubsub_client() {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "no purge listener: other instances' purges reach this one only through L1 expiry");
                    return;
                }
            };
            tokio::spawn(listen(
                Arc::downgrade(&self.purge_bus),
                client,
                self.purge_channel(),
                self.options.connect_timeout,
                self.shutdown_signal(),
                Arc::clone(&self.renew),
            ));
        }
    }
}

/// The purge listener: one subscriber connection, reconnecting with back-off,
/// ending when the store is dropped.
async fn listen(
    bus: Weak<PurgeBus>,
    client: redis::Client,
    channel: String,
    connect_timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
    renew: Arc<tokio::sync::Notify>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut renewed = false;
        if let Ok(Ok(mut pubsub)) =
            tokio::time::timeout(connect_timeout, client.get_async_pubsub()).await
        {
            if let Ok(Ok(())) =
                tokio::time::timeout(connect_timeout, pubsub.subscribe(&channel)).await
            {
                backoff = Duration::from_millis(100);
                let mut messages = pubsub.into_on_message();
                loop {
                    tokio::select! {
                        msg = messages.next() => match (msg, bus.upgrade()) {
                            (Some(m), Some(b)) => b.apply(m.get_payload_bytes()),
                            (Some(_), None) => return,
                            (None, _) => break,
                        },
                        // The server was found demoted: reconnect, perhaps elsewhere.
                        _ = renew.notified() => {
                            renewed = true;
                            break;
                        }
                        _ = shutdown.changed() => return,
                    }
                }
            }
        }
        if bus.strong_count() == 0 {
            return;
        }
        if renewed {
            // Asked to move, not failed: reconnect at once.
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
