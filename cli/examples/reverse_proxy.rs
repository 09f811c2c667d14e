//! A caching reverse proxy: herdguard in front of an HTTP API you don't own.
//!
//! ```text
//! cargo run --release --example reverse_proxy -- \
//!     --listen 127.0.0.1:8082 --upstream http://127.0.0.1:8000 \
//!     [--purge-token SECRET] [--redis redis://127.0.0.1:6379] [--grace 60s]
//!     [--redis-cluster redis://127.0.0.1:7000,redis://127.0.0.1:7001,...]
//!     [--trusted-proxies 10.0.0.0/8,127.0.0.1]
//! ```
//!
//! This is `herdguard proxy` (see its `--help` for TLS, limits, an admin
//! listener and the rest) with a few flags: the proxy's code is the
//! `herdguard_cli` library (cli/src/proxy/), which both use. No peer is
//! trusted to report Forwarded / X-Forwarded-* unless `--trusted-proxies`
//! names it: from anyone else they are replaced or removed, since the cache
//! key does not hold them.

use std::net::SocketAddr;

use axum::http::Uri;
use herdguard::CacheLayer;
use herdguard_cli::app::Config;
use herdguard_cli::proxy::{self as shared, Proxy};

fn arg_value(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let listen: SocketAddr = arg_value(&args, "--listen")
        .unwrap_or_else(|| "127.0.0.1:8082".to_owned())
        .parse()?;
    let upstream: Uri = arg_value(&args, "--upstream")
        .unwrap_or_else(|| "http://127.0.0.1:8000".to_owned())
        .parse()?;
    if upstream.scheme_str() != Some("http") || upstream.authority().is_none() {
        return Err("--upstream must be http://host:port".into());
    }
    let purge_token = arg_value(&args, "--purge-token");
    let mut builder = CacheLayer::builder();
    if let Some(grace) = arg_value(&args, "--grace") {
        // Stale-while-updating on the operator's say-so (`60s`, `500ms`, `2m`).
        builder = builder.grace(shared::parse_duration(&grace)?);
    }
    if let Some(redis) = arg_value(&args, "--redis") {
        // Every proxy on this Redis shares entries and the single flight.
        builder = builder.redis(herdguard::RedisOptions::new(redis).namespace("proxy"));
    }
    if let Some(seeds) = arg_value(&args, "--redis-cluster") {
        let urls: Vec<String> = seeds
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        builder = builder.redis(herdguard::RedisOptions::cluster(urls).namespace("proxy"));
    }
    let cache = builder.build()?;
    let purge = if purge_token.is_some() { "on" } else { "off" };
    let mut config = Config {
        upstream: upstream.clone(),
        purge_token,
    }
    .shared();
    if let Some(ranges) = arg_value(&args, "--trusted-proxies") {
        config.trusted_proxies = ranges
            .split(',')
            .filter(|r| !r.trim().is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()?;
    }
    let proxy = Proxy::new(config, cache)?;
    let server = shared::server::ServerConfig::new(listen);
    shared::server::run(server, proxy, None, |bound| {
        println!(
            "herdguard reverse proxy on http://{} → {upstream} (purge {purge})",
            bound.listen
        );
    })
    .await?;
    Ok(())
}
