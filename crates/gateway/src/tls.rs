//! HTTPS on the API listener: rustls (ring), HTTP/1.1 by ALPN, and a certificate that can be
//! replaced while the server runs (a SIGHUP after a renewal) without dropping a connection.
//!
//! Handshakes run on each connection's own task with a deadline, after the connection passed
//! its source address's cap, so a client that opens connections and sends nothing holds
//! neither the accept loop nor the handshakes of other clients ([`Handshakes`]).

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
pub use rustls::sign::CertifiedKey;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; connections beyond wait for a slot (within their deadline).
/// Four times the default per-address connection cap, so that one address's idle connections
/// cannot take every slot.
pub const MAX_PENDING_HANDSHAKES: usize = 1024;

/// Why a certificate or key was refused.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("the certificate file holds no PEM certificate")]
    NoCertificate,
    #[error("cannot read the certificate PEM: {0}")]
    CertificatePem(#[source] rustls::pki_types::pem::Error),
    #[error("cannot read the private key PEM (PKCS#8, PKCS#1 or SEC1 expected): {0}")]
    KeyPem(#[source] rustls::pki_types::pem::Error),
    #[error("the private key cannot sign: {0}")]
    Key(#[source] rustls::Error),
    #[error("the private key does not belong to the certificate: {0}")]
    Mismatch(#[source] rustls::Error),
    #[error("cannot build the TLS configuration: {0}")]
    Config(#[source] rustls::Error),
}

/// A certificate chain with its key, checked to belong together, from PEM text: the chain
/// leaf first, as web servers take it.
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem).collect::<Result<_, _>>().map_err(TlsError::CertificatePem)?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(TlsError::KeyPem)?;
    let provider = rustls::crypto::ring::default_provider();
    let signer = provider.key_provider.load_private_key(key).map_err(TlsError::Key)?;
    let ck = CertifiedKey::new(chain, signer);
    ck.keys_match().map_err(TlsError::Mismatch)?;
    Ok(Arc::new(ck))
}

/// The server's certificate, replaceable while it serves: handshakes that start after
/// [`ServerCertificate::replace`] present the new one; connections already open keep theirs.
#[derive(Debug)]
pub struct ServerCertificate(RwLock<Arc<CertifiedKey>>);

impl ServerCertificate {
    pub fn new(key: Arc<CertifiedKey>) -> Arc<Self> {
        Arc::new(ServerCertificate(RwLock::new(key)))
    }

    pub fn replace(&self, key: Arc<CertifiedKey>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = key;
    }

    /// The rustls configuration presenting this certificate (TLS 1.2 and 1.3, ALPN http/1.1).
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }
}

impl ResolvesServerCert for ServerCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// The TLS handshakes of an HTTPS listener: each runs on its connection's own task (started by
/// [`crate::listener::serve`] once the connection passed its address's cap), within
/// [`HANDSHAKE_TIMEOUT`] (a wait for one of the [`MAX_PENDING_HANDSHAKES`] slots included).
#[derive(Clone)]
pub struct Handshakes {
    acceptor: TlsAcceptor,
    slots: Arc<Semaphore>,
}

impl Handshakes {
    pub fn new(config: Arc<rustls::ServerConfig>) -> Self {
        Handshakes { acceptor: TlsAcceptor::from(config), slots: Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES)) }
    }

    /// The connection over TLS, or `None` when its handshake failed or ran out of time.
    pub async fn accept(&self, stream: TcpStream, peer: SocketAddr) -> Option<TlsStream<TcpStream>> {
        let handshake = async {
            let _slot = self.slots.acquire().await.ok()?;
            Some(self.acceptor.accept(stream).await)
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
            Ok(Some(Ok(tls))) => Some(tls),
            // A refused handshake is the client's business (a wrong CA, plain HTTP): a debug
            // line, with the peer, and nothing else.
            Ok(Some(Err(e))) => {
                tracing::debug!(%peer, error = %e, "https: handshake failed");
                None
            }
            Ok(None) => None,
            Err(_) => {
                tracing::debug!(%peer, "https: handshake timed out");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{certified_key, TlsError};

    #[test]
    fn a_file_without_a_certificate_is_refused() {
        assert!(matches!(certified_key(b"", b""), Err(TlsError::NoCertificate)));
        assert!(matches!(certified_key(b"not pem at all", b""), Err(TlsError::NoCertificate)));
    }

    #[test]
    fn garbage_inside_pem_armour_is_refused() {
        let cert = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let key = b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        assert!(certified_key(cert, key).is_err());
    }
}
