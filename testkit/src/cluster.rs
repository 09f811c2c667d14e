//! A real Redis Cluster on loopback: 3 masters (and optionally one replica
//! each), created with `redis-cli --cluster create`, torn down on drop.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::RedisServer;

/// A running cluster. Every node is a [`RedisServer`], stopped when dropped.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub id: String,
    pub port: u16,
    pub master: bool,
    /// For a replica, the id of its master.
    pub master_id: Option<String>,
}

impl RedisCluster {
    /// 3 masters, no replicas.
    pub fn start() -> Self {
        Self::start_with_replicas(0)
    }

    /// 3 masters with `replicas` replicas each, every node in cluster mode
    /// with its own directory (so its own nodes.conf); waits (bounded) until
    /// every node reports `cluster_state:ok` and every replica is in sync.
    pub fn start_with_replicas(replicas: usize) -> Self {
        let count = 3 * (1 + replicas);
        let nodes: Vec<RedisServer> = (0..count)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    "2000",
                    // A replica may take over however long its master has been silent.
                    "--cluster-replica-validity-factor",
                    "0",
                ])
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port()));
        }
        create.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        run_bounded(create, Duration::from_secs(30));
        let cluster = Self { nodes };
        cluster.wait_ok(Duration::from_secs(20));
        cluster
    }

    /// A node that still answers (the first ones may have been killed).
    fn live_port(&self) -> u16 {
        self.nodes
            .iter()
            .map(RedisServer::port)
            .find(|&p| cli(p, &["ping"]).contains("PONG"))
            .expect("a live node")
    }

    /// Seed URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The topology as the first node sees it.
    pub fn topology(&self) -> Vec<NodeInfo> {
        let text = cli(self.live_port(), &["cluster", "nodes"]);
        text.lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() < 8 {
                    return None;
                }
                let port = f[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
                Some(NodeInfo {
                    id: f[0].to_owned(),
                    port,
                    master: f[2].contains("master") && !f[2].contains("fail"),
                    master_id: (f[3] != "-").then(|| f[3].to_owned()),
                })
            })
            .collect()
    }

    /// Ports of the current masters.
    pub fn master_ports(&self) -> Vec<u16> {
        self.topology()
            .into_iter()
            .filter(|n| n.master)
            .map(|n| n.port)
            .collect()
    }

    /// The port of the master that owns `key`'s slot.
    pub fn master_of(&self, key: &str) -> u16 {
        let port = self.live_port();
        let slot = cli(port, &["cluster", "keyslot", key]);
        let slot: u16 = slot.trim().parse().expect("a slot number");
        let text = cli(port, &["cluster", "nodes"]);
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            for range in &f[8..] {
                let (lo, hi) = match range.split_once('-') {
                    Some((lo, hi)) => (lo.parse().ok(), hi.parse().ok()),
                    None => (range.parse().ok(), range.parse().ok()),
                };
                if let (Some(lo), Some(hi)) = (lo, hi) {
                    if (lo..=hi).contains(&slot) {
                        let port = f[1].split('@').next().and_then(|a| a.rsplit(':').next());
                        return port.and_then(|p| p.parse().ok()).expect("node port");
                    }
                }
            }
        }
        panic!("no master owns slot {slot}");
    }

    /// The replica port of the master at `master_port`.
    pub fn replica_of(&self, master_port: u16) -> u16 {
        let topo = self.topology();
        let master = topo
            .iter()
            .find(|n| n.port == master_port)
            .expect("master is in the topology");
        topo.iter()
            .find(|n| n.master_id.as_deref() == Some(master.id.as_str()))
            .map(|n| n.port)
            .expect("the master has a replica")
    }

    /// Number of keys stored on the node at `port`.
    pub fn dbsize(&self, port: u16) -> usize {
        cli(port, &["dbsize"])
            .trim()
            .parse()
            .expect("DBSIZE is a number")
    }

    /// `CLUSTER FAILOVER` on the replica at `port`: it becomes master after
    /// catching up with its master (no acknowledged write is lost). Waits
    /// (bounded) until it reports the master role and the cluster is ok.
    pub fn failover(&self, replica_port: u16) {
        let reply = cli(replica_port, &["cluster", "failover"]);
        assert!(reply.contains("OK"), "CLUSTER FAILOVER: {reply}");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if cli(replica_port, &["role"]).starts_with("master") {
                break;
            }
            assert!(Instant::now() < deadline, "the replica did not take over");
            std::thread::sleep(Duration::from_millis(50));
        }
        self.wait_ok(Duration::from_secs(15));
    }

    /// SIGKILL the node at `port` (a crash: no failover handshake). Its
    /// replica takes over once the others mark it failed (node timeout 2 s);
    /// waits (bounded) until the cluster is ok again without it.
    pub fn kill(&mut self, port: u16) {
        let replica = self.replica_of(port);
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .expect("a node of this cluster");
        node.stop();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let promoted = cli(replica, &["role"]).starts_with("master");
            let ok = cli(replica, &["cluster", "info"]).contains("cluster_state:ok");
            if promoted && ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the replica did not take over from the killed master"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether `key` exists on the node that owns it.
    pub fn exists(&self, key: &str) -> bool {
        cli(self.master_of(key), &["exists", key]).trim() == "1"
    }

    fn wait_ok(&self, bound: Duration) {
        let deadline = Instant::now() + bound;
        loop {
            let all_ok = self.nodes.iter().all(|n| {
                let info = cli(n.port(), &["cluster", "info"]);
                let role = cli(n.port(), &["info", "replication"]);
                info.contains("cluster_state:ok")
                    && (role.contains("role:master") || role.contains("master_link_status:up"))
            });
            let agreed = {
                let topo = self.topology();
                topo.iter().filter(|n| n.master).count() == 3
            };
            if all_ok && agreed {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok within {bound:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `redis-cli -p port args...` on loopback, its stdout.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("redis-cli is not installed: apt-get install -y redis-tools");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run `redis-cli --cluster create ...`, killed if it takes longer than
/// `bound` (nodes that cannot meet make it wait forever); panics on failure.
pub fn run_bounded(mut cmd: Command, bound: Duration) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("redis-cli is not installed: apt-get install -y redis-tools");
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for redis-cli") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut s, &mut out);
    }
    assert!(
        status.is_some_and(|s| s.success()),
        "redis-cli --cluster create failed or took over {bound:?}: {out}"
    );
}
