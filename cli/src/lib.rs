//! The caching reverse proxy behind `herdguard proxy`, as a library: the
//! `herdguard` binary runs it, and so do the `reverse_proxy` example and the
//! tests, as a normal dependency. It uses only herdguard's public API.
//!
//! - [`proxy`]: the proxy itself ([`proxy::Proxy`], its server, upstream
//!   client, forwarding rules and access log).
//! - [`app`]: the same proxy as an axum `Router`, with the two options the
//!   example takes.
//!
//! Install the binary with `cargo install --path cli` (from a checkout) or
//! `cargo install herdguard-cli`.

pub mod app;
#[allow(
    missing_docs,
    reason = "the proxy's parts are public for the binary; fields and variants are named for what they hold"
)]
pub mod proxy;
