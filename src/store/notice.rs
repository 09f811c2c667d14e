//! The purge notice: the bytes one instance publishes on the purge channel
//! so every other instance clears its copies, written and read here only.
//!
//! - `k:<32 hex digits>`: a key; `t:<tag>`: a tag (`Surrogate-Key`).
//! - Either prefixed `s` for a soft purge (marked stale, kept). An older
//!   version ignores those: its copies end with its L1 lifetime.
//! - `*`: notices may have gone by unheard (the subscriber reconnected), so
//!   keep no copy from before.

use crate::key::CacheKey;

/// What a purge does to the entries it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PurgeMode {
    /// Delete them everywhere.
    Hard,
    /// Keep them, stale from now on (see [`CacheLayer::soft_purge_url`](crate::CacheLayer::soft_purge_url)).
    Soft,
}

/// One purge notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notice<'a> {
    Key(CacheKey, PurgeMode),
    Tag(&'a str, PurgeMode),
    /// Notices may have been lost.
    Missed,
}

/// The bytes of [`Notice::Missed`].
pub(crate) const MISSED: &[u8] = b"*";

impl<'a> Notice<'a> {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let soft = |mode: &PurgeMode| match mode {
            PurgeMode::Hard => "",
            PurgeMode::Soft => "s",
        };
        match self {
            Notice::Key(k, mode) => format!("{}k:{}", soft(mode), k.to_hex()).into_bytes(),
            Notice::Tag(t, mode) => format!("{}t:{t}", soft(mode)).into_bytes(),
            Notice::Missed => MISSED.to_vec(),
        }
    }

    /// `None` for anything that is not a notice (a newer version's, or
    /// garbage): it is ignored.
    pub(crate) fn parse(payload: &'a [u8]) -> Option<Self> {
        if payload == MISSED {
            return Some(Notice::Missed);
        }
        let (payload, mode) = match payload.strip_prefix(b"s") {
            Some(rest) => (rest, PurgeMode::Soft),
            None => (payload, PurgeMode::Hard),
        };
        if let Some(hex) = payload.strip_prefix(b"k:") {
            return CacheKey::from_hex(hex).map(|k| Notice::Key(k, mode));
        }
        let tag = std::str::from_utf8(payload.strip_prefix(b"t:")?).ok()?;
        Some(Notice::Tag(tag, mode))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every notice reads back as itself; the wire bytes are the ones older
    /// versions read; anything else is no notice.
    #[test]
    fn notices_round_trip_and_keep_their_bytes() {
        let key = CacheKey::new("k");
        for mode in [PurgeMode::Hard, PurgeMode::Soft] {
            for n in [Notice::Key(key, mode), Notice::Tag("news", mode)] {
                assert_eq!(Notice::parse(&n.encode()), Some(n));
            }
        }
        assert_eq!(
            Notice::parse(&Notice::Missed.encode()),
            Some(Notice::Missed)
        );
        assert_eq!(
            Notice::Key(key, PurgeMode::Hard).encode(),
            format!("k:{}", key.to_hex()).into_bytes()
        );
        assert_eq!(Notice::Tag("a", PurgeMode::Soft).encode(), b"st:a");
        for bad in [&b"k:zz"[..], b"x:1", b"", b"s", b"t:\xff"] {
            assert_eq!(Notice::parse(bad), None, "{bad:?}");
        }
    }
}
