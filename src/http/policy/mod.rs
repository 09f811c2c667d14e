//! RFC 9111 decisions for a shared cache: may this request use the cache, may
//! this response be stored or shared, and for how long.

mod directives;
mod freshness;
mod not_stored;
mod request;
mod storability;
pub(crate) mod targeted;
mod unkeyed;

pub(crate) use freshness::{stale_if_error_allows, usability, StoredRules, Usable};
pub(crate) use not_stored::NotStored;
pub(crate) use request::{
    classify_request, classify_scanned, invalidates, Forward, RequestDirectives, RequestScan,
    RequestVerdict,
};
pub(crate) use storability::lacks_freshness;
pub(crate) use storability::{
    classify_response, request_specific, shared_across_credentials, vary_names, ResponseRules,
    ResponseVerdict,
};
pub use unkeyed::host_is_valid;
pub(crate) use unkeyed::{request_form, RequestForm, Unkeyed};

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use http::header::{HeaderMap, HeaderName};
    use http::{HeaderValue, StatusCode};

    use super::directives::{CacheControl, MAX_DELTA_SECS};
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn classify(pairs: &[(&str, &str)], auth: bool) -> ResponseVerdict {
        let now = SystemTime::now();
        classify_response(
            &ResponseRules::default(),
            auth,
            StatusCode::OK,
            &headers(pairs),
            now,
            now,
        )
    }

    /// s-maxage wins over max-age for a shared cache.
    #[test]
    fn s_maxage_wins() {
        let v = classify(&[("cache-control", "max-age=5, s-maxage=60")], false);
        assert!(
            matches!(v, ResponseVerdict::Store { fresh_for, .. } if fresh_for == Duration::from_secs(60))
        );
    }

    /// A duplicated max-age is treated as stale, not as the larger value.
    #[test]
    fn duplicate_max_age_is_zero() {
        let cc = CacheControl::parse(&headers(&[
            ("cache-control", "max-age=60"),
            ("cache-control", "max-age=5"),
        ]));
        assert_eq!(cc.max_age, Some(0));
    }

    /// The Age header shortens the freshness left.
    #[test]
    fn age_header_is_subtracted() {
        let v = classify(&[("cache-control", "max-age=60"), ("age", "50")], false);
        assert!(
            matches!(v, ResponseVerdict::Store { fresh_for, .. } if fresh_for == Duration::from_secs(10))
        );
    }

    /// must-revalidate removes the stale grace.
    #[test]
    fn must_revalidate_forbids_stale() {
        let v = classify(
            &[(
                "cache-control",
                "max-age=5, stale-while-revalidate=30, must-revalidate",
            )],
            false,
        );
        assert!(matches!(v, ResponseVerdict::Store { stale_for, .. } if stale_for.is_zero()));
    }

    /// Expires relative to Date gives the lifetime; an invalid Expires is already stale.
    #[test]
    fn expires_minus_date() {
        let date = SystemTime::now();
        let d = httpdate::fmt_http_date(date);
        let e = httpdate::fmt_http_date(date + Duration::from_secs(120));
        let v = classify(&[("date", &d), ("expires", &e)], false);
        assert!(
            matches!(v, ResponseVerdict::Store { fresh_for, .. } if fresh_for >= Duration::from_secs(119))
        );
        assert_eq!(classify(&[("expires", "0")], false), ResponseVerdict::Share);
    }

    /// Directive names are case-insensitive, and an overlong unknown name is ignored.
    #[test]
    fn directive_names_ignore_case() {
        let long = format!("{}=1, Max-Age=7", "x".repeat(100));
        let cc = CacheControl::parse(&headers(&[
            ("cache-control", "NO-STORE"),
            ("cache-control", &long),
        ]));
        assert!(cc.no_store);
        assert_eq!(cc.max_age, Some(7));
    }

    /// Huge max-age values saturate instead of overflowing.
    #[test]
    fn huge_max_age_saturates() {
        let cc = CacheControl::parse(&headers(&[(
            "cache-control",
            "max-age=99999999999999999999999",
        )]));
        assert_eq!(cc.max_age, Some(MAX_DELTA_SECS));
    }

    /// Vary with an invalid header name can never match.
    #[test]
    fn unreadable_vary_is_star() {
        assert_eq!(vary_names(&headers(&[("vary", "accept, bad name")])), None);
        assert_eq!(
            vary_names(&headers(&[("vary", "Accept, accept")]))
                .unwrap()
                .len(),
            1
        );
    }
}
