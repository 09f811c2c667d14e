//! Turning an origin answer and its verdict into an engine fill, keeping
//! the Vary index and the retained copies in step. No I/O.

use std::time::Duration;

use http::header::{HeaderMap, HeaderName};
use http::StatusCode;

use crate::engine::{AlsoStored, Fill};
use crate::http::keys::variant_key;
use crate::http::policy::{self, Forward, NotStored, RequestDirectives, ResponseVerdict, Usable};
use crate::http::response::CachedResponse;
use crate::http::state::LayerState;
use crate::store::memory::{Probe, Stored};

use crate::http::keys::Target;

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
            ResponseVerdict::Share => self.counters().not_stored(NotStored::NoFreshness.label()),
            ResponseVerdict::Pass(reason) => self.counters().not_stored(reason.label()),
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
                self.store_fill(target, value, fresh_for, stale_for, request_headers)
            }
            // An error page is about the request that got it as much as
            // about the resource (an oversized header, a method override):
            // it never sets a pass marker and never removes what is stored.
            // Only the request that led gets it; waiters go to the origin
            // themselves, or get stale-if-error (see `coalesce`).
            ResponseVerdict::Share | ResponseVerdict::Pass(_)
                if self.http.share_uncacheable || is_error(value.status) =>
            {
                if let ResponseVerdict::Pass(reason) = verdict {
                    tracing::debug!(
                        reason = reason.as_str(),
                        "response is not cacheable; shared with waiters"
                    );
                    // The opt-in shares it, but the resource said so for everyone.
                    let everyone = !is_error(value.status) && !policy::request_specific(reason);
                    if everyone && !self.usable_entry(&target) {
                        self.retained.remove(&target.key);
                    }
                }
                Fill::Share(value)
            }
            // Uncacheable because of this request alone: the stored entry
            // stays and nobody else is told to pass.
            ResponseVerdict::Pass(reason) if policy::request_specific(reason) => {
                tracing::debug!(
                    reason = reason.as_str(),
                    "response is for its own request only"
                );
                Fill::Private(value)
            }
            // Uncacheable for everyone, but an entry still usable for other
            // requests is here (a reload or a refresh got this answer): one
            // request's answer never evicts or marks it.
            ResponseVerdict::Share | ResponseVerdict::Pass(_) if self.usable_entry(&target) => {
                tracing::debug!("uncacheable answer; the usable stored entry stays");
                if matches!(verdict, ResponseVerdict::Share) {
                    value.not_stored = Some(NotStored::NoFreshness);
                }
                Fill::Private(value)
            }
            // No freshness information, `no-store`, `private`, `Vary: *`:
            // uncacheable for everyone.
            ResponseVerdict::Share | ResponseVerdict::Pass(_) => {
                tracing::debug!("response is not cacheable");
                self.retained.remove(&target.key);
                if matches!(verdict, ResponseVerdict::Share) {
                    value.not_stored = Some(NotStored::NoFreshness);
                }
                Fill::Pass(Some(value))
            }
        }
    }

    /// The fill of a stored response: the variant it is filed under, its
    /// copy kept aside, and the base key's copy carrying the Vary names.
    fn store_fill(
        &self,
        target: Target,
        mut value: CachedResponse,
        fresh_for: Duration,
        stale_for: Duration,
        request_headers: &HeaderMap,
    ) -> Fill<CachedResponse> {
        // Its own bytes only, not the buffers it arrived in.
        value.compact();
        let names: Vec<HeaderName> = value.vary.iter().map(|(n, _)| n.clone()).collect();
        self.vary.learn(target.base, &names);
        // The next request with these values computes this key; file
        // the response there too when it differs from the flight's.
        // Copies are written by the engine after the fill's own
        // fenced write, under its token and purge checks.
        let key = variant_key(&target.base, &names, request_headers);
        let mut copies = Vec::new();
        if key != target.key {
            copies.push(AlsoStored { key, memory: true });
        }
        // Kept past its stale grace: to revalidate it (validators),
        // for stale-if-error, and for clients that accept max-stale.
        let keep = self
            .http
            .keep
            .max(stale_for)
            .max(Duration::from_secs(u64::from(value.rules.sie)));
        self.retained.insert(key, value.clone(), fresh_for, keep);
        // The base key always holds some variant in Redis, carrying
        // the Vary names: an instance that has not learned them yet
        // looks the base key up first and learns them there.
        if !names.is_empty() && target.base != target.key && target.base != key {
            copies.push(AlsoStored {
                key: target.base,
                memory: false,
            });
        }
        Fill::Store {
            value,
            fresh_for,
            stale_for,
            copies,
        }
    }

    /// The fill of a response whose body was not buffered (too large, or
    /// past the fill budget): a pass marker only where [`finish`] would set
    /// one, for a response uncacheable for everyone. Too large alone is not
    /// uncacheable.
    ///
    /// [`finish`]: Self::finish
    pub(super) fn unbuffered_fill(
        &self,
        verdict: &ResponseVerdict,
        status: StatusCode,
    ) -> Fill<CachedResponse> {
        let for_everyone = match verdict {
            ResponseVerdict::Store { .. } => false,
            ResponseVerdict::Share => !self.http.share_uncacheable && !is_error(status),
            ResponseVerdict::Pass(reason) => {
                !self.http.share_uncacheable
                    && !is_error(status)
                    && !policy::request_specific(*reason)
            }
        };
        if for_everyone {
            Fill::Pass(None)
        } else {
            Fill::Unbuffered
        }
    }

    /// The copy kept aside for `target` that the request's varied fields
    /// match, to revalidate.
    pub(super) fn kept_aside(
        &self,
        target: &Target,
        request: &HeaderMap,
    ) -> Option<CachedResponse> {
        self.retained
            .get(&target.key)
            .filter(|e| e.value.vary_matches(request))
            .map(|e| e.value.clone())
    }

    /// Whether an entry for `target` that other requests may still be
    /// served (fresh, or stale within its grace) is here: in the engine, or
    /// kept aside (read from Redis by a refresh that refused it).
    pub(super) fn usable_entry(&self, target: &Target) -> bool {
        if matches!(
            self.engine.probe(&target.key),
            Probe::Fresh(_) | Probe::Stale(_)
        ) {
            return true;
        }
        self.retained.get(&target.key).is_some_and(|e| {
            let age = e.value.current_age(e.age());
            let rd = RequestDirectives::default();
            matches!(
                policy::usability(&rd, e.value.rules, age, self.http.rules.grace),
                Usable::Fresh | Usable::StaleWhileRevalidate | Usable::Grace
            )
        })
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
            route: target.route,
        })
    }
}

/// A 4xx or 5xx: never a pass marker, never shared unless stored.
pub(super) fn is_error(status: StatusCode) -> bool {
    status.is_client_error() || status.is_server_error()
}

/// Whether `entry` was stored (it has a lifetime), rather than handed to
/// the requests waiting on one flight.
pub(super) fn is_stored(entry: &Stored<CachedResponse>) -> bool {
    !entry.meta.fresh_for.is_zero() || !entry.meta.stale_for.is_zero()
}
