//! The Redis key names of one entry, all under the entry's hash tag. Names
//! only: no key is read or written here.

use crate::key::CacheKey;

/// The Redis key names of one entry.
#[derive(Debug)]
pub(crate) struct EntryKeys {
    pub(crate) value: String,
    pub(crate) fresh: String,
    pub(crate) lock: String,
    pub(crate) fence: String,
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
