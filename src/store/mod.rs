//! Where entries live: [`memory`] is the embedded default and the L1 in front
//! of a shared store.

#[cfg(feature = "redis")]
#[path = "redis/cluster.rs"]
pub(crate) mod cluster;
#[cfg(feature = "redis")]
#[path = "redis/fills.rs"]
pub(crate) mod fills;
pub(crate) mod memory;
#[cfg(feature = "redis")]
#[path = "redis/purge_bus.rs"]
pub(crate) mod purge_bus;
#[cfg(feature = "redis")]
pub(crate) mod redis;
// Same path as the real store, so its users need no cfg of their own.
#[cfg(not(feature = "redis"))]
#[path = "no_redis.rs"]
pub(crate) mod redis;
#[cfg(feature = "redis")]
#[path = "redis/tls.rs"]
pub(crate) mod tls;
