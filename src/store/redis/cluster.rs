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

use std::sync::atomic::{AtomicU64, Ordering};
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
    /// A std `Mutex`: held only to clone or replace the handle, never across
    /// `.await`. With its id, so a failure seen on an older connection does
    /// not replace a newer one.
    connection: Mutex<Option<(u64, ClusterConnection)>>,
    /// The id of the next connection.
    ids: AtomicU64,
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
            ids: AtomicU64::new(0),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    fn current(&self) -> Option<(u64, ClusterConnection)> {
        self.connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The shared connection, connecting if there is none. The caller bounds
    /// the wait (the connect itself is bounded by the connection timeout).
    pub(crate) async fn get(&self) -> redis::RedisResult<(u64, ClusterConnection)> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let c = self.client.get_async_connection().await?;
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        *self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((id, c.clone()));
        Ok((id, c))
    }

    /// Forget connection `id` after an error it cannot recover from by
    /// itself, unless a newer one replaced it already.
    pub(crate) fn reset(&self, id: u64) {
        let mut c = self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if c.as_ref().is_some_and(|(kept, _)| *kept == id) {
            *c = None;
        }
    }

    /// Forget whatever connection there is.
    pub(crate) fn reset_any(&self) {
        *self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}
