//! The Redis key names of one entry, all under the entry's hash tag. Names
//! only: no key is read or written here.

use crate::key::CacheKey;

/// The Redis key names of one entry.
#[derive(Debug)]
pub(crate) struct EntryKeys {
    /// The entry (or the pass marker); freshness is its PTTL past the
    /// entry's keep time.
    pub(crate) value: String,
    /// The older layout's (entry version 3) freshness key: never written
    /// now; a purge still deletes it, with whatever an older version left.
    pub(crate) fresh: String,
    pub(crate) lock: String,
    pub(crate) fence: String,
    /// The older layout's pass marker key, like `fresh`.
    pub(crate) pass: String,
}

impl EntryKeys {
    /// The key names of `key`'s entry under the namespace `ns`.
    pub(super) fn new(ns: &str, key: &CacheKey) -> Self {
        let h = key.to_hex();
        Self {
            value: format!("{ns}:{{{h}}}:v"),
            fresh: format!("{ns}:{{{h}}}:fresh"),
            lock: format!("{ns}:{{{h}}}:lock"),
            fence: format!("{ns}:{{{h}}}:fence"),
            pass: format!("{ns}:{{{h}}}:pass"),
        }
    }
}
