//! The `Cache-Control` field parsed once into the directives a shared
//! cache acts on, with RFC 9111's rules for duplicates and bad values.
//! Parsing only: what the directives mean is decided elsewhere.

use http::header::{self, HeaderMap};

/// RFC 9111 §1.2.2: delta-seconds past 2^31 are treated as 2^31.
pub(super) const MAX_DELTA_SECS: u64 = 2_147_483_648;

/// Cache-Control directives we act on, from every Cache-Control field line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct CacheControl {
    pub(crate) no_store: bool,
    pub(crate) no_cache: bool,
    pub(crate) private: bool,
    pub(crate) public: bool,
    pub(crate) must_revalidate: bool,
    pub(crate) proxy_revalidate: bool,
    pub(crate) max_age: Option<u64>,
    pub(crate) s_maxage: Option<u64>,
    pub(crate) stale_while_revalidate: Option<u64>,
    pub(crate) stale_if_error: Option<u64>,
    pub(crate) only_if_cached: bool,
    pub(crate) must_understand: bool,
    /// `max-stale` without a value accepts any staleness (`u64::MAX`).
    pub(crate) max_stale: Option<u64>,
    pub(crate) min_fresh: Option<u64>,
}

impl CacheControl {
    pub(crate) fn parse(headers: &HeaderMap) -> Self {
        let mut cc = CacheControl::default();
        for line in headers.get_all(header::CACHE_CONTROL) {
            // Non-ASCII or non-UTF-8 bytes cannot form a directive we know.
            let Ok(line) = line.to_str() else { continue };
            for directive in line.split(',') {
                let directive = directive.trim();
                if directive.is_empty() {
                    continue;
                }
                // No whitespace around `=` (RFC 9110 §5.6.2): `max-age =60`
                // is an unknown directive and `max-age= 60` an invalid value.
                let (name, value) = match directive.split_once('=') {
                    Some((n, v)) => (n, Some(unquote(v))),
                    None => (directive, None),
                };
                let secs = || value.map(parse_delta);
                // Lowercased on the stack: every directive we know is short,
                // and a longer one is one we ignore.
                let mut buf = [0u8; 24];
                let lower = match buf.get_mut(..name.len()) {
                    Some(b) => {
                        b.copy_from_slice(name.as_bytes());
                        b.make_ascii_lowercase();
                        std::str::from_utf8(b).unwrap_or("")
                    }
                    None => "",
                };
                match lower {
                    "no-store" => cc.no_store = true,
                    // `no-cache="field"` restricts named fields; treating it as a
                    // plain no-cache is the conservative reading.
                    "no-cache" => cc.no_cache = true,
                    "private" => cc.private = true,
                    "public" => cc.public = true,
                    "must-revalidate" => cc.must_revalidate = true,
                    "proxy-revalidate" => cc.proxy_revalidate = true,
                    "only-if-cached" => cc.only_if_cached = true,
                    "must-understand" => cc.must_understand = true,
                    // A duplicate or invalid age is treated as 0 (stale), the
                    // safe reading of RFC 9111 §4.2.1.
                    "max-age" => cc.max_age = Some(merge(cc.max_age, secs())),
                    "s-maxage" => cc.s_maxage = Some(merge(cc.s_maxage, secs())),
                    "stale-while-revalidate" => {
                        cc.stale_while_revalidate = Some(merge(cc.stale_while_revalidate, secs()))
                    }
                    "stale-if-error" => cc.stale_if_error = Some(merge(cc.stale_if_error, secs())),
                    // A bare max-stale accepts any staleness; an invalid value
                    // accepts none (the safe reading).
                    "max-stale" => {
                        cc.max_stale = Some(match value {
                            None => u64::MAX,
                            Some(v) => parse_delta(v).unwrap_or(0),
                        })
                    }
                    // An invalid min-fresh asks for more than any entry has.
                    "min-fresh" => cc.min_fresh = Some(secs().flatten().unwrap_or(u64::MAX)),
                    _ => {}
                }
            }
        }
        cc
    }
}

/// A directive value without the quotes of a quoted-string (and only those:
/// `'60'` stays invalid).
pub(super) fn unquote(v: &str) -> &str {
    v.strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(v)
}

pub(super) fn merge(previous: Option<u64>, new: Option<Option<u64>>) -> u64 {
    match (previous, new) {
        (None, Some(Some(v))) => v,
        _ => 0,
    }
}

pub(super) fn parse_delta(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(
        s.parse::<u64>()
            .unwrap_or(MAX_DELTA_SECS)
            .min(MAX_DELTA_SECS),
    )
}
