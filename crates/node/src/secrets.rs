//! A node's trust: its cluster secrets, its own node key and the node identities it trusts, read
//! once at start-up (a missing, loose or short file, or an empty allow-list, fails there);
//! secrets and allow-list are reloaded on SIGHUP, so a secret rotates and a node is revoked
//! without a restart (docs/cluster.md).

use cluster::SecretRing;

use crate::config::Config;
use crate::error::ServeError;

/// The node's cluster secrets, key and allow-list from its config (read once, so a bad file
/// fails at start-up).
pub fn cluster_secrets(config: &Config) -> Result<SecretRing, ServeError> {
    let (current, others) = config.cluster.secrets()?;
    let key = config.cluster.node_key()?;
    let trusted = config.cluster.trusted_identities()?;
    let ring = SecretRing::new(current, others, key, trusted);
    println!("cluster: {}", ring.describe());
    Ok(ring)
}

/// Reloads `ring`'s secrets and allow-list from the config file on every SIGHUP (when the config
/// came from a file): how a secret is rotated and a node revoked without a restart. Every link
/// of this node then re-checks its secret and its peer's key (see `cluster::secrets`). A reload
/// that fails (unreadable file, loose permissions, short secret, empty or malformed allow-list)
/// keeps what is in use. The node's own key is not reloaded. Needs a running Tokio runtime.
pub fn reload_secrets_on_sighup(config: &Config, ring: &SecretRing) {
    #[cfg(unix)]
    if let Some(path) = config.source.clone() {
        let ring = ring.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut hup) = signal(SignalKind::hangup()) else { return };
            while hup.recv().await.is_some() {
                let loaded = Config::load(&path)
                    .map_err(ServeError::from)
                    .and_then(|c| Ok((c.cluster.secrets()?, c.cluster.trusted_identities()?)));
                match loaded {
                    Ok(((current, others), trusted)) => {
                        ring.replace(current, others, trusted);
                        println!("cluster: reloaded: {}", ring.describe());
                    }
                    Err(e) => {
                        tracing::error!(error = %crate::config::Chain(&e), "cluster trust: reload failed, keeping the secrets and trusted node keys in use")
                    }
                }
            }
        });
    }
}
