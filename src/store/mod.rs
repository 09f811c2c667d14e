//! Where entries live: [`memory`] is the embedded default and the L1 in front
//! of a shared store.

pub(crate) mod cluster;
pub(crate) mod fills;
pub(crate) mod memory;
pub(crate) mod purge_bus;
pub(crate) mod redis;
pub(crate) mod tls;
