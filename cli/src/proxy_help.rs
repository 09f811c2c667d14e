//! The `[default: …]` in `herdguard proxy --help`, taken from the values
//! the proxy and the library use, so the help cannot drift from the code.

use std::time::Duration;

use herdguard::RedisOptions;

use crate::proxy::server::ServerConfig;
use crate::proxy::upstream::UpstreamOptions;
use crate::proxy_cmd::{
    DEFAULT_ACCESS_LOG, DEFAULT_CAPACITY_BYTES, DEFAULT_LEASE_REPLICAS_TIMEOUT, DEFAULT_LISTEN,
    DEFAULT_MAX_BODY_BYTES, DEFAULT_ORIGIN_BUDGET,
};
use crate::proxy_values::show_bytes;

/// The `[default: …]` that `--help` shows for each option with a value as
/// its default, from the values the proxy and the library use.
fn shown_defaults() -> Vec<(&'static str, String)> {
    let server = ServerConfig::new(DEFAULT_LISTEN);
    let upstream = UpstreamOptions::default();
    let duration = |d: Duration| humantime::format_duration(d).to_string();
    let bytes = |b: u64| show_bytes(b);
    vec![
        ("listen", DEFAULT_LISTEN.to_string()),
        ("connect_timeout", duration(upstream.connect_timeout)),
        ("upstream_timeout", duration(upstream.response_timeout)),
        ("upstream_idle_timeout", duration(upstream.idle_timeout)),
        ("upstream_max_idle", upstream.max_idle.to_string()),
        (
            "redis_namespace",
            RedisOptions::DEFAULT_NAMESPACE.to_owned(),
        ),
        (
            "redis_lease_replicas_timeout",
            duration(DEFAULT_LEASE_REPLICAS_TIMEOUT),
        ),
        ("grace", duration(Duration::ZERO)),
        ("origin_timeout", "1m".to_owned()),
        ("origin_budget", DEFAULT_ORIGIN_BUDGET.to_string()),
        ("breaker_failures", "5".to_owned()),
        ("refresh_ahead", "0.25".to_owned()),
        ("max_body_bytes", bytes(DEFAULT_MAX_BODY_BYTES)),
        ("capacity_bytes", bytes(DEFAULT_CAPACITY_BYTES)),
        ("max_connections", server.max_connections.to_string()),
        ("header_timeout", duration(server.header_timeout)),
        ("max_header_bytes", bytes(server.max_header_bytes as u64)),
        ("shutdown_timeout", duration(server.shutdown_timeout)),
        ("log_format", "text".to_owned()),
        ("access_log", DEFAULT_ACCESS_LOG.to_owned()),
        ("hot_keys", "64".to_owned()),
    ]
}

/// Append `[default: …]` from [`shown_defaults`] to the help of the
/// `proxy` subcommand's options.
pub(crate) fn show_defaults(mut cmd: clap::Command) -> clap::Command {
    for (id, value) in shown_defaults() {
        cmd = cmd.mut_arg(id, |arg| {
            let add = |h: Option<&clap::builder::StyledStr>| {
                format!(
                    "{} [default: {value}]",
                    h.map(ToString::to_string).unwrap_or_default()
                )
            };
            let long = arg.get_long_help().map(|h| add(Some(h)));
            let short = add(arg.get_help());
            let arg = arg.help(short);
            match long {
                Some(long) => arg.long_help(long),
                None => arg,
            }
        });
    }
    cmd
}
