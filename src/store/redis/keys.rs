//! The Redis key names of one entry, all under the entry's hash tag. Names
//! only: no key is read or written here.

use crate::key::CacheKey;

/// The suffixes of an entry's keys, in the order [`EntryKeys`] holds them.
const SUFFIXES: [&str; 5] = ["v", "fresh", "lock", "fence", "pass"];

/// The Redis key names of one entry: `{ns}:{H}:v`, `:fresh`, `:lock`,
/// `:fence` and `:pass`, written one after another into a single string
/// (one allocation per lookup or write, no formatting machinery).
#[derive(Debug)]
pub(crate) struct EntryKeys {
    names: String,
    /// Where each name ends in `names`, in [`SUFFIXES`] order.
    ends: [usize; 5],
}

impl EntryKeys {
    /// The key names of `key`'s entry under the namespace `ns`.
    pub(super) fn new(ns: &str, key: &CacheKey) -> Self {
        // `{ns}:{` + 32 hex digits + `}:`, then the suffix.
        let prefix = ns.len() + 2 + 32 + 2;
        let total = 5 * prefix + SUFFIXES.iter().map(|s| s.len()).sum::<usize>();
        let mut names = String::with_capacity(total);
        let mut ends = [0; 5];
        for (end, suffix) in ends.iter_mut().zip(SUFFIXES) {
            names.push_str(ns);
            names.push_str(":{");
            key.push_hex(&mut names);
            names.push_str("}:");
            names.push_str(suffix);
            *end = names.len();
        }
        Self { names, ends }
    }

    fn name(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.names[start..self.ends[i]]
    }

    /// The entry (or the pass marker); freshness is its PTTL past the
    /// entry's keep time.
    pub(crate) fn value(&self) -> &str {
        self.name(0)
    }

    /// The older layout's (entry version 3) freshness key: never written
    /// now; a purge still deletes it, with whatever an older version left.
    pub(crate) fn fresh(&self) -> &str {
        self.name(1)
    }

    pub(crate) fn lock(&self) -> &str {
        self.name(2)
    }

    pub(crate) fn fence(&self) -> &str {
        self.name(3)
    }

    /// The older layout's pass marker key, like `fresh`.
    pub(crate) fn pass(&self) -> &str {
        self.name(4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are the documented layout, byte for byte.
    #[test]
    fn names_are_the_documented_layout() {
        let key = CacheKey::new("k");
        let h = key.to_hex();
        let k = EntryKeys::new("ns", &key);
        assert_eq!(
            [k.value(), k.fresh(), k.lock(), k.fence(), k.pass()],
            [
                format!("ns:{{{h}}}:v"),
                format!("ns:{{{h}}}:fresh"),
                format!("ns:{{{h}}}:lock"),
                format!("ns:{{{h}}}:fence"),
                format!("ns:{{{h}}}:pass"),
            ]
        );
    }
}
