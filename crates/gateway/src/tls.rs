//! HTTPS on the API listener: rustls (ring), HTTP/1.1 by ALPN, and a certificate that can be
//! replaced while the server runs (a SIGHUP after a renewal) without dropping a connection.
//!
//! Handshakes run on tasks of their own, each with a deadline, so a client that opens a
//! connection and sends nothing holds neither the accept loop nor a worker; only finished
//! handshakes reach the HTTP server through [`TlsListener`].

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
pub use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; connections beyond wait in the kernel's backlog.
pub const MAX_PENDING_HANDSHAKES: usize = 256;

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

/// A listener that hands the HTTP server only connections whose handshake finished.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accept_task: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        let accept_task = tokio::spawn(accept_loop(tcp, acceptor, tx));
        Ok(TlsListener { ready, local, accept_task })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

async fn accept_loop(tcp: TcpListener, acceptor: TlsAcceptor, tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>) {
    let slots = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let (stream, peer) = match tcp.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors and the like: back off rather than spin.
                tracing::warn!(error = %e, "https: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (acceptor, tx) = (acceptor.clone(), tx.clone());
        tokio::spawn(async move {
            let _slot = slot;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                }
                // A refused handshake is the client's business (a wrong CA, plain HTTP): a debug
                // line, with the peer, and nothing else.
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "https: handshake failed"),
                Err(_) => tracing::debug!(%peer, "https: handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accept loop only ends with the listener; wait for the server to stop.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
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
