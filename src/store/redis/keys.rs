//! The Redis key names of one entry, all under the entry's hash tag.

use super::store::RedisStore;
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

impl RedisStore {
    pub(crate) fn keys(&self, key: &CacheKey) -> EntryKeys {
        let ns = &self.options.namespace;
        let h = key.to_hex();
        EntryKeys {
            value: format!("{ns}:{{{h}}}:v"),
            fresh: format!("{ns}:{{{h}}}:fresh"),
            lock: format!("{ns}:{{{h}}}:lock"),
            fence: format!("{ns}:{{{h}}}:fence"),
            pass: format!("{ns}:{{{h}}}:pass"),
        }
    }
}
