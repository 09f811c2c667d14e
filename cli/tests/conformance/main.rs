//! Replays the request/response shapes of the public HTTP-cache conformance
//! suite (http-tests/cache-tests, cache-tests.fyi) against the reverse proxy
//! example, over real loopback HTTP.
//!
//! The harness is our own: a scripted origin that plays one response per
//! numbered request (a client header `Req-Num` says which), the proxy in
//! front of it, and a client that checks each answer the way the suite
//! describes its expectations:
//!
//! - `Cached`: the answer carries an older `Server-Request-Count` than the
//!   request number (it was stored), or is a 304 without one;
//! - `NotCached`: the origin saw this very request;
//! - `EtagValidated` / `LmValidated`: the origin saw a conditional request
//!   (it answers 304 only when the validator matches what it sent before,
//!   and a 999 status otherwise, so an unconditional request shows up);
//! - plus expected status, headers, missing headers and body.
//!
//! Every case runs on its own URL, and the cases of one group run
//! concurrently, so pauses overlap and the file stays fast. Where the suite
//! pauses three seconds to let a `max-age=2` response go stale, we pause
//! 2.1 s; elsewhere pauses are skipped because lifetimes are long. Where a
//! short-lived response must first be served fresh, its max-age is
//! `SLACK_MAX_AGE` instead of the suite's 1 or 2 s, which a loaded machine
//! overruns.
//!
//! The survey tests assert our expected outcome for each mirrored suite
//! test id: a pass, or a listed deviation with the reason (see
//! `/// Mirrors` lines and the `KNOWN` tables).

use herdguard_cli::app as proxy;

mod age_expires;
mod cdn_cache_control;
mod directives;
mod freshness;
mod harness;
mod vary_conditional_stale_partial;
