//! A key's lease on a Redlock quorum, when leases live there instead of on
//! the main Redis. One attempt, no retries; the fence still comes from the
//! main store.

use std::sync::Arc;

use super::resolve::Engine;
use crate::entry::envelope::decode_entry;
use crate::entry::Value;
use crate::entry::{FenceToken, LeaseToken};
use crate::key::CacheKey;
use crate::lock::watchdog::HeldLease;
use crate::store::redis::{RedisStore, RemoteLookup};

impl<V: Value> Engine<V> {
    /// With a Redlock backend: one acquisition attempt (no retries: others
    /// wait for the fill instead), then a fence from the main store.
    ///
    /// `newer_than`: a refresh's refused fence; only a newer entry counts as
    /// filled meanwhile.
    pub(super) async fn redlock_lease(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        newer_than: Option<u64>,
    ) -> RedlockTry {
        let Some(redlock) = self.redlock.as_ref() else {
            return RedlockTry::Contended;
        };
        let Ok(lease) = redlock.acquire_key(key, 0).await else {
            return RedlockTry::Contended;
        };
        // Lookup and lease are two steps here: the previous holder may have
        // filled the entry just before we won. Look again before computing.
        let unused = LeaseToken::random();
        if let Ok(RemoteLookup::Fresh { bytes, .. }) =
            remote.lookup_or_lease(&key, &unused, false).await
        {
            let newer = newer_than
                .is_none_or(|r| decode_entry::<V>(bytes).is_ok_and(|(meta, _)| meta.fence > r));
            if newer {
                redlock.release(lease).await;
                return RedlockTry::FilledMeanwhile;
            }
        }
        match remote.next_fence(&key).await {
            Ok(fence) => RedlockTry::Won(HeldLease::Redlock(Arc::clone(redlock), lease), fence),
            Err(e) => {
                tracing::debug!(key = %key.short(), error = %e, "no fence from the main store");
                redlock.release(lease).await;
                RedlockTry::Contended
            }
        }
    }
}

/// One attempt at the Redlock lease.
#[derive(Debug)]
pub(super) enum RedlockTry {
    Won(HeldLease, FenceToken),
    /// Won, but the entry was filled just before: look it up instead.
    FilledMeanwhile,
    Contended,
}
