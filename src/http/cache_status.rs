//! The `Cache-Status` header (RFC 9211): its name and the wording of every
//! value the layer writes, `<cache name>; <params>`. Formatting only.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};

use crate::http::policy::Forward;
use crate::http::state::LayerState;

/// The RFC 9211 response header.
pub(crate) const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

impl LayerState {
    pub(crate) fn status(&self, params: std::fmt::Arguments<'_>) -> HeaderValue {
        use std::fmt::Write;
        let mut s = String::with_capacity(64);
        let _ = write!(s, "{}; {}", self.http.cache_name, params);
        // One allocation: the String's buffer becomes the header's bytes.
        // The cache name is validated as a token when the layer is built.
        HeaderValue::from_maybe_shared(Bytes::from(s))
            .unwrap_or_else(|_| HeaderValue::from_static("herdguard"))
    }

    pub(crate) fn status_fwd(&self, fwd: Forward, detail: Option<&str>) -> HeaderValue {
        match detail {
            Some(d) => self.status(format_args!("fwd={}; detail={d}", fwd.as_str())),
            None => self.status(format_args!("fwd={}", fwd.as_str())),
        }
    }
}
