//! The `Cache-Status` header (RFC 9211): its name and the wording of every
//! value the layer writes, `<cache name>; <params>`. Formatting only.

use std::cell::RefCell;

use bytes::Bytes;
use http::header::HeaderValue;

use crate::http::numbers;
use crate::http::policy::{Forward, Unkeyed};
use crate::http::state::LayerState;
use crate::metrics::OwnCall;

pub(crate) use crate::http::CACHE_STATUS;

/// Why a forwarded request went to the origin on its own, or how its answer
/// came: the `detail=` of its `Cache-Status` (`fwd=…; detail=…`). One enum,
/// so every such word the layer writes is listed here, beside the
/// not-stored reasons (`policy::NotStored`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Detail {
    /// The GET or HEAD carried a body: never cached, never coalesced.
    RequestBody,
    /// The answer is over `max_body_bytes` (or a range of a key known to be).
    TooLarge,
    /// A pass marker sent the request to the origin alone.
    HitForPass,
    /// The wait for another request's fill ran out.
    WaitTimeout,
    /// The flight's streamed body had moved past this reader's window.
    StreamWindowPassed,
    /// Too many waiters: released under the fallback cap.
    Overloaded,
    /// The flight's answer was an error not shared with waiters.
    ErrorNotShared,
    /// The flight's answer was not storable, so not for this request.
    Uncacheable,
    /// A body streamed to its readers as it arrived.
    Streamed,
    /// A request the key cannot hold (bad Host, method or URL override).
    Unkeyed(Unkeyed),
}

impl Detail {
    /// The word on the wire.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Detail::RequestBody => "request-body",
            Detail::TooLarge => "too-large",
            Detail::HitForPass => "hit-for-pass",
            Detail::WaitTimeout => "wait-timeout",
            Detail::StreamWindowPassed => "stream-window-passed",
            Detail::Overloaded => "overloaded",
            Detail::ErrorNotShared => "error-not-shared",
            Detail::Uncacheable => "uncacheable",
            Detail::Streamed => "streamed",
            Detail::Unkeyed(why) => why.detail(),
        }
    }
}

impl Detail {
    /// The reason counted for a request that went to the origin alone
    /// with this detail; `None` for a word that says how an answer came.
    fn own_call(self) -> Option<OwnCall> {
        Some(match self {
            Detail::RequestBody => OwnCall::RequestBody,
            Detail::TooLarge => OwnCall::TooLarge,
            Detail::HitForPass => OwnCall::HitForPass,
            Detail::WaitTimeout => OwnCall::WaitTimeout,
            Detail::StreamWindowPassed => OwnCall::StreamWindowPassed,
            Detail::Overloaded => OwnCall::Overloaded,
            Detail::ErrorNotShared => OwnCall::ErrorNotShared,
            Detail::Uncacheable => OwnCall::Uncacheable,
            Detail::Unkeyed(_) => OwnCall::Unkeyed,
            Detail::Streamed => return None,
        })
    }
}

impl LayerState {
    /// [`Self::status_fwd`] for a request about to call the origin on its
    /// own, outside any flight: counted by why
    /// ([`names::OWN_CALLS`](crate::metrics::names::OWN_CALLS)).
    pub(crate) fn own_call_status(&self, fwd: Forward, detail: Option<Detail>) -> HeaderValue {
        let why = match (detail, fwd) {
            (Some(d), _) => d.own_call(),
            (None, Forward::Method) => Some(OwnCall::Method),
            (None, Forward::Request) => Some(OwnCall::Request),
            (None, Forward::VaryMiss) => Some(OwnCall::VaryMiss),
            (None, Forward::UriMiss | Forward::Stale) => None,
        };
        if let Some(why) = why {
            self.counters().own_call(why);
        }
        self.status_fwd(fwd, detail)
    }

    pub(crate) fn status(&self, params: std::fmt::Arguments<'_>) -> HeaderValue {
        use std::fmt::Write;
        let mut s = String::with_capacity(64);
        let _ = write!(s, "{}; {}", self.http.cache_name, params);
        // One allocation: the String's buffer becomes the header's bytes.
        // The cache name is validated as a token when the layer is built.
        HeaderValue::from_maybe_shared(Bytes::from(s))
            .unwrap_or_else(|_| HeaderValue::from_static("herdguard"))
    }

    pub(crate) fn status_fwd(&self, fwd: Forward, detail: Option<Detail>) -> HeaderValue {
        match detail {
            Some(d) => self.status(format_args!("fwd={}; detail={}", fwd.as_str(), d.as_str())),
            None => self.status(format_args!("fwd={}", fwd.as_str())),
        }
    }

    /// `<name>; hit; ttl=N[; detail=D]`, made once per thread for each
    /// value: a hit's wording changes at most once a second, and building it
    /// per request was a format and an allocation on every hit.
    pub(crate) fn hit_status(&self, ttl: i64, detail: Option<&'static str>) -> HeaderValue {
        let name = self.http.cache_name.as_bytes();
        let slot = ttl.rem_euclid(WORDINGS as i64) as usize;
        WORDINGS_BUILT.with(|cell| {
            let mut built = cell.borrow_mut();
            if let Some(w) = &built[slot] {
                // The name is checked too: layers with other names share the thread.
                let v = w.value.as_bytes();
                if w.ttl == ttl
                    && w.detail == detail
                    && v.len() > name.len()
                    && v.starts_with(name)
                    && v[name.len()] == b';'
                {
                    return w.value.clone();
                }
            }
            let value = match detail {
                Some(d) => self.status(format_args!("hit; ttl={ttl}; detail={d}")),
                None => self.status(format_args!("hit; ttl={ttl}")),
            };
            built[slot] = Some(Wording {
                ttl,
                detail,
                value: value.clone(),
            });
            value
        })
    }
}

/// Slots of the per-thread wording and `Age` tables.
const WORDINGS: usize = 32;

struct Wording {
    ttl: i64,
    detail: Option<&'static str>,
    value: HeaderValue,
}

thread_local! {
    static WORDINGS_BUILT: RefCell<[Option<Wording>; WORDINGS]> =
        const { RefCell::new([const { None }; WORDINGS]) };
    static AGES_BUILT: RefCell<[Option<(u64, HeaderValue)>; WORDINGS]> =
        const { RefCell::new([const { None }; WORDINGS]) };
}

/// An `Age` value: static text below [`numbers::STATIC_BELOW`] seconds,
/// above it made once per thread for each number (`HeaderValue::from`
/// allocates).
pub(crate) fn age_value(age: u64) -> HeaderValue {
    if age < numbers::STATIC_BELOW {
        return numbers::number_value(age);
    }
    let slot = (age % WORDINGS as u64) as usize;
    AGES_BUILT.with(|cell| {
        let mut built = cell.borrow_mut();
        match &built[slot] {
            Some((a, v)) if *a == age => v.clone(),
            _ => {
                let v = HeaderValue::from(age);
                built[slot] = Some((age, v.clone()));
                v
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::age_value;

    /// A remembered Age is only reused for the same number.
    #[test]
    fn age_values_are_per_number() {
        for age in [0, 1, 31, 32, 33, 64, 9_999, 10_000, 10_031, 1_000_000] {
            assert_eq!(age_value(age), age.to_string().as_str(), "first {age}");
            assert_eq!(age_value(age), age.to_string().as_str(), "again {age}");
        }
    }
}

#[cfg(test)]
mod detail_tests {
    use super::Detail;
    use crate::http::policy::Unkeyed;

    /// The words are what dashboards and log queries match on: changing the
    /// enum must not change them.
    #[test]
    fn details_keep_their_words() {
        let words = [
            (Detail::RequestBody, "request-body"),
            (Detail::TooLarge, "too-large"),
            (Detail::HitForPass, "hit-for-pass"),
            (Detail::WaitTimeout, "wait-timeout"),
            (Detail::StreamWindowPassed, "stream-window-passed"),
            (Detail::Overloaded, "overloaded"),
            (Detail::ErrorNotShared, "error-not-shared"),
            (Detail::Uncacheable, "uncacheable"),
            (Detail::Streamed, "streamed"),
            (Detail::Unkeyed(Unkeyed::BadHost), "bad-host"),
            (Detail::Unkeyed(Unkeyed::MethodOverride), "method-override"),
            (Detail::Unkeyed(Unkeyed::UrlOverride), "url-override"),
        ];
        for (detail, word) in words {
            assert_eq!(detail.as_str(), word, "{detail:?}");
        }
    }
}
