//! How the layer feeds its hot keys ([`crate::hot`]): the name a request's
//! key is listed under (its axum route, or its URL with the query redacted
//! unless full URLs are opted in), and the outcomes counted per key.
//! Knows requests and sources; the counting itself is `crate::hot`'s.

use http::Request;
use tokio::time::Instant;

use crate::hot::{Measure, NameBuf};
use crate::http::keys::effective_uri;
use crate::http::state::LayerState;
use crate::key::CacheKey;
use crate::metrics::Source;

/// Write the name of `req`'s key: the route axum matched, else the path,
/// with `?…` in place of a query (which may hold tokens) unless `full`.
/// Only called when the key takes a slot, so a hit on a listed key never
/// builds it.
pub(crate) fn write_name<B>(req: &Request<B>, full: bool, out: &mut NameBuf<'_>) {
    #[cfg(feature = "axum")]
    if let Some(route) = req.extensions().get::<axum::extract::MatchedPath>() {
        out.push_str(route.as_str());
        return;
    }
    let uri = effective_uri(req);
    out.push_str(uri.path());
    if let Some(query) = uri.query() {
        if full {
            out.push_str("?");
            out.push_str(query);
        } else {
            out.push_str("?…");
        }
    }
}

impl LayerState {
    /// Count a request for `key` at `now` (the clock read the lookup made).
    #[inline]
    pub(crate) fn hot_request<B>(&self, key: &CacheKey, req: &Request<B>, now: Instant) {
        if let Some(hot) = &self.engine.hot {
            let full = self.http.hot_key_full_urls;
            hot.record(Measure::Requests, key, 1, now, |out| {
                write_name(req, full, out)
            });
        }
    }

    /// Count a follower answered from its leader's streamed body, which
    /// arrived at `arrived` (the engine counts those its flights answer).
    pub(crate) fn record_waiter(&self, key: &CacheKey, arrived: std::time::Instant) {
        self.counters().record(Source::Coalesced);
        if let Some(hot) = &self.engine.hot {
            let waited = arrived.elapsed().as_millis() as u64;
            hot.record_known(Measure::Waiters, key, 1);
            hot.record_known(Measure::WaitedMs, key, waited);
        }
    }

    /// Count `source` as [`crate::metrics::Counters::record`] does, and
    /// for the hot keys of `key` ([`Self::hot_outcome`]).
    pub(crate) fn record_for(&self, source: Source, key: &CacheKey) {
        self.counters().record(source);
        self.hot_outcome(source, key);
    }

    /// Count an answer's outcome for `key`: stale answers and passes (the
    /// engine counts origin calls and waits itself).
    pub(crate) fn hot_outcome(&self, source: Source, key: &CacheKey) {
        let measure = match source {
            Source::Stale => Measure::Stale,
            Source::Bypass => Measure::Passes,
            Source::Hit | Source::Miss | Source::Coalesced => return,
        };
        if let Some(hot) = &self.engine.hot {
            hot.record_known(measure, key, 1);
        }
    }
}
