//! A `herdguard proxy` process for the CLI's tests: started on free
//! loopback ports with the caller's flags, its addresses read from its
//! ready line, its stderr drained, and killed (SIGKILL) when dropped or
//! asked. The binary's path comes from the caller
//! (`env!("CARGO_BIN_EXE_herdguard")` exists only in the CLI's own tests).

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

/// A running proxy.
#[derive(Debug)]
pub struct ProxyProcess {
    /// Killed on drop.
    _child: tokio::process::Child,
    /// Where it serves.
    pub listen: SocketAddr,
    /// Its admin port, when `--admin` was given.
    pub admin: Option<SocketAddr>,
}

impl ProxyProcess {
    /// `bin proxy --listen 127.0.0.1:0 ARGS…`, ready within 30 s.
    ///
    /// # Panics
    /// If it does not start or print its ready line in time.
    pub async fn start(bin: &str, args: &[&str]) -> Self {
        let mut child = tokio::process::Command::new(bin)
            .arg("proxy")
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the proxy starts");
        let mut errors = BufReader::new(child.stderr.take().expect("piped")).lines();
        // Drained all along, so a full pipe never blocks the proxy.
        tokio::spawn(async move { while let Ok(Some(_)) = errors.next_line().await {} });
        let mut out = BufReader::new(child.stdout.take().expect("piped")).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), out.next_line())
            .await
            .expect("ready within 30 s")
            .expect("stdout readable")
            .expect("a ready line");
        // "herdguard proxy listening on http://A upstream U admin http://B redis off"
        let addr = |after: &str| -> Option<SocketAddr> {
            let rest = line.split(after).nth(1)?;
            let word = rest.split_whitespace().next()?;
            word.split("://").nth(1)?.parse().ok()
        };
        let listen = addr("listening on ").unwrap_or_else(|| panic!("{line}"));
        Self {
            _child: child,
            listen,
            admin: addr(" admin "),
        }
    }
}
