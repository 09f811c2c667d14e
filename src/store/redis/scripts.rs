//! The Lua scripts (one `.lua` file each, loaded with `include_str!`), the
//! modes a fenced write takes and what a lookup-or-lease returns. Knows the
//! scripts' wire shapes only; calling them is the store's job.

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use deadpool_redis::redis::{Script, Value as RedisValue};

use crate::entry::FenceToken;

/// What one lookup-or-lease round trip found.
#[derive(Debug)]
pub(crate) enum RemoteLookup {
    Fresh {
        bytes: Bytes,
        fresh_left: Duration,
        hard_left: Duration,
    },
    /// Stale; `fence` is `Some` when this caller also won the lease to refresh it.
    Stale {
        bytes: Bytes,
        hard_left: Duration,
        fence: Option<FenceToken>,
        /// Whoever holds the refresh lease here (empty when none is known).
        holder: Bytes,
    },
    Leased {
        fence: FenceToken,
    },
    /// Another caller holds the lease.
    Held {
        /// At most this long left (the lease TTL: the script does not ask).
        lease_left: Duration,
        /// The holder's lease token, to check later that the same lease
        /// still runs (one GET) instead of looking again.
        holder: Bytes,
    },
    /// No entry, and the lease is not taken here (it lives on Redlock nodes).
    Miss,
    /// The server is full (`noeviction` at `maxmemory`), so no lease can be
    /// taken: `bytes` is the stale entry it holds (empty: none).
    Full {
        bytes: Bytes,
        hard_left: Duration,
    },
    Pass {
        left: Duration,
    },
}

/// What a fenced write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WriteOutcome {
    /// The entry (or pass marker) was stored: its fence was newer than
    /// the newest accepted write.
    pub(crate) accepted: bool,
    /// Our lease was still ours and is now released.
    pub(crate) released: bool,
    /// A pass marker was not set: the entry there is still fresh, and one
    /// answer never replaces a fresh entry with a marker.
    pub(crate) kept: bool,
    /// Nothing was stored: a purge group folded into the write was purged
    /// after the lease was taken.
    pub(crate) purged: bool,
}

/// What a fenced write stores.
#[derive(Debug)]
pub(crate) enum WriteMode<'a> {
    Store {
        bytes: &'a [u8],
        fresh: Duration,
        hard: Duration,
    },
    Pass {
        ttl: Duration,
    },
    /// Store nothing; release the lease and wake waiters to compete again.
    Release,
}

/// The entry and its freshness, or the lease and a fence token, in one round trip.
pub(super) static LOOKUP_OR_LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("fence.lua"),
        include_str!("lookup_or_lease.lua")
    ))
});

/// Store only if the fence is newer than the newest accepted write;
/// release the lease if still ours; announce the fill (the notice carries
/// the stored entry when asked to).
pub(super) static FENCED_WRITE_AND_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("fence.lua"),
        include_str!("index.lua"),
        include_str!("fenced_write.lua")
    ))
});

/// Delete an entry and raise its fence above every lease taken before.
pub(super) static PURGE_ENTRY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("fence.lua"),
        include_str!("purge_entry.lua")
    ))
});

/// Keep an entry but end its freshness now (or delete one that may not be
/// served stale), and raise its fence as a purge does.
pub(super) static SOFT_PURGE_ENTRY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("fence.lua"),
        include_str!("soft_purge_entry.lua")
    ))
});

/// Extend the lease while the token still holds it.
pub(super) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("extend.lua")));

/// Compare-and-delete of a lease (and of the origin's probe slot).
pub(super) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("release.lua")));

/// The next fence token of a key alone, for a write guarded by a lease held
/// elsewhere (Redlock).
pub(super) static NEXT_FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("fence.lua"),
        include_str!("next_fence.lua")
    ))
});

/// Records an entry's keys in a group index (purge by URL or tag) and says
/// when the group was last purged.
pub(super) static INDEX_GROUP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("index.lua"),
        include_str!("index_group.lua")
    ))
});

/// Stamps a group purged, then says how large its index is.
pub(super) static PURGE_GROUP: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("purge_group.lua")));

pub(super) fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

fn pttl(ms: i64) -> Duration {
    // -1 (no expiry) cannot happen for our keys; treat it as "long".
    match ms {
        -1 => Duration::from_secs(3600),
        ms if ms > 0 => Duration::from_millis(ms as u64),
        _ => Duration::ZERO,
    }
}

pub(super) fn parse_lookup(reply: RedisValue) -> Option<RemoteLookup> {
    let items = match reply {
        RedisValue::Array(items) => items,
        _ => return None,
    };
    let mut it = items.into_iter();
    let status = match it.next()? {
        RedisValue::BulkString(s) => s,
        RedisValue::SimpleString(s) => s.into_bytes(),
        _ => return None,
    };
    let value = match it.next()? {
        RedisValue::BulkString(b) => Bytes::from(b),
        RedisValue::Nil => Bytes::new(),
        _ => return None,
    };
    let mut int = || match it.next() {
        Some(RedisValue::Int(i)) => Some(i),
        _ => None,
    };
    let (fresh, hard, fence, other) = (int()?, int()?, int()?, int()?);
    let holder = match it.next() {
        Some(RedisValue::BulkString(b)) => Bytes::from(b),
        _ => Bytes::new(),
    };
    Some(match status.as_slice() {
        b"fresh" => RemoteLookup::Fresh {
            bytes: value,
            fresh_left: pttl(fresh),
            hard_left: pttl(hard),
        },
        b"stale_leased" => RemoteLookup::Stale {
            bytes: value,
            hard_left: pttl(hard),
            fence: Some(FenceToken(fence as u64)),
            holder,
        },
        b"stale" => RemoteLookup::Stale {
            bytes: value,
            hard_left: pttl(hard),
            fence: None,
            holder,
        },
        b"leased" => RemoteLookup::Leased {
            fence: FenceToken(fence as u64),
        },
        b"held" => RemoteLookup::Held {
            lease_left: pttl(other),
            holder,
        },
        b"pass" => RemoteLookup::Pass { left: pttl(other) },
        b"miss" => RemoteLookup::Miss,
        b"stale_full" | b"full" => RemoteLookup::Full {
            bytes: value,
            hard_left: pttl(hard),
        },
        _ => return None,
    })
}
