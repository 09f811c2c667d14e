//! Where entries live: [`memory`] is the embedded default and the L1 in front
//! of a shared store, [`redis`] the shared store. Stores keep bytes and
//! leases; they decide nothing about HTTP or freshness rules.
//!
//! Must not import `http`. What it imports from above, and why: lock's token
//! types (a fenced write carries its `FenceToken`, a release its
//! `LeaseToken`) and engine's `envelope` and `Value` (the stored bytes'
//! format, checked before anything read is served); none of those files
//! imports the store.

pub(crate) mod memory;
pub(crate) mod notice;
#[cfg(feature = "redis")]
pub(crate) mod redis;
// Same path as the real store, so its users need no cfg of their own.
#[cfg(not(feature = "redis"))]
#[path = "no_redis.rs"]
pub(crate) mod redis;
