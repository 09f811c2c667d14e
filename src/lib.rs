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
//! ## Failure behaviour
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
mod conditional;
mod engine;
mod entry;
mod error;
mod flight;
mod future;
mod key;
mod layer;
mod metrics;
mod policy;
mod purge;
mod retain;
mod service;
mod store;
mod vary;

pub use body::CacheBody;
pub use engine::{Cache, CacheBuilder, Freshness, Lookup};
pub use entry::{CachedResponse, Value};
pub use error::{BoxError, BuildError, DecodeError, Error};
pub use future::ResponseFuture;
pub use key::CacheKey;
pub use layer::{CacheLayer, CacheLayerBuilder};
pub use metrics::{Source, Stats};
pub use service::CacheService;

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
