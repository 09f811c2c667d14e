//! The `herdguard` diagnostics CLI against real redis-server processes:
//! inspect, locks (a split made by hand), clock-skew and purge, with their
//! exit codes (0 healthy, 1 problem, 2 usage or connection error).

use herdguard_testkit as support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis;
use herdguard::redlock::Redlock;
use herdguard::{CacheKey, CacheLayer, RedisOptions};
use serde_json::Value as Json;
use support::origin::{cache_status, get_req, send, Origin};
use support::RedisServer;
use tokio::time::Instant;

/// What one run of the binary printed, and its exit code.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Json {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }
}

/// Run the CLI, killed after 30 s at most.
async fn cli(args: &[&str]) -> Run {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_herdguard"))
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), child)
        .await
        .expect("the CLI finishes within 30 s")
        .expect("the CLI runs");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn layer(server: &RedisServer) -> CacheLayer {
    CacheLayer::builder()
        .redis(RedisOptions::new(server.url()).namespace("cli"))
        .build()
        .unwrap()
}

fn value_key(key: &CacheKey) -> String {
    format!("cli:{{{}}}:v", key.to_hex())
}

async fn exists(server: &RedisServer, key: &str) -> bool {
    let mut c = server.connection().await;
    let n: i64 = redis::cmd("EXISTS")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap();
    n == 1
}

/// Wait (at most 2 s) until `key` exists in Redis: the fill is written by the leader's task.
async fn until_stored(server: &RedisServer, key: &str) {
    let start = Instant::now();
    while !exists(server, key).await {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{key} was never stored"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn set(server: &RedisServer, key: &str, value: &[u8]) {
    let mut c = server.connection().await;
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(60_000)
        .query_async(&mut c)
        .await
        .unwrap();
}

// ---------------------------------------------------------------- inspect

/// A filled entry, named by URL (any host case; the port counts, as in the key), is reported fresh with its size, TTLs and fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_filled_entry_by_url() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60"), ("surrogate-key", "t1 t2")]);
    let cache = layer(&server);
    send(&origin.app(cache.clone()), get_req("/item/1?x=2")).await;
    let key = cache.key_for(&get_req("/item/1?x=2"));
    until_stored(&server, &value_key(&key)).await;

    let url = server.url();
    let run = cli(&[
        "--json",
        "inspect",
        "http://EXAMPLE.test/item/1?x=2",
        "--redis",
        &url,
        "--namespace",
        "cli",
    ])
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let j = run.json();
    assert_eq!(j["key"], key.to_hex(), "the layer's own key derivation");
    assert_eq!(j["status"], "fresh");
    assert!(j["stored_bytes"].as_u64().unwrap() > j["payload_bytes"].as_u64().unwrap());
    assert_eq!(j["http_status"], 200);
    assert_eq!(j["tags"], serde_json::json!(["t1", "t2"]));
    let fresh = j["fresh_left_ms"].as_i64().unwrap();
    assert!(fresh > 50_000 && fresh <= 60_000, "fresh left {fresh}");
    // Against the lifetimes written in the entry, not the other PTTL: the
    // two keys get their PX a moment apart, so their PTTLs may cross by 1 ms.
    let lifetime = j["fresh_for_ms"].as_i64().unwrap() + j["stale_for_ms"].as_i64().unwrap();
    let hard = j["hard_ttl_ms"].as_i64().unwrap();
    assert!(
        hard > lifetime - 10_000 && hard <= lifetime,
        "hard TTL {hard} of a {lifetime} ms lifetime"
    );
    assert_eq!(j["lock"]["held"], false);
    assert_eq!(j["fence"]["hw"], j["fence"]["next"]);
    assert!(j["fence"]["hw"].as_u64().unwrap() >= 1);

    let text = cli(&[
        "inspect",
        &key.to_hex(),
        "--redis",
        &url,
        "--namespace",
        "cli",
    ])
    .await;
    assert_eq!(text.code, 0);
    assert!(text.stdout.contains("status      fresh"), "{}", text.stdout);
    assert!(text.stdout.contains("HTTP 200"), "{}", text.stdout);
}

/// A missing entry is reported as missing (healthy), with a held lease's token and PTTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_missing_entry_shows_the_lease_holder() {
    let server = RedisServer::start();
    let key = CacheKey::new("anything");
    set(
        &server,
        &format!("cli:{{{}}}:lock", key.to_hex()),
        b"feedface",
    )
    .await;
    let url = server.url();
    let run = cli(&[
        "--json",
        "inspect",
        &key.to_hex(),
        "--redis",
        &url,
        "--namespace",
        "cli",
    ])
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let j = run.json();
    assert_eq!(j["status"], "missing");
    assert_eq!(j["stored_bytes"], Json::Null);
    assert_eq!(j["lock"]["token"], "feedface");
    assert!(j["lock"]["pttl_ms"].as_i64().unwrap() > 50_000);
}

/// A corrupt entry is reported as corrupt with exit code 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_corrupt_entry_is_a_problem() {
    let server = RedisServer::start();
    let key = CacheKey::new("corrupt");
    set(&server, &value_key(&key), b"HG\x03 this is not an entry").await;
    let url = server.url();
    let run = cli(&[
        "--json",
        "inspect",
        &key.to_hex(),
        "--redis",
        &url,
        "--namespace",
        "cli",
    ])
    .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    let j = run.json();
    assert_eq!(j["status"], "corrupt");
    assert_eq!(j["problems"].as_array().unwrap().len(), 1);
}

/// A response entry in the current encoding with `payload` behind a correct
/// checksum, as a buggy or hostile writer could store it (layout of
/// src/entry/envelope.rs, v3; flag 1: the payload is a stored response).
fn sealed_entry(payload: &[u8]) -> Vec<u8> {
    let mut v = b"HG\x03\x01".to_vec();
    for field in [0u64, 60_000, 0, 1, payload.len() as u64] {
        v.extend_from_slice(&field.to_le_bytes());
    }
    let mut h = blake3::Hasher::new();
    h.update(&v);
    h.update(payload);
    v.extend_from_slice(&h.finalize().as_bytes()[..8]);
    v.extend_from_slice(payload);
    v
}

/// A filled entry cut short, bit-flipped in its body, or sealed around a header count of 30000 is reported corrupt (exit 1), never a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_mutated_entries_are_corrupt_without_crashing() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let cache = layer(&server);
    send(&origin.app(cache.clone()), get_req("/mutated")).await;
    let key = cache.key_for(&get_req("/mutated"));
    until_stored(&server, &value_key(&key)).await;
    let mut c = server.connection().await;
    let good: Vec<u8> = redis::cmd("GET")
        .arg(value_key(&key))
        .query_async(&mut c)
        .await
        .unwrap();
    let truncated = good[..good.len() - 5].to_vec();
    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 0x01;
    // status, age, url key, rules, flags, then a header count of 30000.
    let mut hostile = vec![200, 0, 0, 0, 0, 0];
    hostile.extend_from_slice(&[0; 16 + 12 + 1]);
    hostile.extend_from_slice(&30000u16.to_le_bytes());
    let url = server.url();
    for (what, bytes) in [
        ("truncated", truncated),
        ("flipped", flipped),
        ("30000 headers", sealed_entry(&hostile)),
    ] {
        set(&server, &value_key(&key), &bytes).await;
        let run = cli(&[
            "--json",
            "inspect",
            &key.to_hex(),
            "--redis",
            &url,
            "--namespace",
            "cli",
        ])
        .await;
        assert_eq!(run.code, 1, "{what}: {}", run.stderr);
        assert_eq!(run.json()["status"], "corrupt", "{what}");
    }
}

/// An unreachable Redis is exit 2, and its password is never printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_unreachable_redis_is_exit_2_without_credentials() {
    let mut server = RedisServer::start();
    let url = format!("redis://:hunter2@127.0.0.1:{}", server.port());
    server.stop();
    let run = cli(&["inspect", &"0".repeat(32), "--redis", &url]).await;
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("cannot connect"), "{}", run.stderr);
    assert!(!run.stderr.contains("hunter2") && !run.stdout.contains("hunter2"));
}

/// Arguments that are neither a key nor an absolute URL are a usage error.
#[tokio::test]
async fn bad_arguments_are_exit_2() {
    assert_eq!(
        cli(&["inspect", "/relative", "--redis", "redis://127.0.0.1:1"])
            .await
            .code,
        2
    );
    assert_eq!(cli(&["locks", "job"]).await.code, 2, "--nodes is required");
    assert_eq!(
        cli(&["purge", "--redis", "redis://127.0.0.1:1"]).await.code,
        2
    );
}

// ---------------------------------------------------------------- locks

/// Lock nodes as an operator names them: the default user, since `locks`
/// reads any key named, also other clients' locks outside a namespace.
fn nodes(servers: &[RedisServer]) -> String {
    servers
        .iter()
        .map(RedisServer::admin_url)
        .collect::<Vec<_>>()
        .join(",")
}

fn lock_name(resource: &str) -> String {
    format!("rl:{{{}}}:lock", CacheKey::new(resource).to_hex())
}

/// Two different tokens set by hand on two of three nodes: a split, exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_reports_a_split_made_by_hand() {
    let servers: Vec<_> = (0..3).map(|_| RedisServer::start()).collect();
    set(&servers[0], &lock_name("job"), b"token-a").await;
    set(&servers[1], &lock_name("job"), b"token-b").await;
    let all = nodes(&servers);
    let run = cli(&[
        "--json",
        "locks",
        "job",
        "--nodes",
        &all,
        "--namespace",
        "rl",
    ])
    .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    let j = run.json();
    assert_eq!(j["state"], "split");
    assert_eq!(j["holders"]["token-a"], 1);
    assert_eq!(j["holders"]["token-b"], 1);
    let text = cli(&["locks", "job", "--nodes", &all, "--namespace", "rl"]).await;
    assert_eq!(text.code, 1);
    assert!(text.stdout.contains("SPLIT"), "{}", text.stdout);
}

/// A lock taken by Redlock itself is held on a quorum with one token: exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_accepts_a_healthy_quorum_lock() {
    let servers: Vec<_> = (0..3).map(|_| RedisServer::start()).collect();
    let lock = Redlock::builder(servers.iter().map(RedisServer::url))
        .namespace("rl")
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let lease = lock.acquire("job").await.expect("all nodes are up");
    let run = cli(&[
        "--json",
        "locks",
        "job",
        "--nodes",
        &nodes(&servers),
        "--namespace",
        "rl",
    ])
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let j = run.json();
    assert_eq!(j["state"], "held");
    assert_eq!(j["holders"].as_object().unwrap().len(), 1);
    for node in j["nodes"].as_array().unwrap() {
        assert!(node["pttl_ms"].as_i64().unwrap() > 25_000);
    }
    lock.release(lease).await;
    let run = cli(&[
        "--json",
        "locks",
        "job",
        "--nodes",
        &nodes(&servers),
        "--namespace",
        "rl",
    ])
    .await;
    assert_eq!((run.code, run.json()["state"].clone()), (0, "free".into()));
}

/// One token on one node of three is below the quorum: exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_reports_a_lock_below_quorum() {
    let servers: Vec<_> = (0..3).map(|_| RedisServer::start()).collect();
    set(&servers[2], &lock_name("job"), b"lonely").await;
    let run = cli(&[
        "--json",
        "locks",
        "job",
        "--nodes",
        &nodes(&servers),
        "--namespace",
        "rl",
    ])
    .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(run.json()["state"], "under_quorum");
}

/// A stopped node is reported unreachable (exit 2) while the others still answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_reports_unreachable_nodes() {
    let mut servers: Vec<_> = (0..3).map(|_| RedisServer::start()).collect();
    set(&servers[0], &lock_name("job"), b"tok").await;
    set(&servers[1], &lock_name("job"), b"tok").await;
    let all = nodes(&servers);
    servers[2].stop();
    let run = cli(&[
        "--json",
        "locks",
        "job",
        "--nodes",
        &all,
        "--namespace",
        "rl",
    ])
    .await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    let j = run.json();
    assert_eq!(j["state"], "held", "the quorum is visible anyway");
    assert_eq!(j["nodes"][2]["reachable"], false);
}

// ---------------------------------------------------------------- clock-skew

/// Loopback nodes share this host's clock: the spread is within budget, exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_skew_passes_on_loopback_nodes() {
    let servers: Vec<_> = (0..3).map(|_| RedisServer::start()).collect();
    let run = cli(&[
        "--json",
        "clock-skew",
        "--nodes",
        &nodes(&servers),
        "--samples",
        "5",
    ])
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let j = run.json();
    assert_eq!(j["within_budget"], true);
    assert!(j["spread_ms"].as_f64().unwrap() < 100.0);
    assert_eq!(j["nodes"].as_array().unwrap().len(), 3);
}

/// A frozen node never answers TIME: exit 2 within the timeout, the others still measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_skew_with_a_frozen_node_is_exit_2() {
    let servers: Vec<_> = (0..2).map(|_| RedisServer::start()).collect();
    servers[1].freeze();
    let start = Instant::now();
    let run = cli(&[
        "--json",
        "--timeout-ms",
        "300",
        "clock-skew",
        "--nodes",
        &nodes(&servers),
    ])
    .await;
    servers[1].thaw();
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    let j = run.json();
    assert_eq!(j["nodes"][0]["reachable"], true);
    assert_eq!(j["nodes"][1]["reachable"], false);
}

/// A node whose clock runs 5 s ahead (a stand-in speaking RESP on loopback) blows the budget: exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_skew_over_budget_is_exit_1() {
    let server = RedisServer::start();
    let skewed = skewed_time_server(Duration::from_secs(5));
    let list = format!("{},{skewed}", server.url());
    let run = cli(&[
        "--json",
        "clock-skew",
        "--nodes",
        &list,
        "--budget-ms",
        "500",
    ])
    .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    let j = run.json();
    assert_eq!(j["within_budget"], false);
    let spread = j["spread_ms"].as_f64().unwrap();
    assert!((4_500.0..5_500.0).contains(&spread), "spread {spread}");
}

/// A loopback RESP server that answers TIME with its clock shifted by `ahead`
/// and OK to anything else. Serves a few connections, then stops.
fn skewed_time_server(ahead: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().take(4).flatten() {
            std::thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let mut out = stream.try_clone().unwrap();
                let mut input = BufReader::new(stream);
                while let Some(command) = read_command(&mut input) {
                    let reply = if command.eq_ignore_ascii_case("TIME") {
                        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + ahead;
                        let (s, us) = (now.as_secs().to_string(), now.subsec_micros().to_string());
                        format!("*2\r\n${}\r\n{s}\r\n${}\r\n{us}\r\n", s.len(), us.len())
                    } else {
                        "+OK\r\n".to_owned()
                    };
                    if out.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// The name of the next RESP command (an array of bulk strings), or None at EOF.
fn read_command(input: &mut impl BufRead) -> Option<String> {
    let mut line = String::new();
    input.read_line(&mut line).ok().filter(|n| *n > 0)?;
    let n: usize = line.trim().strip_prefix('*')?.parse().ok()?;
    let mut name = None;
    for _ in 0..n {
        line.clear();
        input.read_line(&mut line).ok()?;
        let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
        let mut buf = vec![0; len + 2];
        input.read_exact(&mut buf).ok()?;
        name.get_or_insert_with(|| String::from_utf8_lossy(&buf[..len]).into_owned());
    }
    name
}

// ---------------------------------------------------------------- purge

/// Fill each `(app, path)` through `cache` and wait until its entry is in Redis.
async fn fill(server: &RedisServer, cache: &CacheLayer, paths: &[(&axum::Router, &str)]) {
    for (app, path) in paths {
        send(app, get_req(path)).await;
        until_stored(server, &value_key(&cache.key_for(&get_req(path)))).await;
    }
}

/// `herdguard <args> --redis <server> --namespace cli`.
async fn purge_cli(server: &RedisServer, args: &[&str]) -> Run {
    let url = server.url();
    cli(&[args, &["--redis", &url, "--namespace", "cli"]].concat()).await
}

/// Purging a URL removes its entry from Redis and leaves other URLs alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_by_url_removes_the_redis_entry() {
    let server = RedisServer::start();
    let origin = Origin::new(&[("cache-control", "max-age=60")]);
    let cache = layer(&server);
    let app = origin.app(cache.clone());
    fill(&server, &cache, &[(&app, "/item/1"), (&app, "/item/2")]).await;
    let run = purge_cli(&server, &["purge", "https://example.test/item/1"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!exists(&server, &value_key(&cache.key_for(&get_req("/item/1")))).await);
    assert!(exists(&server, &value_key(&cache.key_for(&get_req("/item/2")))).await);
}

/// Purging a tag removes every tagged entry from Redis and leaves untagged ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_by_tag_removes_tagged_entries() {
    let server = RedisServer::start();
    let tagged = Origin::new(&[("cache-control", "max-age=60"), ("surrogate-key", "sale")]);
    let plain = Origin::new(&[("cache-control", "max-age=60")]);
    let cache = layer(&server);
    let (ta, pa) = (tagged.app(cache.clone()), plain.app(cache.clone()));
    fill(&server, &cache, &[(&ta, "/a"), (&ta, "/b"), (&pa, "/c")]).await;
    let run = purge_cli(&server, &["--json", "purge", "--tag", "sale"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.json()["purged"]["tag"], "sale");
    for path in ["/a", "/b"] {
        assert!(!exists(&server, &value_key(&cache.key_for(&get_req(path)))).await);
    }
    assert!(exists(&server, &value_key(&cache.key_for(&get_req("/c")))).await);
}

/// `purge --soft` by URL keeps the entry in Redis, stale from now on: an
/// instance with no copy of its own is answered it stale (one refresh
/// started), and another URL stays a hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_purge_by_url_keeps_the_entry_stale() {
    let server = RedisServer::start();
    // A slow origin: the refresh the stale answer starts must not land
    // before the request reads its flight, or it is answered fresh instead
    // (correct, but not what this test looks at).
    let origin = Origin::new(&[("cache-control", "max-age=60, stale-while-revalidate=30")])
        .delay(Duration::from_millis(500));
    let cache = layer(&server);
    let app = origin.app(cache.clone());
    fill(&server, &cache, &[(&app, "/item/1"), (&app, "/item/2")]).await;
    let run = purge_cli(&server, &["purge", "--soft", "https://example.test/item/1"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.starts_with("soft-purged every variant"),
        "{}",
        run.stdout
    );
    assert!(exists(&server, &value_key(&cache.key_for(&get_req("/item/1")))).await);
    let other = origin.app(layer(&server));
    let (_, h, _) = send(&other, get_req("/item/1")).await;
    let status = cache_status(&h);
    assert!(
        status.contains("fwd=stale") && status.contains("detail=soft-purge"),
        "{status}"
    );
    let (_, h, _) = send(&other, get_req("/item/2")).await;
    assert!(
        cache_status(&h).starts_with("herdguard; hit"),
        "{}",
        cache_status(&h)
    );
}

/// `purge --soft --tag` marks only the tagged entries stale, and says so in its JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_purge_by_tag_marks_tagged_entries_stale() {
    let server = RedisServer::start();
    let swr = ("cache-control", "max-age=60, stale-while-revalidate=30");
    // Slow, as in the test above: the stale answer goes out before the
    // refresh lands.
    let tagged = Origin::new(&[swr, ("surrogate-key", "sale")]).delay(Duration::from_millis(500));
    let plain = Origin::new(&[swr]);
    let cache = layer(&server);
    let (ta, pa) = (tagged.app(cache.clone()), plain.app(cache.clone()));
    fill(&server, &cache, &[(&ta, "/a"), (&pa, "/c")]).await;
    let run = purge_cli(&server, &["--json", "purge", "--tag", "sale", "--soft"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.json()["purged"]["tag"], "sale");
    assert_eq!(run.json()["soft"], true);
    let fresh = layer(&server);
    let (_, h, _) = send(&tagged.app(fresh.clone()), get_req("/a")).await;
    assert!(
        cache_status(&h).contains("detail=soft-purge"),
        "{} {:?}",
        cache_status(&h),
        fresh.stats()
    );
    let (_, h, _) = send(&plain.app(fresh), get_req("/c")).await;
    assert!(
        cache_status(&h).starts_with("herdguard; hit"),
        "{}",
        cache_status(&h)
    );
}

/// A purge against a Redis that is down is exit 2 with the reason, within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_with_redis_down_is_exit_2() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.stop();
    let run = cli(&[
        "purge",
        "--tag",
        "x",
        "--redis",
        &url,
        "--timeout-ms",
        "300",
    ])
    .await;
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("cannot connect"), "{}", run.stderr);
}

// ---------------------------------------------------------------- raw keys

/// The lock key of the redis-cli recipes, made by other clients.
const FOREIGN_LOCK: &str = "lock:rebuild:{42}";

/// A foreign lock key held with two tokens on two of three nodes is read as given and reported split, with each node's token and PTTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_reads_a_foreign_lock_key_as_given() {
    let servers: Vec<_> = (0..3).map(|_| RedisServer::start()).collect();
    set(&servers[0], FOREIGN_LOCK, b"token-a").await;
    set(&servers[1], FOREIGN_LOCK, b"token-b").await;
    let all = nodes(&servers);
    let run = cli(&["--json", "locks", FOREIGN_LOCK, "--nodes", &all]).await;
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let j = run.json();
    assert_eq!(
        (&j["key"], &j["key_form"]),
        (&FOREIGN_LOCK.into(), &"as_given".into())
    );
    assert_eq!(j["state"], "split");
    let n = &j["nodes"];
    assert_eq!(
        (&n[0]["token"], &n[1]["token"]),
        (&"token-a".into(), &"token-b".into())
    );
    for held in [&n[0], &n[1]] {
        let pttl = held["pttl_ms"].as_i64().unwrap();
        assert!(pttl > 50_000 && pttl <= 60_000, "pttl {pttl}");
    }
    assert_eq!(n[2]["token"], Json::Null);
    let text = cli(&["locks", FOREIGN_LOCK, "--nodes", &all]).await;
    assert!(text.stdout.contains("SPLIT"), "{}", text.stdout);
    assert!(text.stdout.contains("token-a"), "{}", text.stdout);
}

/// `--raw` reads the name verbatim where a Redlock resource lock of the same name also exists (which alone is ambiguous, exit 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_raw_takes_the_key_verbatim() {
    let servers: Vec<_> = (0..3).map(|_| RedisServer::start()).collect();
    for s in &servers[..2] {
        set(s, "job", b"theirs").await;
        set(s, &lock_name("job"), b"ours").await;
    }
    let all = nodes(&servers);
    let args = [
        "--json",
        "locks",
        "job",
        "--nodes",
        &all,
        "--namespace",
        "rl",
    ];
    let ambiguous = cli(&args).await;
    assert_eq!(ambiguous.code, 2, "{}", ambiguous.stdout);
    assert!(
        ambiguous.stderr.contains("ambiguous"),
        "{}",
        ambiguous.stderr
    );
    let run = cli(&[&args[..], &["--raw"]].concat()).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let j = run.json();
    assert_eq!((&j["key"], &j["state"]), (&"job".into(), &"held".into()));
    assert_eq!(j["holders"]["theirs"], 2);
}

/// A key that is no string is flagged as not a lock: exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_flags_a_key_that_is_not_a_lock() {
    let server = RedisServer::start();
    let mut c = server.connection().await;
    let _: () = redis::cmd("HSET")
        .arg(FOREIGN_LOCK)
        .arg("f")
        .arg("v")
        .query_async(&mut c)
        .await
        .unwrap();
    let run = cli(&["--json", "locks", FOREIGN_LOCK, "--nodes", &server.url()]).await;
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert_eq!(run.json()["nodes"][0]["type"], "hash");
}

/// inspect reads an existing foreign key as given: type, token and PTTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reads_a_foreign_key_as_given() {
    let server = RedisServer::start();
    set(&server, FOREIGN_LOCK, b"token-a").await;
    let url = server.url();
    let run = cli(&["--json", "inspect", FOREIGN_LOCK, "--redis", &url]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let j = run.json();
    assert_eq!(
        (&j["type"], &j["value"]),
        (&"string".into(), &"token-a".into())
    );
    assert!(j["pttl_ms"].as_i64().unwrap() > 50_000);
    let text = cli(&["inspect", FOREIGN_LOCK, "--redis", &url]).await;
    assert!(text.stdout.contains("token-a"), "{}", text.stdout);
}

/// A name that is no key yet is a usage error, unless `--raw` asks for it: then it is reported missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_raw_reports_a_missing_key() {
    let server = RedisServer::start();
    let url = server.url();
    let guessed = cli(&["inspect", "lock:none", "--redis", &url]).await;
    assert_eq!(guessed.code, 2);
    assert!(guessed.stderr.contains("--raw"), "{}", guessed.stderr);
    let run = cli(&["--json", "inspect", "lock:none", "--raw", "--redis", &url]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        (&run.json()["status"], &run.json()["type"]),
        (&"missing".into(), &"none".into())
    );
}

/// Each subcommand's --help lists only its own options: the diagnostics' --json and --timeout-ms are not the proxy's.
#[tokio::test]
async fn help_lists_only_the_subcommands_own_options() {
    let proxy = cli(&["proxy", "--help"]).await;
    assert_eq!(proxy.code, 0, "{}", proxy.stderr);
    assert!(proxy.stdout.contains("--upstream"), "{}", proxy.stdout);
    assert!(!proxy.stdout.contains("--json"), "{}", proxy.stdout);
    assert!(!proxy.stdout.contains("--timeout-ms"), "{}", proxy.stdout);
    for diagnostic in ["inspect", "locks", "clock-skew", "purge"] {
        let help = cli(&[diagnostic, "--help"]).await;
        assert_eq!(help.code, 0, "{}", help.stderr);
        assert!(
            help.stdout.contains("--json"),
            "{diagnostic}: {}",
            help.stdout
        );
        assert!(
            help.stdout.contains("--timeout-ms"),
            "{diagnostic}: {}",
            help.stdout
        );
    }
}

/// `proxy --help` shows the defaults from the code (the library's Redis namespace, sizes as people write them), and so do the diagnostics' `--namespace`.
#[tokio::test]
async fn help_shows_defaults_from_the_code() {
    let proxy = cli(&["proxy", "--help"]).await;
    assert_eq!(proxy.code, 0, "{}", proxy.stderr);
    let namespace = format!("[default: {}]", RedisOptions::DEFAULT_NAMESPACE);
    let flat = proxy
        .stdout
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(flat.contains(&namespace), "{flat}");
    assert!(flat.contains("[default: 8MiB]"), "{flat}");
    assert!(flat.contains("[default: 5s]"), "{flat}");
    let inspect = cli(&["inspect", "--help"]).await;
    let flat = inspect
        .stdout
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(flat.contains(&namespace), "{flat}");
}
