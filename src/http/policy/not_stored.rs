//! Why an origin answer was not stored: one typed reason, its word in
//! `Cache-Status` and its label on `herdguard_not_stored_total`.

use crate::metrics::NotStoredLabel;

/// Why an origin answer was not stored (as pingora-cache's
/// `NoCacheReason`): the policy's refusals, and the layer's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotStored {
    /// `must-understand` with a status whose caching rules we do not know.
    MustUnderstand,
    NoStore,
    Private,
    SetCookie,
    /// `Vary: *`.
    VaryStar,
    /// An answer to an authorized request the origin did not allow storing.
    Authorization,
    /// A 206: it answers its own request's range.
    PartialContent,
    /// A 1xx or a 304.
    Status,
    /// The layer's `should_cache` predicate refused it.
    Predicate,
    /// Shareable with the waiters of its flight, but without freshness.
    NoFreshness,
    /// Its body outgrew the layer's bound.
    TooLarge,
    /// Answered under a pass marker.
    HitForPass,
}

impl NotStored {
    /// The reason's word, as `Cache-Status` detail and logs give it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::MustUnderstand => "must-understand",
            Self::NoStore => "no-store",
            Self::Private => "private",
            Self::SetCookie => "set-cookie",
            Self::VaryStar => "vary-star",
            Self::Authorization => "authorization",
            Self::PartialContent => "partial-content",
            Self::Status => "status",
            Self::Predicate => "predicate",
            Self::NoFreshness => "no-freshness",
            Self::TooLarge => "too-large",
            Self::HitForPass => "hit-for-pass",
        }
    }

    /// The stable `reason` label it is counted under: the status-shaped
    /// reasons share `status`, and the layer's own choices are `other`.
    pub(crate) fn label(self) -> NotStoredLabel {
        match self {
            Self::SetCookie => NotStoredLabel::SetCookie,
            Self::Private => NotStoredLabel::Private,
            Self::NoStore => NotStoredLabel::NoStore,
            Self::NoFreshness => NotStoredLabel::NoFreshness,
            Self::TooLarge => NotStoredLabel::TooLarge,
            Self::VaryStar => NotStoredLabel::VaryStar,
            Self::Authorization => NotStoredLabel::Authorization,
            Self::Status | Self::MustUnderstand | Self::PartialContent => NotStoredLabel::Status,
            Self::Predicate | Self::HitForPass => NotStoredLabel::Other,
        }
    }
}

impl std::fmt::Display for NotStored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::NotStored;

    /// Each reason keeps its `Cache-Status` word and its metric label: the
    /// status-shaped ones count as `status`, the layer's own as `other`.
    #[test]
    fn reasons_keep_their_words_and_labels() {
        use NotStored::*;
        for (reason, word, label) in [
            (SetCookie, "set-cookie", "set-cookie"),
            (Private, "private", "private"),
            (NoStore, "no-store", "no-store"),
            (NoFreshness, "no-freshness", "no-freshness"),
            (TooLarge, "too-large", "too-large"),
            (VaryStar, "vary-star", "vary-star"),
            (Authorization, "authorization", "authorization"),
            (MustUnderstand, "must-understand", "status"),
            (Status, "status", "status"),
            (PartialContent, "partial-content", "status"),
            (Predicate, "predicate", "other"),
            (HitForPass, "hit-for-pass", "other"),
        ] {
            assert_eq!(reason.as_str(), word);
            assert_eq!(reason.label().as_str(), label, "{word}");
        }
    }
}
