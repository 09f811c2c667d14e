//! Make the request the cache sees the one the upstream gets, in one walk
//! over its headers: which of them need work (hop-by-hop fields, a client's
//! forwarding claims, the transfer coding, the hosts) is learnt first, and
//! most requests need none of the removals. Imports only `forwarded`.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::StatusCode;

use super::forwarded;

/// Headers that describe one connection, never forwarded (RFC 9110 §7.6.1).
/// Names, not strings: removing by `&str` parses the name on every request
/// (`parse_hdr` showed in the profile of a hit).
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// A refused request: its status and why.
pub type Refusal = (StatusCode, &'static str);

/// What the connection a request came on says about forwarding, worked out
/// once per connection (see `server::Session`).
#[derive(Debug, Clone, Copy)]
pub struct Hop {
    /// The peer is in `trusted_proxies`: its forwarding headers are kept.
    pub trusted: bool,
    /// This connection's own `X-Forwarded-Proto`; None for a request that
    /// came on no connection (a test calling the service).
    pub proto: Option<&'static str>,
}

/// What one walk over the headers found.
#[derive(Debug, Default)]
struct Scan {
    /// A hop-by-hop field, or a name from NOT_OURS / `X-Forwarded-*` of an
    /// untrusted peer: the full removal path runs.
    removals: bool,
    /// Which of [`HOP_BY_HOP`] are present, bit `i` for entry `i`.
    hop: u16,
    hosts: Hosts,
}

const CONNECTION_BIT: u16 = 1 << 0;
const TRANSFER_ENCODING_BIT: u16 = 1 << 7;

/// The `Host` fields a request has, once normalised.
#[derive(Debug, Default, Clone, Copy)]
pub struct Hosts {
    /// How many (2 stands for more).
    pub count: u8,
    /// The one there is passes [`plain_host`]: valid, lowercase.
    pub plain: bool,
}

/// Where `name` is in [`HOP_BY_HOP`] (a match: a length test for most
/// names).
fn hop_index(name: &str) -> Option<u16> {
    Some(match name {
        "connection" => 0,
        "keep-alive" => 1,
        "proxy-connection" => 2,
        "proxy-authenticate" => 3,
        "proxy-authorization" => 4,
        "te" => 5,
        "trailer" => 6,
        "transfer-encoding" => 7,
        "upgrade" => 8,
        _ => return None,
    })
}

/// Whether `name` needs the removal path: hop-by-hop (RFC 9110 §7.6.1, or
/// a name the Connection header may list: that needs Connection, also
/// hop-by-hop), or a forwarding header an untrusted peer may not set.
#[cfg(test)]
fn needs_removal(name: &HeaderName, trusted: bool) -> bool {
    hop_index(name.as_str()).is_some() || !trusted && forwarded::not_ours(name.as_str())
}

fn scan(headers: &HeaderMap, trusted: bool) -> Scan {
    let mut found = Scan::default();
    // Every field, a name once per value: no lookup by name.
    for (name, value) in headers {
        if name == header::HOST {
            found.hosts.count = found.hosts.count.saturating_add(1).min(2);
            found.hosts.plain = found.hosts.count == 1 && plain_host(value.as_bytes());
        } else if let Some(i) = hop_index(name.as_str()) {
            found.removals = true;
            found.hop |= 1 << i;
        } else if !trusted && forwarded::not_ours(name.as_str()) {
            found.removals = true;
        }
    }
    found
}

/// The hosts left once the Connection header's names are gone.
fn hosts_left(headers: &HeaderMap) -> Hosts {
    let mut hosts = headers.get_all(header::HOST).iter();
    let first = hosts.next();
    let count = match (first, hosts.next()) {
        (None, _) => 0,
        (Some(_), None) => 1,
        (Some(_), Some(_)) => 2,
    };
    Hosts {
        count,
        plain: count == 1 && first.is_some_and(|h| plain_host(h.as_bytes())),
    }
}

/// Hop-by-hop and Connection-named headers go (so they cannot select a Vary
/// variant the upstream never saw), then an untrusted client's forwarding
/// headers, and `X-Forwarded-Proto` is settled. A transfer coding other
/// than chunked is a 501 (RFC 9112 §6.1). Returns the `Host` fields left.
pub fn headers(parts: &mut Parts, hop: Hop) -> Result<Hosts, Refusal> {
    let found = scan(&parts.headers, hop.trusted);
    if !found.removals {
        // Nothing to remove, no Transfer-Encoding: only the proto to settle.
        forwarded::settle_proto(&mut parts.headers, hop.proto, hop.trusted);
        return Ok(found.hosts);
    }
    // The order of old: a Connection header may name any field, even one
    // set just before. Only the fields the walk saw are removed.
    let framing = if found.hop & TRANSFER_ENCODING_BIT != 0 {
        transfer_codings(&parts.headers)?;
        // Transfer-Encoding stays until the upstream request is built: it
        // tells the cache this GET carries a body (which then bypasses it).
        parts.headers.get(header::TRANSFER_ENCODING).cloned()
    } else {
        None
    };
    if !hop.trusted {
        forwarded::strip_untrusted(&mut parts.headers);
    }
    forwarded::settle_proto(&mut parts.headers, hop.proto, hop.trusted);
    if found.hop & CONNECTION_BIT != 0 {
        strip_connection_named(&mut parts.headers);
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if found.hop & (1 << i) != 0 {
            parts.headers.remove(name);
        }
    }
    if let Some(te) = framing {
        parts.headers.insert(header::TRANSFER_ENCODING, te);
    }
    if found.hop & CONNECTION_BIT != 0 {
        // `Connection: host` removes it.
        return Ok(hosts_left(&parts.headers));
    }
    Ok(found.hosts)
}

/// Only `chunked`, once, may frame a request body here: another coding is a
/// 501, never passed on re-labelled (RFC 9112 §6.1); `chunked` twice a 400.
fn transfer_codings(headers: &HeaderMap) -> Result<(), Refusal> {
    let mut chunked = 0;
    for value in headers.get_all(header::TRANSFER_ENCODING) {
        for coding in value.as_bytes().split(|&b| b == b',') {
            let coding = coding.trim_ascii();
            if coding.is_empty() {
                continue;
            }
            if !coding.eq_ignore_ascii_case(b"chunked") {
                let why = "transfer coding not implemented (only chunked)";
                return Err((StatusCode::NOT_IMPLEMENTED, why));
            }
            chunked += 1;
        }
    }
    if chunked > 1 {
        return Err((StatusCode::BAD_REQUEST, "chunked applied more than once"));
    }
    Ok(())
}

/// Remove the hop-by-hop fields and those the Connection header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(header::CONNECTION) {
        strip_connection_named(headers);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Remove the fields the Connection header names.
fn strip_connection_named(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
}

/// Whether `host` is a plain lowercase name or IPv4 address, with or
/// without a port: `[a-z0-9.-]+(:[0-9]*)?`. Every such host passes the
/// layer's grammar ([`herdguard::service::host_is_valid`]) and needs no lowercasing;
/// anything else goes through the full check.
pub fn plain_host(host: &[u8]) -> bool {
    let (name, port) = match host.iter().position(|&b| b == b':') {
        Some(colon) => (&host[..colon], &host[colon + 1..]),
        None => (host, &[][..]),
    };
    let plain = |b: &u8| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'-');
    !name.is_empty() && name.iter().all(plain) && port.iter().all(u8::is_ascii_digit)
}

/// A value for `Host`: `host` as it is when it has no capitals (no copy),
/// else lowercased.
pub fn lowercase_host(host: &str) -> Option<HeaderValue> {
    let value = if host.bytes().any(|b| b.is_ascii_uppercase()) {
        HeaderValue::from_str(&host.to_ascii_lowercase())
    } else {
        HeaderValue::from_str(host)
    };
    value.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast Host check takes plain lowercase names only, and every
    /// host it takes passes the layer's full grammar too.
    #[test]
    fn plain_hosts_are_valid_hosts() {
        let valid = |h: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_str(h).unwrap());
            herdguard::service::host_is_valid(
                http::Version::HTTP_11,
                &"/".parse().unwrap(),
                &headers,
            )
        };
        for host in [
            "app.test",
            "app.test:8080",
            "127.0.0.1:80",
            "a-b.c",
            "x:",
            "1",
        ] {
            assert!(plain_host(host.as_bytes()), "{host}");
            assert!(valid(host), "{host}");
        }
        for host in [
            "",
            ":80",
            "App.test",
            "evil@app.test",
            "a:b",
            "a:80:80",
            "[::1]",
            "a_b",
            "a%41",
            "a b",
            "a,b",
            "a;b",
            "a/b",
            "a\\b",
            "a\"b",
            "a'b",
        ] {
            assert!(!plain_host(host.as_bytes()), "{host}");
        }
    }

    /// On the removal path, hop-by-hop and Connection-named fields go, and
    /// the hosts are counted again: `Connection` may name `Host` itself.
    #[test]
    fn connection_named_fields_go_and_hosts_are_recounted() {
        let hop = Hop {
            trusted: false,
            proto: Some("http"),
        };
        for (named, hosts_left) in [("x-secret", 1), ("x-secret, host", 0)] {
            let mut parts = http::Request::new(()).into_parts().0;
            for (name, value) in [
                ("host", "app.test"),
                ("connection", named),
                ("keep-alive", "5"),
                ("te", "trailers"),
                ("x-secret", "1"),
            ] {
                parts.headers.append(name, HeaderValue::from_static(value));
            }
            let hosts = headers(&mut parts, hop).unwrap();
            assert_eq!(hosts.count, hosts_left, "{named}");
            assert_eq!(hosts.plain, hosts_left == 1, "{named}");
            let left: Vec<&str> = parts.headers.keys().map(HeaderName::as_str).collect();
            let want: &[&str] = if hosts_left == 1 {
                &["host", "x-forwarded-proto"]
            } else {
                &["x-forwarded-proto"]
            };
            assert_eq!(left, want, "{named}");
        }
    }

    /// The walk sends every hop-by-hop field, and an untrusted peer's
    /// forwarding claims, to the removal path; plain fields skip it.
    #[test]
    fn the_walk_finds_what_must_go() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert!(needs_removal(name, true), "{name}");
            assert_eq!(hop_index(name.as_str()), u16::try_from(i).ok(), "{name}");
        }
        for name in ["forwarded", "x-forwarded-host", "x-host", "x-rewrite-url"] {
            let name = HeaderName::from_static(name);
            assert!(needs_removal(&name, false), "{name}");
            assert!(!needs_removal(&name, true), "{name}");
        }
        for name in ["host", "accept", "x-forwarded-for", "x-forwarded-proto"] {
            let name = HeaderName::from_static(name);
            assert!(!needs_removal(&name, false), "{name}");
        }
    }
}
