//! Signals: SIGINT/SIGTERM start a drain; SIGHUP re-reads the tenant table (and, in
//! [`crate::secrets`], the cluster secrets).

use std::path::PathBuf;

use gateway::tenants::Tenants;
use tokio::sync::mpsc;

use crate::config::Config;

/// A future that completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Re-reads the tenants from `path` on every SIGHUP and sends them on: a removed tenant's or a
/// rotated key's old key is refused from then on, the tenant's requests in flight end with an
/// error and every worker drops its cached prefixes. A file that fails to load keeps the
/// tenants in use; with `dev` (the development tenant stands in for an empty table), a file
/// that still names no tenant changes nothing. Needs a running Tokio runtime.
pub fn reload_tenants_on_sighup(path: Option<PathBuf>, dev: bool) -> Option<mpsc::UnboundedReceiver<Tenants>> {
    #[cfg(unix)]
    if let Some(path) = path {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut hup) = signal(SignalKind::hangup()) else { return };
            while hup.recv().await.is_some() {
                let config = match Config::load(&path) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::error!(error = %e, "tenants: reload failed, keeping the tenants in use");
                        continue;
                    }
                };
                if dev && config.tenants.is_empty() {
                    continue;
                }
                if tx.send(Tenants::new(config.tenants)).is_err() {
                    return;
                }
            }
        });
        return Some(rx);
    }
    let _ = (path, dev);
    None
}
