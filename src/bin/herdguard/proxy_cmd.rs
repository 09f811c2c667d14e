//! `herdguard proxy`: flags, environment and config file, mapped onto the
//! shared proxy (`proxy/`). Precedence: flag, then environment variable,
//! then the `--config` file, then the default shown in `--help`.
//! Holds no proxying logic: that is `proxy/`, which must not depend on
//! this file (the example builds `proxy/` without clap).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use herdguard::{CacheLayer, RedisOptions};
use http::Uri;
use serde::Deserialize;

use crate::proxy::access_log::{self, AccessLog, Destination};
use crate::proxy::forwarded::Cidr;
use crate::proxy::server::{self, ServerConfig};
use crate::proxy::upstream::UpstreamOptions;
use crate::proxy::{parse_duration, Proxy, ProxyConfig};

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// Options of `herdguard proxy`. Durations take `500ms`, `10s`, `2m`, `1h`.
#[derive(Debug, Args, Deserialize, Default)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct ProxyArgs {
    /// TOML file with any of these options (long names as keys, e.g.
    /// `upstream = "http://127.0.0.1:8000"`, `trusted-proxies = ["10.0.0.0/8"]`).
    /// Flags and environment variables override it.
    #[arg(long, env = "HERDGUARD_CONFIG")]
    #[serde(skip)]
    pub(crate) config: Option<PathBuf>,
    /// Address for clients [default: 127.0.0.1:8080].
    #[arg(long, env = "HERDGUARD_LISTEN")]
    listen: Option<SocketAddr>,
    /// The API to cache, `http://host[:port]` or `https://host[:port]` (required).
    #[arg(long, env = "HERDGUARD_UPSTREAM")]
    upstream: Option<String>,
    /// PEM file of the CA(s) that sign an https upstream's certificate
    /// [default: the system's root store].
    #[arg(long, env = "HERDGUARD_UPSTREAM_CA")]
    upstream_ca: Option<PathBuf>,
    /// Bound on connecting to the upstream [default: 5s]; past it, 504.
    #[arg(long, env = "HERDGUARD_CONNECT_TIMEOUT", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    connect_timeout: Option<Duration>,
    /// Bound on the upstream's response head [default: 60s]; past it, 504.
    #[arg(long, env = "HERDGUARD_UPSTREAM_TIMEOUT", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    upstream_timeout: Option<Duration>,
    /// Idle upstream connections are closed after this [default: 30s].
    #[arg(long, env = "HERDGUARD_UPSTREAM_IDLE_TIMEOUT", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    upstream_idle_timeout: Option<Duration>,
    /// Idle upstream connections kept open [default: 256].
    #[arg(long, env = "HERDGUARD_UPSTREAM_MAX_IDLE")]
    upstream_max_idle: Option<usize>,
    /// Address of the admin listener: /healthz, /readyz, /metrics [default: off].
    #[arg(long, env = "HERDGUARD_ADMIN")]
    admin: Option<SocketAddr>,
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
    #[arg(long, env = "HERDGUARD_REDIS", conflicts_with = "redis_cluster")]
    redis: Option<String>,
    /// Redis Cluster seed URLs, comma-separated [default: none].
    #[arg(long, env = "HERDGUARD_REDIS_CLUSTER", value_delimiter = ',')]
    #[serde(default)]
    redis_cluster: Vec<String>,
    /// PEM CA for a `rediss://` Redis with a private CA [default: system roots].
    #[arg(long, env = "HERDGUARD_REDIS_CA")]
    redis_ca: Option<PathBuf>,
    /// Prefix of every Redis key [default: proxy].
    #[arg(long, env = "HERDGUARD_REDIS_NAMESPACE")]
    redis_namespace: Option<String>,
    /// Serve stale while one request updates, for answers that allow it [default: 0s].
    #[arg(long, env = "HERDGUARD_GRACE", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    grace: Option<Duration>,
    /// Freshness of answers without Cache-Control or Expires [default: not cached].
    #[arg(long, env = "HERDGUARD_DEFAULT_TTL", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    default_ttl: Option<Duration>,
    /// Largest body stored; larger answers stream past the cache [default: 8388608].
    #[arg(long, env = "HERDGUARD_MAX_BODY_BYTES")]
    max_body_bytes: Option<usize>,
    /// Memory for entries [default: 268435456].
    #[arg(long, env = "HERDGUARD_CAPACITY_BYTES")]
    capacity_bytes: Option<u64>,
    /// Client connections served at once; more wait in the backlog [default: 10000].
    #[arg(long, env = "HERDGUARD_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// Bound on receiving a request head, also the TLS handshake [default: 10s].
    #[arg(long, env = "HERDGUARD_HEADER_TIMEOUT", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    header_timeout: Option<Duration>,
    /// Largest request head; HTTP/1.1 answers 431 above it [default: 65536].
    #[arg(long, env = "HERDGUARD_MAX_HEADER_BYTES")]
    max_header_bytes: Option<usize>,
    /// Bound on finishing in-flight requests after SIGTERM or SIGINT [default: 30s].
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
    /// Log format [default: text].
    #[arg(long, env = "HERDGUARD_LOG_FORMAT", value_enum)]
    log_format: Option<LogFormat>,
    /// One line per request, buffered and written off the request path:
    /// a file path (appended to), `stdout`, `stderr` or `off`
    /// [default: stderr]. Lines that would wait on a slow destination are
    /// dropped and counted in herdguard_access_log_dropped_lines_total.
    #[arg(long, env = "HERDGUARD_ACCESS_LOG")]
    #[serde(default, deserialize_with = "de_access_log")]
    access_log: Option<String>,
}

/// `access-log` in the config file: a string as on the command line, or the
/// older boolean (true: stderr, false: off).
fn de_access_log<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Value {
        Flag(bool),
        Text(String),
    }
    Ok(Option::<Value>::deserialize(d)?.map(|v| match v {
        Value::Flag(on) => on.to_string(),
        Value::Text(s) => s,
    }))
}

fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = Option::<String>::deserialize(d)?;
    s.map(|s| parse_duration(&s).map_err(serde::de::Error::custom))
        .transpose()
}

macro_rules! merge {
    ($a:ident, $b:ident; $($opt:ident),*; $($vec:ident),*) => {
        $( if $a.$opt.is_none() { $a.$opt = $b.$opt.take(); } )*
        $( if $a.$vec.is_empty() { $a.$vec = std::mem::take(&mut $b.$vec); } )*
    };
}

impl ProxyArgs {
    /// Fill what flags and environment left open from the config file.
    fn with_file(mut self) -> Result<Self, String> {
        let Some(path) = &self.config else {
            return Ok(self);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut file: Self =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let a = &mut self;
        merge!(a, file;
            listen, upstream, upstream_ca, connect_timeout, upstream_timeout,
            upstream_idle_timeout, upstream_max_idle, admin, purge_token, redis,
            redis_ca, redis_namespace, grace, default_ttl, max_body_bytes,
            capacity_bytes, max_connections, header_timeout, max_header_bytes,
            shutdown_timeout, tls_cert, tls_key, log_format, access_log;
            trusted_proxies, redis_cluster);
        Ok(self)
    }

    fn cache(&self) -> Result<CacheLayer, String> {
        let mut builder = CacheLayer::builder();
        if let Some(grace) = self.grace {
            builder = builder.grace(grace);
        }
        if let Some(ttl) = self.default_ttl {
            builder = builder.default_ttl(ttl);
        }
        if let Some(bytes) = self.max_body_bytes {
            builder = builder.max_body_bytes(bytes);
        }
        if let Some(bytes) = self.capacity_bytes {
            builder = builder.capacity_bytes(bytes);
        }
        let redis = match (&self.redis, self.redis_cluster.is_empty()) {
            (Some(url), _) => Some(RedisOptions::new(url.clone())),
            (None, false) => Some(RedisOptions::cluster(self.redis_cluster.clone())),
            (None, true) => None,
        };
        if let Some(mut redis) = redis {
            redis = redis.namespace(self.redis_namespace.as_deref().unwrap_or("proxy"));
            if let Some(ca) = &self.redis_ca {
                let pem =
                    std::fs::read(ca).map_err(|e| format!("cannot read {}: {e}", ca.display()))?;
                redis = redis.tls_root_cert_pem(pem);
            }
            builder = builder.redis(redis);
        }
        builder.build().map_err(|e| e.to_string())
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

    fn server_config(&self) -> ServerConfig {
        let listen = self
            .listen
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
        let d = ServerConfig::new(listen);
        ServerConfig {
            listen,
            admin: self.admin,
            max_connections: self.max_connections.unwrap_or(d.max_connections),
            header_timeout: self.header_timeout.unwrap_or(d.header_timeout),
            max_header_bytes: self.max_header_bytes.unwrap_or(d.max_header_bytes),
            shutdown_timeout: self.shutdown_timeout.unwrap_or(d.shutdown_timeout),
            tls: self.tls_cert.clone().zip(self.tls_key.clone()),
        }
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
    let access = match Destination::parse(args.access_log.as_deref().unwrap_or("stderr")) {
        Ok(Some(dest)) => {
            let format = match format {
                LogFormat::Text => access_log::Format::Text,
                LogFormat::Json => access_log::Format::Json,
            };
            match access_log::start(dest, format) {
                Ok(started) => Some(started),
                Err(e) => return fail(e),
            }
        }
        Ok(None) => None,
        Err(e) => return fail(e),
    };
    let (access, access_writer) = access.unzip();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start the runtime: {e}")),
    };
    let result = runtime.block_on(async {
        let server = args.server_config();
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
            // One line on stdout that scripts (and tests) can wait for.
            println!(
                "herdguard proxy listening on {scheme}://{} upstream {upstream} admin {admin} redis {}",
                bound.listen,
                if memory_only { "off" } else { "on" },
            );
        })
        .await
        .map_err(|e| e.to_string())
    });
    // After the server stopped: the last requests' lines reach the log.
    if let Some(writer) = access_writer {
        writer.finish();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
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
