//! A TLS-only `redis-server` with a private CA and a server certificate the
//! test makes with the `openssl` CLI, and an ACL user. Stopped on drop.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::free_port;

/// The ACL user every TLS server has (the default user is off).
pub const USER: &str = "app";

/// A TLS-only server: `--port 0`, `--tls-port P`, clients not asked for
/// certificates, `default` user off and [`USER`] allowed everything.
pub struct TlsRedisServer {
    port: u16,
    child: Child,
    dir: PathBuf,
    certs: Arc<Certs>,
}

/// A directory with a CA and a server certificate signed by it, removed on drop.
pub struct Certs {
    dir: PathBuf,
}

impl Certs {
    pub fn make() -> Arc<Self> {
        let dir = std::env::temp_dir().join(format!(
            "herdguard-certs-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("create certs dir");
        make_certs(&dir);
        Arc::new(Self { dir })
    }

    /// A file in the directory: `ca.crt`, `server.crt`, `server.key`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.path("ca.crt")).expect("read ca.crt")
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("openssl is not installed: apt-get install -y openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a server certificate for `localhost` / 127.0.0.1, signed by it.
fn make_certs(dir: &Path) {
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n\
         basicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\n\
         extendedKeyUsage=serverAuth,clientAuth\n",
    )
    .expect("write server.ext");
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=herdguard test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(dir, &ca);
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend([
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    openssl(dir, &csr);
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
}

impl TlsRedisServer {
    /// Make the certificates, start the server and wait until it accepts
    /// TLS connections (bounded).
    pub fn start(password: &str) -> Self {
        Self::start_with(&Certs::make(), password, &[])
    }

    /// Start with shared certificates and extra `redis-server` arguments.
    pub fn start_with(certs: &Arc<Certs>, password: &str, extra: &[&str]) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("herdguard-redis-tls-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create redis dir");
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--tls-cert-file")
            .arg(certs.path("server.crt"))
            .arg("--tls-key-file")
            .arg(certs.path("server.key"))
            .arg("--tls-ca-cert-file")
            .arg(certs.path("ca.crt"))
            .args(["--tls-auth-clients", "no"])
            .args([
                "--user",
                USER,
                "on",
                &format!(">{password}"),
                "~*",
                "&*",
                "+@all",
            ])
            .args(["--user", "default", "off"])
            .args(["--daemonize", "no", "--loglevel", "warning"])
            .args(extra)
            .arg("--dir")
            .arg(&dir)
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let server = Self {
            port,
            child,
            dir,
            certs: Arc::clone(certs),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if TcpStream::connect_timeout(
                &([127, 0, 0, 1], port).into(),
                Duration::from_millis(200),
            )
            .is_ok()
                && server.cli(password, &["ping"]).contains("PONG")
            {
                return server;
            }
            assert!(
                Instant::now() < deadline,
                "the TLS redis-server on port {port} did not answer within 10 s \
                 (is redis-server built with TLS? Debian's is)"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `rediss://` URL with [`USER`] and `password`.
    pub fn url(&self, password: &str) -> String {
        format!("rediss://{USER}:{password}@127.0.0.1:{}", self.port)
    }

    /// The CA certificate (PEM) that signed the server's certificate.
    pub fn ca_pem(&self) -> Vec<u8> {
        self.certs.ca_pem()
    }

    /// `redis-cli` over TLS as [`USER`].
    pub fn cli(&self, password: &str, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(self.certs.path("ca.crt"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["--user", USER, "--pass", password, "--no-auth-warning"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli is not installed: apt-get install -y redis-tools");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for TlsRedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A 3-master Redis Cluster speaking only TLS (clients and the cluster bus),
/// with [`USER`] on every node. Torn down on drop.
pub struct TlsRedisCluster {
    nodes: Vec<TlsRedisServer>,
    password: String,
}

impl TlsRedisCluster {
    pub fn start(password: &str) -> Self {
        let certs = Certs::make();
        let nodes: Vec<TlsRedisServer> = (0..3)
            .map(|_| {
                TlsRedisServer::start_with(
                    &certs,
                    password,
                    &["--cluster-enabled", "yes", "--tls-cluster", "yes"],
                )
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create
            .args(["--tls", "--cacert"])
            .arg(certs.path("ca.crt"))
            .args(["--user", USER, "--pass", password, "--no-auth-warning"])
            .args(["--cluster", "create"]);
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port()));
        }
        create.args(["--cluster-yes"]);
        super::cluster::run_bounded(create, Duration::from_secs(30));
        let cluster = Self {
            nodes,
            password: password.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cluster.nodes.iter().all(|n| {
            n.cli(password, &["cluster", "info"])
                .contains("cluster_state:ok")
        }) {
            assert!(
                Instant::now() < deadline,
                "the TLS cluster did not reach cluster_state:ok within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    /// `rediss://` seed URLs with [`USER`] and `password`.
    pub fn urls(&self, password: &str) -> Vec<String> {
        self.nodes.iter().map(|n| n.url(password)).collect()
    }

    pub fn ca_pem(&self) -> Vec<u8> {
        self.nodes[0].ca_pem()
    }

    /// Keys stored on each node.
    pub fn dbsizes(&self) -> Vec<usize> {
        self.nodes
            .iter()
            .map(|n| {
                n.cli(&self.password, &["dbsize"])
                    .trim()
                    .parse()
                    .expect("DBSIZE")
            })
            .collect()
    }
}
