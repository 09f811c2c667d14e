//! Keeps a lease alive while the leader works: extends it every lease/3, and
//! stops when the work ends (dropping the guard aborts the task).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::key::CacheKey;
use crate::lock::redlock::{Redlock, RedlockLease};
use crate::lock::LeaseToken;
use crate::store::redis::RedisStore;

/// A lease the engine holds while it computes.
#[derive(Debug)]
pub(crate) enum HeldLease {
    /// `SET NX PX` on the main store (the default).
    Single(LeaseToken),
    /// A quorum lease on independent masters.
    Redlock(Arc<Redlock>, RedlockLease),
}

/// What stopping a watchdog hands back.
#[derive(Debug)]
pub(crate) struct Stopped {
    /// An extension found the lease gone while the work ran.
    pub(crate) lost: bool,
    /// A Redlock lease to release (single leases are released by the write).
    pub(crate) redlock: Option<(Arc<Redlock>, RedlockLease)>,
}

/// A running watchdog.
#[derive(Debug)]
pub(crate) struct Watchdog {
    /// `None` once stopped; `Drop` aborts whatever still runs.
    kind: Option<Kind>,
    lost: Arc<AtomicBool>,
}

#[derive(Debug)]
enum Kind {
    Off,
    Single(JoinHandle<()>),
    Redlock {
        stop: Option<oneshot::Sender<()>>,
        task: JoinHandle<RedlockLease>,
        lock: Arc<Redlock>,
    },
    /// Redlock with the watchdog off: the lease is simply held.
    RedlockIdle(Arc<Redlock>, RedlockLease),
}

impl Watchdog {
    /// Start extending `lease` (when `enabled`) every `ttl`/3. Returns the
    /// guard and the token the fenced write carries.
    pub(crate) fn watch(
        store: &Arc<RedisStore>,
        key: CacheKey,
        lease: HeldLease,
        ttl: Duration,
        enabled: bool,
    ) -> (Self, LeaseToken) {
        let lost = Arc::new(AtomicBool::new(false));
        let every = (ttl / 3).max(Duration::from_millis(10));
        match lease {
            HeldLease::Single(token) => {
                if !enabled {
                    return (
                        Self {
                            kind: Some(Kind::Off),
                            lost,
                        },
                        token,
                    );
                }
                let (store, flag, t) = (Arc::clone(store), Arc::clone(&lost), token.clone());
                let task = tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(every).await;
                        match store.extend(&key, &t, ttl).await {
                            Ok(true) => {}
                            Ok(false) => {
                                // Someone else holds it now (or it expired): the
                                // fenced write decides what lands.
                                mark_lost(&flag, &key);
                                return;
                            }
                            // Transient Redis trouble: try again next tick.
                            Err(_) => {}
                        }
                    }
                });
                (
                    Self {
                        kind: Some(Kind::Single(task)),
                        lost,
                    },
                    token,
                )
            }
            HeldLease::Redlock(lock, lease) => {
                let token = lease.token().clone();
                if !enabled {
                    return (
                        Self {
                            kind: Some(Kind::RedlockIdle(lock, lease)),
                            lost,
                        },
                        token,
                    );
                }
                let (stop_tx, mut stop_rx) = oneshot::channel();
                let (l, flag) = (Arc::clone(&lock), Arc::clone(&lost));
                let task = tokio::spawn(async move {
                    let mut lease = lease;
                    let mut alive = true;
                    loop {
                        tokio::select! {
                            _ = &mut stop_rx => return lease,
                            _ = tokio::time::sleep(every), if alive => {
                                if l.extend(&mut lease).await.is_err() {
                                    mark_lost(&flag, &key);
                                    alive = false;
                                }
                            }
                        }
                    }
                });
                (
                    Self {
                        kind: Some(Kind::Redlock {
                            stop: Some(stop_tx),
                            task,
                            lock,
                        }),
                        lost,
                    },
                    token,
                )
            }
        }
    }

    /// Stop extending; hand back what must still be released.
    pub(crate) async fn stop(mut self) -> Stopped {
        let lost = Arc::clone(&self.lost);
        let redlock = match self.kind.take() {
            None | Some(Kind::Off) => None,
            Some(Kind::Single(task)) => {
                task.abort();
                None
            }
            Some(Kind::RedlockIdle(lock, lease)) => Some((lock, lease)),
            Some(Kind::Redlock {
                mut stop,
                task,
                lock,
            }) => {
                if let Some(s) = stop.take() {
                    let _ = s.send(());
                }
                // The task only ends by returning the lease (or by a panic,
                // in which case its copy expires by itself).
                task.await.ok().map(|lease| (lock, lease))
            }
        };
        Stopped {
            lost: lost.load(Ordering::SeqCst),
            redlock,
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Dropped without `stop` (the leader's task was cancelled): stop
        // extending; the lease then expires by itself.
        match self.kind.take() {
            Some(Kind::Single(task)) => task.abort(),
            Some(Kind::Redlock { task, .. }) => task.abort(),
            _ => {}
        }
    }
}

fn mark_lost(flag: &AtomicBool, key: &CacheKey) {
    flag.store(true, Ordering::SeqCst);
    crate::lock::record_acquire("expired_mid_work");
    tracing::warn!(key = %key.short(), "lease lost while the origin call was running");
}
