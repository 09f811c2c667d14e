//! The shared store on Redis: entries, the lease, the fence, and fill
//! notifications, each entry's keys under one hash tag so a single Lua script
//! can touch all of them (also on Redis Cluster). This file only declares the
//! parts and re-exports what the crate uses; no code lives here.
//!
//! ```text
//! {ns}:{H}:v      entry (versioned encoding), PX = hard expiry; fresh while
//!                 PTTL > the keep time past freshness in the encoding (u64 LE
//!                 at byte 36: the stale window, or stale-if-error when longer);
//!                 or the pass marker `HG\x04pass`, PX = pass TTL
//! {ns}:{H}:lock   lease token, SET NX PX GET
//! {ns}:{H}:fence  string `<next>:<hw>`: the last token issued, and the highest
//!                 accepted write or purge (a lease on a new or lost fence
//!                 sets it to the stored entry's own token, 0 for none)
//! ```
//!
//! A leader's cold fill on a single server is two scripts, 15 commands in
//! all: the lookup that leases (`GET` of the entry, `SET NX GET` of the
//! lease, and the token: `GET` of the fence, `TIME`, `SET PX` of the fence)
//! and the fenced write (`GET` of the fence, the URL's purge index: the
//! stamp's `GET`, `ZADD`, `PEXPIRE NX`, then `SET` of the entry, `SET PX` of
//! the fence, `DEL` of the lease while `next` is still its token, and
//! `SPUBLISH`), each behind its `EVALSHA`; a tag adds 3 (its stamp, `ZADD`,
//! `PEXPIRE NX`). On a cluster each purge index lives in a slot of its own,
//! so it is recorded first by a script of its own (`TIME`, `ZADD`,
//! `PEXPIRE NX`, the stamp's `GET`), per group.
//!
//! One key per entry, so eviction takes an entry whole. On a server that
//! may evict (a `maxmemory` and a policy other than `noeviction`), an entry is
//! served only while its purge indexes still list it (one `ZSCORE` per group,
//! after a lookup that found it), so an evicted index cannot hide an entry
//! from a purge. Entry version 3
//! kept freshness and the pass marker in keys of their own (`:fresh`,
//! `:pass`); nothing writes them now and purges still delete them.
//!
//! Connections to a standalone Redis: deadpool builds them (with connect and
//! response timeouts), and we keep a few multiplexed connections checked out
//! for good. A multiplexed connection already pipelines concurrent commands,
//! and a pool checkout costs an UNWATCH+PING round trip, which would triple
//! the commands of a Redis hit. On Redis Cluster one cluster connection does
//! the same job (see [`cluster`]).
//!
//! Fill notifications use sharded pub/sub on a per-entry channel
//! `{ns}:{H}:fill` (see [`fills`]), on a cluster and standalone alike. The
//! notice is the stored entry itself (up to
//! [`RedisOptions::notice_entry_limit`]) or `wake`.
//!
//! # Parts
//!
//! Imports run down this list only, never back up:
//!
//! ```text
//! purge.rs       purge by group (indexes walked in batches), purge notices sent
//! origin.rs      the origin's cluster-wide budget and shared breaker
//! replicas.rs    lease_replicas: WAIT on a connection kept apart
//! store.rs       RedisStore, the facade: lookup-or-lease, fenced write, leases, fill waits
//! purge_bus.rs   the listener that hears purge notices
//! eviction.rs    whether the server may evict keys (INFO memory, read now and then)
//! scripts.rs     the *.lua scripts, the write modes and the lookup reply
//! keys.rs        the key names of one entry
//! connection.rs  the breaker and error handling every command goes through
//! slots.rs       kept connections of one Redis or of the Sentinel primary, their connects
//! fills/         fill notifications: waiter registry, subscriber.rs its subscriber
//! cluster.rs     the Redis Cluster connection
//! sentinel.rs    the primary as the sentinels name it, and their +switch-master
//! breaker.rs     the circuit breaker
//! error.rs       StoreError, ErrorClass, redacted error text
//! options_coordination.rs  RedisOptions' settings for how instances work
//!                together: leases, fill waits, the cluster's origin budget
//! options.rs     RedisOptions: plain data, checked when a store is built
//! tls.rs         rediss:// clients
//! ```

mod breaker;
mod cluster;
mod connection;
mod error;
mod eviction;
mod fills;
mod keys;
mod options;
mod options_coordination;
mod origin;
mod purge;
mod purge_bus;
mod replicas;
mod scripts;
mod sentinel;
mod slots;
mod store;
mod tls;

pub(crate) use self::error::{redact_error, StoreError};
pub(crate) use self::fills::{FillSubscription, Woken};
pub use self::options::RedisOptions;
pub(crate) use self::origin::ProbeReply;
pub(crate) use self::scripts::{RemoteLookup, WriteMode, WriteOutcome};
pub(crate) use self::store::GroupIndex;
pub(crate) use self::store::RedisStore;
