//! `herdguard proxy`: flags, environment and config file, mapped onto the
//! shared proxy (`proxy/`). Precedence: flag, then environment variable,
//! then the `--config` file, then the default shown in `--help` (taken from
//! the values the code uses, by `proxy_help::show_defaults`).
//! Holds no proxying logic: that is `proxy/`, which must not depend on
//! this file (the example builds `proxy/` without clap).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use herdguard::{CacheLayer, OriginBreaker, RedisOptions};
use http::Uri;
use serde::Deserialize;

use crate::proxy::access_log::{self, AccessLog, Destination};
use crate::proxy::forwarded::Cidr;
use crate::proxy::server::{self, ServerConfig};
use crate::proxy::upstream::UpstreamOptions;
use crate::proxy::{parse_duration, Proxy, ProxyConfig};
use crate::proxy_values::{de_access_log, de_bytes, de_duration, parse_bytes, size};

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// Where the proxy listens without `--listen`.
pub(crate) const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);
/// The library's own origin budget, which the cluster budget follows.
pub(crate) const DEFAULT_ORIGIN_BUDGET: usize = 64;
/// The proxy's body limit without `--max-body-bytes`.
pub(crate) const DEFAULT_MAX_BODY_BYTES: u64 = 8 * 1024 * 1024;
/// The proxy's memory for entries without `--capacity-bytes`.
pub(crate) const DEFAULT_CAPACITY_BYTES: u64 = 256 * 1024 * 1024;
/// How long `--redis-lease-replicas` waits without
/// `--redis-lease-replicas-timeout`: a few replication round trips.
pub(crate) const DEFAULT_LEASE_REPLICAS_TIMEOUT: Duration = Duration::from_millis(100);
/// The access log's destination without `--access-log`.
pub(crate) const DEFAULT_ACCESS_LOG: &str = "stderr";

/// A setting that flags or the environment may have left open, for the
/// `--config` file to fill.
trait FromFile {
    fn or_file(&mut self, file: Self);
}

impl<T> FromFile for Option<T> {
    fn or_file(&mut self, file: Self) {
        if self.is_none() {
            *self = file;
        }
    }
}

impl<T> FromFile for Vec<T> {
    fn or_file(&mut self, file: Self) {
        if self.is_empty() {
            *self = file;
        }
    }
}

/// Declares the options struct and, from the same list of fields, the
/// merge with the config file: an option is read from the file by being
/// declared, so a new one cannot be left out (and one whose type is neither
/// `Option` nor `Vec` does not compile).
macro_rules! options {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $fvis:vis $field:ident: $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[$fmeta])* $fvis $field: $ty, )*
        }

        impl $name {
            /// Take from `file` each option that flags and environment left open.
            fn or_file(&mut self, file: Self) {
                $( FromFile::or_file(&mut self.$field, file.$field); )*
            }
        }
    };
}

options! {
/// Options of `herdguard proxy`. Durations read as people write them
/// (`500ms`, `10s`, `2m`, `1h 30m`, or bare seconds), sizes too (`64MiB`,
/// `512KiB`, `1GB`, or bare bytes).
#[derive(Debug, Args, Deserialize, Default)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct ProxyArgs {
    /// TOML file with any of these options (long names as keys, e.g.
    /// `upstream = "http://127.0.0.1:8000"`, `trusted-proxies = ["10.0.0.0/8"]`,
    /// `max-body-bytes = "4MiB"`). Flags and environment variables override it.
    #[arg(long, env = "HERDGUARD_CONFIG")]
    #[serde(skip)]
    pub(crate) config: Option<PathBuf>,
    /// Address for clients.
    #[arg(long, env = "HERDGUARD_LISTEN")]
    listen: Option<SocketAddr>,
    /// The API to cache, `http://host[:port]` or `https://host[:port]` (required).
    #[arg(long, env = "HERDGUARD_UPSTREAM")]
    upstream: Option<String>,
    /// PEM file of the CA(s) that sign an https upstream's certificate
    /// [default: the system's root store].
    #[arg(long, env = "HERDGUARD_UPSTREAM_CA")]
    upstream_ca: Option<PathBuf>,
    /// Bound on connecting to the upstream; past it, 504.
    #[arg(long, env = "HERDGUARD_CONNECT_TIMEOUT", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    connect_timeout: Option<Duration>,
    /// Bound on the upstream's response head; past it, 504.
    #[arg(long, env = "HERDGUARD_UPSTREAM_TIMEOUT", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    upstream_timeout: Option<Duration>,
    /// Idle upstream connections are closed after this.
    #[arg(long, env = "HERDGUARD_UPSTREAM_IDLE_TIMEOUT", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    upstream_idle_timeout: Option<Duration>,
    /// Idle upstream connections kept open.
    #[arg(long, env = "HERDGUARD_UPSTREAM_MAX_IDLE")]
    upstream_max_idle: Option<usize>,
    /// Address of the admin listener: /healthz, /readyz, /metrics [default: off].
    #[arg(long, env = "HERDGUARD_ADMIN")]
    admin: Option<SocketAddr>,
    /// With --redis, the admin URL said in Redis for `herdguard top
    /// --redis` [default: http:// and the --admin address].
    #[arg(long, env = "HERDGUARD_ADMIN_ANNOUNCE")]
    admin_announce: Option<String>,
    /// Enables PURGE and POST /.herdguard/purge/tag/{tag} with this token in
    /// X-Purge-Token [default: purge off].
    #[arg(long, env = "HERDGUARD_PURGE_TOKEN", hide_env_values = true)]
    purge_token: Option<String>,
    /// Peers (addresses or CIDR ranges, comma-separated) whose
    /// X-Forwarded-For and -Proto are kept and extended; from anyone else
    /// they are replaced [default: none].
    #[arg(long, env = "HERDGUARD_TRUSTED_PROXIES", value_delimiter = ',')]
    #[serde(default)]
    trusted_proxies: Vec<String>,
    /// Redis for entries and the cluster-wide single flight
    /// (`redis://`, or `rediss://` for TLS) [default: memory only].
    #[arg(long, env = "HERDGUARD_REDIS", conflicts_with_all = ["redis_cluster", "redis_sentinel"])]
    redis: Option<String>,
    /// Redis Cluster seed URLs, comma-separated [default: none].
    #[arg(long, env = "HERDGUARD_REDIS_CLUSTER", value_delimiter = ',', conflicts_with = "redis_sentinel")]
    #[serde(default)]
    redis_cluster: Vec<String>,
    /// Redis Sentinel URLs, comma-separated: the primary is asked of them
    /// and followed through failovers (with --redis-master-name) [default: none].
    #[arg(
        long,
        env = "HERDGUARD_REDIS_SENTINEL",
        value_delimiter = ',',
        requires = "redis_master_name"
    )]
    #[serde(default)]
    redis_sentinel: Vec<String>,
    /// The master name the sentinels of --redis-sentinel monitor.
    #[arg(long, env = "HERDGUARD_REDIS_MASTER_NAME")]
    redis_master_name: Option<String>,
    /// Behind Sentinel, the data nodes' scheme, credentials and database as
    /// a URL whose host is replaced by the primary's
    /// (`rediss://user:pass@primary/0`) [default: redis://, no credentials].
    #[arg(long, env = "HERDGUARD_REDIS_NODE_URL", hide_env_values = true)]
    redis_node_url: Option<String>,
    /// After taking a lease, and before a purge counts as done, wait until
    /// this many replicas have it (`WAIT`), so a failover cannot elect a
    /// second leader or lose an acknowledged purge [default: off].
    #[arg(long, env = "HERDGUARD_REDIS_LEASE_REPLICAS")]
    redis_lease_replicas: Option<usize>,
    /// How long --redis-lease-replicas waits for the replicas.
    #[arg(long, env = "HERDGUARD_REDIS_LEASE_REPLICAS_TIMEOUT", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    redis_lease_replicas_timeout: Option<Duration>,
    /// PEM CA for a `rediss://` Redis with a private CA [default: system roots].
    #[arg(long, env = "HERDGUARD_REDIS_CA")]
    redis_ca: Option<PathBuf>,
    /// Prefix of every Redis key, the library's own default unless set.
    #[arg(long, env = "HERDGUARD_REDIS_NAMESPACE")]
    redis_namespace: Option<String>,
    /// Serve stale while one request updates, for answers that allow it.
    #[arg(long, env = "HERDGUARD_GRACE", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    grace: Option<Duration>,
    /// Freshness of answers without Cache-Control or Expires [default: not cached].
    #[arg(long, env = "HERDGUARD_DEFAULT_TTL", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    default_ttl: Option<Duration>,
    /// Most origin calls at once from this instance (misses, revalidations,
    /// refreshes); a miss queues up to --max-wait for one, then gets 503.
    #[arg(long, env = "HERDGUARD_ORIGIN_BUDGET")]
    origin_budget: Option<usize>,
    /// Most origin calls at once from all instances on the same Redis, so a
    /// fleet of proxies in front of one origin shares its capacity; 0 gives
    /// each instance its own --origin-budget alone [default: --origin-budget
    /// when a Redis is given].
    #[arg(long, env = "HERDGUARD_CLUSTER_ORIGIN_BUDGET")]
    cluster_origin_budget: Option<usize>,
    /// Longest an origin call may take (a flight's response and body; a
    /// call outside a flight, until its response head), after which its
    /// waiters get 504. A crashed instance's cluster budget permit expires
    /// a second after it. --max-wait must not be below it.
    #[arg(long, env = "HERDGUARD_ORIGIN_TIMEOUT", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    origin_timeout: Option<Duration>,
    /// Longest a request waits for another's origin call, or for a budget
    /// permit [default: 65s].
    #[arg(long, env = "HERDGUARD_MAX_WAIT", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    max_wait: Option<Duration>,
    /// The last part of an entry's freshness in which a hot key is
    /// refreshed ahead of expiry (0: never).
    #[arg(long, env = "HERDGUARD_REFRESH_AHEAD")]
    refresh_ahead: Option<f64>,
    /// Failed origin calls in a row that open the breaker (0: no breaker).
    #[arg(long, env = "HERDGUARD_BREAKER_FAILURES")]
    breaker_failures: Option<u32>,
    /// Largest body stored; larger answers stream past the cache.
    #[arg(long, env = "HERDGUARD_MAX_BODY_BYTES", value_parser = parse_bytes)]
    #[serde(default, deserialize_with = "de_bytes")]
    max_body_bytes: Option<u64>,
    /// Memory for entries.
    #[arg(long, env = "HERDGUARD_CAPACITY_BYTES", value_parser = parse_bytes)]
    #[serde(default, deserialize_with = "de_bytes")]
    capacity_bytes: Option<u64>,
    /// Client connections served at once; more wait in the backlog.
    #[arg(long, env = "HERDGUARD_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// Bound on receiving a request head, also the TLS handshake. A client
    /// connection with no new request head and nothing in flight for this
    /// long is closed (HTTP/2: GOAWAY first): silent, slow-header and idle
    /// keep-alive clients alike, after one to two times this.
    #[arg(long, env = "HERDGUARD_HEADER_TIMEOUT", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    header_timeout: Option<Duration>,
    /// Largest request head; HTTP/1.1 answers 431 above it.
    #[arg(long, env = "HERDGUARD_MAX_HEADER_BYTES", value_parser = parse_bytes)]
    #[serde(default, deserialize_with = "de_bytes")]
    max_header_bytes: Option<u64>,
    /// Bound on finishing in-flight requests after SIGTERM or SIGINT.
    #[arg(long, env = "HERDGUARD_SHUTDOWN_TIMEOUT", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    shutdown_timeout: Option<Duration>,
    /// PEM certificate chain: serve TLS, HTTP/2 and HTTP/1.1 by ALPN
    /// (with --tls-key) [default: plain HTTP/1.1 and h2c].
    #[arg(long, env = "HERDGUARD_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "HERDGUARD_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Log format.
    #[arg(long, env = "HERDGUARD_LOG_FORMAT", value_enum)]
    log_format: Option<LogFormat>,
    /// One line per request, buffered and written off the request path:
    /// a file path (appended to), `stdout`, `stderr` or `off`. Lines that
    /// would wait on a slow destination are dropped and counted in
    /// herdguard_access_log_dropped_lines_total.
    #[arg(long, env = "HERDGUARD_ACCESS_LOG")]
    #[serde(default, deserialize_with = "de_access_log")]
    access_log: Option<String>,
    /// Keys listed per measure on the admin port's /hot-keys (requests,
    /// origin calls, waiters, time waited, stale, passes); 0 keeps none.
    #[arg(long, env = "HERDGUARD_HOT_KEYS")]
    hot_keys: Option<usize>,
    /// Name hot keys by their whole URL: queries can hold tokens
    /// [default: false, the path with `?…` for a query].
    #[arg(long, env = "HERDGUARD_HOT_KEY_FULL_URLS", num_args = 0..=1, default_missing_value = "true")]
    hot_key_full_urls: Option<bool>,
}
}

impl ProxyArgs {
    /// Fill what flags and environment left open from the config file.
    fn with_file(mut self) -> Result<Self, String> {
        let Some(path) = &self.config else {
            return Ok(self);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let file: Self = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        self.or_file(file);
        Ok(self)
    }

    fn cache(&self) -> Result<CacheLayer, String> {
        // The scheme the upstream is told is part of the key (settled per
        // request in `normalize`): an answer for plain HTTP (a redirect to
        // HTTPS, http:// links) is never served to HTTPS clients.
        let mut builder =
            CacheLayer::builder().key_header(http::HeaderName::from_static("x-forwarded-proto"));
        if let Some(grace) = self.grace {
            builder = builder.grace(grace);
        }
        if let Some(ttl) = self.default_ttl {
            builder = builder.default_ttl(ttl);
        }
        if let Some(permits) = self.origin_budget {
            builder = builder.origin_budget(permits);
        }
        if let Some(timeout) = self.origin_timeout {
            builder = builder.origin_timeout(timeout);
        }
        if let Some(wait) = self.max_wait {
            builder = builder.max_wait(wait);
        }
        if let Some(fraction) = self.refresh_ahead {
            builder = builder.refresh_ahead(fraction);
        }
        if let Some(failures) = self.breaker_failures {
            builder = builder.origin_breaker(OriginBreaker::default().failures(failures));
        }
        if let Some(k) = self.hot_keys {
            builder = builder.hot_keys(k);
        }
        builder = builder.hot_key_full_urls(self.hot_key_full_urls.unwrap_or(false));
        let body = self.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        builder = builder.max_body_bytes(size("max-body-bytes", body)?);
        let capacity = self.capacity_bytes.unwrap_or(DEFAULT_CAPACITY_BYTES);
        builder = builder.capacity_bytes(size("capacity-bytes", capacity)?);
        let redis = self.redis_options()?;
        if self.cluster_origin_budget.is_some_and(|n| n > 0) && redis.is_none() {
            return Err(
                "--cluster-origin-budget needs --redis, --redis-cluster or --redis-sentinel"
                    .to_owned(),
            );
        }
        if let Some(mut redis) = redis {
            let budget = self.origin_budget.unwrap_or(DEFAULT_ORIGIN_BUDGET);
            match self.cluster_origin_budget.unwrap_or(budget) {
                0 => {}
                permits => redis = redis.cluster_origin_budget(permits),
            }
            if let Some(namespace) = &self.redis_namespace {
                redis = redis.namespace(namespace.as_str());
            }
            if let Some(n) = self.redis_lease_replicas {
                let wait = self
                    .redis_lease_replicas_timeout
                    .unwrap_or(DEFAULT_LEASE_REPLICAS_TIMEOUT);
                redis = redis.lease_replicas(n, wait);
            }
            if let Some(ca) = &self.redis_ca {
                let pem =
                    std::fs::read(ca).map_err(|e| format!("cannot read {}: {e}", ca.display()))?;
                redis = redis.tls_root_cert_pem(pem);
            }
            builder = builder.redis(redis);
        }
        builder.build().map_err(|e| e.to_string())
    }

    /// Which Redis, if any: one URL, a cluster, or the sentinels of a primary.
    fn redis_options(&self) -> Result<Option<RedisOptions>, String> {
        let topologies = [
            self.redis.is_some(),
            !self.redis_cluster.is_empty(),
            !self.redis_sentinel.is_empty(),
        ];
        if topologies.iter().filter(|set| **set).count() > 1 {
            return Err("give one of redis, redis-cluster and redis-sentinel".to_owned());
        }
        if let Some(url) = &self.redis {
            return Ok(Some(RedisOptions::new(url.clone())));
        }
        if !self.redis_cluster.is_empty() {
            return Ok(Some(RedisOptions::cluster(self.redis_cluster.clone())));
        }
        if self.redis_sentinel.is_empty() {
            return Ok(None);
        }
        let name = self
            .redis_master_name
            .as_deref()
            .ok_or("--redis-sentinel needs --redis-master-name")?;
        let mut redis = RedisOptions::sentinel(name, self.redis_sentinel.clone());
        if let Some(node) = &self.redis_node_url {
            redis = redis.node_url(node.clone());
        }
        Ok(Some(redis))
    }

    fn proxy_config(&self, access_log: Option<AccessLog>) -> Result<ProxyConfig, String> {
        let upstream = self
            .upstream
            .as_deref()
            .ok_or("--upstream (or HERDGUARD_UPSTREAM, or `upstream` in --config) is required")?;
        let upstream: Uri = upstream
            .parse()
            .map_err(|e| format!("--upstream {upstream:?}: {e}"))?;
        let mut config = ProxyConfig::new(upstream);
        config.purge_token = self.purge_token.clone();
        config.access_log = access_log;
        config.trusted_proxies = self
            .trusted_proxies
            .iter()
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.parse::<Cidr>())
            .collect::<Result<_, _>>()?;
        let d = UpstreamOptions::default();
        config.upstream_options = UpstreamOptions {
            connect_timeout: self.connect_timeout.unwrap_or(d.connect_timeout),
            response_timeout: self.upstream_timeout.unwrap_or(d.response_timeout),
            idle_timeout: self.upstream_idle_timeout.unwrap_or(d.idle_timeout),
            max_idle: self.upstream_max_idle.unwrap_or(d.max_idle),
            ca_file: self.upstream_ca.clone(),
        };
        Ok(config)
    }

    fn server_config(&self) -> Result<ServerConfig, String> {
        let listen = self.listen.unwrap_or(DEFAULT_LISTEN);
        let d = ServerConfig::new(listen);
        let max_header_bytes = match self.max_header_bytes {
            Some(b) => size("max-header-bytes", b)?,
            None => d.max_header_bytes,
        };
        Ok(ServerConfig {
            listen,
            admin: self.admin,
            max_connections: self.max_connections.unwrap_or(d.max_connections),
            header_timeout: self.header_timeout.unwrap_or(d.header_timeout),
            max_header_bytes,
            shutdown_timeout: self.shutdown_timeout.unwrap_or(d.shutdown_timeout),
            tls: self.tls_cert.clone().zip(self.tls_key.clone()),
        })
    }
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let default = "info";
    let filter = EnvFilter::try_from_env("HERDGUARD_LOG").unwrap_or_else(|_| default.into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// Run the proxy until a signal; exit 0 after a graceful stop, 2 on a
/// configuration or startup error.
pub(crate) fn main(args: ProxyArgs) -> ExitCode {
    let fail = |msg: String| {
        eprintln!("herdguard proxy: {msg}");
        ExitCode::from(2)
    };
    let args = match args.with_file() {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let format = args.log_format.unwrap_or(LogFormat::Text);
    init_logging(format);
    let (access, access_writer) = match start_access_log(&args, format) {
        Ok(started) => started.unzip(),
        Err(e) => return fail(e),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start the runtime: {e}")),
    };
    let result = runtime.block_on(serve(&args, access));
    // After the server stopped: the last requests' lines reach the log.
    if let Some(writer) = access_writer {
        writer.finish();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

/// The access log's writer, unless `--access-log off`.
fn start_access_log(
    args: &ProxyArgs,
    format: LogFormat,
) -> Result<Option<(access_log::AccessLog, access_log::Writer)>, String> {
    let Some(dest) = Destination::parse(args.access_log.as_deref().unwrap_or(DEFAULT_ACCESS_LOG))?
    else {
        return Ok(None);
    };
    let format = match format {
        LogFormat::Text => access_log::Format::Text,
        LogFormat::Json => access_log::Format::Json,
    };
    access_log::start(dest, format).map(Some)
}

/// Build the proxy and serve until a signal; the listening line on stdout
/// once bound.
async fn serve(args: &ProxyArgs, access: Option<access_log::AccessLog>) -> Result<(), String> {
    let server = args.server_config()?;
    // Before the layer, so the gauges it sets when built are recorded.
    let metrics = if server.admin.is_some() {
        Some(server::install_metrics()?)
    } else {
        None
    };
    let config = args.proxy_config(access)?;
    check_upstream_name(&config.upstream).await?;
    let upstream = config.upstream.clone();
    let proxy = Proxy::new(config, args.cache()?)?;
    let memory_only = proxy.cache().redis_connected().is_none();
    server::run(server, proxy, metrics, |bound| {
        let scheme = if args.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        let admin = bound
            .admin
            .map_or_else(|| "off".to_owned(), |a| format!("http://{a}"));
        crate::announce::start(
            args.redis.as_deref(),
            args.redis_namespace.as_deref(),
            args.admin_announce.as_deref(),
            bound.admin,
        );
        // One line on stdout that scripts (and tests) can wait for.
        println!(
            "herdguard proxy listening on {scheme}://{} upstream {upstream} admin {admin} redis {}",
            bound.listen,
            if memory_only { "off" } else { "on" },
        );
    })
    .await
    .map_err(|e| e.to_string())
}

/// Resolve the upstream's name once at startup, so a typo fails now rather
/// than as 502s; later connections resolve it again.
async fn check_upstream_name(upstream: &Uri) -> Result<(), String> {
    let host = upstream.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let https = upstream.scheme_str() == Some("https");
    let port = upstream.port_u16().unwrap_or(if https { 443 } else { 80 });
    match tokio::net::lookup_host((host, port)).await {
        Ok(mut addrs) => match addrs.next() {
            Some(_) => Ok(()),
            None => Err(format!("the upstream host {host:?} has no address")),
        },
        Err(e) => Err(format!("cannot resolve the upstream host {host:?}: {e}")),
    }
}

#[cfg(test)]
#[path = "proxy_cmd_tests.rs"]
mod tests;
