//! # herdguard
//!
//! A stampede-proof read-through cache for HTTP services, as a Tower layer.
//!
//! When a hot entry is missing or expired, exactly one request recomputes it;
//! every other request for that key waits for that one result or is served
//! the stale copy at once.
//!
//! ## Request flow
//!
//! ```text
//! request ─► cacheable? (GET/HEAD, no Upgrade/If-Match, no request no-store)
//!               │ no ─► inner service, Cache-Status: fwd=method|request
//!               ▼ yes
//!           key = hash(host:port, path, query, Authorization present?, Vary values)
//!               │
//!           memory: fresh ─► HIT (no await, no allocation beyond headers)
//!                   stale ─► STALE now; one background refresh
//!                   pass  ─► inner service (origin said "uncacheable" recently)
//!                   miss  ─► flight for this key running?
//!                               yes ─► wait (bounded) and share its outcome
//!                               no  ─► lead: call the inner service in a spawned task,
//!                                      buffer the body (≤ 8 MiB), store if allowed,
//!                                      wake every waiter
//! a GET with one byte range ─► the same flow, then its 206 (or 416) is cut
//!                              from the complete 200 (see "Byte ranges")
//! ```
//!
//! ## With Redis: one origin call per key per cluster
//!
//! [`CacheLayerBuilder::redis`] (or [`CacheBuilder::redis`]) shares entries
//! through Redis. Memory stays in front as an L1 (fresh answers from it for
//! 1 s by default, never beyond the entry's own freshness; stale answers
//! within the grace while a refresh asks Redis), and the in-process flight stays in front of
//! Redis, so each process sends one lookup per key per flight however many
//! requests wait in it. The local leader makes **one** round trip (a Lua
//! script, by EVALSHA) that returns one of:
//!
//! ```text
//! fresh entry             ─► HIT (fill L1)
//! stale entry, lease won  ─► everyone here gets STALE now; refresh in background
//! stale entry, lease held ─► STALE
//! no entry, lease won     ─► LEADER: call the origin (watchdog extends the lease
//!                            every lease/3), fenced write + release + SPUBLISH
//! no entry, lease held    ─► WAIT for the fill notification (sharded pub/sub on
//!                            the entry's own channel, one subscriber connection
//!                            per process, bounded poll as a fallback); the
//!                            notice carries the entry up to
//!                            `RedisOptions::notice_entry_limit` (64 KiB), else
//!                            look again; if the lease lapsed with no fill,
//!                            compete again: exactly one wins
//! pass marker             ─► go to the origin (known uncacheable)
//! ```
//!
//! Each entry's keys share one hash tag made from the hex of the key's hash
//! (`{ns}:{H}:v`, the entry or the pass marker, whose PTTL past the entry's
//! keep time (its stale window, or its stale-if-error window when longer) is
//! its freshness; `:lock`; `:fence`), so no request text
//! reaches a key name and every script touches one slot. Every lease comes
//! with a fence token; the write script stores an entry only if its token is
//! strictly newer than the newest accepted one, so a leader whose lease
//! lapsed (GC pause, slow origin) cannot overwrite a newer value. Rejected
//! writes are counted in [`Stats::fenced_rejections`](metrics::Stats::fenced_rejections). A token is above the
//! last one issued for the key, above its high-water mark (or, when the
//! fence was lost, the stored entry's own token) and above the
//! Redis server's clock in microseconds: it never repeats, not after a
//! FLUSHALL, an evicted fence, a restart without persistence or a
//! failover to a replica that missed the last tokens. (This assumes the
//! server clock does not step back further than the time between two
//! leases of a key.)
//!
//! Redis Cluster ([`RedisOptions::cluster`]) runs the same scripts unchanged:
//! entries spread over the slots, and fill notifications are published on
//! `{ns}:{H}:fill` in the entry's own slot (SPUBLISH), so they reach only the
//! shard that owns the entry. `rediss://` (TLS via rustls, cargo feature
//! `tls`) and ACL credentials in the URL are supported; credentials never
//! reach logs, errors or `Debug` output. See [`RedisOptions`].
//!
//! Redis Sentinel ([`RedisOptions::sentinel`]): the primary is asked of the
//! sentinels on every connect and checked to be a master before it is used,
//! and a `+switch-master` (or a `READONLY` or broken connection, whichever
//! comes first) moves every connection, the fill and purge subscribers' too,
//! to the new primary without a restart.
//!
//! ## Layout
//!
//! The modules follow the request flow, top to bottom, and stand on
//! floors: a module imports only modules on floors below its own, and no
//! two files import each other (`.ci/layers.sh` checks both).
//!
//! ```text
//! inspect → http → engine → lock → store → entry, hot → key, error, metrics
//! ```
//!
//! ```text
//! inspect.rs       public read-only views of the Redis layout (the CLI's
//!                  diagnostics read through them): reads stored entries
//!                  as the layer would, so it stands above http
//! http/            everything that knows HTTP
//!   layer.rs         CacheLayer (the public handle, purges)
//!   builder.rs       CacheLayerBuilder: every setting, its bounds checked
//!   origin_settings.rs  its settings of the origin calls (waits, caps,
//!                    budget, breaker, refresh-ahead)
//!   state.rs         what every clone and route layer shares
//!   keys.rs          how HTTP names an entry: URL key, base and variant key
//!   service/         the Tower service, one file per step:
//!     mod.rs           classify the request, find the candidate, pick the path
//!     lookup.rs        route's steps: admit, the stored candidate, its use
//!     coalesce.rs      miss: lead or follow the key's flight, or be released
//!     miss_status.rs   the states a miss can be in (what it wants, hears)
//!     follow.rs        miss with the key's flight running: join it, answer
//!                      a plain outcome at once, the rest as coalesce.rs
//!     origin.rs        one origin request as the flight's computation
//!     returned.rs      what that call sends back to the request that made
//!                      it (Returned: spare, handoff, error), on one channel
//!     origin_body.rs   its answer's body read: buffered, streamed or passed on
//!     streamed.rs      a fill that spans frames, read once by every reader
//!     fill.rs          the origin's answer and verdict turned into a fill
//!     direct.rs        calls outside any flight (Honor reloads, released)
//!     respond.rs       building answers from entries; the layer's own answers
//!     fields.rs        the fields a fill drops and a store never keeps; a
//!                      plain GET, a body; the hit-for-miss permit (a leaf)
//!   policy/          RFC 9111: directives, request, freshness, storability,
//!                    targeted (RFC 9213)
//!   stream/          a streaming fill's shared body: window, pace (cut-off
//!                    rules), reader, registry
//!   hot.rs           what the layer feeds hot keys: names (route or
//!                    redacted URL) and outcomes per key
//!   vary.rs, conditional.rs, purge.rs, route.rs, body.rs,
//!   request_body.rs, response.rs (CachedResponse), cache_status.rs, future.rs,
//!   warnings.rs (the one WARN per route for answers without freshness)
//! engine/          the HTTP-agnostic read-through state machine
//!   cache.rs         the public Cache<V>
//!   cache_builder.rs CacheBuilder: its settings, Cache::builder
//!   resolve.rs       Engine::resolve: the miss path in reading order
//!   flight.rs        the local single flight
//!   remote/          across instances (Redis): mod.rs the lookup-or-lease
//!                    and waiting for another's fill, lead.rs the leader's
//!                    write and copies, stale.rs stale replies
//!   quorum_lease.rs  a key's lease on the Redlock quorum
//!   gate/            the origin as a whole: the budget by priority, the
//!                    breaker, their cluster-wide half on Redis;
//!                    origin_calls.rs how the engine's calls meet it
//!   fill.rs, refresh.rs, outside_flight.rs, retained.rs, purge_log.rs,
//!   spawn.rs (background work, a leaf)
//! lock/            Redlock and the lease watchdog
//! store/           memory/ (embedded default and L1; stored.rs one entry,
//!                  clock.rs its map,
//!                  CLOCK eviction by weight), notice.rs (the purge
//!                  notice's bytes), redis/ (connection
//!                  and breaker, keys, Lua scripts as .lua files, fills,
//!                  purge bus, the origin's cluster budget and shared
//!                  breaker, cluster, Sentinel, TLS)
//! entry/           what engine, lock and store share: value.rs (Value),
//!                  envelope.rs (the stored bytes), token.rs (lease and
//!                  fence tokens)
//! hot/             hot keys: the top K per measure over a sliding window
//!                  (Space-Saving, fixed memory); keys and names only
//! key.rs, error.rs, metrics/
//! docs/            the sections of these crate docs below this map
//! ```
//!
//! Beside the library, in the same Cargo workspace: `cli/` (package
//! herdguard-cli: the `herdguard` binary, and the proxy as the library
//! `herdguard_cli`, on this crate's public API only) and `testkit/`
//! (unpublished test support both packages' tests share).
//!
#![doc = include_str!("docs/failure.md")]
#![doc = include_str!("docs/origin.md")]
#![doc = include_str!("docs/http_choices.md")]
#![doc = include_str!("docs/grace.md")]
#![doc = include_str!("docs/memory.md")]
#![doc = include_str!("docs/sharing.md")]
#![doc = include_str!("docs/bounds.md")]
#![doc = include_str!("docs/streamed_fills.md")]
#![doc = include_str!("docs/work_once.md")]
#![doc = include_str!("docs/observability.md")]
#![doc = include_str!("docs/usage.md")]
// docs.rs: mark feature-gated items with the feature they need.
#![cfg_attr(docsrs, feature(doc_cfg))]
// The docs describe the Redis paths too; built memory-only, their links to
// Redis items have nothing to point at and stay plain text.
#![cfg_attr(not(feature = "redis"), allow(rustdoc::broken_intra_doc_links))]

mod engine;
mod entry;
mod error;
mod hot;
mod http;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod inspect;
mod key;
#[cfg(feature = "redis")]
mod lock;
// Same path as the real leases, so their users need no cfg of their own.
#[cfg(not(feature = "redis"))]
#[path = "lock/no_redis.rs"]
mod lock;
pub mod metrics;
mod store;

// The everyday names: the HTTP layer, `Cache<V>`, their settings and errors.
pub use engine::{Cache, CacheBuilder, Freshness, Lookup, OriginBreaker};
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use entry::Json;
pub use entry::Value;
pub use error::{BoxError, BuildError, DecodeError, Error, StoreFailure, StoreFailureKind};
pub use http::builder::CacheLayerBuilder;
pub use http::layer::CacheLayer;
pub use http::route::RoutePolicy;
pub use http::state::ReloadMode;
pub use key::CacheKey;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use store::redis::RedisOptions;

/// The Tower service [`CacheLayer`] makes and the types its signatures
/// name: the service, its future, the bodies it answers with and reads,
/// and a [`RoutePolicy`]'s predicate. Most users never name them; code
/// that stores the service in a struct, or writes its own predicate, does.
pub mod service {
    pub use crate::http::body::CacheBody;
    pub use crate::http::future::ResponseFuture;
    pub use crate::http::policy::host_is_valid;
    pub use crate::http::request_body::RequestBody;
    pub use crate::http::route::{DefaultPredicate, Predicate};
    pub use crate::http::service::CacheService;
}

/// Purging: what [`CacheLayer::purge_url`], [`purge_key`](CacheLayer::purge_key),
/// [`purge_tag`](CacheLayer::purge_tag) and their soft forms return, and
/// what they take as a URL. A [`PurgeHandle`](purge::PurgeHandle) resolves
/// when the purge is done everywhere there is to reach.
pub mod purge {
    pub use crate::http::purge::{AsUri, PurgeError, PurgeHandle, Purged};
}

/// Work done once across processes: [`Redlock`](redlock::Redlock) leases
/// on a quorum of independent Redis masters, and fencing tokens
/// ([`FencedStore`](redlock::FencedStore)) that make a late writer
/// harmless. For work whose double execution is unsafe; the cache itself
/// needs neither (see the crate docs' "Work that must run once").
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redlock {
    pub use crate::lock::redlock::{
        FencedStore, Guarded, LockError, Redlock, RedlockBuilder, RedlockLease, Work,
    };
}

/// What the cache is doing now: the flights running
/// ([`CacheLayer::flights`]), the origin's budget and breaker
/// ([`CacheLayer::origin_status`]) and the hottest keys
/// ([`CacheLayer::hot_keys`]). Counters are in [`metrics`].
pub mod status {
    pub use crate::engine::{Flight, OriginStatus};
    pub use crate::hot::{HotKey, HotKeys};
}

/// The README's examples, compiled as doctests (some use Redis).
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
