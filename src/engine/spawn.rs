//! Background work on the current runtime, from code that may run outside
//! one. A leaf: it imports nothing of the engine.

use std::future::Future;

/// Spawn background work on the current runtime. The sync entry points
/// (purge, invalidate, `Service::call`) may run outside one; then the work is
/// skipped with a warning instead of panicking.
pub(crate) fn spawn_detached<F>(what: &'static str, fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(fut);
        }
        Err(_) => tracing::warn!(what, "no tokio runtime here: background work skipped"),
    }
}
