//! Everything that knows HTTP: the Tower layer and its service, RFC 9111
//! rules, Vary, conditional requests, purge by URL and tag, streamed bodies.
//! It drives the engine ([`crate::engine`]); nothing below it imports this.

/// The RFC 9211 response header (its wording is [`cache_status`]'s).
pub(crate) const CACHE_STATUS: http::HeaderName = http::HeaderName::from_static("cache-status");

pub(crate) mod body;
pub(crate) mod builder;
pub(crate) mod cache_status;
pub(crate) mod conditional;
pub(crate) mod future;
pub(crate) mod hot;
pub(crate) mod keys;
pub(crate) mod layer;
pub(crate) mod numbers;
mod origin_settings;
pub(crate) mod policy;
pub(crate) mod purge;
pub(crate) mod range;
pub(crate) mod request_body;
pub(crate) mod response;
pub(crate) mod route;
pub(crate) mod service;
pub(crate) mod state;
pub(crate) mod stream;
pub(crate) mod vary;
pub(crate) mod warnings;
