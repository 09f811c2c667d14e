//! The listeners: clients (HTTP/1.1 and h2c, or TLS with ALPN), limits on
//! them, the admin endpoints, and graceful shutdown. Hands every request to
//! `Proxy`; decides nothing about caching or forwarding.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::{self, Connection};
use metrics_exporter_prometheus::PrometheusHandle;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio_rustls::TlsAcceptor;

use super::body::ProxyBody;
use super::conn::{self, Activity, Tracked};
use super::{Peer, Proxy};

/// How the proxy serves its clients.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// `/healthz`, `/readyz`, `/metrics`; off when `None`.
    pub admin: Option<SocketAddr>,
    /// Connections served at once; further ones wait in the kernel's backlog.
    pub max_connections: usize,
    /// Bound on receiving a request head, and on a connection's idle time
    /// between requests (see `conn.rs`): slow-header, silent and idle
    /// clients are closed, HTTP/2 ones with GOAWAY.
    pub header_timeout: Duration,
    /// Largest request head accepted (HTTP/1.1 answers 431 above it).
    pub max_header_bytes: usize,
    /// Bound on finishing in-flight requests after SIGTERM/SIGINT.
    pub shutdown_timeout: Duration,
    /// PEM certificate chain and key: serve TLS (h2 and http/1.1 by ALPN).
    pub tls: Option<(PathBuf, PathBuf)>,
}

impl ServerConfig {
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            admin: None,
            max_connections: 10_000,
            header_timeout: Duration::from_secs(10),
            max_header_bytes: 64 * 1024,
            shutdown_timeout: Duration::from_secs(30),
            tls: None,
        }
    }
}

/// Where the listeners ended up (port 0 picks one).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    pub listen: SocketAddr,
    pub admin: Option<SocketAddr>,
}

/// Serve until SIGTERM or SIGINT, then drain. `ready` is called once both
/// listeners are bound.
///
/// # Errors
/// A listener cannot be bound, or the TLS files are unusable.
pub async fn run(
    config: ServerConfig,
    proxy: Proxy,
    metrics: Option<PrometheusHandle>,
    ready: impl FnOnce(Bound),
) -> io::Result<()> {
    let tls = match &config.tls {
        Some((cert, key)) => Some(acceptor(cert, key)?),
        None => None,
    };
    let listener = TcpListener::bind(config.listen).await?;
    let draining = Arc::new(AtomicBool::new(false));
    let admin = match config.admin {
        Some(addr) => Some(serve_admin(addr, &proxy, metrics, &draining).await?),
        None => None,
    };
    ready(Bound {
        listen: listener.local_addr()?,
        admin,
    });
    let conns = Connections {
        builder: Arc::new(connection_builder(&config)),
        proxy,
        tls,
        header_timeout: config.header_timeout,
    };
    let permits = Arc::new(Semaphore::new(config.max_connections.max(1)));
    // Connections hold a receiver each: a send asks them to finish, and
    // the sender sees them gone.
    let (stop, stopped) = watch::channel(());
    let mut signal = std::pin::pin!(shutdown_signal());

    loop {
        // A permit first: at the limit, clients wait in the backlog instead
        // of being accepted and starved.
        let permit = tokio::select! {
            p = Arc::clone(&permits).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut signal => break,
        };
        let (tcp, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(error) => {
                    // Out of file descriptors and the like: back off, go on.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut signal => break,
        };
        let _ = tcp.set_nodelay(true);
        let stopped = stopped.clone();
        let conns = conns.clone();
        tokio::spawn(async move {
            let _permit = permit;
            conns.serve(tcp, addr, stopped).await;
        });
    }

    // Stop accepting: the kernel refuses new connections from here on.
    drop(listener);
    draining.store(true, Ordering::SeqCst);
    drop(stopped);
    tracing::info!(
        open = stop.receiver_count(),
        "shutting down: finishing in-flight requests"
    );
    stop.send_replace(());
    tokio::select! {
        () = stop.closed() => tracing::info!("all connections closed"),
        () = tokio::time::sleep(config.shutdown_timeout) => {
            tracing::warn!(timeout = ?config.shutdown_timeout, "shutdown timeout: closing the remaining connections");
        }
    }
    Ok(())
}

/// Bind the admin listener and serve it in a task of its own.
async fn serve_admin(
    addr: SocketAddr,
    proxy: &Proxy,
    metrics: Option<PrometheusHandle>,
    draining: &Arc<AtomicBool>,
) -> io::Result<SocketAddr> {
    let admin = TcpListener::bind(addr).await?;
    let bound = admin.local_addr()?;
    let state = Admin {
        proxy: proxy.clone(),
        metrics,
        draining: Arc::clone(draining),
        instance: format!("{bound} pid {}", std::process::id()).into(),
        history: super::status_view::History::default(),
    };
    state.history.sample_every_second(proxy.cache().clone());
    tokio::spawn(state.serve(admin));
    Ok(bound)
}

/// HTTP/1.1 and h2, with the header timeout and size limits.
fn connection_builder(config: &ServerConfig) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        // One watch per connection instead (conn.rs): hyper's arms a timer
        // for every request.
        .header_read_timeout(None)
        .max_buf_size(config.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(config.max_header_bytes).unwrap_or(u32::MAX));
    builder
}

/// What every client connection's task shares.
#[derive(Clone)]
struct Connections {
    builder: Arc<auto::Builder<TokioExecutor>>,
    proxy: Proxy,
    tls: Option<TlsAcceptor>,
    header_timeout: Duration,
}

impl Connections {
    /// Serve one client connection until it closes or shutdown ends it.
    async fn serve(self, tcp: TcpStream, addr: SocketAddr, stop: watch::Receiver<()>) {
        let peer = Peer {
            addr,
            tls: self.tls.is_some(),
        };
        // Per connection, not per request: trust, scheme, the proxy's Arcs.
        let activity = Arc::new(Activity::new(self.proxy.session(Some(peer))));
        let requests = Arc::clone(&activity);
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let busy = requests.start();
            async move {
                let response = busy.shared().handle(req.map(ProxyBody::Incoming)).await;
                Ok::<_, Infallible>(response.map(|body| Tracked::new(body, busy)))
            }
        });
        let timeout = self.header_timeout;
        let result = match self.tls {
            Some(tls) => {
                // The handshake counts as reading the request head.
                let stream = match tokio::time::timeout(timeout, tls.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(error)) => {
                        tracing::debug!(%error, %addr, "TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                };
                let conn = self.builder.serve_connection(TokioIo::new(stream), service);
                conn::watch(
                    conn,
                    Connection::graceful_shutdown,
                    &activity,
                    timeout,
                    stop,
                )
                .await
            }
            None => {
                let conn = self.builder.serve_connection(TokioIo::new(tcp), service);
                conn::watch(
                    conn,
                    Connection::graceful_shutdown,
                    &activity,
                    timeout,
                    stop,
                )
                .await
            }
        };
        match result {
            Some(Err(error)) => {
                tracing::debug!(%error, %addr, "client connection ended with an error");
            }
            None => {
                tracing::debug!(%addr, "client connection closed: quiet for the header timeout")
            }
            Some(Ok(())) => {}
        }
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only SIGINT stops the proxy");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn acceptor(cert: &PathBuf, key: &PathBuf) -> io::Result<TlsAcceptor> {
    let bad = |what: &str, path: &PathBuf, e: &dyn std::fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} {}: {e}", path.display()),
        )
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad("cannot read the certificate", cert, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad("bad certificate PEM in", cert, &e))?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| bad("bad key in", key, &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("TLS setup for", cert, &e))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| bad("certificate and key do not fit:", cert, &e))?;
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(tls)))
}

/// The admin listener's state.
#[derive(Clone)]
struct Admin {
    proxy: Proxy,
    metrics: Option<PrometheusHandle>,
    draining: Arc<AtomicBool>,
    /// This process in `/status.json`: its admin address and pid.
    instance: Arc<str>,
    /// The counters' last minutes, for `/status.json`.
    history: super::status_view::History,
}

impl Admin {
    async fn serve(self, listener: TcpListener) {
        if let Some(handle) = &self.metrics {
            // Histograms drain their buckets on upkeep; without it they grow.
            let handle = handle.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(5));
                loop {
                    tick.tick().await;
                    handle.run_upkeep();
                }
            });
        }
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let admin = self.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let answer = admin.answer(req.uri().path());
                    async move { Ok::<_, Infallible>(answer) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    }

    fn answer(&self, path: &str) -> Response<ProxyBody> {
        let json = |code: StatusCode, body: String| {
            let mut r = Response::new(ProxyBody::text(body));
            *r.status_mut() = code;
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            r
        };
        match path {
            "/healthz" => json(StatusCode::OK, "{\"status\":\"alive\"}\n".into()),
            "/readyz" => {
                // Redis trouble does not make the proxy unready: it fails
                // open to memory. Draining does, so balancers move on.
                let redis = match self.proxy.cache().redis_connected() {
                    None => "memory-only",
                    Some(true) => "connected",
                    Some(false) => "unreachable",
                };
                if self.draining.load(Ordering::SeqCst) {
                    json(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("{{\"ready\":false,\"reason\":\"shutting down\",\"redis\":\"{redis}\"}}\n"),
                    )
                } else {
                    json(
                        StatusCode::OK,
                        format!("{{\"ready\":true,\"redis\":\"{redis}\"}}\n"),
                    )
                }
            }
            "/metrics" => match &self.metrics {
                Some(handle) => {
                    let mut r = Response::new(ProxyBody::text(handle.render()));
                    r.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("text/plain; version=0.0.4"),
                    );
                    r
                }
                None => super::status(StatusCode::NOT_FOUND, "metrics are off"),
            },
            "/status.json" => {
                let snap =
                    super::status_view::snapshot(self.proxy.cache(), &self.instance, &self.history);
                json(StatusCode::OK, format!("{snap}\n"))
            }
            "/status" => {
                let mut r = Response::new(ProxyBody::text(super::status_view::PAGE));
                let headers = r.headers_mut();
                headers.insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("text/html; charset=utf-8"),
                );
                // The page loads nothing from elsewhere.
                headers.insert(
                    http::header::CONTENT_SECURITY_POLICY,
                    http::HeaderValue::from_static(
                        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'",
                    ),
                );
                r
            }
            "/hot-keys" => json(
                StatusCode::OK,
                super::hot_keys::json(&self.proxy.cache().hot_keys()),
            ),
            _ => super::status(
                StatusCode::NOT_FOUND,
                "try /healthz, /readyz, /metrics, /status, /status.json or /hot-keys",
            ),
        }
    }
}

/// Install the Prometheus recorder for this process, with buckets for the
/// histograms (as cli/examples/metrics/main.rs does). Before the layer is built, so
/// gauges set at build time are recorded.
///
/// # Errors
/// A recorder is already installed.
pub fn install_metrics() -> Result<PrometheusHandle, String> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    const SECONDS: &[f64] = &[
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ];
    const BYTES: &[f64] = &[
        256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 8388608.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), SECONDS)
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(herdguard::metrics::names::ENTRY_BYTES.to_owned()),
                BYTES,
            )
        })
        .and_then(|b| b.install_recorder())
        .map_err(|e| e.to_string())?;
    herdguard::metrics::describe_metrics();
    Ok(handle)
}
