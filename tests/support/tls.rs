//! A TLS-only `redis-server` with a private CA and a server certificate the
//! test makes with the `openssl` CLI, and an ACL user. Stopped on drop.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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
         extendedKeyUsage=serverAuth\n",
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
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("herdguard-redis-tls-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create redis dir");
        make_certs(&dir);
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args([
                "--tls-cert-file",
                "server.crt",
                "--tls-key-file",
                "server.key",
            ])
            .args(["--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no"])
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
            .arg("--dir")
            .arg(&dir)
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let server = Self { port, child, dir };
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
        std::fs::read(self.dir.join("ca.crt")).expect("read ca.crt")
    }

    /// `redis-cli` over TLS as [`USER`].
    pub fn cli(&self, password: &str, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(self.dir.join("ca.crt"))
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
