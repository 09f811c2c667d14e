//! A real Sentinel topology on loopback: one primary, its replicas and three
//! `redis-sentinel` processes watching it, with a short
//! `down-after-milliseconds` and `failover-timeout` so a failover completes
//! in a few seconds. Every process is stopped by its PID when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use deadpool_redis::redis;

use super::{answers_on, free_port, RedisServer, ACL_PASSWORD, ACL_USER};

/// The name the sentinels monitor the primary under.
pub const MASTER_NAME: &str = "herdguard-primary";

/// How long the sentinels wait before calling an unanswering primary down.
pub const DOWN_AFTER: Duration = Duration::from_millis(500);

/// The default user's password on every node of a set started
/// [`with_auth`](SentinelSet::start_with_auth): for the test, the replicas
/// and the sentinels, never for the code under test.
const NODE_ADMIN_PASSWORD: &str = "node-admin-Kq27";
/// The sentinels' default user's password (they log in to each other with it).
const SENTINEL_PEER_PASSWORD: &str = "sentinel-peer-Vt64";
/// The sentinels' ACL user for the code under test: another user than the
/// data nodes' ([`ACL_USER`]), allowed only what docs/operations.md says the
/// layer sends to a sentinel.
const SENTINEL_USER: &str = "herdguard-sentinel";
const SENTINEL_PASSWORD: &str = "sentinel-Jw58";

/// A primary, its replicas and three sentinels.
pub struct SentinelSet {
    /// Every data node; the first is the primary the sentinels start with.
    servers: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
    /// Whether sentinels and data nodes require credentials.
    auth: bool,
}

/// One `redis-sentinel` process and its directory (it rewrites its config).
struct SentinelProcess {
    port: u16,
    child: Child,
    dir: PathBuf,
    /// The default user's password, if the sentinel requires one.
    password: Option<&'static str>,
}

fn sentinel_binary() -> &'static str {
    match Command::new("redis-sentinel").arg("--version").output() {
        Ok(o) if o.status.success() => "redis-sentinel",
        _ => panic!(
            "redis-sentinel is not installed: run `apt-get install -y redis-sentinel` \
             (`bash .ci/run` installs it)"
        ),
    }
}

impl SentinelProcess {
    /// A sentinel on a free port, once it answers there itself (the port
    /// may be taken meanwhile by another process: then a new one is tried).
    fn start(primary: u16, failover_timeout: Duration, auth: bool) -> Self {
        (0..5)
            .find_map(|_| Self::start_on(free_port(), primary, failover_timeout, auth))
            .expect("redis-sentinel did not start on any of 5 free ports within 10 s each")
    }

    fn start_on(port: u16, primary: u16, failover_timeout: Duration, auth: bool) -> Option<Self> {
        let dir =
            std::env::temp_dir().join(format!("herdguard-sentinel-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create sentinel dir");
        let conf = dir.join("sentinel.conf");
        let down = DOWN_AFTER.as_millis();
        let failover = failover_timeout.as_millis();
        let mut text = format!(
            "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\n\
             loglevel warning\ndir {dir}\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} {down}\n\
             sentinel failover-timeout {MASTER_NAME} {failover}\n\
             sentinel parallel-syncs {MASTER_NAME} 2\n",
            dir = dir.display(),
        );
        if auth {
            // The `user` rules are what docs/operations.md lists for the
            // sentinels (GET-MASTER-ADDR-BY-NAME, SUBSCRIBE +switch-master,
            // PING): a layer that needs more fails this set.
            text.push_str(&format!(
                "requirepass {SENTINEL_PEER_PASSWORD}\n\
                 sentinel sentinel-pass {SENTINEL_PEER_PASSWORD}\n\
                 sentinel auth-pass {MASTER_NAME} {NODE_ADMIN_PASSWORD}\n\
                 user {SENTINEL_USER} on >{SENTINEL_PASSWORD} -@all \
                 +sentinel|get-master-addr-by-name +subscribe +ping &+switch-master\n"
            ));
        }
        std::fs::write(&conf, text).expect("write sentinel.conf");
        let mut child = Command::new(sentinel_binary())
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-sentinel");
        let password = auth.then_some(SENTINEL_PEER_PASSWORD);
        let ours = answers_on(&mut child, port, password);
        let started = Self {
            port,
            child,
            dir,
            password,
        };
        ours.then_some(started)
    }

    /// The default user, for the set's own queries.
    fn admin_url(&self) -> String {
        match self.password {
            Some(pw) => format!("redis://:{pw}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One command on the node at `url`, every step bounded by 1 s; `None` when
/// the node does not answer.
fn query<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> Option<T> {
    let bound = Duration::from_secs(1);
    let client = redis::Client::open(url).ok()?;
    let mut conn = client.get_connection_with_timeout(bound).ok()?;
    conn.set_read_timeout(Some(bound)).ok()?;
    conn.set_write_timeout(Some(bound)).ok()?;
    cmd.query(&mut conn).ok()
}

/// The `role:` of a data node (`master`, `slave`), if it answers.
fn role(node: &RedisServer) -> Option<String> {
    let info: String = query(&node.admin_url(), redis::cmd("INFO").arg("replication"))?;
    info.lines()
        .find_map(|l| l.strip_prefix("role:"))
        .map(|r| r.trim().to_owned())
}

impl SentinelSet {
    /// A primary with `replicas` replicas (1 or 2) and three sentinels (quorum
    /// 2). Blocking: returns once every replica is linked and every sentinel
    /// knows the other two and every replica, so a failover can start as soon
    /// as the primary dies (bounded: panics after 30 s).
    pub fn start(replicas: usize) -> Self {
        Self::start_through(replicas, |primary| primary, Duration::from_secs(5))
    }

    /// Like [`start`](Self::start), with credentials everywhere and a
    /// different user on each tier: the sentinels' default user has a
    /// password (they log in to each other with it) and the code under test
    /// gets their own ACL user ([`sentinel_urls`](Self::sentinel_urls)); the
    /// data nodes' default user has another password (the sentinels and the
    /// replicas log in with it) and the code under test is the documented
    /// ACL user ([`node_url`](Self::node_url)).
    pub fn start_with_auth(replicas: usize) -> Self {
        Self::start_inner(replicas, |primary| primary, Duration::from_secs(5), true)
    }

    /// Like [`start`](Self::start), but the replicas replicate from the port
    /// `link` returns for the primary's port (a forwarder a test can cut,
    /// such as [`crate::Vip`]). The sentinels fix a replica that replicates
    /// from another address than the primary's once `failover_timeout` has
    /// passed (`+fix-slave-config`), so give a long one (and the sentinels
    /// still fail over within seconds).
    pub fn start_through(
        replicas: usize,
        link: impl FnOnce(u16) -> u16,
        failover_timeout: Duration,
    ) -> Self {
        Self::start_inner(replicas, link, failover_timeout, false)
    }

    fn start_inner(
        replicas: usize,
        link: impl FnOnce(u16) -> u16,
        failover_timeout: Duration,
        auth: bool,
    ) -> Self {
        // `--masterauth` on the primary too: after a failover it replicates.
        let auth_args: &[&str] = if auth {
            &[
                "--requirepass",
                NODE_ADMIN_PASSWORD,
                "--masterauth",
                NODE_ADMIN_PASSWORD,
            ]
        } else {
            &[]
        };
        let primary = RedisServer::start_with(auth_args);
        let port = link(primary.port()).to_string();
        let mut servers = vec![primary];
        for _ in 0..replicas {
            let mut args = vec!["--replicaof", "127.0.0.1", &port];
            args.extend_from_slice(auth_args);
            servers.push(RedisServer::start_with(&args));
        }
        let set = Self {
            sentinels: (0..3)
                .map(|_| SentinelProcess::start(servers[0].port(), failover_timeout, auth))
                .collect(),
            servers,
            auth,
        };
        set.wait_ready(replicas, Duration::from_secs(30));
        set
    }

    fn wait_ready(&self, replicas: usize, bound: Duration) {
        let deadline = Instant::now() + bound;
        let linked = |s: &RedisServer| {
            let info: Option<String> = query(&s.admin_url(), redis::cmd("INFO").arg("replication"));
            info.is_some_and(|i| i.contains("master_link_status:up"))
        };
        let knows_all = |p: &SentinelProcess| {
            let fields: Option<Vec<String>> = query(
                &p.admin_url(),
                redis::cmd("SENTINEL").arg("MASTER").arg(MASTER_NAME),
            );
            let field = |name: &str| {
                fields.as_ref().and_then(|f| {
                    let i = f.iter().position(|x| x == name)?;
                    f.get(i + 1)?.parse::<usize>().ok()
                })
            };
            field("num-other-sentinels") == Some(2) && field("num-slaves") == Some(replicas)
        };
        loop {
            if self.servers[1..].iter().all(linked) && self.sentinels.iter().all(knows_all) {
                return;
            }
            if Instant::now() >= deadline {
                let seen: Vec<Option<Vec<String>>> = self
                    .sentinels
                    .iter()
                    .map(|p| {
                        query(
                            &p.admin_url(),
                            redis::cmd("SENTINEL").arg("MASTER").arg(MASTER_NAME),
                        )
                    })
                    .collect();
                let links: Vec<bool> = self.servers[1..].iter().map(linked).collect();
                panic!(
                    "the sentinel topology was not ready within {bound:?}: replicas linked {links:?}, sentinels {seen:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The URLs of the three sentinels: no credentials, or the sentinels'
    /// ACL user for a set started [`with_auth`](Self::start_with_auth).
    pub fn sentinel_urls(&self) -> Vec<String> {
        let login = if self.auth {
            format!("{SENTINEL_USER}:{SENTINEL_PASSWORD}@")
        } else {
            String::new()
        };
        self.sentinels
            .iter()
            .map(|s| format!("redis://{login}127.0.0.1:{}", s.port))
            .collect()
    }

    /// Every password a set started [`with_auth`](Self::start_with_auth)
    /// uses, for tests that check none is shown.
    pub fn passwords(&self) -> [&'static str; 4] {
        [
            NODE_ADMIN_PASSWORD,
            SENTINEL_PEER_PASSWORD,
            SENTINEL_PASSWORD,
            ACL_PASSWORD,
        ]
    }

    /// How the code under test reaches the data nodes: as the documented
    /// ACL user (see [`RedisServer::url`]), host and port left to Sentinel.
    pub fn node_url(&self) -> String {
        format!("redis://{ACL_USER}:{ACL_PASSWORD}@localhost")
    }

    /// The ports of the three sentinels.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The name the sentinels monitor the primary under.
    pub fn master_name(&self) -> &'static str {
        MASTER_NAME
    }

    /// The data node on `port`.
    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .expect("a data node of this set")
    }

    /// Every data node, the first primary first.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The primary's port as the sentinel at `index` reports it.
    pub fn primary_seen_by(&self, index: usize) -> Option<u16> {
        let addr: Option<(String, u16)> = query(
            &self.sentinels[index].admin_url(),
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(MASTER_NAME),
        );
        addr.map(|(_, port)| port)
    }

    /// The primary's port, as the first sentinel that answers reports it.
    pub fn primary_port(&self) -> u16 {
        (0..self.sentinels.len())
            .find_map(|i| self.primary_seen_by(i))
            .expect("a sentinel that answers")
    }

    /// SIGKILL the current primary (and wait for it to exit); its port.
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.primary_port();
        self.servers
            .iter_mut()
            .find(|s| s.port() == port)
            .expect("the primary is a data node of this set")
            .stop();
        port
    }

    /// SIGSTOP the current primary: its port still accepts connections but
    /// nothing answers (a hung host, a partition); its port.
    pub fn freeze_primary(&self) -> u16 {
        let port = self.primary_port();
        self.server(port).freeze();
        port
    }

    /// Start the data node on `port` again (after `kill_primary`): it comes
    /// back as a primary of nothing, until the sentinels make it a replica.
    pub fn restart(&mut self, port: u16) {
        self.servers
            .iter_mut()
            .find(|s| s.port() == port)
            .expect("a data node of this set")
            .restart();
    }

    /// Wait (at most `bound`) until every sentinel names a primary other than
    /// `old` and that node says it is a master: the new primary's port and
    /// when it was first seen so.
    pub fn wait_for_promotion(&self, old: u16, bound: Duration) -> (u16, Instant) {
        let deadline = Instant::now() + bound;
        loop {
            let seen: Vec<Option<u16>> = (0..self.sentinels.len())
                .map(|i| self.primary_seen_by(i))
                .collect();
            if let Some(Some(new)) = seen.first() {
                let agreed = seen.iter().all(|s| *s == Some(*new));
                if *new != old && agreed && role(self.server(*new)).as_deref() == Some("master") {
                    return (*new, Instant::now());
                }
            }
            assert!(
                Instant::now() < deadline,
                "no promotion within {bound:?}: the sentinels name {seen:?} (old {old})"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A failover: SIGKILL the primary, then wait (at most `bound` each)
    /// for the promotion and for every other live replica to follow the new
    /// primary, so it has a replica again. Blocking (run it off the
    /// runtime). The old primary's port and the new one's.
    pub fn fail_over(&mut self, bound: Duration) -> (u16, u16) {
        let old = self.kill_primary();
        let (new, _) = self.wait_for_promotion(old, bound);
        let others: Vec<u16> = self
            .servers
            .iter()
            .map(RedisServer::port)
            .filter(|p| *p != old && *p != new)
            .collect();
        for port in others {
            self.wait_for_replica(port, bound);
        }
        (old, new)
    }

    /// Wait (at most `bound`) until the node on `port` is a replica linked to
    /// the current primary (one the sentinels reconfigured after a failover).
    pub fn wait_for_replica(&self, port: u16, bound: Duration) {
        let deadline = Instant::now() + bound;
        loop {
            let primary = format!("master_port:{}", self.primary_port());
            let info: Option<String> = query(
                &self.server(port).admin_url(),
                redis::cmd("INFO").arg("replication"),
            );
            if info.is_some_and(|i| {
                i.contains("role:slave")
                    && i.contains("master_link_status:up")
                    && i.lines().any(|l| l.trim() == primary)
            }) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{port} never became a linked replica within {bound:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
