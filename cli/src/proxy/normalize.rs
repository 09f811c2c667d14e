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
    hosts: Hosts,
}

/// The `Host` fields a request has, once normalised.
#[derive(Debug, Default, Clone, Copy)]
pub struct Hosts {
    /// How many (2 stands for more).
    pub count: u8,
    /// The one there is passes [`plain_host`]: valid, lowercase.
    pub plain: bool,
}

/// Whether `name` needs the removal path: hop-by-hop (RFC 9110 §7.6.1, or
/// a name the Connection header may list: that needs Connection, also
/// hop-by-hop), or a forwarding header an untrusted peer may not set.
fn needs_removal(name: &HeaderName, trusted: bool) -> bool {
    // HOP_BY_HOP's names; a match is a length test for most names.
    match name.as_str() {
        "connection"
        | "keep-alive"
        | "proxy-connection"
        | "proxy-authenticate"
        | "proxy-authorization"
        | "te"
        | "trailer"
        | "transfer-encoding"
        | "upgrade" => true,
        name => !trusted && forwarded::not_ours(name),
    }
}

fn scan(headers: &HeaderMap, trusted: bool) -> Scan {
    let mut found = Scan::default();
    // Every field, a name once per value: no lookup by name.
    for (name, value) in headers {
        if name == header::HOST {
            found.hosts.count = found.hosts.count.saturating_add(1).min(2);
            found.hosts.plain = found.hosts.count == 1 && plain_host(value.as_bytes());
        } else if needs_removal(name, trusted) {
            found.removals = true;
        }
    }
    found
}

/// Hop-by-hop and Connection-named headers go (so they cannot select a Vary
/// variant the upstream never saw), then an untrusted client's forwarding
/// headers, and `X-Forwarded-Proto` is settled. A transfer coding other
/// than chunked is a 501 (RFC 9112 §6.1). Returns the `Host` fields left.
pub fn headers(parts: &mut Parts, hop: Hop) -> Result<Hosts, Refusal> {
    let found = scan(&parts.headers, hop.trusted);
    if found.removals {
        // The order of old: a Connection header may name any field, even
        // one set just before.
        transfer_codings(&parts.headers)?;
        if !hop.trusted {
            forwarded::strip_untrusted(&mut parts.headers);
        }
        forwarded::settle_proto(&mut parts.headers, hop.proto, hop.trusted);
        // Transfer-Encoding stays until the upstream request is built: it
        // tells the cache this GET carries a body (which then bypasses it).
        let framing = parts.headers.get(header::TRANSFER_ENCODING).cloned();
        strip_hop_by_hop(&mut parts.headers);
        if let Some(te) = framing {
            parts.headers.insert(header::TRANSFER_ENCODING, te);
        }
        let count = parts.headers.get_all(header::HOST).iter().count();
        return Ok(Hosts {
            count: u8::try_from(count).unwrap_or(2).min(2),
            // Not looked at: the full check decides.
            plain: false,
        });
    }
    // Nothing to remove, no Transfer-Encoding: only the proto to settle.
    forwarded::settle_proto(&mut parts.headers, hop.proto, hop.trusted);
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
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Whether `host` is a plain lowercase name or IPv4 address, with or
/// without a port: `[a-z0-9.-]+(:[0-9]*)?`. Every such host passes the
/// layer's grammar ([`herdguard::host_is_valid`]) and needs no lowercasing;
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
            herdguard::host_is_valid(http::Version::HTTP_11, &"/".parse().unwrap(), &headers)
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

    /// The walk sends every hop-by-hop field, and an untrusted peer's
    /// forwarding claims, to the removal path; plain fields skip it.
    #[test]
    fn the_walk_finds_what_must_go() {
        for name in &HOP_BY_HOP {
            assert!(needs_removal(name, true), "{name}");
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
