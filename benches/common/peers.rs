//! What readers would otherwise use: nginx (`proxy_cache_lock`) and Varnish
//! (its waiting list), as rows in front of the same origin when they are
//! installed. The rows themselves are not built yet: today this only says
//! which are present, so a table never silently lacks them.

use std::process::Command;

/// Whether `program` is on `PATH` (by `which`, as a user would check).
fn installed(program: &str) -> bool {
    Command::new("which")
        .arg(program)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// One line per peer for the bench's header.
pub(crate) fn report() -> Vec<String> {
    ["nginx", "varnishd"]
        .into_iter()
        .map(|p| {
            if installed(p) {
                format!("{p}: installed, but its comparison row is not implemented yet; skipped")
            } else {
                format!("{p}: not installed; its comparison row is skipped")
            }
        })
        .collect()
}
