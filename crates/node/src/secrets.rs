//! A node's cluster secrets: read once at start-up (a missing, loose or short file fails
//! there), reloaded on SIGHUP so a secret rotates without a restart (docs/cluster.md).

use cluster::SecretRing;

use crate::config::Config;
use crate::error::ServeError;

/// The node's cluster secrets from its config (read once, so a bad file fails at start-up).
pub fn cluster_secrets(config: &Config) -> Result<SecretRing, ServeError> {
    let (current, others) = config.cluster.secrets()?;
    let ring = SecretRing::new(current, others);
    println!("cluster: {}", ring.describe());
    Ok(ring)
}

/// Reloads `ring` from the config file on every SIGHUP (when the config came from a file): how
/// a secret is rotated without a restart. A reload that fails (unreadable file, loose
/// permissions, short secret) keeps the secrets in use. Needs a running Tokio runtime.
pub fn reload_secrets_on_sighup(config: &Config, ring: &SecretRing) {
    #[cfg(unix)]
    if let Some(path) = config.source.clone() {
        let ring = ring.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut hup) = signal(SignalKind::hangup()) else { return };
            while hup.recv().await.is_some() {
                match Config::load(&path).map_err(ServeError::from).and_then(|c| Ok(c.cluster.secrets()?)) {
                    Ok((current, others)) => {
                        ring.replace(current, others);
                        println!("cluster: reloaded: {}", ring.describe());
                    }
                    Err(e) => tracing::error!(error = %e, "cluster secrets: reload failed, keeping the secrets in use"),
                }
            }
        });
    }
}
