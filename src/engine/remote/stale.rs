//! Stale replies from Redis: whether a copy may be served stale, for how
//! long after a soft purge, and the copy kept aside to revalidate.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::engine::resolve::Engine;
use crate::entry::envelope::{decode_entry, kept_of, EntryMeta};
use crate::entry::{Value, ValueMeta};
use crate::key::CacheKey;
use crate::store::memory::Stored;
use crate::store::redis::{RedisStore, RemoteLookup};

impl<V: Value> Engine<V> {
    /// Read a stale reply: the entry, whether it may be served stale, and
    /// how long ago a soft purge made it stale (see [`cut_short`]); `None`
    /// when it is corrupt or no purge index lists it any more. One that may
    /// not be served is kept aside for the origin call to revalidate.
    pub(super) async fn read_stale(
        &self,
        remote: &Arc<RedisStore>,
        key: CacheKey,
        bytes: Bytes,
        hard_left: Duration,
    ) -> Option<(EntryMeta, V, bool, Option<Duration>)> {
        // How long Redis has held it stale: its keep time past
        // freshness less what is left. A soft purge cut its
        // freshness short, so this counts from the purge.
        let stale_since = kept_of(&bytes).saturating_sub(hard_left);
        let decoded = decode_entry::<V>(bytes);
        if let Err(e) = &decoded {
            crate::entry::envelope::report_corrupt(&key, e);
            self.counters.corrupt_entry();
        }
        // As for a fresh entry no index lists: neither served
        // nor kept aside, as if it were not there.
        let listed = match &decoded {
            Ok((_, value)) => remote.anchored(&key, &value.purge_groups()).await,
            Err(_) => true,
        };
        if !listed {
            tracing::debug!(key = %key.short(), "stale entry no longer indexed; refilled");
        }
        let decoded = decoded.ok().filter(|_| listed);
        // An entry stored without a stale window is never handed
        // out stale: Redis reports one so only in the last
        // millisecond of its freshness (PTTL rounds down to 0
        // while the key still exists). Handing it out sent every
        // request that then refused it to the origin on its own.
        // Past its stale grace, an entry kept only for
        // stale-if-error is not served either; it is kept aside
        // for this instance's origin call to revalidate, or to
        // stand in for an error. The grace counts from the end of
        // freshness by Redis's clock as well as by the entry's
        // own: after a soft purge, from the purge.
        decoded.map(|(meta, value)| {
            let soft = cut_short(&meta, stale_since);
            let servable = !meta.stale_for.is_zero()
                && meta.elapsed() < meta.fresh_for.saturating_add(meta.stale_for)
                && stale_since < meta.stale_for;
            if !servable {
                self.keep_aside(key, &value, meta, hard_left, soft);
            }
            (meta, value, servable, soft)
        })
    }

    /// Keep an entry read from Redis that may not be served as it is aside
    /// (its user's retained copies), with its age: the origin call that
    /// follows revalidates it, and it stands in for an origin error where
    /// `stale-if-error` allows.
    ///
    /// `soft`: Redis holds it soft-purged, that long ago (see [`cut_short`]).
    pub(super) fn keep_aside(
        &self,
        key: CacheKey,
        value: &V,
        meta: EntryMeta,
        hard_left: Duration,
        soft: Option<Duration>,
    ) {
        // A copy read before a purge that landed since is not kept.
        if self.flights.purged_during(&key, || value.purge_groups()) {
            return;
        }
        if let Some(retained) = &self.retained {
            let mut entry = Stored::new(
                value.clone(),
                meta,
                Duration::ZERO,
                hard_left,
                meta.elapsed(),
            );
            if let Some(since) = soft {
                entry = entry.soft_purged_before(since);
            }
            retained.keep(key, Arc::new(entry), hard_left);
        }
    }
}

/// Whether Redis ended `meta`'s freshness before the entry's own end (a
/// soft purge cut its PTTL), and if so how long ago: `stale_since`, by
/// Redis's clock. A copy of it then counts as soft-purged that long ago,
/// so it is stale by its response's own lifetime too. (A reader whose
/// clock lags the writer's by a few milliseconds may count an entry that
/// just expired so too; its stale window then counts from Redis's end of
/// freshness, which it does anyway.)
pub(super) fn cut_short(meta: &EntryMeta, stale_since: Duration) -> Option<Duration> {
    (meta.elapsed() < meta.fresh_for).then_some(stale_since)
}

/// A full server's reply as the stale reply it stands for (no lease was
/// taken, so it carries no fence), and whether it was one; `None` for a full
/// server holding nothing. Any other reply as it is.
pub(super) fn full_as_stale(found: RemoteLookup) -> Option<(RemoteLookup, bool)> {
    match found {
        RemoteLookup::Full { bytes, hard_left } if !bytes.is_empty() => {
            let stale = RemoteLookup::Stale {
                bytes,
                hard_left,
                fence: None,
                holder: Bytes::new(),
            };
            Some((stale, true))
        }
        RemoteLookup::Full { .. } => None,
        found => Some((found, false)),
    }
}
