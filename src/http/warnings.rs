//! Advice for whoever sets the cache up: a route whose answers cannot be
//! stored for want of freshness says so in one WARN, not once per request.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use http::request;
use tokio::time::Instant;

/// How long one route stays quiet after its warning.
pub(crate) const ROUTE_INTERVAL: Duration = Duration::from_secs(600);
/// Least time between two warnings of one layer, whatever their routes, so
/// routes that are really distinct paths (no axum `MatchedPath`) cannot
/// flood the log.
pub(crate) const ANY_INTERVAL: Duration = Duration::from_secs(1);
/// Most routes remembered: past it, those warned longest ago are forgotten
/// first, and a new route waits until one is.
const ROUTES: usize = 256;
/// Longest route name kept (a raw path can be long).
const ROUTE_CHARS: usize = 200;

/// When each route was last warned about.
#[derive(Debug, Default)]
pub(crate) struct RouteWarnings {
    // A std Mutex: held for one map operation, never across an `.await`.
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    routes: HashMap<Box<str>, Instant>,
    last: Option<Instant>,
}

impl RouteWarnings {
    /// Whether `route` is due a warning now; if so, it counts as warned.
    pub(crate) fn due(&self, route: &str) -> bool {
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let recent = |t: &Instant, within| now.saturating_duration_since(*t) < within;
        if seen.last.is_some_and(|t| recent(&t, ANY_INTERVAL)) {
            return false;
        }
        if seen
            .routes
            .get(route)
            .is_some_and(|t| recent(t, ROUTE_INTERVAL))
        {
            return false;
        }
        if seen.routes.len() >= ROUTES && !seen.routes.contains_key(route) {
            seen.routes.retain(|_, t| recent(t, ROUTE_INTERVAL));
            if seen.routes.len() >= ROUTES {
                return false;
            }
        }
        seen.routes.insert(Box::from(route), now);
        seen.last = Some(now);
        true
    }
}

/// The route a request came through: axum's matched path (`/report/{id}`)
/// where there is one, else the request's path, cut to a bounded length.
pub(crate) fn route_of(request: &request::Parts) -> &str {
    #[cfg(feature = "axum")]
    if let Some(matched) = request.extensions.get::<axum::extract::MatchedPath>() {
        return cut(matched.as_str());
    }
    cut(request.uri.path())
}

fn cut(s: &str) -> &str {
    match s.char_indices().nth(ROUTE_CHARS) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}
