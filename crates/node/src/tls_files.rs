//! `[tls]`: the API's certificate and key files, read at start-up and again on every SIGHUP
//! (a renewed certificate is served to new connections without a restart; a file that fails
//! to load keeps the certificate in use).

use std::path::PathBuf;
use std::sync::Arc;

use gateway::tls::{certified_key, CertifiedKey, ServerCertificate};

use crate::config_error::{invalid, ConfigError};
use crate::private_file::check_private;

/// The section as written.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

impl RawTls {
    /// Both files are needed (a section with one is a mistake, not plain HTTP).
    pub(crate) fn settings(self) -> Result<TlsSettings, ConfigError> {
        match self {
            RawTls { cert_file: Some(cert_file), key_file: Some(key_file) } => Ok(TlsSettings { cert_file, key_file }),
            RawTls { cert_file: None, .. } => {
                Err(invalid("tls.cert_file", "`[tls]` needs `cert_file` (PEM, the chain leaf first)"))
            }
            RawTls { key_file: None, .. } => {
                Err(invalid("tls.key_file", "`[tls]` needs `key_file` (PEM, readable by its owner only)"))
            }
        }
    }
}

/// `[tls] cert_file` and `key_file`: PEM, the chain leaf first; the key readable by its owner
/// only.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl TlsSettings {
    /// Reads and checks both files: the key private (mode 600) and belonging to the certificate.
    pub fn load(&self) -> Result<Arc<CertifiedKey>, ConfigError> {
        let read = |field: &'static str, path: &PathBuf| {
            std::fs::read(path).map_err(|e| invalid(field, format!("cannot read {}: {e}", path.display())))
        };
        check_private("tls.key_file", &self.key_file)?;
        let cert = read("tls.cert_file", &self.cert_file)?;
        let key = read("tls.key_file", &self.key_file)?;
        certified_key(&cert, &key).map_err(|e| {
            let field = match e {
                gateway::tls::TlsError::NoCertificate | gateway::tls::TlsError::CertificatePem(_) => "tls.cert_file",
                _ => "tls.key_file",
            };
            invalid(field, e.to_string())
        })
    }

    /// The certificate to serve, loaded now and reloaded on every SIGHUP. Needs a running Tokio
    /// runtime.
    pub fn serve(&self) -> Result<Arc<ServerCertificate>, ConfigError> {
        let cert = ServerCertificate::new(self.load()?);
        #[cfg(unix)]
        {
            let (settings, target) = (self.clone(), cert.clone());
            tokio::spawn(async move {
                use tokio::signal::unix::{signal, SignalKind};
                let Ok(mut hup) = signal(SignalKind::hangup()) else { return };
                while hup.recv().await.is_some() {
                    match settings.load() {
                        Ok(key) => {
                            target.replace(key);
                            tracing::info!(cert = %settings.cert_file.display(), "tls: certificate reloaded");
                        }
                        Err(e) => tracing::error!(error = %e, "tls: reload failed, keeping the certificate in use"),
                    }
                }
            });
        }
        Ok(cert)
    }
}
