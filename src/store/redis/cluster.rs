//! Redis Cluster: one `ClusterConnection` per store, built directly. Opens
//! and replaces that connection only; errors and the breaker are the
//! connection's.
//!
//! Why not deadpool's cluster pool, as for a standalone Redis: its manager
//! builds the client from URLs alone, so it cannot take our connect and
//! response timeouts, a private CA, or the RESP3 push channel that sharded
//! fill notifications need. A `ClusterConnection` is cheap to clone,
//! multiplexes every command over one connection per node, follows MOVED and
//! ASK, and refreshes the slot map and reconnects by itself, so a pool would
//! add nothing but a checkout round trip.

use std::sync::{Mutex, PoisonError};

use deadpool_redis::redis::{
    self,
    cluster::{ClusterClient, ClusterClientBuilder},
    cluster_async::ClusterConnection,
};

use super::error::redact_error;
use super::options::RedisOptions;
use crate::error::BuildError;

/// Redirects (MOVED, ASK) and TRYAGAIN are retried this often, quickly: the
/// whole call stays under the response timeout, and after that the layer
/// fails open rather than queueing behind a failover.
const RETRIES: u32 = 3;
const MIN_RETRY_WAIT_MS: u64 = 10;
const MAX_RETRY_WAIT_MS: u64 = 100;

/// A client for the nodes of `options`, with our timeouts and TLS settings.
pub(crate) fn client(
    options: &RedisOptions,
    push: Option<tokio::sync::mpsc::UnboundedSender<redis::PushInfo>>,
) -> Result<ClusterClient, BuildError> {
    let mut builder = ClusterClientBuilder::new(options.urls.iter().map(String::as_str))
        .connection_timeout(options.connect_timeout)
        .response_timeout(options.response_timeout)
        .retries(RETRIES)
        .min_retry_wait(MIN_RETRY_WAIT_MS)
        .max_retry_wait(MAX_RETRY_WAIT_MS);
    #[cfg(feature = "tls")]
    {
        super::tls::install_crypto_provider();
        if let Some(certs) = super::tls::certificates(options.tls_root_cert.as_deref()) {
            builder = builder.certs(certs);
        }
    }
    if let Some(tx) = push {
        builder = builder
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(tx);
    }
    builder.build().map_err(|e| {
        BuildError::redis(
            "invalid redis cluster configuration".to_owned(),
            redact_error(&e),
        )
    })
}

/// The data connection of a store on Redis Cluster, opened on first use.
pub(crate) struct ClusterLink {
    client: ClusterClient,
    /// A std `Mutex`: held only to clone or replace the handle, never across `.await`.
    connection: Mutex<Option<ClusterConnection>>,
    /// One connect at a time: a burst on a cold store must not open one
    /// connection per request to every node.
    connecting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for ClusterLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterLink").finish_non_exhaustive()
    }
}

impl ClusterLink {
    pub(crate) fn new(options: &RedisOptions) -> Result<Self, BuildError> {
        Ok(Self {
            client: client(options, None)?,
            connection: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    fn current(&self) -> Option<ClusterConnection> {
        self.connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The shared connection, connecting if there is none. The caller bounds
    /// the wait (the connect itself is bounded by the connection timeout).
    pub(crate) async fn get(&self) -> redis::RedisResult<ClusterConnection> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let c = self.client.get_async_connection().await?;
        *self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(c.clone());
        Ok(c)
    }

    /// Forget the connection after an error it cannot recover from by itself.
    pub(crate) fn reset(&self) {
        *self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}
