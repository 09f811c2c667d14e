//! Forwarded (RFC 7239), X-Forwarded-For / -Proto, and which peers may set
//! them. Header rules only: imports nothing else of the proxy.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use http::header::{HeaderMap, HeaderValue};

/// What the server knows about the connection a request came on; put in the
/// request's extensions (the cache copies them onto the requests it builds).
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub addr: SocketAddr,
    pub tls: bool,
}

/// Append to a comma-separated list header (Via, X-Forwarded-For).
pub fn append_list(headers: &mut HeaderMap, name: &'static str, item: &str) {
    let value = match headers.get(name).and_then(|v| v.to_str().ok()) {
        Some(existing) if !existing.is_empty() => {
            HeaderValue::from_str(&format!("{existing}, {item}"))
        }
        _ => HeaderValue::from_str(item),
    };
    if let Ok(v) = value {
        headers.insert(name, v);
    }
}

/// An address range, `10.0.0.0/8`, `::1/128`, or one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr(ipnet::IpNet);

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            // A v4 client on a dual-stack socket shows up as ::ffff:a.b.c.d.
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.0.contains(&ip)
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let bad = || format!("{s:?} is not an address or CIDR range (10.0.0.0/8, ::1)");
        if s.contains('/') {
            s.parse().map(Self).map_err(|_| bad())
        } else {
            s.parse::<IpAddr>()
                .map(|a| Self(a.into()))
                .map_err(|_| bad())
        }
    }
}

/// Forwarding headers this proxy never sets: an application may build
/// links or routes from them, and the cache key does not hold them.
const NOT_OURS: [&str; 5] = [
    "x-host",
    "front-end-https",
    "x-original-url",
    "x-rewrite-url",
    "forwarded",
];

/// Whether `peer` may tell the upstream about the hops before it.
pub fn is_trusted(peer: Option<Peer>, trusted: &[Cidr]) -> bool {
    peer.is_some_and(|p| trusted.iter().any(|c| c.contains(p.addr.ip())))
}

/// Drop what a client outside `trusted_proxies` says about forwarding,
/// before the cache keys the request: `Forwarded` (replaced by ours later),
/// every `X-Forwarded-*` but -For and -Proto (replaced too), `X-Host`,
/// `Front-End-Https`, `X-Original-URL`, `X-Rewrite-URL`.
pub fn strip_untrusted(headers: &mut HeaderMap) {
    let theirs: Vec<http::HeaderName> = headers
        .keys()
        .filter(|n| not_ours(n.as_str()))
        .cloned()
        .collect();
    for name in theirs {
        headers.remove(name);
    }
}

/// Whether [`strip_untrusted`] removes the header `name` (lowercase).
pub fn not_ours(name: &str) -> bool {
    NOT_OURS.contains(&name)
        || name
            .strip_prefix("x-forwarded-")
            .is_some_and(|rest| rest != "for" && rest != "proto")
}

/// A name, not a string: a `&str` key is parsed on every use.
const X_FORWARDED_PROTO: http::HeaderName = http::HeaderName::from_static("x-forwarded-proto");

/// Settle `X-Forwarded-Proto` before the cache keys the request (the proxy
/// keys on it: an origin that redirects plain HTTP to HTTPS must not have
/// that redirect served to HTTPS clients). A trusted peer's first value
/// when it is `http` or `https`, else `own`, this connection's scheme; no
/// connection (a test calling the service, `own` None): none.
pub fn settle_proto(headers: &mut HeaderMap, own: Option<&'static str>, trusted: bool) {
    let Some(own) = own else {
        headers.remove(&X_FORWARDED_PROTO);
        return;
    };
    let theirs = trusted
        .then(|| headers.get(&X_FORWARDED_PROTO))
        .flatten()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(str::trim);
    let scheme = match theirs {
        Some(t) if t.eq_ignore_ascii_case("https") => "https",
        Some(t) if t.eq_ignore_ascii_case("http") => "http",
        _ => own,
    };
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(scheme));
}

/// This connection's scheme, as `X-Forwarded-Proto` says it.
pub fn scheme(peer: Peer) -> &'static str {
    if peer.tls {
        "https"
    } else {
        "http"
    }
}

/// Set Forwarded and X-Forwarded-For on an upstream request (-Proto was
/// settled before the cache keyed it: [`settle_proto`]). A trusted peer's
/// chains are extended; anyone else's are replaced, so a client cannot
/// claim an address, a scheme or a host it does not have. `host` is the one
/// the cache keyed.
pub fn apply(
    headers: &mut HeaderMap,
    peer: Option<Peer>,
    trusted: &[Cidr],
    host: Option<&HeaderValue>,
) {
    let Some(peer) = peer else {
        // Not from a connection we accepted (a test calling the service):
        // say nothing rather than something false.
        headers.remove("x-forwarded-for");
        headers.remove("forwarded");
        return;
    };
    let ip = peer.addr.ip();
    let element = forwarded_element(ip, scheme(peer), host);
    if is_trusted(Some(peer), trusted) {
        append_list(headers, "x-forwarded-for", &ip.to_string());
        append_list(headers, "forwarded", &element);
    } else {
        if let Ok(v) = HeaderValue::from_str(&ip.to_string()) {
            headers.insert("x-forwarded-for", v);
        }
        if let Ok(v) = HeaderValue::from_str(&element) {
            headers.insert("forwarded", v);
        }
    }
}

/// One RFC 7239 element for this hop: `for=…;proto=…;host="…"`.
fn forwarded_element(ip: IpAddr, scheme: &str, host: Option<&HeaderValue>) -> String {
    let mut element = match ip {
        IpAddr::V4(v4) => format!("for={v4};proto={scheme}"),
        IpAddr::V6(v6) => format!("for=\"[{v6}]\";proto={scheme}"),
    };
    // The host passed the Host grammar: no quote or backslash to escape.
    if let Some(host) = host.and_then(|h| h.to_str().ok()) {
        element.push_str(&format!(";host=\"{host}\""));
    }
    element
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forwarded elements quote IPv6 and the host, as RFC 7239 §4 requires.
    #[test]
    fn forwarded_elements() {
        let host = HeaderValue::from_static("app.test:8080");
        assert_eq!(
            forwarded_element("192.0.2.1".parse().unwrap(), "http", Some(&host)),
            "for=192.0.2.1;proto=http;host=\"app.test:8080\""
        );
        assert_eq!(
            forwarded_element("::1".parse().unwrap(), "https", None),
            "for=\"[::1]\";proto=https"
        );
    }

    /// Ranges match by prefix, in both families, and v4-mapped v6 as v4.
    #[test]
    fn cidr_matching() {
        let c: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(c.contains("10.1.200.3".parse().unwrap()));
        assert!(!c.contains("10.2.0.1".parse().unwrap()));
        assert!(c.contains("::ffff:10.1.0.9".parse().unwrap()));
        let c: Cidr = "10.0.0.0/9".parse().unwrap();
        assert!(c.contains("10.127.0.1".parse().unwrap()));
        assert!(!c.contains("10.128.0.1".parse().unwrap()));
        let c: Cidr = "::1".parse().unwrap();
        assert!(c.contains("::1".parse().unwrap()));
        assert!(!c.contains("127.0.0.1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
    }
}
