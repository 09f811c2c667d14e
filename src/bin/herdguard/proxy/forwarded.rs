//! X-Forwarded-For / -Proto, and which peers may set them. Header rules
//! only: imports nothing else of the proxy.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use http::header::{HeaderMap, HeaderValue};

/// What the server knows about the connection a request came on; put in the
/// request's extensions (the cache copies them onto the requests it builds).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    pub(crate) addr: SocketAddr,
    pub(crate) tls: bool,
}

/// Append to a comma-separated list header (Via, X-Forwarded-For).
pub(crate) fn append_list(headers: &mut HeaderMap, name: &'static str, item: &str) {
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
pub(crate) struct Cidr {
    net: IpAddr,
    bits: u8,
}

impl Cidr {
    /// Every IPv4 and IPv6 address: trust any peer.
    #[allow(dead_code, reason = "the reverse_proxy example trusts everyone")]
    pub(crate) fn everyone() -> Vec<Self> {
        vec![
            Self {
                net: IpAddr::from([0, 0, 0, 0]),
                bits: 0,
            },
            Self {
                net: IpAddr::from([0u16; 8]),
                bits: 0,
            },
        ]
    }

    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            // A v4 client on a dual-stack socket shows up as ::ffff:a.b.c.d.
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), self.bits),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), self.bits),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let full = usize::from(bits / 8);
    let rest = bits % 8;
    if a[..full] != b[..full] {
        return false;
    }
    rest == 0 || {
        let mask = 0xffu8 << (8 - rest);
        a[full] & mask == b[full] & mask
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not an address or CIDR range (10.0.0.0/8, ::1)");
        let (addr, bits) = match s.trim().split_once('/') {
            Some((a, b)) => (a, Some(b.parse::<u8>().map_err(|_| bad())?)),
            None => (s.trim(), None),
        };
        let net: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(max);
        if bits > max {
            return Err(bad());
        }
        Ok(Self { net, bits })
    }
}

/// Set X-Forwarded-For and -Proto on an upstream request. A trusted peer's
/// chain is extended and its proto kept; anyone else's is replaced, so a
/// client cannot claim an address or a scheme it does not have.
pub(crate) fn apply(headers: &mut HeaderMap, peer: Option<Peer>, trusted: &[Cidr]) {
    let Some(peer) = peer else {
        // Not from a connection we accepted (a test calling the service):
        // say nothing rather than something false.
        headers.remove("x-forwarded-for");
        headers.remove("x-forwarded-proto");
        return;
    };
    let ip = peer.addr.ip();
    let proto = HeaderValue::from_static(if peer.tls { "https" } else { "http" });
    if trusted.iter().any(|c| c.contains(ip)) {
        append_list(headers, "x-forwarded-for", &ip.to_string());
        if !headers.contains_key("x-forwarded-proto") {
            headers.insert("x-forwarded-proto", proto);
        }
    } else {
        if let Ok(v) = HeaderValue::from_str(&ip.to_string()) {
            headers.insert("x-forwarded-for", v);
        }
        headers.insert("x-forwarded-proto", proto);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
