//! Turning an origin answer and its verdict into an engine fill, keeping
//! the Vary index and the retained copies in step. No I/O.

use std::time::Duration;

use http::header::{HeaderMap, HeaderName};

use crate::engine::{Fill, Freshness};
use crate::http::policy::{self, Forward, ResponseVerdict};
use crate::http::response::CachedResponse;
use crate::http::state::LayerState;
use crate::http::vary::variant_key;
use crate::store::memory::Stored;

use super::target::Target;

impl LayerState {
    /// Turn a response and its verdict into a fill, keeping the Vary index
    /// and the retained store in step with it.
    pub(super) fn finish(
        &self,
        target: Target,
        mut value: CachedResponse,
        verdict: ResponseVerdict,
        request_headers: &HeaderMap,
    ) -> Fill<CachedResponse> {
        match &verdict {
            ResponseVerdict::Share => self.engine.counters.not_stored("no-freshness"),
            ResponseVerdict::Pass(reason) => self.engine.counters.not_stored(reason),
            ResponseVerdict::Store { .. } => {}
        }
        match verdict {
            ResponseVerdict::Store {
                fresh_for,
                stale_for,
                initial_age,
                rules,
            } => {
                value.initial_age = initial_age.as_secs().min(u64::from(u32::MAX)) as u32;
                value.rules = rules;
                let names: Vec<HeaderName> = value.vary.iter().map(|(n, _)| n.clone()).collect();
                self.vary.learn(target.base, &names);
                // The next request with these values computes this key; file
                // the response there too when it differs from the flight's.
                let key = variant_key(&target.base, &names, request_headers);
                if key != target.key {
                    let freshness = Freshness::new(fresh_for).with_stale(stale_for);
                    self.engine
                        .store_outside_flight(key, value.clone(), freshness);
                }
                // Kept past its stale grace: to revalidate it (validators),
                // for stale-if-error, and for clients that accept max-stale.
                let keep = self
                    .http
                    .keep
                    .max(stale_for)
                    .max(Duration::from_secs(u64::from(rules.sie)));
                self.retained.insert(key, value.clone(), fresh_for, keep);
                // The base key always holds some variant in Redis, carrying
                // the Vary names: an instance that has not learned them yet
                // looks the base key up first and learns them there.
                if !names.is_empty() && target.base != target.key && target.base != key {
                    let freshness = Freshness::new(fresh_for).with_stale(stale_for);
                    self.engine
                        .store_remote_only(target.base, &value, freshness);
                }
                Fill::Store {
                    value,
                    fresh_for,
                    stale_for,
                }
            }
            // A server error goes to the requests waiting on it, stored for
            // none: a failing origin must not be asked once per waiter.
            ResponseVerdict::Share
                if self.http.share_uncacheable || value.status.is_server_error() =>
            {
                Fill::Share(value)
            }
            // No freshness information: uncacheable for everyone.
            ResponseVerdict::Share => {
                tracing::debug!(reason = "no-freshness", "response is not cacheable");
                self.retained.remove(&target.key);
                value.not_stored = Some("no-freshness");
                Fill::Pass(Some(value))
            }
            ResponseVerdict::Pass(reason) if self.http.share_uncacheable => {
                tracing::debug!(reason, "response is not cacheable; shared with waiters");
                if !policy::request_specific(reason) {
                    self.retained.remove(&target.key);
                }
                Fill::Share(value)
            }
            // Uncacheable because of this request alone: the stored entry
            // stays and nobody else is told to pass.
            ResponseVerdict::Pass(reason) if policy::request_specific(reason) => {
                tracing::debug!(reason, "response is for its own request only");
                Fill::Private(value)
            }
            ResponseVerdict::Pass(reason) => {
                tracing::debug!(reason, "response is not cacheable");
                self.retained.remove(&target.key);
                Fill::Pass(Some(value))
            }
        }
    }
}

impl LayerState {
    /// The fill of a response whose body was not buffered (too large, or
    /// past the fill budget): a pass marker only where [`finish`] would set
    /// one, for a response uncacheable for everyone. Too large alone is not
    /// uncacheable.
    ///
    /// [`finish`]: Self::finish
    pub(super) fn unbuffered_fill(
        &self,
        verdict: &ResponseVerdict,
        status: http::StatusCode,
    ) -> Fill<CachedResponse> {
        let for_everyone = match verdict {
            ResponseVerdict::Store { .. } => false,
            ResponseVerdict::Share => !self.http.share_uncacheable && !status.is_server_error(),
            ResponseVerdict::Pass(reason) => {
                !self.http.share_uncacheable && !policy::request_specific(reason)
            }
        };
        if for_everyone {
            Fill::Pass(None)
        } else {
            Fill::Unbuffered
        }
    }

    /// Learn the Vary names `entry` carries for its URL (it may come from
    /// another instance), and say which variant `request` needs when `entry`
    /// is not it and lives under another key.
    pub(super) fn variant_for(
        &self,
        target: &Target,
        entry: &Stored<CachedResponse>,
        request: &HeaderMap,
    ) -> Option<Target> {
        let names: Vec<HeaderName> = entry.value.vary.iter().map(|(n, _)| n.clone()).collect();
        if is_stored(entry) {
            self.vary.learn(target.base, &names);
        }
        if names.is_empty() || entry.value.vary_matches(request) {
            return None;
        }
        let key = variant_key(&target.base, &names, request);
        (key != target.key).then_some(Target {
            base: target.base,
            key,
            miss: Forward::VaryMiss,
        })
    }
}

/// Whether `entry` was stored (it has a lifetime), rather than handed to
/// the requests waiting on one flight.
pub(super) fn is_stored(entry: &Stored<CachedResponse>) -> bool {
    !entry.meta.fresh_for.is_zero() || !entry.meta.stale_for.is_zero()
}
