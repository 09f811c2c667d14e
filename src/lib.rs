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
//! request ─► cacheable? (GET/HEAD, no Range/Upgrade, no request no-store/no-cache)
//!               │ no ─► inner service, Cache-Status: fwd=method|request
//!               ▼ yes
//!           key = hash(method, authority, path, query, Authorization present?)
//!               │
//!           memory: fresh ─► HIT (no await, no allocation beyond headers)
//!                   stale ─► STALE now; one background refresh
//!                   pass  ─► inner service (origin said "uncacheable" recently)
//!                   miss  ─► flight for this key running?
//!                               yes ─► wait (bounded) and share its outcome
//!                               no  ─► lead: call the inner service in a spawned task,
//!                                      buffer the body (≤ 8 MiB), store if allowed,
//!                                      wake every waiter
//! ```
//!
//! ## With Redis: one origin call per key per cluster
//!
//! [`CacheLayerBuilder::redis`] (or [`CacheBuilder::redis`]) shares entries
//! through Redis. Memory stays in front as an L1 (1 s by default, never
//! fresher than the entry), and the in-process flight stays in front of
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
//!                            per process, bounded poll as a fallback),
//!                            then look again; if the lease lapsed with no fill,
//!                            compete again: exactly one wins
//! pass marker             ─► go to the origin (known uncacheable)
//! ```
//!
//! Each entry's keys share one hash tag made from the hex of the key's hash
//! (`{ns}:{H}:v`, `:fresh`, `:lock`, `:fence`, `:pass`), so no request text
//! reaches a key name and every script touches one slot. Every lease comes
//! with a fence token (a per-key counter); the write script stores an entry
//! only if its token is not older than the newest accepted one, so a leader
//! whose lease lapsed (GC pause, slow origin) cannot overwrite a newer value.
//! Rejected writes are counted in [`Stats::fenced_rejections`].
//!
//! Redis Cluster ([`RedisOptions::cluster`]) runs the same scripts unchanged:
//! entries spread over the slots, and fill notifications are published on
//! `{ns}:{H}:fill` in the entry's own slot (SPUBLISH), so they reach only the
//! shard that owns the entry. `rediss://` (TLS via rustls, cargo feature
//! `tls`) and ACL credentials in the URL are supported; credentials never
//! reach logs, errors or `Debug` output. See [`RedisOptions`].
//!
//! ## Failure behaviour
//!
//! - **Redis down or slow:** every call has a timeout (connect 1 s, reply
//!   250 ms, pool wait 250 ms by default). A failure opens a circuit breaker:
//!   the layer serves from memory, coalesces in-process, and calls the origin
//!   through the local leader; it probes Redis again after a doubling back-off
//!   (250 ms to 5 s) and goes back to it by itself. Redis trouble is never a
//!   5xx and never a panic.
//! - **Corrupt or unknown-version entry in Redis:** a miss; logged and overwritten.
//! - **A leader process dies:** its lease expires (5 s by default) and exactly
//!   one waiter wins the next election.
//!
//! - **The origin errors, times out or panics:** every waiter of that flight
//!   gets the same outcome (a 502/504 response, or the inner service's own
//!   error for the request that led); nobody retries on their behalf. The next
//!   request elects a new leader.
//! - **The leading request is cancelled** (client disconnect): the origin call
//!   runs in its own task and still completes for the waiters.
//! - **A wait runs out** (`max_wait`, 30 s by default): the waiter calls the
//!   origin itself, uncached, under a concurrency cap (`fallback_limit`).
//! - **Uncacheable response** (`private`, `no-store`, `Set-Cookie`, `Vary: *`,
//!   Authorization without explicit permission): waiters go to the origin on
//!   their own and a short pass marker keeps later requests from queueing.
//! - **Response without freshness information:** handed to the requests
//!   already waiting for it ("collapsed") but not stored.
//! - **Body larger than the limit:** streamed through to the requesting client
//!   unbuffered; nothing is stored.
//!
//! ## HTTP choices
//!
//! - A response is stored only with explicit freshness (`s-maxage`, `max-age`,
//!   `Expires`) or a [`default_ttl`](CacheLayerBuilder::default_ttl) you set.
//! - `stale-while-revalidate` gives the stale grace; `must-revalidate` and
//!   `proxy-revalidate` remove it.
//! - Requests with `Authorization` are keyed apart from requests without it,
//!   and their responses are stored only with `public`, `s-maxage` or
//!   `must-revalidate` (RFC 9111 §3.5).
//! - A stored response that varies on request headers is served only to
//!   requests with the same values of those headers; others go to the origin.
//! - HEAD is answered from the GET entry; a HEAD miss fills it with a GET.
//! - Successful POST, PUT, PATCH and DELETE invalidate the target URI.
//! - Every response the layer handles carries `Cache-Status` (RFC 9211);
//!   responses from the cache carry `Age`.
//!
//! ## With axum
//!
//! ```
//! use axum::{routing::get, Router};
//! use herdguard::CacheLayer;
//!
//! async fn report() -> ([(&'static str, &'static str); 1], &'static str) {
//!     ([("cache-control", "max-age=5, stale-while-revalidate=30")], "expensive")
//! }
//!
//! let cache = CacheLayer::new();
//! let app: Router = Router::new()
//!     .route("/report/{id}", get(report))
//!     .route("/other", get(report))
//!     // One layer, shared state: coalescing spans both routes.
//!     .layer(cache.clone());
//! # let _ = app;
//! ```
//!
//! ## Without HTTP
//!
//! [`Cache`] is the same engine for any value: see
//! [`Cache::get_or_compute`].

mod body;
mod engine;
mod entry;
mod error;
mod flight;
mod future;
mod key;
mod layer;
mod lock;
mod metrics;
mod policy;
mod service;
mod store;

pub use body::CacheBody;
pub use engine::{Cache, CacheBuilder, Freshness, Lookup};
pub use entry::{CachedResponse, Value};
pub use error::{BoxError, BuildError, DecodeError, Error};
pub use future::ResponseFuture;
pub use key::CacheKey;
pub use layer::{CacheLayer, CacheLayerBuilder};
pub use metrics::{Source, Stats};
pub use service::CacheService;
pub use store::redis::RedisOptions;

/// The `redis` crate this one uses, so you can stay on one version.
pub use deadpool_redis::redis;

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
