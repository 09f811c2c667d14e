//! TLS for `rediss://` URLs (cargo feature `tls`): rustls with the ring
//! provider, the system root store by default, or a private CA given as PEM.
//! Builds clients only; connects nothing.

use deadpool_redis::redis;

use crate::error::BuildError;

/// Whether `url` asks for TLS.
pub(crate) fn wants_tls(url: &str) -> bool {
    url.get(..9)
        .is_some_and(|s| s.eq_ignore_ascii_case("rediss://"))
}

/// The certificates redis-rs should trust, when the user gave a private CA.
#[cfg(feature = "tls")]
pub(crate) fn certificates(root_cert_pem: Option<&[u8]>) -> Option<redis::TlsCertificates> {
    root_cert_pem.map(|pem| redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem.to_vec()),
    })
}

/// rustls needs a process-wide crypto provider; the redis crate selects none.
/// An application that installed its own keeps it.
#[cfg(feature = "tls")]
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Refuse `rediss://` when TLS support is compiled out, with a message that
/// says how to get it (instead of the redis crate's generic one).
pub(crate) fn check_available(urls: &[String]) -> Result<(), BuildError> {
    if cfg!(feature = "tls") || !urls.iter().any(|u| wants_tls(u)) {
        return Ok(());
    }
    Err(BuildError::missing_feature("tls", "a rediss:// url"))
}

/// A client for one standalone Redis, with the private CA if there is one.
pub(crate) fn client(
    info: redis::ConnectionInfo,
    #[cfg_attr(not(feature = "tls"), allow(unused_variables))] root_cert_pem: Option<&[u8]>,
) -> redis::RedisResult<redis::Client> {
    #[cfg(feature = "tls")]
    {
        install_crypto_provider();
        if let Some(certs) = certificates(root_cert_pem) {
            return redis::Client::build_with_tls(info, certs);
        }
    }
    redis::Client::open(info)
}
