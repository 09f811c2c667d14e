//! Requests whose meaning the key cannot hold: a Host the key would read
//! differently from the origin (userinfo, bad grammar, none at all, two of
//! them, or one that disagrees with the target), and the headers that make
//! an application act on another method or URL than the one keyed. Such a
//! GET or HEAD bypasses the cache: never stored, never served from it, never
//! coalesced (docs/operations.md, "Hostile requests").

use std::net::Ipv6Addr;

use http::header::{self, HeaderMap};
use http::{Uri, Version};

/// Why a GET or HEAD bypasses the cache although its directives allow it;
/// the reason becomes `Cache-Status: fwd=request; detail=…`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unkeyed {
    /// RFC 9112 §3.2 / RFC 9113 §8.3.1: userinfo, bad grammar, an empty or
    /// missing host, two Host lines, or a Host other than the target's.
    BadHost,
    /// X-HTTP-Method-Override, X-HTTP-Method, X-Method-Override.
    MethodOverride,
    /// X-Original-URL, X-Rewrite-URL.
    UrlOverride,
}

impl Unkeyed {
    pub(crate) fn detail(self) -> &'static str {
        match self {
            Unkeyed::BadHost => "bad-host",
            Unkeyed::MethodOverride => "method-override",
            Unkeyed::UrlOverride => "url-override",
        }
    }
}

/// What the cache does with a request's host and override headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestForm {
    /// Keyed as it is.
    Keyed,
    /// A valid host with capitals: the key lowercases hosts, so the request
    /// is handed on with its host lowercased too, and both see one string.
    UppercaseHost,
    /// Bypass the cache.
    Unkeyed(Unkeyed),
}

/// The form of a GET or HEAD, from its target (`uri`: the effective one),
/// version, headers and the override header its scan found
/// (`RequestScan::overridden`).
pub(crate) fn request_form(
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
    overridden: Option<Unkeyed>,
) -> RequestForm {
    if let Some(why) = overridden {
        return RequestForm::Unkeyed(why);
    }
    match host_form(version, uri, headers) {
        None => RequestForm::Unkeyed(Unkeyed::BadHost),
        Some(true) => RequestForm::UppercaseHost,
        Some(false) => RequestForm::Keyed,
    }
}

/// Whether the host a request names is one the cache can key (RFC 9112
/// §3.2, RFC 9113 §8.3.1): exactly one `Host` (or only the h2 `:authority` /
/// absolute-form target), agreeing with the target when both are sent, no
/// userinfo, host and port inside the grammar; an HTTP/1.0 request may name
/// none. A GET or HEAD that fails this bypasses the cache
/// (`detail=bad-host`); a proxy in front can answer such a request 400, as
/// `herdguard proxy` does, and so refuse exactly what the layer would not key.
///
/// ```
/// use http::{HeaderMap, HeaderValue, Uri, Version};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("host", HeaderValue::from_static("api.example"));
/// let uri = Uri::from_static("/users/7");
/// assert!(herdguard::service::host_is_valid(Version::HTTP_11, &uri, &headers));
///
/// headers.insert("host", HeaderValue::from_static("evil@api.example"));
/// assert!(!herdguard::service::host_is_valid(Version::HTTP_11, &uri, &headers));
/// assert!(!herdguard::service::host_is_valid(Version::HTTP_11, &uri, &HeaderMap::new()));
/// ```
pub fn host_is_valid(version: Version, uri: &Uri, headers: &HeaderMap) -> bool {
    host_form(version, uri, headers).is_some()
}

/// Whether the host a request names is valid (RFC 9112 §3.2, RFC 9113
/// §8.3.1): `None` when not, else whether it has capitals.
pub(crate) fn host_form(version: Version, uri: &Uri, headers: &HeaderMap) -> Option<bool> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let host = hosts.next().map(http::HeaderValue::as_bytes);
    if hosts.next().is_some() {
        return None;
    }
    let (named, also) = match (uri.authority(), host) {
        // h2 :authority or an absolute-form target: Host, when sent, must
        // name the same host (the application may read either).
        (Some(a), Some(h)) if !a.as_str().as_bytes().eq_ignore_ascii_case(h) => return None,
        (Some(a), h) => (a.as_str().as_bytes(), h),
        (None, Some(h)) => (h, None),
        // Only HTTP/1.0 may name no host at all.
        (None, None) if version <= Version::HTTP_10 => return Some(false),
        (None, None) => return None,
    };
    let upper = host_grammar(named)?;
    // Capitals in a Host beside the target's authority count too.
    Some(upper || also.is_some_and(|h| h.iter().any(u8::is_ascii_uppercase)))
}

/// Whether a header name (lowercase, as `HeaderName::as_str` gives it) is a
/// method or URL override.
pub(crate) fn override_named(name: &str) -> Option<Unkeyed> {
    match name {
        "x-http-method-override" | "x-http-method" | "x-method-override" => {
            Some(Unkeyed::MethodOverride)
        }
        "x-original-url" | "x-rewrite-url" => Some(Unkeyed::UrlOverride),
        _ => None,
    }
}

/// `Host = uri-host [ ":" port ]` (RFC 9110 §7.2, RFC 3986 §3.2.2–3) with a
/// non-empty host (RFC 9110 §4.2.1). `None` when invalid, else whether it
/// has capitals. IPvFuture literals are refused: nothing sends them.
fn host_grammar(authority: &[u8]) -> Option<bool> {
    let (host, port) = match authority.strip_prefix(b"[") {
        Some(rest) => {
            let end = rest.iter().position(|&b| b == b']')?;
            let literal = std::str::from_utf8(&rest[..end]).ok()?;
            literal.parse::<Ipv6Addr>().ok()?;
            let port = match &rest[end + 1..] {
                [] => None,
                [b':', port @ ..] => Some(port),
                _ => return None,
            };
            (&rest[..end], port)
        }
        None => match authority.iter().rposition(|&b| b == b':') {
            Some(colon) => (&authority[..colon], Some(&authority[colon + 1..])),
            None => (authority, None),
        },
    };
    if host.is_empty() || !port.unwrap_or_default().iter().all(u8::is_ascii_digit) {
        return None;
    }
    // Most hosts are plain names: one pass of table lookups decides them;
    // a `%` or `:` takes the byte-by-byte walk below.
    let seen = host
        .iter()
        .fold(0u8, |seen, &b| seen | HOST_BYTE[usize::from(b)]);
    if seen & BAD != 0 {
        return None;
    }
    if seen & (PERCENT | COLON) == 0 {
        return Some(seen & UPPER != 0);
    }
    let mut upper = false;
    let mut i = 0;
    while i < host.len() {
        match host[i] {
            b'%' => {
                let hex = host.get(i + 1..i + 3)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                i += 2;
            }
            b'A'..=b'Z' => upper = true,
            b if b.is_ascii_alphanumeric() => {}
            // unreserved and sub-delims; `:` only inside an IPv6 literal
            b'-' | b'.' | b'_' | b'~' | b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+'
            | b',' | b';' | b'=' => {}
            b':' if authority.first() == Some(&b'[') => {}
            _ => return None,
        }
        i += 1;
    }
    Some(upper)
}

/// [`HOST_BYTE`]'s classes, as bits so one pass can OR them together.
const UPPER: u8 = 1;
const PERCENT: u8 = 2;
const COLON: u8 = 4;
const BAD: u8 = 8;

/// The class of every byte in a host (RFC 3986 §3.2.2 reg-name and IP
/// literals): 0 for letters, digits, unreserved and sub-delims, else the
/// bits above; `%` and `:` need the context [`host_grammar`] walks for.
static HOST_BYTE: [u8; 256] = {
    let mut t = [BAD; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = match c {
            b'A'..=b'Z' => UPPER,
            b'a'..=b'z' | b'0'..=b'9' => 0,
            b'-' | b'.' | b'_' | b'~' | b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+'
            | b',' | b';' | b'=' => 0,
            b'%' => PERCENT,
            b':' => COLON,
            _ => BAD,
        };
        b += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn form(version: Version, uri: &str, hosts: &[&str], extra: &[(&str, &str)]) -> RequestForm {
        let mut h = HeaderMap::new();
        for v in hosts {
            h.append(header::HOST, HeaderValue::from_str(v).unwrap());
        }
        for (k, v) in extra {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let overridden = crate::http::policy::RequestScan::of(&h).overridden;
        request_form(version, &uri.parse().unwrap(), &h, overridden)
    }

    /// RFC 9110 §7.2 hosts are keyed; userinfo, spaces, paths, bad ports and empty hosts are not.
    #[test]
    fn host_forms() {
        let h11 = |host: &str| form(Version::HTTP_11, "/x", &[host], &[]);
        let bad = RequestForm::Unkeyed(Unkeyed::BadHost);
        for ok in [
            "app.test",
            "app.test:8080",
            "app.test:",
            "127.0.0.1",
            "[::1]:3000",
            "[2001:db8::1]",
            "xn--bcher-kva.test",
            "a%41b.test",
        ] {
            assert_eq!(h11(ok), RequestForm::Keyed, "{ok}");
        }
        assert_eq!(h11("App.Test"), RequestForm::UppercaseHost);
        for no in [
            "evil.example@app.test",
            "app test",
            "app.test/evil",
            "app.test:abc",
            "",
            ":80",
            "[::1",
            "[nope]:1",
            "[::1]x",
            "a:b:c",
            "a%4",
            "a%zz.test",
            "app.test\t",
        ] {
            assert_eq!(h11(no), bad, "{no:?}");
        }
        assert_eq!(
            form(Version::HTTP_11, "/x", &[], &[]),
            bad,
            "missing on 1.1"
        );
        assert_eq!(form(Version::HTTP_2, "/x", &[], &[]), bad, "missing on h2");
        assert_eq!(form(Version::HTTP_10, "/x", &[], &[]), RequestForm::Keyed);
        assert_eq!(
            form(Version::HTTP_11, "/x", &["a.test", "a.test"], &[]),
            bad
        );
    }

    /// A target authority (h2 :authority, absolute form) is checked the same way and must agree with Host.
    #[test]
    fn target_authority() {
        let h2 = |uri: &str, hosts: &[&str]| form(Version::HTTP_2, uri, hosts, &[]);
        let bad = RequestForm::Unkeyed(Unkeyed::BadHost);
        assert_eq!(h2("http://app.test/x", &[]), RequestForm::Keyed);
        assert_eq!(
            h2("http://app.test/x", &["APP.test"]),
            RequestForm::UppercaseHost
        );
        assert_eq!(h2("http://app.test/x", &["app.test"]), RequestForm::Keyed);
        assert_eq!(h2("http://evil@app.test/x", &[]), bad);
        assert_eq!(h2("http://app.test/x", &["other.test"]), bad);
        assert_eq!(h2("http://App.test/x", &[]), RequestForm::UppercaseHost);
    }

    /// Method and URL override headers bypass, in any case; other x- headers do not.
    #[test]
    fn overrides() {
        let with = |k: &str| form(Version::HTTP_11, "/x", &["a.test"], &[(k, "DELETE")]);
        for k in [
            "X-HTTP-Method-Override",
            "x-http-method",
            "X-Method-Override",
        ] {
            assert_eq!(
                with(k),
                RequestForm::Unkeyed(Unkeyed::MethodOverride),
                "{k}"
            );
        }
        for k in ["X-Original-URL", "x-rewrite-url"] {
            assert_eq!(with(k), RequestForm::Unkeyed(Unkeyed::UrlOverride), "{k}");
        }
        assert_eq!(with("x-request-id"), RequestForm::Keyed);
    }
}
