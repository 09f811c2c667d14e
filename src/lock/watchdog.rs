//! Keeps a lease alive while the leader works: extends it every lease/3, and
//! stops when the work ends (dropping the guard aborts the task).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::entry::LeaseToken;
use crate::key::CacheKey;
use crate::lock::redlock::{Redlock, RedlockLease};
use crate::metrics::LeaseLost;
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
    /// Lease time left now, by our own clock: how close the work came to
    /// the lease's end.
    pub(crate) remaining: Duration,
}

/// How long a watched lease has left, readable while the work runs (a
/// Redlock lease: of its first term; its renewals are not tracked here).
#[derive(Debug, Clone)]
pub(crate) struct LeaseClock {
    started: Instant,
    renewed_ms: Arc<AtomicU64>,
    ttl: Duration,
}

impl LeaseClock {
    pub(crate) fn left(&self) -> Duration {
        let renewed = Duration::from_millis(self.renewed_ms.load(Ordering::Relaxed));
        (self.started + renewed + self.ttl).saturating_duration_since(Instant::now())
    }
}

/// A running watchdog.
#[derive(Debug)]
pub(crate) struct Watchdog {
    /// `None` once stopped; `Drop` aborts whatever still runs.
    kind: Option<Kind>,
    lost: Arc<AtomicBool>,
    /// When the single lease was taken; with `renewed_ms`, its expiry.
    started: Instant,
    /// Milliseconds after `started` of the last successful extension.
    renewed_ms: Arc<AtomicU64>,
    ttl: Duration,
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
    /// Start extending `lease` (when `enabled`) every `ttl`/3; a failed
    /// extension is counted with `on_lost`. Returns the guard and the token
    /// the fenced write carries.
    pub(crate) fn watch(
        store: &Arc<RedisStore>,
        key: CacheKey,
        lease: HeldLease,
        ttl: Duration,
        enabled: bool,
        on_lost: LeaseLost,
    ) -> (Self, LeaseToken) {
        let lost = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let renewed_ms = Arc::new(AtomicU64::new(0));
        let every = (ttl / 3).max(Duration::from_millis(10));
        let make = |kind: Kind, lost: Arc<AtomicBool>, renewed_ms: Arc<AtomicU64>| Self {
            kind: Some(kind),
            lost,
            started,
            renewed_ms,
            ttl,
        };
        match lease {
            HeldLease::Single(token) => {
                if !enabled {
                    return (make(Kind::Off, lost, renewed_ms), token);
                }
                let task = tokio::spawn(extend_single(
                    Arc::clone(store),
                    key,
                    token.clone(),
                    Tick {
                        every,
                        ttl,
                        started,
                    },
                    (Arc::clone(&lost), Arc::clone(&renewed_ms)),
                    on_lost,
                ));
                (make(Kind::Single(task), lost, renewed_ms), token)
            }
            HeldLease::Redlock(lock, lease) => {
                let token = lease.token().clone();
                if !enabled {
                    return (
                        make(Kind::RedlockIdle(lock, lease), lost, renewed_ms),
                        token,
                    );
                }
                let (stop_tx, stop_rx) = oneshot::channel();
                let task = tokio::spawn(extend_redlock(
                    Arc::clone(&lock),
                    lease,
                    key,
                    every,
                    Arc::clone(&lost),
                    on_lost,
                    stop_rx,
                ));
                let kind = Kind::Redlock {
                    stop: Some(stop_tx),
                    task,
                    lock,
                };
                (make(kind, lost, renewed_ms), token)
            }
        }
    }

    /// The lease's time left, to read while the work runs.
    pub(crate) fn clock(&self) -> LeaseClock {
        LeaseClock {
            started: self.started,
            renewed_ms: Arc::clone(&self.renewed_ms),
            ttl: self.ttl,
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
        let remaining = match &redlock {
            Some((_, lease)) => lease.remaining(),
            None => self.clock().left(),
        };
        Stopped {
            lost: lost.load(Ordering::SeqCst),
            redlock,
            remaining,
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

/// When a watchdog extends, and for how long.
struct Tick {
    every: Duration,
    ttl: Duration,
    /// When the lease was taken: renewals are measured from it.
    started: Instant,
}

/// Extend a single-server lease every tick until it is lost; `seen`: the
/// lost flag and when the last renewal was asked for (ms since `started`).
async fn extend_single(
    store: Arc<RedisStore>,
    key: CacheKey,
    token: LeaseToken,
    tick: Tick,
    seen: (Arc<AtomicBool>, Arc<AtomicU64>),
    on_lost: LeaseLost,
) {
    let (flag, renewed) = seen;
    loop {
        tokio::time::sleep(tick.every).await;
        let asked = tick.started.elapsed();
        match store.extend(&key, &token, tick.ttl).await {
            Ok(true) => {
                // Measured from when we asked: the conservative end.
                renewed.store(asked.as_millis() as u64, Ordering::Relaxed);
            }
            Ok(false) => {
                // Someone else holds it now (or it expired): the
                // fenced write decides what lands.
                mark_lost(&flag, &key, &on_lost);
                return;
            }
            // Transient Redis trouble: try again next tick.
            Err(_) => {}
        }
    }
}

/// Extend a Redlock lease every `every` until told to stop, then hand it
/// back (for release); once an extension fails, only wait for the stop.
async fn extend_redlock(
    lock: Arc<Redlock>,
    mut lease: RedlockLease,
    key: CacheKey,
    every: Duration,
    flag: Arc<AtomicBool>,
    on_lost: LeaseLost,
    mut stop: oneshot::Receiver<()>,
) -> RedlockLease {
    let mut alive = true;
    loop {
        tokio::select! {
            _ = &mut stop => return lease,
            _ = tokio::time::sleep(every), if alive => {
                if lock.extend(&mut lease).await.is_err() {
                    mark_lost(&flag, &key, &on_lost);
                    alive = false;
                }
            }
        }
    }
}

fn mark_lost(flag: &AtomicBool, key: &CacheKey, on_lost: &LeaseLost) {
    flag.store(true, Ordering::SeqCst);
    on_lost.record();
    tracing::warn!(key = %key.short(), "lease lost while the origin call was running");
}
