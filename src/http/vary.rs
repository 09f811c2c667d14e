//! Vary: several variants of one URL, each under its own key.
//!
//! A variant's key is the base key (URL, Authorization present or not,
//! configured key headers) plus the request's values of the headers the
//! URL's responses vary on. Those names are learned from responses and kept
//! per base key here. A forgotten or outdated list costs a miss, never a wrong
//! answer: every stored variant still compares its own header values before
//! it is served.
//!
//! Varied values are compared in a normal form, so equivalent requests share
//! one variant (see [`normal_form`]): `Accept-Encoding` falls into one of
//! four buckets (`br, gzip`, `br`, `gzip`, `identity`), and the request the
//! cache sends to fill an entry carries that bucket, so whoever shares the
//! variant accepts what is stored.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{header, HeaderMap, HeaderName, HeaderValue};
use moka::sync::Cache as MokaCache;

use crate::key::{CacheKey, KeyHasher};

/// Header names each base key varies on.
#[derive(Debug, Clone)]
pub(crate) struct VaryIndex {
    // Bounded by count and idle time: a lost list only costs one miss.
    names: MokaCache<CacheKey, Arc<[HeaderName]>>,
    /// Whether any response has varied yet: until one does, a hit skips the
    /// lookup (most APIs never vary, and the hit path is counted in ns).
    any: Arc<AtomicBool>,
}

impl VaryIndex {
    pub(crate) fn new(max_urls: u64) -> Self {
        Self {
            names: MokaCache::builder()
                .max_capacity(max_urls)
                .time_to_idle(Duration::from_secs(24 * 3600))
                .build(),
            any: Arc::new(AtomicBool::new(false)),
        }
    }

    /// URLs held, after pending evictions run.
    pub(crate) fn len(&self) -> u64 {
        self.names.run_pending_tasks();
        self.names.entry_count()
    }

    pub(crate) fn names(&self, base: &CacheKey) -> Option<Arc<[HeaderName]>> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.names.get(base)
    }

    /// Remember what the latest response for `base` varies on.
    pub(crate) fn learn(&self, base: CacheKey, names: &[HeaderName]) {
        if names.is_empty() {
            // Until a response varies, no list is kept that could be
            // outdated: every hit learns its entry's names, and one that
            // does not vary then looks nothing up.
            if self.any.load(Ordering::Acquire) && self.names.contains_key(&base) {
                self.names.invalidate(&base);
            }
            return;
        }
        if self.names.get(&base).as_deref() != Some(names) {
            self.names.insert(base, Arc::from(names));
            self.any.store(true, Ordering::Release);
        }
    }
}

/// The request's values of a varied header as a stored entry keeps them:
/// the normal form, as one value (none when absent). Credentials are kept
/// as a digest: the secret itself never reaches Redis.
pub(crate) fn stored_values(name: &HeaderName, request: &HeaderMap) -> Vec<HeaderValue> {
    if name == header::AUTHORIZATION {
        return request
            .get_all(name)
            .iter()
            .map(|v| stored_value(name, v))
            .collect();
    }
    normal_form(name, request)
        .and_then(|v| HeaderValue::from_bytes(&v).ok())
        .into_iter()
        .collect()
}

/// Whether `request` has the values `stored` keeps for `name`.
pub(crate) fn values_match(name: &HeaderName, request: &HeaderMap, stored: &[HeaderValue]) -> bool {
    if name != header::AUTHORIZATION {
        return match (normal_form(name, request), stored) {
            (None, []) => true,
            (Some(v), [one]) => *v == *one.as_bytes(),
            _ => false,
        };
    }
    let mut theirs = request.get_all(name).iter();
    let mut ours = stored.iter();
    loop {
        match (theirs.next(), ours.next()) {
            (None, None) => return true,
            (Some(t), Some(o)) if stored_value(name, t) == o => {}
            _ => return false,
        }
    }
}

fn stored_value(name: &HeaderName, value: &HeaderValue) -> HeaderValue {
    if name != header::AUTHORIZATION {
        return value.clone();
    }
    let digest = KeyHasher::new()
        .part(b"credentials")
        .part(value.as_bytes())
        .finish();
    // Hex digits are always a valid header value.
    HeaderValue::from_str(&digest.to_hex()).unwrap_or_else(|_| HeaderValue::from_static("-"))
}

/// The header the cache sends to fill an entry: `Accept-Encoding` becomes
/// its bucket, which offers every coding all requests of the variant
/// accept (`br, gzip` for browsers: a gzip-only origin still compresses)
/// and none that any of them refused.
pub(crate) fn normalise_fill_request(headers: &mut HeaderMap) {
    if headers.contains_key(header::ACCEPT_ENCODING) {
        let bucket = encoding_bucket(headers);
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static(bucket));
    }
}

/// A varied header's values in normal form; `None` when the request has none.
///
/// - `Accept-Encoding`: its bucket, the acceptable ones of `br` and `gzip`
///   (`x-gzip` counts as gzip): `br, gzip`, `br`, `gzip` or `identity`.
/// - `Accept`, `Accept-Charset`, `Accept-Language`: elements lowercased
///   (outside quoted strings), whitespace around `,` and `;` removed, and
///   sorted by q-value, then by text: the order of equally preferred
///   elements says nothing.
/// - `Cookie`: pairs joined with `; `, whitespace around them removed,
///   order and case kept.
/// - Any other field: field lines combined, whitespace around commas
///   removed, empty elements dropped; case and order kept.
pub(crate) fn normal_form<'a>(name: &HeaderName, request: &'a HeaderMap) -> Option<Cow<'a, [u8]>> {
    let mut lines = request.get_all(name).iter();
    let first = lines.next()?;
    if *name == header::ACCEPT_ENCODING {
        return Some(Cow::Borrowed(encoding_bucket(request).as_bytes()));
    }
    let single = lines.next().is_none();
    if *name == header::COOKIE {
        let pairs: Vec<&[u8]> = request
            .get_all(name)
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b';'))
            .map(<[u8]>::trim_ascii)
            .filter(|p| !p.is_empty())
            .collect();
        return Some(Cow::Owned(pairs.join(&b"; "[..])));
    }
    let negotiated = *name == header::ACCEPT
        || *name == header::ACCEPT_LANGUAGE
        || *name == header::ACCEPT_CHARSET;
    // The common case costs nothing: one plain value with nothing to normalise.
    if single
        && !negotiated
        && !first
            .as_bytes()
            .iter()
            .any(|b| matches!(b, b',' | b' ' | b'\t' | b'"'))
    {
        return Some(Cow::Borrowed(first.as_bytes()));
    }
    let mut elements: Vec<Vec<u8>> = Vec::new();
    for line in request.get_all(name) {
        for element in split_outside_quotes(line.as_bytes(), b',') {
            let element = element.trim_ascii();
            if element.is_empty() {
                continue;
            }
            if !negotiated {
                elements.push(element.to_vec());
                continue;
            }
            let pieces: Vec<Vec<u8>> = split_outside_quotes(element, b';')
                .map(|p| lowercase_outside_quotes(p.trim_ascii()))
                .collect();
            elements.push(pieces.join(&b';'));
        }
    }
    if negotiated {
        // Higher q first; equal q in text order.
        elements.sort_by(|a, b| q_millis(b).cmp(&q_millis(a)).then_with(|| a.cmp(b)));
    }
    Some(Cow::Owned(elements.join(&b", "[..])))
}

/// The bucket of a request's Accept-Encoding: which of `br` and `gzip` it
/// accepts (q > 0, named or by `*`). Everyone in a bucket accepts every
/// coding its name lists, and the fill request offers exactly those, so a
/// gzip-only origin still compresses for a browser and nobody is sent a
/// coding they refused. Other codings (zstd, deflate) are not offered: not
/// every browser accepts them, and a bucket per combination would split
/// the variants of one URL for no gain over these two.
fn encoding_bucket(request: &HeaderMap) -> &'static str {
    let (mut br, mut gzip, mut star) = (None, None, None);
    for line in request.get_all(header::ACCEPT_ENCODING) {
        for element in split_outside_quotes(line.as_bytes(), b',') {
            let element = element.trim_ascii();
            let coding = split_outside_quotes(element, b';')
                .next()
                .unwrap_or_default()
                .trim_ascii();
            let q = q_millis(element);
            if coding.eq_ignore_ascii_case(b"br") {
                br = Some(q);
            } else if coding.eq_ignore_ascii_case(b"gzip") || coding.eq_ignore_ascii_case(b"x-gzip")
            {
                gzip = Some(gzip.map_or(q, |g: u16| g.max(q)));
            } else if coding == b"*" {
                star = Some(q);
            }
        }
    }
    // A coding not named is acceptable as `*` says.
    let br = br.or(star).unwrap_or(0) > 0;
    let gzip = gzip.or(star).unwrap_or(0) > 0;
    match (br, gzip) {
        (true, true) => "br, gzip",
        (true, false) => "br",
        (false, true) => "gzip",
        (false, false) => "identity",
    }
}

/// An element's q-value in thousandths (1000 when absent; 0 when invalid,
/// the safe reading: not acceptable).
fn q_millis(element: &[u8]) -> u16 {
    for param in split_outside_quotes(element, b';').skip(1) {
        let param = param.trim_ascii();
        let Some(value) = param
            .strip_prefix(b"q=")
            .or_else(|| param.strip_prefix(b"Q="))
        else {
            continue;
        };
        let text = std::str::from_utf8(value).unwrap_or("");
        return match text.parse::<f64>() {
            Ok(q) if (0.0..=1.0).contains(&q) => (q * 1000.0).round() as u16,
            _ => 0,
        };
    }
    1000
}

/// `bytes` split at `sep`, but never inside a quoted string.
fn split_outside_quotes(bytes: &[u8], sep: u8) -> impl Iterator<Item = &[u8]> {
    let mut quoted = false;
    let mut escaped = false;
    bytes.split(move |&b| {
        if escaped {
            escaped = false;
            return false;
        }
        match b {
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            _ => {}
        }
        b == sep && !quoted
    })
}

fn lowercase_outside_quotes(bytes: &[u8]) -> Vec<u8> {
    let mut quoted = false;
    bytes
        .iter()
        .map(|&b| {
            if b == b'"' {
                quoted = !quoted;
            }
            if quoted {
                b
            } else {
                b.to_ascii_lowercase()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(name: &str, lines: &[&str]) -> Option<String> {
        let mut h = HeaderMap::new();
        let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
        for l in lines {
            h.append(name.clone(), HeaderValue::from_str(l).unwrap());
        }
        normal_form(&name, &h).map(|v| String::from_utf8(v.into_owned()).unwrap())
    }

    /// Accept-Encoding strings fall into four buckets by which of br and gzip they accept, honouring q=0.
    #[test]
    fn accept_encoding_buckets() {
        let ae = |v: &str| form("accept-encoding", &[v]).unwrap();
        assert_eq!(ae("gzip, deflate, br, zstd"), "br, gzip");
        assert_eq!(ae("gzip, deflate, br"), "br, gzip");
        assert_eq!(ae("br;q=1.0, gzip;q=0.8, *;q=0.1"), "br, gzip");
        assert_eq!(ae("br;q=0.2, gzip;q=0.9"), "br, gzip");
        assert_eq!(ae("*"), "br, gzip");
        assert_eq!(ae("br"), "br");
        assert_eq!(ae("br, gzip;q=0"), "br");
        assert_eq!(ae("gzip, deflate"), "gzip");
        assert_eq!(ae("GZIP"), "gzip");
        assert_eq!(ae("x-gzip"), "gzip");
        assert_eq!(ae("br;q=0, gzip"), "gzip");
        assert_eq!(ae("*, br;q=0"), "gzip");
        assert_eq!(ae("br;q=0"), "identity");
        assert_eq!(ae("gzip;q=0, *;q=0"), "identity");
        assert_eq!(ae("deflate"), "identity");
        assert_eq!(ae("zstd, deflate"), "identity");
        assert_eq!(ae(""), "identity");
        assert_eq!(ae("br;q=nonsense"), "identity");
        assert_eq!(form("accept-encoding", &[]), None);
        // The fill request carries the bucket, and it is its own bucket.
        for bucket in ["br, gzip", "br", "gzip", "identity"] {
            assert_eq!(ae(bucket), bucket);
        }
    }

    /// Whitespace, repeated lines, case and the order of equal preferences do not split variants.
    #[test]
    fn equivalent_values_share_a_form() {
        assert_eq!(form("foo", &["1,2"]), form("foo", &[" 1, 2 "]));
        assert_eq!(form("foo", &["1, 2"]), form("foo", &["1", "2"]));
        assert_ne!(
            form("foo", &["1, 2"]),
            form("foo", &["2, 1"]),
            "order of unknown fields kept"
        );
        assert_ne!(
            form("foo", &["A"]),
            form("foo", &["a"]),
            "case of unknown fields kept"
        );
        assert_eq!(form("foo", &["\"a, b\""]).unwrap(), "\"a, b\"");
        assert_eq!(
            form("accept-language", &["en, de"]),
            form("accept-language", &["DE ,EN"])
        );
        assert_ne!(
            form("accept-language", &["en, de;q=0.5"]),
            form("accept-language", &["de, en;q=0.5"]),
            "different preferences stay apart"
        );
        assert_eq!(
            form("accept", &["text/html;q=0.9, application/json"]),
            form("accept", &["Application/JSON", "text/html ; q=0.9"])
        );
        assert_eq!(
            form("cookie", &["a=1;b=2"]),
            form("cookie", &["a=1", "b=2"])
        );
        assert_ne!(form("cookie", &["a=1; b=2"]), form("cookie", &["b=2; a=1"]));
        assert_ne!(
            form("foo", &[""]),
            form("foo", &[]),
            "present but empty is not absent"
        );
    }

    /// Credentials are stored as a digest that still tells them apart.
    #[test]
    fn credentials_are_stored_as_a_digest() {
        let mut alice = HeaderMap::new();
        alice.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer alice"),
        );
        let mut bob = HeaderMap::new();
        bob.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer bob"),
        );
        let stored = stored_values(&header::AUTHORIZATION, &alice);
        assert_ne!(stored[0].as_bytes(), b"Bearer alice");
        assert!(values_match(&header::AUTHORIZATION, &alice, &stored));
        assert!(!values_match(&header::AUTHORIZATION, &bob, &stored));
        assert!(!values_match(
            &header::AUTHORIZATION,
            &HeaderMap::new(),
            &stored
        ));
    }
}
