//! The read-through state machine, HTTP-agnostic: usable alone as
//! [`Cache`].
//!
//! ```text
//! probe memory ── fresh ─► Hit
//!      │ stale ─► Stale now, one background refresh (if none runs)
//!      │ pass  ─► caller goes to the origin itself
//!      ▼ miss
//! join_or_lead ── follower ─► wait (bounded) for the leader's outcome
//!      │ leader
//!      ▼
//! spawn drive(): compute (timeout + catch_unwind) → fill memory → complete flight
//! ```
//! The computation runs in a spawned task so a caller that goes away does not
//! cancel it for everyone waiting on it.
//!
//! - `cache`: the public [`Cache`] API; `cache_builder`: its builder.
//! - `resolve`: the shared state and the miss path, top to bottom.
//! - `flight`: the in-process single flight.
//! - `remote`: leading and waiting across instances (Redis);
//!   `quorum_lease`: the lease on a Redlock quorum.
//! - `gate`: the origin as a whole: every origin call's budget and the
//!   breaker.
//! - `fill`: putting outcomes into memory; `refresh`: background refreshes;
//!   `outside_flight`: stores and purges outside any flight.
//! - `purge_log`: purge generations; `retained`: copies kept past their
//!   stale grace.
//!
//! The [`Value`] trait and the stored entry's encoding are `entry`'s,
//! below the store. Must not import `inspect` or `http`, which stand above
//! it (see `.ci/layers.sh`).
//!
//! [`Value`]: crate::Value

mod cache;
mod cache_builder;
mod compute;
mod config;
mod fill;
pub(crate) mod flight;
mod gate;
#[cfg(not(feature = "redis"))]
mod no_redis;
mod origin_calls;
mod outside_flight;
pub(crate) mod purge_log;
#[cfg(feature = "redis")]
mod quorum_lease;
mod refresh;
#[cfg(feature = "redis")]
mod remote;
mod resolve;
pub(crate) mod retained;
mod spawn;

pub use cache::{Cache, Freshness, Lookup};
pub use cache_builder::CacheBuilder;
pub(crate) use compute::{AlsoStored, Compute, ComputeFuture, Fill, Work};
pub(crate) use config::EngineConfig;
pub use flight::Flight;
pub(crate) use flight::Joined;
pub(crate) use gate::{Caller, Priority, Refusal};
pub use gate::{OriginBreaker, OriginStatus};
pub(crate) use resolve::{Engine, Resolved};
