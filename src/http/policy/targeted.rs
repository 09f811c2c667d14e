//! Targeted cache control (RFC 9213): `CDN-Cache-Control`, and a header of
//! the user's own above it, each a Structured Fields Dictionary (RFC 9651).
//!
//! A cache that obeys a targeted field uses the first one (in target-list
//! order) with a valid, non-empty value, and then ignores `Cache-Control`
//! and `Expires` in that response. A field that does not parse is ignored
//! whole, as if absent.

use http::header::{HeaderMap, HeaderName};

use crate::http::policy::directives::{CacheControl, MAX_DELTA_SECS};

/// The RFC 9213 field for CDN caches; a shared cache in front of an origin
/// is one.
pub(crate) const CDN_CACHE_CONTROL: HeaderName = HeaderName::from_static("cdn-cache-control");

/// The directives of the first valid, non-empty targeted field, if any.
pub(crate) fn targeted(own: Option<&HeaderName>, headers: &HeaderMap) -> Option<CacheControl> {
    own.into_iter()
        .chain(std::iter::once(&CDN_CACHE_CONTROL))
        .find_map(|name| parse_field(headers, name))
}

/// One targeted field's directives; `None` when absent, empty or invalid.
fn parse_field(headers: &HeaderMap, name: &HeaderName) -> Option<CacheControl> {
    let mut lines = headers.get_all(name).iter().peekable();
    lines.peek()?;
    // Field lines combine with commas before parsing (RFC 9651 §4.2).
    let mut joined = Vec::new();
    for (i, line) in lines.enumerate() {
        if i > 0 {
            joined.extend_from_slice(b", ");
        }
        joined.extend_from_slice(line.as_bytes());
    }
    let members = Parser::new(&joined).dictionary()?;
    if members.is_empty() {
        return None;
    }
    let mut cc = CacheControl::default();
    for (key, value) in members {
        // A restricting directive holds unless it is explicitly false; an
        // age of the wrong type reads as 0 (stale), as in Cache-Control.
        let on = !matches!(value, Value::Bool(false));
        let secs = match value {
            Value::Int(n) => u64::try_from(n).unwrap_or(0).min(MAX_DELTA_SECS),
            _ => 0,
        };
        match key.as_str() {
            "no-store" => cc.no_store = on,
            "no-cache" => cc.no_cache = on,
            "private" => cc.private = on,
            "public" => cc.public = matches!(value, Value::Bool(true)),
            "must-revalidate" => cc.must_revalidate = on,
            "proxy-revalidate" => cc.proxy_revalidate = on,
            "must-understand" => cc.must_understand = on,
            "max-age" => cc.max_age = Some(secs),
            "s-maxage" => cc.s_maxage = Some(secs),
            "stale-while-revalidate" => cc.stale_while_revalidate = Some(secs),
            "stale-if-error" => cc.stale_if_error = Some(secs),
            _ => {}
        }
    }
    Some(cc)
}

/// A member value, as far as cache directives care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    Int(i64),
    Bool(bool),
    Other,
}

/// An RFC 9651 Dictionary parser: keys and the values we act on, nothing
/// more kept. Any syntax error fails the whole field.
struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn new(input: &'a [u8]) -> Self {
        Self { input, pos: 0 }
    }

    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn skip_sp(&mut self) {
        while self.peek() == Some(b' ') {
            self.pos += 1;
        }
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
    }

    fn dictionary(mut self) -> Option<Vec<(String, Value)>> {
        let mut members: Vec<(String, Value)> = Vec::new();
        self.skip_sp();
        if self.peek().is_none() {
            return Some(members);
        }
        loop {
            let key = self.key()?;
            let value = if self.eat(b'=') {
                if self.peek() == Some(b'(') {
                    self.inner_list()?;
                    self.parameters()?;
                    Value::Other
                } else {
                    let v = self.bare_item()?;
                    self.parameters()?;
                    v
                }
            } else {
                self.parameters()?;
                Value::Bool(true)
            };
            // A repeated key overwrites the earlier value (RFC 9651 §4.2.2).
            match members.iter_mut().find(|(k, _)| *k == key) {
                Some(m) => m.1 = value,
                None => members.push((key, value)),
            }
            self.skip_ows();
            if self.peek().is_none() {
                return Some(members);
            }
            if !self.eat(b',') {
                return None;
            }
            self.skip_ows();
            self.peek()?;
        }
    }

    fn key(&mut self) -> Option<String> {
        let start = self.pos;
        match self.peek() {
            Some(b'a'..=b'z' | b'*') => self.pos += 1,
            _ => return None,
        }
        while matches!(
            self.peek(),
            Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*')
        ) {
            self.pos += 1;
        }
        // Only the ASCII bytes just matched.
        Some(String::from_utf8_lossy(&self.input[start..self.pos]).into_owned())
    }

    fn parameters(&mut self) -> Option<()> {
        while self.eat(b';') {
            self.skip_sp();
            self.key()?;
            if self.eat(b'=') {
                self.bare_item()?;
            }
        }
        Some(())
    }

    fn inner_list(&mut self) -> Option<()> {
        if !self.eat(b'(') {
            return None;
        }
        loop {
            self.skip_sp();
            if self.eat(b')') {
                return Some(());
            }
            self.bare_item()?;
            self.parameters()?;
            match self.peek() {
                Some(b' ' | b')') => {}
                _ => return None,
            }
        }
    }

    fn bare_item(&mut self) -> Option<Value> {
        match self.peek()? {
            b'-' | b'0'..=b'9' => self.number(),
            b'"' => self.string().map(|()| Value::Other),
            b'%' => {
                self.pos += 1;
                self.string().map(|()| Value::Other)
            }
            b':' => self.byte_sequence().map(|()| Value::Other),
            b'?' => {
                self.pos += 1;
                let v = match self.peek()? {
                    b'0' => false,
                    b'1' => true,
                    _ => return None,
                };
                self.pos += 1;
                Some(Value::Bool(v))
            }
            b'@' => {
                self.pos += 1;
                match self.number()? {
                    Value::Int(_) => Some(Value::Other),
                    _ => None,
                }
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'*' => {
                self.pos += 1;
                while self
                    .peek()
                    .is_some_and(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b))
                {
                    self.pos += 1;
                }
                Some(Value::Other)
            }
            _ => None,
        }
    }

    fn number(&mut self) -> Option<Value> {
        let negative = self.eat(b'-');
        let start = self.pos;
        let mut dot = None;
        while let Some(b) = self.peek() {
            match b {
                b'0'..=b'9' => {}
                b'.' if dot.is_none() => dot = Some(self.pos),
                _ => break,
            }
            self.pos += 1;
        }
        let digits = &self.input[start..self.pos];
        if digits.first().is_none_or(|b| !b.is_ascii_digit()) {
            return None;
        }
        match dot {
            None => {
                if digits.len() > 15 {
                    return None;
                }
                let n = std::str::from_utf8(digits).ok()?.parse::<i64>().ok()?;
                Some(Value::Int(if negative { -n } else { n }))
            }
            Some(d) => {
                let int_len = d - start;
                let frac_len = self.pos - d - 1;
                if int_len > 12 || frac_len == 0 || frac_len > 3 {
                    return None;
                }
                Some(Value::Other)
            }
        }
    }

    fn string(&mut self) -> Option<()> {
        if !self.eat(b'"') {
            return None;
        }
        loop {
            match self.peek()? {
                b'\\' => {
                    self.pos += 1;
                    match self.peek()? {
                        b'"' | b'\\' => self.pos += 1,
                        _ => return None,
                    }
                }
                b'"' => {
                    self.pos += 1;
                    return Some(());
                }
                0x20..=0x7e => self.pos += 1,
                _ => return None,
            }
        }
    }

    fn byte_sequence(&mut self) -> Option<()> {
        if !self.eat(b':') {
            return None;
        }
        loop {
            match self.peek()? {
                b':' => {
                    self.pos += 1;
                    return Some(());
                }
                b if b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=' => {
                    self.pos += 1;
                }
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn cdn(value: &str) -> Option<CacheControl> {
        let mut h = HeaderMap::new();
        h.insert(CDN_CACHE_CONTROL, HeaderValue::from_str(value).unwrap());
        targeted(None, &h)
    }

    /// Valid dictionaries map to directives; invalid or empty fields are ignored whole.
    #[test]
    fn dictionary_parses_or_is_ignored() {
        assert_eq!(cdn("max-age=60").unwrap().max_age, Some(60));
        assert_eq!(cdn("foobar, max-age=3600").unwrap().max_age, Some(3600));
        assert!(cdn("no-store").unwrap().no_store);
        assert!(!cdn("no-store=?0").unwrap().no_store);
        assert_eq!(
            cdn("max-age=99999999999").unwrap().max_age,
            Some(MAX_DELTA_SECS)
        );
        // A string where an integer belongs reads as stale.
        assert_eq!(cdn("max-age=\"10000\"").unwrap().max_age, Some(0));
        for bad in [
            "max-age=10000, &&&&&",
            "max-age =100",
            "max-age= 100",
            "MaX-aGe=1",
            "a,",
            "",
        ] {
            assert_eq!(cdn(bad), None, "{bad:?} must be ignored");
        }
        assert_eq!(
            cdn("no-cache=(\"a\" \"b\");x=1").map(|c| c.no_cache),
            Some(true)
        );
    }

    /// The user's own field wins over CDN-Cache-Control; an invalid one falls through.
    #[test]
    fn own_field_comes_first() {
        let own = HeaderName::from_static("herdguard-cache-control");
        let mut h = HeaderMap::new();
        h.insert(CDN_CACHE_CONTROL, HeaderValue::from_static("max-age=5"));
        h.insert(own.clone(), HeaderValue::from_static("max-age=50"));
        assert_eq!(targeted(Some(&own), &h).unwrap().max_age, Some(50));
        h.insert(own.clone(), HeaderValue::from_static("max-age=@@"));
        assert_eq!(targeted(Some(&own), &h).unwrap().max_age, Some(5));
    }
}
