//! Connections to the upstream: plain TCP or rustls, through hyper-util's
//! pooled client. Names are resolved on every new connection, so a moved
//! upstream is found on reconnect. Knows nothing of the cache or of
//! clients.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tower_service::Service;

use super::body::BoxError;

/// How the proxy talks to its upstream.
#[derive(Debug, Clone)]
pub struct UpstreamOptions {
    /// Bound on TCP connect (each resolved address).
    pub connect_timeout: Duration,
    /// Bound from sending the request to the response head.
    pub response_timeout: Duration,
    /// Idle pooled connections are closed after this.
    pub idle_timeout: Duration,
    /// Idle connections kept per upstream host.
    pub max_idle: usize,
    /// PEM file of the CA(s) to trust for an https upstream, instead of the
    /// system roots.
    pub ca_file: Option<PathBuf>,
}

impl Default for UpstreamOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(30),
            max_idle: 256,
            ca_file: None,
        }
    }
}

/// Plain or TLS connector for the pooled client.
#[derive(Clone)]
pub struct Connector {
    http: HttpConnector,
    tls: Option<TlsConnector>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// # Errors
    /// The CA file cannot be read, or no trusted root was found.
    pub fn new(upstream: &Uri, options: &UpstreamOptions) -> Result<Self, String> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(options.connect_timeout));
        http.set_keepalive(Some(Duration::from_secs(60)));
        let tls = if upstream.scheme_str() == Some("https") {
            Some(TlsConnector::from(Arc::new(client_tls(options)?)))
        } else {
            None
        };
        Ok(Self { http, tls })
    }
}

fn client_tls(options: &UpstreamOptions) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(path) = &options.ca_file {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("cannot read the CA file {}: {e}", path.display()))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("bad PEM in {}: {e}", path.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("bad CA in {}: {e}", path.display()))?;
        }
    } else {
        let found = rustls_native_certs::load_native_certs();
        for error in &found.errors {
            tracing::warn!(%error, "while loading the system's root certificates");
        }
        // Some system stores hold certificates rustls refuses; skip those.
        let (_added, _ignored) = roots.add_parsable_certificates(found.certs);
    }
    if roots.is_empty() {
        return Err("no trusted root certificates for the https upstream".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Whether a client error was a timeout (504) rather than a refusal (502).
pub fn is_timeout(error: &hyper_util::client::legacy::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        if e.downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::TimedOut)
            || e.to_string().contains("timed out")
        {
            return true;
        }
        source = e.source();
    }
    false
}

type Connecting = Pin<Box<dyn Future<Output = Result<Stream, BoxError>> + Send>>;

impl Service<Uri> for Connector {
    type Response = Stream;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Connecting {
        let tls = self.tls.clone();
        let host = uri.host().unwrap_or_default().to_owned();
        let https = uri.scheme_str() == Some("https");
        let connecting = self.http.call(uri);
        Box::pin(async move {
            let tcp = connecting.await?;
            if !https {
                return Ok(Stream::Plain(tcp));
            }
            let tls = tls.ok_or("an https upstream needs TLS set up")?;
            // `[::1]` in a URI is the name `::1`.
            let name = host.trim_start_matches('[').trim_end_matches(']');
            let name = ServerName::try_from(name.to_owned())?;
            let stream = tls.connect(name, tcp.into_inner()).await?;
            Ok(Stream::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

/// One upstream connection.
#[derive(Debug)]
pub enum Stream {
    Plain(TokioIo<TcpStream>),
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        match self {
            Self::Plain(s) => s.connected(),
            Self::Tls(s) => s.inner().get_ref().0.connected(),
        }
    }
}

impl Read for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl Write for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
}
