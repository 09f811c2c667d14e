//! Loopback TCP forwarders in front of a server: a switchable one that
//! stands in for a DNS name or virtual IP ([`Vip`]), and a delay line
//! ([`SlowLink`]).

use std::time::Duration;

use crate::{ACL_PASSWORD, ACL_USER};

/// A stand-in for a DNS name or virtual IP in front of Redis: a loopback TCP
/// forwarder whose target can be switched. Connections already open stay
/// with the old target, as they do when a VIP moves; [`blackhole`](Self::blackhole)
/// silences them as a failover's network often does.
pub struct Vip {
    port: u16,
    target: std::sync::Arc<std::sync::atomic::AtomicU16>,
    /// How many blackholes so far; a connection remembers the count it was
    /// accepted at.
    cut: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Vip {
    /// Forward new connections to 127.0.0.1:`target`. Needs a tokio runtime.
    pub async fn start(target: u16) -> Self {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let port = listener.local_addr().expect("local addr").port();
        let target = std::sync::Arc::new(std::sync::atomic::AtomicU16::new(target));
        let to = target.clone();
        let cut = tokio::sync::watch::channel(0u64).0;
        let cuts = cut.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let port = to.load(Ordering::SeqCst);
                let mut cut = cuts.subscribe();
                let born = *cut.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                    else {
                        return;
                    };
                    let silenced = tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => false,
                        _ = cut.wait_for(|c| *c > born) => true,
                    };
                    if silenced {
                        // Both sockets stay open and nothing moves: each peer
                        // waits for an answer that never comes, until the
                        // Vip is dropped.
                        while cut.changed().await.is_ok() {}
                        drop((inbound, outbound));
                    }
                });
            }
        });
        Self {
            port,
            target,
            cut,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Send new connections to `port` from now on.
    pub fn point_to(&self, port: u16) {
        self.target.store(port, std::sync::atomic::Ordering::SeqCst);
    }

    /// Stop forwarding bytes on every connection open now, both ways,
    /// without closing it (no FIN, no RST). New connections still go through.
    pub fn blackhole(&self) {
        self.cut.send_modify(|c| *c += 1);
    }
}

impl Drop for Vip {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A loopback TCP forwarder to 127.0.0.1:`target` that delays everything the
/// server sends by `delay` (a pure delay line: replies keep their order and
/// their rate; what the client sends goes through at once): a slow path to
/// one client, or a loaded host where a reply waits before its task runs.
pub struct SlowLink {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl SlowLink {
    pub async fn start(target: u16, delay: Duration) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let port = listener.local_addr().expect("local addr").port();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    let (mut client_rx, mut client_tx) = inbound.into_split();
                    let (mut server_rx, mut server_tx) = outbound.into_split();
                    let (line, mut due) =
                        tokio::sync::mpsc::channel::<(tokio::time::Instant, Vec<u8>)>(1024);
                    let up = tokio::io::copy(&mut client_rx, &mut server_tx);
                    let read = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n @ 1..) = server_rx.read(&mut buf).await {
                            let at = tokio::time::Instant::now() + delay;
                            if line.send((at, buf[..n].to_vec())).await.is_err() {
                                break;
                            }
                        }
                    };
                    let write = async move {
                        while let Some((at, bytes)) = due.recv().await {
                            tokio::time::sleep_until(at).await;
                            if client_tx.write_all(&bytes).await.is_err() {
                                break;
                            }
                        }
                    };
                    tokio::select! {
                        _ = up => {}
                        _ = async { tokio::join!(read, write) } => {}
                    }
                });
            }
        });
        Self { port, task }
    }

    /// As the documented ACL user, like [`RedisServer::url`](crate::RedisServer::url).
    pub fn url(&self) -> String {
        format!("redis://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{}", self.port)
    }
}

impl Drop for SlowLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}
