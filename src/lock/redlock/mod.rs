//! Redlock: the same lease on a majority of N independent Redis masters.
//!
//! Use it where running the work twice is unsafe rather than wasteful. Even
//! then a lease can lapse under a paused worker, and a failover can lose it:
//! Redlock without fencing is an efficiency lock, not a correctness
//! guarantee. [`Redlock::run`] therefore issues a fence token from the
//! resource's own store and writes through it, so a lapsed holder's late write
//! is rejected.
//!
//! [`RedlockBuilder`] and [`Redlock::builder`], the settings and their
//! checks, are in `builder.rs`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::entry::{FenceToken, LeaseToken};
use crate::error::{BoxError, BuildError, StoreFailure};
use crate::key::CacheKey;
use crate::lock;
use crate::store::redis::{RedisOptions, RedisStore, WriteMode};

mod builder;

pub use self::builder::RedlockBuilder;

/// Why a lock operation failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum LockError {
    /// No quorum (or no validity left) after every retry; nothing is held.
    NotAcquired,
    /// An extension found fewer than a quorum of nodes still holding the lease.
    Lost,
    /// The work ran past the lease's validity and was abandoned.
    Expired,
    /// The resource store could not issue a fence, take the write or read:
    /// branch on its [`kind`](StoreFailure::kind).
    Store(StoreFailure),
    /// The work itself failed.
    Work(BoxError),
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::NotAcquired => f.write_str("lock not acquired: no quorum"),
            LockError::Lost => f.write_str("lock lost: fewer than a quorum still hold it"),
            LockError::Expired => {
                f.write_str("work ran past the lock's validity and was abandoned")
            }
            LockError::Store(_) => f.write_str("resource store failed"),
            LockError::Work(_) => f.write_str("guarded work failed"),
        }
    }
}

impl std::error::Error for LockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LockError::Work(e) => Some(&**e),
            LockError::Store(e) => Some(e),
            _ => None,
        }
    }
}

/// A Redlock lease. Its [`deadline`](RedlockLease::deadline) is the end of
/// its validity: work past it must be abandoned, because another holder may
/// exist from then on.
#[derive(Debug)]
pub struct RedlockLease {
    key: CacheKey,
    token: LeaseToken,
    deadline: Instant,
    acquired_at: Instant,
}

impl RedlockLease {
    /// End of validity, on the tokio clock.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Validity left now (zero once past the deadline).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    pub(crate) fn token(&self) -> &LeaseToken {
        &self.token
    }
}

/// A lease held on a majority of independent Redis masters.
///
/// Use it where running work twice is unsafe rather than wasteful. The
/// lease's [`deadline`](RedlockLease::deadline) is the end of its validity:
/// **work past it must be abandoned**, because another holder may exist from
/// then on. And **Redlock without fencing is an efficiency lock, not a
/// correctness guarantee**: a paused holder, clock drift, or a failover that
/// loses the lock can each produce two holders. Stamp every write to the
/// protected resource with the fence token from the resource's own store
/// ([`FencedStore`], or [`Work::fence`] inside [`run`](Redlock::run)) and have
/// the resource refuse older tokens.
///
/// ```no_run
/// use std::time::Duration;
/// use herdguard::RedisOptions;
/// use herdguard::redlock::{FencedStore, Redlock};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let lock = Redlock::builder(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])
///     .ttl(Duration::from_secs(10))
///     .build()?;
/// let store = FencedStore::new(RedisOptions::new("redis://10.0.0.9"))?;
/// let written = lock
///     .run(&store, "flush:orders", |work| async move {
///         // ... do the work before work.deadline() ...
///         Ok::<_, std::io::Error>(bytes::Bytes::from(format!("flushed with fence {}", work.fence())))
///     })
///     .await?;
/// println!("accepted: {}", written.accepted);
/// # Ok(()) }
/// ```
///
/// A `Redlock` is a cheap handle (one reference count to clone, like a redis
/// client): clones share the node connections, so hand one to every task
/// instead of wrapping it in an `Arc`.
#[derive(Debug, Clone)]
pub struct Redlock {
    /// Shared by clones: each node's pool and breaker is per process, not per handle.
    nodes: Arc<[RedisStore]>,
    quorum: usize,
    ttl: Duration,
    node_timeout: Duration,
    drift: f64,
    retries: u32,
    retry_delay: Duration,
}

/// What [`Redlock::run`] did with the work's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guarded {
    /// The fence token the work ran under.
    pub fence: u64,
    /// The fenced write landed (false: a newer holder had already written).
    pub accepted: bool,
}

/// Handed to guarded work: its fence token and the lease's current deadline.
#[derive(Debug, Clone)]
pub struct Work {
    fence: u64,
    deadline: watch::Receiver<Instant>,
}

impl Work {
    /// The fence token to stamp on every write to the protected resource.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The lease's validity end, moved forward by each successful extension.
    pub fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }
}

impl Redlock {
    /// Number of nodes that must agree.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// The lease lifetime.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Take the lease on `resource`, retrying with random jitter.
    ///
    /// # Errors
    /// [`LockError::NotAcquired`] after every attempt failed; nothing is left
    /// held on any node.
    pub async fn acquire(&self, resource: &str) -> Result<RedlockLease, LockError> {
        self.acquire_key(CacheKey::new(resource), self.retries)
            .await
    }

    pub(crate) async fn acquire_key(
        &self,
        key: CacheKey,
        retries: u32,
    ) -> Result<RedlockLease, LockError> {
        for attempt in 0..=retries {
            if attempt > 0 {
                let jitter = rand::random_range(0..=self.retry_delay.as_millis().max(1) as u64);
                tokio::time::sleep(Duration::from_millis(jitter)).await;
            }
            if let Some(lease) = self.try_once(key).await {
                lock::record_acquire("acquired");
                return Ok(lease);
            }
        }
        lock::record_acquire("contended");
        Err(LockError::NotAcquired)
    }

    async fn try_once(&self, key: CacheKey) -> Option<RedlockLease> {
        let token = LeaseToken::random();
        let (start, held) = self
            .vote(|node| node.try_lease(&key, &token, self.ttl))
            .await;
        if let Some(validity) = held {
            return Some(RedlockLease {
                key,
                token,
                deadline: start + validity,
                acquired_at: start,
            });
        }
        // Failed or too late: leave nothing behind, anywhere.
        self.release_everywhere(&key, &token).await;
        None
    }

    /// Ask every node at once, each within the node timeout: when the vote
    /// started, and how long the lease is valid if a quorum said yes in
    /// time (`None`: too few, or too late).
    async fn vote<'a, F, Fut, E>(&'a self, ask: F) -> (Instant, Option<Duration>)
    where
        F: Fn(&'a RedisStore) -> Fut,
        Fut: Future<Output = Result<bool, E>>,
    {
        let start = Instant::now();
        let votes = join_all(self.nodes.iter().map(|node| {
            let asked = ask(node);
            async move {
                matches!(
                    tokio::time::timeout(self.node_timeout, asked).await,
                    Ok(Ok(true))
                )
            }
        }))
        .await;
        let granted = votes.iter().filter(|v| **v).count();
        let validity = self.validity(start.elapsed());
        let held = granted >= self.quorum && !validity.is_zero();
        (start, held.then_some(validity))
    }

    /// TTL − elapsed − (TTL × drift + 2 ms), floored at zero.
    fn validity(&self, elapsed: Duration) -> Duration {
        let drift = self.ttl.mul_f64(self.drift) + Duration::from_millis(2);
        self.ttl.saturating_sub(elapsed).saturating_sub(drift)
    }

    /// Extend the lease on a quorum and recompute its validity.
    ///
    /// # Errors
    /// [`LockError::Lost`] when fewer than a quorum still hold it; the
    /// deadline is then left as it was.
    pub async fn extend(&self, lease: &mut RedlockLease) -> Result<(), LockError> {
        let (start, held) = {
            let lease = &*lease;
            self.vote(|node| node.extend(&lease.key, &lease.token, self.ttl))
                .await
        };
        if let Some(validity) = held {
            lease.deadline = start + validity;
            Ok(())
        } else {
            lock::record_acquire("expired_mid_work");
            Err(LockError::Lost)
        }
    }

    /// Compare-and-delete on every node; unreachable nodes are skipped
    /// (their copy expires by itself).
    pub async fn release(&self, lease: RedlockLease) {
        lock::record_held(lease.acquired_at.elapsed().as_secs_f64());
        self.release_everywhere(&lease.key, &lease.token).await;
    }

    async fn release_everywhere(&self, key: &CacheKey, token: &LeaseToken) {
        join_all(self.nodes.iter().map(|node| async move {
            let _ = tokio::time::timeout(self.node_timeout, node.release(key, token)).await;
        }))
        .await;
    }

    /// Guarded work: acquire → run `work` under the deadline while a watchdog
    /// extends the lease every TTL/3 → write its result to `store` fenced →
    /// release.
    ///
    /// Work still running at the deadline is dropped (abandoned), and the
    /// result is not written.
    ///
    /// # Errors
    /// [`LockError::NotAcquired`], [`LockError::Expired`] (work abandoned at
    /// the deadline), [`LockError::Work`] (the work failed), or
    /// [`LockError::Store`] (no fence or no write). A write refused by the
    /// fence is not an error: it returns `accepted: false`.
    pub async fn run<F, Fut, E>(
        &self,
        store: &FencedStore,
        resource: &str,
        work: F,
    ) -> Result<Guarded, LockError>
    where
        F: FnOnce(Work) -> Fut,
        Fut: Future<Output = Result<Bytes, E>>,
        E: Into<BoxError>,
    {
        let key = CacheKey::new(resource);
        let mut lease = self.acquire_key(key, self.retries).await?;
        let fence = match store.store.next_fence(&key).await {
            Ok(f) => f.0,
            Err(e) => {
                self.release(lease).await;
                return Err(LockError::Store(StoreFailure::from(&e)));
            }
        };
        let (deadline_tx, deadline_rx) = watch::channel(lease.deadline());
        let work = work(Work {
            fence,
            deadline: deadline_rx.clone(),
        });
        tokio::pin!(work);
        let mut next_extend = Instant::now() + self.ttl / 3;
        let mut deadline_rx = deadline_rx;
        let result = loop {
            let deadline = *deadline_rx.borrow_and_update();
            tokio::select! {
                r = &mut work => break Some(r),
                _ = tokio::time::sleep_until(deadline) => break None,
                _ = tokio::time::sleep_until(next_extend) => {
                    next_extend = Instant::now() + self.ttl / 3;
                    if self.extend(&mut lease).await.is_ok() {
                        let _ = deadline_tx.send(lease.deadline());
                    }
                }
            }
        };
        let Some(result) = result else {
            self.release(lease).await;
            return Err(LockError::Expired);
        };
        let bytes = match result {
            Ok(b) => b,
            Err(e) => {
                self.release(lease).await;
                return Err(LockError::Work(e.into()));
            }
        };
        let written = store.write(resource, fence, &bytes).await;
        self.release(lease).await;
        let accepted = written?;
        Ok(Guarded { fence, accepted })
    }
}

/// The resource side of fencing: a Redis that issues fence tokens per
/// resource and accepts a write only if its token is strictly newer than the
/// newest accepted one. The fence lives here, with the data it protects, not
/// on the lock nodes.
///
/// Cloning is cheap (one reference count): clones share one connection pool.
#[derive(Debug, Clone)]
pub struct FencedStore {
    pub(crate) store: Arc<RedisStore>,
    keep: Duration,
}

impl FencedStore {
    /// A fenced store on the Redis in `options`. Written values are kept
    /// 24 hours unless [`keep`](FencedStore::keep) says otherwise.
    ///
    /// # Errors
    /// [`BuildError`] for an invalid URL or namespace.
    pub fn new(options: RedisOptions) -> Result<Self, BuildError> {
        Ok(Self {
            store: Arc::new(RedisStore::new(options)?),
            keep: Duration::from_secs(24 * 3600),
        })
    }

    /// How long written values are kept.
    #[must_use]
    pub fn keep(mut self, keep: Duration) -> Self {
        self.keep = keep;
        self
    }

    /// Issue the next fence token for `resource`.
    ///
    /// # Errors
    /// [`LockError::Store`] when Redis does not answer.
    pub async fn next_fence(&self, resource: &str) -> Result<u64, LockError> {
        self.store
            .next_fence(&CacheKey::new(resource))
            .await
            .map(|f| f.0)
            .map_err(|e| LockError::Store(StoreFailure::from(&e)))
    }

    /// Write `value` for `resource` if `fence` is newer than the newest
    /// accepted write. Returns whether it was accepted.
    ///
    /// # Errors
    /// [`LockError::Store`] when Redis does not answer.
    pub async fn write(&self, resource: &str, fence: u64, value: &[u8]) -> Result<bool, LockError> {
        // No lease is held on this store: the fence alone decides.
        let mode = WriteMode::Store {
            bytes: value,
            fresh: self.keep,
            hard: self.keep,
        };
        let key = CacheKey::new(resource);
        let outcome = self
            .store
            .write_unleased(&key, FenceToken(fence), mode)
            .await
            .map_err(|e| LockError::Store(StoreFailure::from(&e)))?;
        if !outcome.accepted {
            metrics::counter!(crate::metrics::names::FENCED_REJECTED).increment(1);
        }
        Ok(outcome.accepted)
    }

    /// The last accepted value of `resource`.
    ///
    /// # Errors
    /// [`LockError::Store`] when Redis does not answer.
    pub async fn read(&self, resource: &str) -> Result<Option<Bytes>, LockError> {
        self.store
            .read_value(&CacheKey::new(resource))
            .await
            .map(|v| v.map(Bytes::from))
            .map_err(|e| LockError::Store(StoreFailure::from(&e)))
    }
}
