//! Tests of `herdguard proxy`'s arguments and config file.

use clap::{Args, Command};

use super::*;
use crate::proxy_help::show_defaults;
use crate::proxy_values::show_bytes;

fn help() -> String {
    let cmd = show_defaults(ProxyArgs::augment_args(Command::new("proxy")));
    cmd.term_width(1000).render_help().to_string()
}

/// `--help` shows the defaults the code uses: the upstream's, the server's, the library's namespace, the proxy's sizes.
#[test]
fn help_shows_the_codes_defaults() {
    let help = help();
    let upstream = UpstreamOptions::default();
    let server = ServerConfig::new(DEFAULT_LISTEN);
    for shown in [
        format!(
            "[default: {}]",
            humantime::format_duration(upstream.connect_timeout)
        ),
        format!(
            "[default: {}]",
            humantime::format_duration(upstream.response_timeout)
        ),
        format!(
            "[default: {}]",
            humantime::format_duration(server.header_timeout)
        ),
        format!("[default: {}]", server.max_connections),
        format!("[default: {}]", RedisOptions::DEFAULT_NAMESPACE),
        format!("[default: {DEFAULT_LISTEN}]"),
        "[default: 8MiB]".to_owned(),
        "[default: 256MiB]".to_owned(),
        "[default: 64KiB]".to_owned(),
    ] {
        assert!(help.contains(&shown), "{shown} missing from\n{help}");
    }
}

/// Every size `--help` shows reads back as the same number of bytes.
#[test]
fn shown_sizes_read_back() {
    for n in [
        DEFAULT_MAX_BODY_BYTES,
        DEFAULT_CAPACITY_BYTES,
        64 * 1024,
        1000,
        1 << 30,
    ] {
        assert_eq!(parse_bytes(&show_bytes(n)), Ok(n), "{}", show_bytes(n));
    }
}

/// Sizes and durations read as people write them, and bare numbers as plain seconds or bytes.
#[test]
fn sizes_and_durations_read_as_written() {
    assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
    assert_eq!(parse_bytes("512 KiB"), Ok(512 << 10));
    assert_eq!(parse_bytes("1MB"), Ok(1_000_000));
    assert_eq!(parse_bytes("8388608"), Ok(8_388_608));
    assert!(parse_bytes("lots").is_err());
    assert!(parse_bytes("-1").is_err());
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
    assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
    assert_eq!(parse_duration("60"), Ok(Duration::from_secs(60)));
    assert!(parse_duration("5 parsecs").is_err());
    assert!(parse_duration("-5s").is_err());
}

/// The config file can set every option, in the forms people write.
#[test]
fn config_file_sets_every_option() {
    let file = r#"
        listen = "127.0.0.1:9000"
        upstream = "http://127.0.0.1:8000"
        upstream-ca = "/ca.pem"
        connect-timeout = "250ms"
        upstream-timeout = 30
        upstream-idle-timeout = "1m"
        upstream-max-idle = 8
        admin = "127.0.0.1:9001"
        admin-announce = "http://10.0.0.5:9001"
        purge-token = "t"
        trusted-proxies = ["10.0.0.0/8"]
        redis = "redis://127.0.0.1"
        redis-cluster = ["redis://127.0.0.1:7000"]
        redis-sentinel = ["redis://127.0.0.1:26379"]
        redis-master-name = "mymaster"
        redis-node-url = "redis://u:p@primary/0"
        redis-lease-replicas = 1
        redis-lease-replicas-timeout = "50ms"
        redis-ca = "/redis-ca.pem"
        redis-namespace = "ns"
        grace = "10s"
        default-ttl = "5s"
        origin-budget = 32
        cluster-origin-budget = 64
        origin-timeout = "60s"
        max-wait = "70s"
        breaker-failures = 3
        refresh-ahead = 0.1
        max-body-bytes = "4MiB"
        capacity-bytes = 1048576
        max-connections = 10
        header-timeout = "2s"
        max-header-bytes = "16KiB"
        shutdown-timeout = "1s"
        tls-cert = "/cert.pem"
        tls-key = "/key.pem"
        log-format = "json"
        access-log = "off"
        hot-keys = 16
        hot-key-full-urls = true
    "#;
    let file: ProxyArgs = toml::from_str(file).unwrap();
    let mut args = ProxyArgs {
        config: Some("/proxy.toml".into()),
        ..ProxyArgs::default()
    };
    args.or_file(file);
    let shown = format!("{args:?}");
    assert!(!shown.contains("None") && !shown.contains("[]"), "{shown}");
    assert_eq!(args.max_body_bytes, Some(4 << 20));
    assert_eq!(args.capacity_bytes, Some(1 << 20));
    assert_eq!(args.max_header_bytes, Some(16 << 10));
    assert_eq!(args.upstream_timeout, Some(Duration::from_secs(30)));
    assert_eq!(args.connect_timeout, Some(Duration::from_millis(250)));
}

/// What flags or the environment set wins over the file.
#[test]
fn flags_win_over_the_file() {
    let file: ProxyArgs =
        toml::from_str("grace = \"10s\"\ntrusted-proxies = [\"10.0.0.0/8\"]").unwrap();
    let mut args = ProxyArgs {
        grace: Some(Duration::from_secs(1)),
        trusted_proxies: vec!["127.0.0.1".into()],
        ..ProxyArgs::default()
    };
    args.or_file(file);
    assert_eq!(args.grace, Some(Duration::from_secs(1)));
    assert_eq!(args.trusted_proxies, ["127.0.0.1"]);
}

/// Sentinel URLs from the config file build a layer on Sentinel; two
/// topologies at once, or sentinels without a master name, are refused.
#[test]
fn config_file_chooses_one_redis_topology() {
    let sentinel = "redis-sentinel = [\"redis://127.0.0.1:1\", \"redis://127.0.0.1:2\"]";
    let args: ProxyArgs =
        toml::from_str(&format!("{sentinel}\nredis-master-name = \"m\"")).unwrap();
    let redis = args.redis_options().unwrap().unwrap();
    assert!(redis.is_sentinel() && !redis.is_cluster());
    let nameless: ProxyArgs = toml::from_str(sentinel).unwrap();
    assert!(nameless
        .redis_options()
        .unwrap_err()
        .contains("master-name"));
    let both: ProxyArgs =
        toml::from_str(&format!("{sentinel}\nredis = \"redis://127.0.0.1:3\"")).unwrap();
    assert!(both.redis_options().unwrap_err().contains("one of"));
}

/// A cluster budget needs a Redis to live in; `0` (none) needs nothing.
#[test]
fn a_cluster_budget_without_redis_is_refused_unless_none() {
    let some: ProxyArgs = toml::from_str("cluster-origin-budget = 8").unwrap();
    assert!(some.cache().unwrap_err().contains("needs --redis"));
    let none: ProxyArgs = toml::from_str("cluster-origin-budget = 0").unwrap();
    assert!(none.cache().is_ok());
}
