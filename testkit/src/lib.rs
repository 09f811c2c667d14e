//! Test support: real `redis-server` (and `redis-sentinel`) processes on free
//! loopback ports, and a small counting origin. Servers are stopped when dropped.
//!
//! A crate of its own (unpublished) so the library's tests and
//! herdguard-cli's share it without `#[path]`. The stream helpers are
//! [`stream`].

pub mod cluster;
pub mod echo;
pub mod faulty;
mod link;
pub mod logs;
pub mod origin;
pub mod proxy_process;
pub mod sentinel;
pub mod stream;
pub mod tls;

pub use link::{SlowLink, Vip};

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use deadpool_redis::redis;

/// A `redis-server` we started: no persistence, loopback only.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
}

const ACL_USER: &str = "herdguard";
const ACL_PASSWORD: &str = "herdguard-test";

/// The rules of the `ACL SETUSER herdguard ...` line of docs/operations.md,
/// for any namespace, as `redis-server --user` takes them; on a cluster node
/// with what the same page says to add on Redis Cluster.
fn documented_user(cluster: bool) -> Vec<String> {
    let doc = include_str!("../../docs/operations.md");
    let line = doc
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("ACL SETUSER herdguard "))
        .expect("docs/operations.md has the ACL SETUSER herdguard line");
    let mut rules: Vec<String> = line
        .split_whitespace()
        .skip(2)
        .map(|w| {
            w.replace("NAMESPACE", "*")
                .replace("PASSWORD", ACL_PASSWORD)
        })
        .collect();
    if cluster {
        let added = doc
            .split("On Redis Cluster add `")
            .nth(1)
            .and_then(|rest| rest.split('`').next())
            .expect("docs/operations.md says what to add on Redis Cluster");
        rules.extend(added.split_whitespace().map(str::to_owned));
    }
    rules
}

/// A loopback port nothing listens on now, and never handed out before by
/// this process (a port just released may come back from the kernel, and two
/// servers given one port would look like one).
fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral loopback port");
        let port = l.local_addr().expect("local addr").port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// The `process_id` of whatever Redis (or sentinel) answers on `port`, so a
/// test knows the server it started answers there and not another
/// process's that took the port first. `password` is the default user's,
/// when the server requires one.
fn pid_on(port: u16, password: Option<&str>) -> Option<u32> {
    let mut s =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
            .ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    if let Some(pw) = password {
        // Its `+OK` comes before the INFO text, which is searched below.
        s.write_all(format!("AUTH {pw}\r\n").as_bytes()).ok()?;
    }
    s.write_all(b"INFO server\r\n").ok()?;
    let (mut buf, mut chunk) = (Vec::new(), [0u8; 4096]);
    while buf.len() < 64 * 1024 {
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        if let Some((line, _)) = text
            .split_once("process_id:")
            .and_then(|(_, rest)| rest.split_once("\r\n"))
        {
            return line.trim().parse().ok();
        }
    }
    None
}

/// Wait (at most 10 s) until `child`, started on `port`, answers there
/// itself (logged in with `password`, if any); false when it exited or
/// another process answers.
fn answers_on(child: &mut Child, port: u16, password: Option<&str>) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return false;
        }
        if let Some(pid) = pid_on(port, password) {
            return pid == child.id();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn redis_server_binary() -> &'static str {
    match Command::new("redis-server").arg("--version").output() {
        Ok(o) if o.status.success() => "redis-server",
        _ => panic!(
            "redis-server is not installed: run `apt-get install -y redis-server` \
             (the tests start their own servers on free loopback ports; `bash .ci/run` installs it)"
        ),
    }
}

impl RedisServer {
    /// Start a server on a free loopback port and wait until it answers PING.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Start with extra `redis-server` arguments (e.g. `["--replicaof", ...]`).
    pub fn start_with(extra: &[&str]) -> Self {
        for _ in 0..5 {
            let mut s = Self::on_port(free_port(), extra);
            if s.spawn() {
                return s;
            }
        }
        panic!("redis-server did not start on any of 5 free ports within 10 s each");
    }

    fn on_port(port: u16, extra: &[&str]) -> Self {
        let dir =
            std::env::temp_dir().join(format!("herdguard-redis-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create redis dir");
        Self {
            port,
            child: None,
            dir,
            extra: extra.iter().map(|a| a.to_string()).collect(),
        }
    }

    /// Start the process on our port; whether it is the one answering there.
    fn spawn(&mut self) -> bool {
        let bin = redis_server_binary();
        let port = self.port.to_string();
        let mut cmd = Command::new(bin);
        cmd.args([
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args([
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ])
        .arg("--dir")
        .arg(&self.dir)
        // The user the layers under test connect as: exactly the commands
        // docs/operations.md lists, so every Redis test runs on that list
        // and the list cannot drift (admin work uses the default user).
        .arg("--user")
        .args(documented_user(
            self.extra.iter().any(|a| a == "--cluster-enabled"),
        ))
        .args(&self.extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("spawn redis-server");
        let ours = answers_on(&mut child, self.port, self.admin_password());
        self.child = Some(child);
        if !ours {
            self.stop();
        }
        ours
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of the documented ACL user (see `documented_user`): what
    /// the code under test connects with.
    pub fn url(&self) -> String {
        format!("redis://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{}", self.port)
    }

    /// The default user, allowed everything: for the test's own inspection
    /// and tampering, and for tools that need more than the cache does.
    pub fn admin_url(&self) -> String {
        match self.admin_password() {
            Some(pw) => format!("redis://:{pw}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The default user's password, if started with `--requirepass`.
    fn admin_password(&self) -> Option<&str> {
        let at = self.extra.iter().position(|a| a == "--requirepass")?;
        self.extra.get(at + 1).map(String::as_str)
    }

    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .map(Child::id)
            .expect("server is running")
    }

    /// Kill the server (SIGKILL) and wait for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again on the same port (after `stop`).
    pub fn restart(&mut self) {
        self.stop();
        assert!(
            self.spawn(),
            "redis-server did not start again on port {} within 10 s",
            self.port
        );
    }

    /// Freeze the process with SIGSTOP: the port accepts nothing it answers.
    pub fn freeze(&self) {
        signal(self.pid(), "-STOP");
    }

    /// Resume a frozen process with SIGCONT.
    pub fn thaw(&self) {
        signal(self.pid(), "-CONT");
    }

    /// A direct connection for inspecting or tampering with keys.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        let client = redis::Client::open(self.admin_url()).expect("client");
        client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to test redis")
    }

    /// A replica of `master` (`--replicaof`), returned once its link is up.
    pub async fn start_replica_of(master: &RedisServer) -> Self {
        let port = master.port.to_string();
        let replica = Self::start_with(&["--replicaof", "127.0.0.1", &port]);
        let mut c = replica.connection().await;
        let start = Instant::now();
        while info_field(&mut c, "replication", "master_link_status").await != "up" {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "replica of {port} never linked up"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        replica
    }

    /// Wait (at most 5 s) until every write so far reached `replicas` replicas.
    /// `WAIT` waits for the writes of its own connection only (on a new one
    /// it returns at once), so a mark is written on it first: replication is
    /// one ordered stream, and replicas that have the mark have every write
    /// before it, from any connection.
    pub async fn wait_replicated(&self, replicas: i64) {
        let mut c = self.connection().await;
        let _: () = redis::cmd("SET")
            .arg("herdguard-testkit:replicated")
            .arg(1)
            .query_async(&mut c)
            .await
            .expect("SET the mark");
        let acked: i64 = redis::cmd("WAIT")
            .arg(replicas)
            .arg(5000)
            .query_async(&mut c)
            .await
            .expect("WAIT");
        assert!(acked >= replicas, "only {acked} replicas acknowledged");
    }

    /// Promote a replica to primary (`REPLICAOF NO ONE`): from now on it
    /// misses whatever its old primary is still told.
    pub async fn promote(&self) {
        let mut c = self.connection().await;
        let _: () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query_async(&mut c)
            .await
            .expect("REPLICAOF NO ONE");
    }

    /// Create an ACL user `name` (password `name`) with `rules`, and return
    /// its URL.
    pub async fn acl_user(&self, name: &str, rules: &[&str]) -> String {
        let mut c = self.connection().await;
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER")
            .arg(name)
            .arg("reset")
            .arg("on")
            .arg(format!(">{name}"));
        for r in rules {
            cmd.arg(*r);
        }
        let _: () = cmd.query_async(&mut c).await.expect("ACL SETUSER");
        format!("redis://{name}:{name}@127.0.0.1:{}", self.port)
    }

    /// Wait (at most 10 s) until `n` clients are subscribed to `channel`,
    /// e.g. the purge listeners of `n` layers, which start when each layer
    /// is built: a test that publishes before then depends on start-up speed.
    pub async fn wait_for_subscribers(&self, channel: &str, n: i64) {
        let start = Instant::now();
        let mut c = self.connection().await;
        loop {
            let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(channel)
                .query_async(&mut c)
                .await
                .expect("PUBSUB NUMSUB");
            if counts.first().is_some_and(|(_, k)| *k >= n) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{n} subscribers never joined {channel}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A frozen server ignores SIGKILL until resumed? No: SIGKILL works,
            // but resume first so nothing lingers in the stopped state.
            signal(c.id(), "-CONT");
        }
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").arg(sig).arg(pid.to_string()).status();
}

/// The commands clients send to a server, seen through `MONITOR` (commands
/// run inside Lua scripts are left out: they are not round trips).
pub struct Monitor {
    child: Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    port: u16,
}

impl Monitor {
    pub fn start(server: &RedisServer) -> Self {
        use std::io::BufRead;
        let mut child = Command::new("redis-cli")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &server.port().to_string(),
                "monitor",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli is not installed: apt-get install -y redis-tools");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if line == "OK" {
                    let _ = ready_tx.send(());
                    continue;
                }
                sink.lock().unwrap().push(line);
            }
        });
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("MONITOR started");
        Self {
            child,
            lines,
            port: server.port(),
        }
    }

    /// Client commands the server ran so far (upper-cased names, script
    /// internals excluded). No fixed sleep: a marker command is sent after
    /// everything else and waited for, and MONITOR reports in execution
    /// order, so every command run before it is in the list.
    pub fn client_commands(&self) -> Vec<String> {
        self.client_commands_once(|_| true)
    }

    /// Like [`client_commands`](Self::client_commands), after waiting (at
    /// most 10 s) until `ready` holds for the commands seen: for commands
    /// the code sends in the background, after the requests were answered.
    pub fn client_commands_once(&self, ready: impl Fn(&[String]) -> bool) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready(&self.commands()) {
            assert!(
                Instant::now() < deadline,
                "never seen: {:?}",
                self.commands()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let mark = format!(
            "herdguard-monitor-mark-{}",
            self.lines.lock().unwrap().len()
        );
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect for the marker");
        s.write_all(format!("ECHO {mark}\r\n").as_bytes())
            .expect("send the marker");
        while !self.lines.lock().unwrap().iter().any(|l| l.contains(&mark)) {
            assert!(Instant::now() < deadline, "MONITOR never showed the marker");
            std::thread::sleep(Duration::from_millis(5));
        }
        let lines = self.lines.lock().unwrap();
        let end = lines
            .iter()
            .position(|l| l.contains(&mark))
            .unwrap_or(lines.len());
        commands_of(&lines[..end])
    }

    fn commands(&self) -> Vec<String> {
        commands_of(&self.lines.lock().unwrap())
    }
}

fn commands_of(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| !l.contains(" lua]"))
        .filter_map(|l| l.split('"').nth(1).map(str::to_uppercase))
        .collect()
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One field of `INFO`, e.g. `info_field(&mut c, "replication", "role")`.
pub async fn info_field(
    conn: &mut redis::aio::MultiplexedConnection,
    section: &str,
    field: &str,
) -> String {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Wait (at most 5 s) until the purge index `index` lists `n` members (the
/// fill that indexes them may still be writing in the background).
pub async fn until_indexed(conn: &mut redis::aio::MultiplexedConnection, index: &str, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let card: usize = redis::cmd("ZCARD")
            .arg(index)
            .query_async(conn)
            .await
            .expect("ZCARD");
        if card >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{index} never reached {n} members"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
