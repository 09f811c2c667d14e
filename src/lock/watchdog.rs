//! Keeps a lease alive while the leader works: extends it every lease/3, and
//! stops when the work ends (the guard aborts the task on drop).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::key::CacheKey;
use crate::lock::LeaseToken;
use crate::store::redis::RedisStore;

/// A running watchdog. Dropping it stops the extensions.
#[derive(Debug)]
pub(crate) struct Watchdog {
    task: Option<JoinHandle<()>>,
    lost: Arc<AtomicBool>,
}

impl Watchdog {
    pub(crate) fn start(
        store: Arc<RedisStore>,
        key: CacheKey,
        token: LeaseToken,
        ttl: Duration,
    ) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&lost);
        let every = (ttl / 3).max(Duration::from_millis(10));
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match store.extend(&key, &token, ttl).await {
                    Ok(true) => {}
                    Ok(false) => {
                        // Someone else holds it now (or it expired): stop
                        // extending; the fenced write decides what lands.
                        flag.store(true, Ordering::SeqCst);
                        crate::lock::record_acquire("expired_mid_work");
                        tracing::warn!(key = %key.short(), "lease lost while the origin call was running");
                        return;
                    }
                    // Transient Redis trouble: try again next tick.
                    Err(_) => {}
                }
            }
        });
        Self {
            task: Some(task),
            lost,
        }
    }

    /// A watchdog that does nothing (watchdog disabled).
    pub(crate) fn disabled() -> Self {
        Self {
            task: None,
            lost: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Stop extending. Returns whether an extension found the lease lost.
    pub(crate) fn stop(mut self) -> bool {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        self.lost.load(Ordering::SeqCst)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}
