//! Building the answer: a response from a stored, shared or streamed entry,
//! the layer's own 503/504/502 answers, and the `Cache-Status` wording.
//! It never calls the origin.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};

use crate::error::Error;
use crate::http::body::CacheBody;
use crate::http::conditional;
use crate::http::future::ResponseFuture;
use crate::http::policy::{self, Forward, NotStored, RequestScan, Usable};
use crate::http::response::{fill_served, CachedResponse, Strip};
use crate::http::state::LayerState;
use crate::http::stream::{Stream, StreamReader};
use crate::key::CacheKey;
use crate::metrics::Source;
use crate::store::memory::Stored;

use super::returned::Handoff;
use crate::http::cache_status::{age_value, Detail, CACHE_STATUS};

/// What a response is built for: HEAD or not, and the request's headers for
/// its own validators.
pub(super) struct View<'a> {
    pub(super) head: bool,
    pub(super) headers: &'a HeaderMap,
    /// Whether the request has a validator of its own (`If-None-Match`,
    /// `If-Modified-Since`): without one it never gets a 304.
    pub(super) validators: bool,
}

impl<'a> View<'a> {
    /// The view of `req`, whose names were scanned once ([`RequestScan`]).
    pub(super) fn scanned<B>(req: &'a Request<B>, head: bool, scan: &RequestScan) -> Self {
        Self {
            head,
            headers: req.headers(),
            validators: scan.validators,
        }
    }
}

/// A response built from an entry, and whether its head already went
/// without the headers the layer strips on the way out (a served head
/// built for this layer's [`Strip`]), so its exit need not look again.
pub(super) struct Built<B> {
    pub(super) response: Response<CacheBody<B>>,
    pub(super) stripped: bool,
}

impl<B> Built<B> {
    fn unstripped(
        mut response: Response<CacheBody<B>>,
        age: Option<u64>,
        status: HeaderValue,
    ) -> Self {
        let headers = response.headers_mut();
        if let Some(age) = age {
            headers.insert(header::AGE, age_value(age));
        }
        headers.insert(CACHE_STATUS, status);
        Self {
            response,
            stripped: false,
        }
    }

    /// The answer as a ready response future.
    pub(super) fn ready<F, E>(self) -> ResponseFuture<F, B, E> {
        if self.stripped {
            ResponseFuture::ready_stripped(self.response)
        } else {
            ResponseFuture::ready(self.response)
        }
    }
}

/// How a response from a stored or shared entry came about, for Cache-Status.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Served {
    Hit,
    /// Served stale; the detail says why.
    Stale(&'static str),
    /// Forwarded to the origin for this request (or collapsed into one that was).
    Forwarded {
        fwd: Forward,
        collapsed: bool,
    },
    /// The origin failed (status or error) and stale-if-error allowed this.
    StaleIfError {
        fwd_status: Option<u16>,
    },
    /// Stale as stale-if-error allows, without asking the origin: its
    /// breaker is open (`origin-down`), the budget had no permit in time
    /// (`origin-busy`), or the key's last fill failed moments ago
    /// (`origin-backoff`).
    Held(&'static str),
}

/// `Cache-Status` detail of a stale answer: the origin's
/// stale-while-revalidate, or the operator's grace.
pub(super) fn stale_detail(usable: Usable) -> &'static str {
    match usable {
        Usable::Grace => "grace",
        _ => "stale",
    }
}

/// How an entry a flight shared is served to a request on it: as found
/// (a hit, a stale copy), or as forwarded for it (`collapsed` when another
/// request led).
pub(super) fn served_from_flight(
    entry: &Stored<CachedResponse>,
    source: Source,
    fwd: Forward,
    grace: Duration,
) -> Served {
    match source {
        Source::Hit => Served::Hit,
        Source::Stale => Served::Stale(stale_detail(policy::usability(
            &policy::RequestDirectives::default(),
            entry.value.rules,
            entry.value.current_age(entry.age()),
            grace,
        ))),
        Source::Coalesced => Served::Forwarded {
            fwd,
            collapsed: true,
        },
        _ => Served::Forwarded {
            fwd,
            collapsed: false,
        },
    }
}

/// What stands in for a failed origin under stale-if-error: the stored
/// response, or without a copy of its own, a copy kept aside since (read
/// from Redis during the flight).
pub(super) struct StandIn {
    pub(super) state: Arc<LayerState>,
    pub(super) stale: Option<Arc<Stored<CachedResponse>>>,
    pub(super) key: CacheKey,
    pub(super) headers: Arc<HeaderMap>,
    pub(super) head: bool,
}

impl StandIn {
    pub(super) fn answer<B>(&self, fwd_status: Option<u16>) -> Option<Response<CacheBody<B>>> {
        self.answer_as(Served::StaleIfError { fwd_status })
    }

    /// The stand-in for a flight the origin gate refused (`error`): served
    /// as [`Served::Held`], or as a plain stale-if-error for another error.
    pub(super) fn answer_for<B>(&self, error: &Error) -> Option<Response<CacheBody<B>>> {
        match error {
            Error::OriginDown { .. } => self.answer_as(Served::Held("origin-down")),
            Error::OriginBusy => self.answer_as(Served::Held("origin-busy")),
            _ => self.answer(None),
        }
    }

    /// The stand-in while the origin's breaker is open, if one may answer.
    pub(super) fn while_down<B>(&self) -> Option<Response<CacheBody<B>>> {
        let retry_after = self.state.engine.origin_down_for()?;
        self.answer_for(&Error::OriginDown { retry_after })
    }

    /// The stored copy as `served`, if stale-if-error allows it.
    pub(super) fn answer_as<B>(&self, served: Served) -> Option<Response<CacheBody<B>>> {
        let kept;
        let entry = match self.stale.as_ref() {
            Some(e) => e,
            None => {
                kept = self
                    .state
                    .retained
                    .get(&self.key)
                    .filter(|e| e.value.vary_matches(&self.headers))?;
                &kept
            }
        };
        let age = entry.value.current_age(entry.age());
        if !policy::stale_if_error_allows(entry.value.rules, age) {
            return None;
        }
        self.state.record_for(Source::Stale, &self.key);
        let view = View {
            head: self.head,
            headers: &self.headers,
            validators: true,
        };
        Some(self.state.respond(entry, &view, served))
    }
}

impl LayerState {
    /// A response built from a stored (or shared) entry.
    pub(super) fn respond<B>(
        &self,
        entry: &Stored<CachedResponse>,
        view: &View<'_>,
        served: Served,
    ) -> Response<CacheBody<B>> {
        self.respond_aged(entry, entry.age(), view, served).response
    }

    /// [`Self::respond`] with the entry's age (since stored) already read.
    pub(super) fn respond_aged<B>(
        &self,
        entry: &Stored<CachedResponse>,
        stored_age: std::time::Duration,
        view: &View<'_>,
        served: Served,
    ) -> Built<B> {
        let value = &entry.value;
        let age = value.current_age(stored_age).as_secs();
        // The entry's own remaining freshness (RFC 9211), not how long this
        // instance keeps its L1 copy before asking Redis again.
        let ttl = i64::from(value.rules.lifetime) - age.min(i64::MAX as u64) as i64;
        let origin_status = if value.revalidated {
            304
        } else {
            value.status.as_u16()
        };
        let status = match served {
            Served::Hit => self.hit_status(ttl, None),
            // Stale because a soft purge made it so: one refresh for it has
            // gone forward (fwd=stale) and this answer did not wait for it.
            Served::Stale(detail) if detail != "max-stale" && entry.soft_purged_for().is_some() => {
                self.status(format_args!("fwd=stale; ttl={ttl}; detail=soft-purge"))
            }
            Served::Stale(detail) => self.hit_status(ttl, Some(detail)),
            Served::Forwarded { fwd, collapsed } => {
                let fwd = fwd.as_str();
                let stored = !entry.meta.fresh_for.is_zero() || !entry.meta.stale_for.is_zero();
                if collapsed {
                    self.status(format_args!(
                        "fwd={fwd}; fwd-status={origin_status}; collapsed"
                    ))
                } else if stored {
                    self.status(format_args!(
                        "fwd={fwd}; fwd-status={origin_status}; stored; ttl={ttl}"
                    ))
                } else {
                    self.status(format_args!("fwd={fwd}; fwd-status={origin_status}"))
                }
            }
            Served::StaleIfError {
                fwd_status: Some(s),
            } => self.status(format_args!(
                "fwd=stale; fwd-status={s}; ttl={ttl}; detail=stale-if-error"
            )),
            Served::StaleIfError { fwd_status: None } => {
                self.status(format_args!("fwd=stale; ttl={ttl}; detail=stale-if-error"))
            }
            Served::Held(detail) => {
                self.status(format_args!("fwd=stale; ttl={ttl}; detail={detail}"))
            }
        };
        // A response fetched for this request (or collapsed into its fetch)
        // keeps the origin's own Age; anything served from storage, including
        // after a 304, carries the age computed here (RFC 9111 §4.2.3, §5.1).
        let fetched = matches!(served, Served::Forwarded { .. }) && !value.revalidated;
        self.build_answer(value, view, status, (!fetched).then_some(age))
    }

    /// The initiating request's answer from what its fill handed it.
    pub(super) fn handed_off<B>(
        &self,
        handoff: Handoff<B>,
        view: &View<'_>,
        fwd: Forward,
        source: Source,
    ) -> Response<CacheBody<B>> {
        self.counters().record(source);
        match handoff {
            Handoff::TooLarge(mut response) => {
                let status = self.status_fwd(fwd, Some(Detail::TooLarge));
                response.headers_mut().insert(CACHE_STATUS, status);
                response
            }
            Handoff::Passed(mut response) => {
                let status = self.status(format_args!(
                    "fwd={}; fwd-status={}; detail=hit-for-pass",
                    fwd.as_str(),
                    response.status().as_u16()
                ));
                response.headers_mut().insert(CACHE_STATUS, status);
                response
            }
            Handoff::Streaming(stream, reader, detail) => {
                let status = self.status(format_args!(
                    "fwd={}; fwd-status={}; detail={}",
                    fwd.as_str(),
                    stream.status().as_u16(),
                    detail.as_str()
                ));
                self.respond_streamed(&stream, reader, view, status)
            }
        }
    }

    /// A response whose body is read from a streaming fill. The head is
    /// built as for a fetched response (the origin's `Age` kept); a 304 for
    /// the request's own validators and HEAD carry no body.
    pub(super) fn respond_streamed<B>(
        &self,
        stream: &Stream,
        reader: StreamReader,
        view: &View<'_>,
        status: HeaderValue,
    ) -> Response<CacheBody<B>> {
        let mut response = self.build(&stream.head.value, view, status, None);
        if response.status() != StatusCode::NOT_MODIFIED && !view.head {
            *response.body_mut() = CacheBody::shared(reader);
        }
        response
    }

    /// A response the leader may use but nobody else.
    pub(super) fn respond_uncached<B>(
        &self,
        value: CachedResponse,
        view: &View<'_>,
        fwd: Forward,
    ) -> Response<CacheBody<B>> {
        let status = self.status(format_args!(
            "fwd={}; fwd-status={}; detail={}",
            fwd.as_str(),
            value.status.as_u16(),
            value.not_stored.map_or("uncacheable", NotStored::as_str)
        ));
        self.build(&value, view, status, None)
    }

    pub(super) fn build<B>(
        &self,
        value: &CachedResponse,
        view: &View<'_>,
        status: HeaderValue,
        age: Option<u64>,
    ) -> Response<CacheBody<B>> {
        self.build_answer(value, view, status, age).response
    }

    /// [`Self::build`], saying whether the head already went without what
    /// the layer strips on the way out.
    fn build_answer<B>(
        &self,
        value: &CachedResponse,
        view: &View<'_>,
        status: HeaderValue,
        age: Option<u64>,
    ) -> Built<B> {
        if view.validators && conditional::not_modified(view.headers, value) {
            let mut r = Response::new(CacheBody::empty());
            *r.status_mut() = StatusCode::NOT_MODIFIED;
            *r.headers_mut() = conditional::not_modified_headers(&value.headers);
            return Built::unstripped(r, age, status);
        }
        let body = if view.head {
            CacheBody::empty()
        } else {
            CacheBody::full(value.body.clone())
        };
        let mut r = Response::new(body);
        *r.status_mut() = value.status;
        // Served from storage: the prebuilt head, its Age and Cache-Status
        // slots filled in place. A fetched response keeps the origin's
        // Age, so it takes the plain copy.
        let served = age.and_then(|age| Some((age, value.served_headers(self.strip())?)));
        match served {
            Some((age, head)) => {
                *r.headers_mut() = head.clone();
                fill_served(r.headers_mut(), age_value(age), status);
                Built {
                    response: r,
                    stripped: true,
                }
            }
            None => {
                *r.headers_mut() = value.headers.clone();
                Built::unstripped(r, age, status)
            }
        }
    }

    /// What this layer takes off every answer on the way out.
    fn strip(&self) -> Strip<'_> {
        Strip {
            surrogate_key: self.http.strip_surrogate_key,
            name: self
                .http
                .rules
                .own_cache_control
                .as_ref()
                .filter(|_| self.http.strip_own_cache_control),
        }
    }

    /// An answer of the layer's own for a call outside any flight: the
    /// `Cache-Status` it would have had, with `detail` in place of its own.
    pub(super) fn own_answer<B>(
        &self,
        code: StatusCode,
        status: &HeaderValue,
        detail: &str,
    ) -> Response<CacheBody<B>> {
        let text = status.to_str().unwrap_or("");
        let kept = text.split("; detail=").next().unwrap_or(text);
        let mut response = Response::new(CacheBody::empty());
        *response.status_mut() = code;
        if code == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        let value = HeaderValue::from_maybe_shared(Bytes::from(format!("{kept}; detail={detail}")))
            .unwrap_or_else(|_| HeaderValue::from_static("herdguard"));
        response.headers_mut().insert(CACHE_STATUS, value);
        response
    }

    /// RFC 9111 §5.2.1.7: nothing stored may answer an only-if-cached request.
    pub(super) fn only_if_cached<B>(&self) -> Response<CacheBody<B>> {
        self.counters().record(Source::Bypass);
        let mut response = Response::new(CacheBody::empty());
        *response.status_mut() = StatusCode::GATEWAY_TIMEOUT;
        let status = self.status(format_args!("detail=only-if-cached"));
        response.headers_mut().insert(CACHE_STATUS, status);
        response
    }

    /// The answer when a shared computation failed and nothing can be served.
    pub(crate) fn error_response<B>(&self, error: &Error) -> Response<CacheBody<B>> {
        let (code, detail) = match error {
            Error::OriginTimeout => (StatusCode::GATEWAY_TIMEOUT, "origin-timeout"),
            Error::Overloaded => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            Error::OriginBusy => (StatusCode::SERVICE_UNAVAILABLE, "origin-busy"),
            Error::OriginDown { .. } => (StatusCode::SERVICE_UNAVAILABLE, "origin-down"),
            Error::Panicked => (StatusCode::BAD_GATEWAY, "origin-panic"),
            Error::Aborted => (StatusCode::BAD_GATEWAY, "origin-aborted"),
            _ => (StatusCode::BAD_GATEWAY, "origin-error"),
        };
        let mut response = Response::new(CacheBody::empty());
        *response.status_mut() = code;
        let status = self.status(format_args!("fwd=uri-miss; collapsed; detail={detail}"));
        response.headers_mut().insert(CACHE_STATUS, status);
        if let Some(after) = retry_after(error) {
            response.headers_mut().insert(header::RETRY_AFTER, after);
        }
        response
    }

    /// The layer's own `503` for a call outside any flight that the origin
    /// gate refused: the `Cache-Status` it would have had, with the reason
    /// as its detail, and when to try again.
    pub(crate) fn refusal_answer<B>(
        &self,
        error: &Error,
        status: &HeaderValue,
    ) -> Response<CacheBody<B>> {
        let detail = match error {
            Error::OriginDown { .. } => "origin-down",
            _ => "origin-busy",
        };
        let mut response = self.own_answer(StatusCode::SERVICE_UNAVAILABLE, status, detail);
        if let Some(after) = retry_after(error) {
            response.headers_mut().insert(header::RETRY_AFTER, after);
        }
        response
    }
}

/// `Retry-After` for a refusal of the origin gate: until the breaker's next
/// probe (whole seconds, at least 1), or 1 s for a full budget.
pub(super) fn retry_after(error: &Error) -> Option<HeaderValue> {
    let secs = match error {
        Error::OriginDown { retry_after } => {
            let whole = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            whole.max(1)
        }
        Error::OriginBusy => 1,
        _ => return None,
    };
    Some(HeaderValue::from(secs))
}
