//! Vary: several variants of one URL, each under its own key.
//!
//! A variant's key is the base key (URL, Authorization present or not,
//! configured key headers) plus the request's values of the headers the
//! URL's responses vary on. Those names are learned from responses and kept
//! per base key here. A forgotten or outdated list costs a miss, never a wrong
//! answer: every stored variant still compares its own header values before
//! it is served.

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
            if self.names.contains_key(&base) {
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

/// The key of the variant of `base` that `request` selects.
pub(crate) fn variant_key(base: &CacheKey, names: &[HeaderName], request: &HeaderMap) -> CacheKey {
    if names.is_empty() {
        return *base;
    }
    let mut h = KeyHasher::new();
    h.part(b"variant").part(base.as_bytes());
    for name in names {
        h.part(name.as_str().as_bytes());
        let values = request.get_all(name);
        // Absent and present-but-empty are different requests.
        h.part(&(values.iter().count() as u64).to_le_bytes());
        for v in values {
            h.part(v.as_bytes());
        }
    }
    h.finish()
}

/// The request's values of a varied header as a stored entry keeps them.
/// Credentials are kept as a digest: the secret itself never reaches Redis.
pub(crate) fn stored_values(name: &HeaderName, request: &HeaderMap) -> Vec<HeaderValue> {
    request
        .get_all(name)
        .iter()
        .map(|v| stored_value(name, v))
        .collect()
}

/// Whether `request` has the values `stored` keeps for `name`.
pub(crate) fn values_match(name: &HeaderName, request: &HeaderMap, stored: &[HeaderValue]) -> bool {
    let mut theirs = request.get_all(name).iter();
    if name != header::AUTHORIZATION {
        return theirs.eq(stored.iter());
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
