//! Where entries live: [`memory`] is the embedded default and the L1 in front
//! of a shared store, [`redis`] the shared store. Stores keep bytes and
//! leases; they decide nothing about HTTP or freshness rules.
//!
//! The stored bytes' format (`entry::envelope`), the [`Value`] trait and
//! the lease and fence tokens come from `entry`, below. Must not import
//! `inspect`, `http`, `engine` or `lock`, which stand above it (see
//! `.ci/layers.sh`).
//!
//! [`Value`]: crate::Value

pub(crate) mod memory;
pub(crate) mod notice;
#[cfg(feature = "redis")]
pub(crate) mod redis;
// Same path as the real store, so its users need no cfg of their own.
#[cfg(not(feature = "redis"))]
#[path = "no_redis.rs"]
pub(crate) mod redis;
