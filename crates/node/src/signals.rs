//! Signals: SIGINT/SIGTERM start a drain; SIGHUP (or, with `[membership]`, a tenant change
//! announced through etcd) re-reads the tenant table (and SIGHUP, in [`crate::secrets`], the
//! cluster secrets).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gateway::tenants::{hex, Tenants};
use tokio::sync::{mpsc, watch};

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

/// How long a gateway keeps re-reading its tenant file after an announced change it does not
/// have yet (the file is copied to each host), before it says so.
const ANNOUNCED_WAIT: Duration = Duration::from_secs(60);

/// Re-reads the tenants from `path` on every SIGHUP, and on every tenant change announced
/// through the membership (`announced`: the digest of the table to serve), and sends them on:
/// a removed tenant's or a rotated key's old key is refused from then on, the tenant's
/// requests in flight end with an error and every worker drops its cached prefixes. A file
/// that fails to load keeps the tenants in use; with `dev` (the development tenant stands in
/// for an empty table), a file that still names no tenant changes nothing. A file that is not
/// yet the announced table is not applied (it may be half-copied); it is read again every
/// second for a minute, then logged as stale.
/// `serving` is the digest of the table in use. Needs a running Tokio runtime.
pub fn reload_tenants(
    path: Option<PathBuf>,
    dev: bool,
    serving: [u8; 32],
    announced: Option<watch::Receiver<Option<String>>>,
) -> Option<mpsc::UnboundedReceiver<Tenants>> {
    #[cfg(unix)]
    if let Some(path) = path {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut hup) = signal(SignalKind::hangup()) else { return };
            let mut announced = announced;
            let mut serving = serving;
            // The announced digest this gateway's file does not match yet, and until when to retry.
            let mut pending: Option<(String, Instant)> = None;
            let mut retry = tokio::time::interval(Duration::from_secs(1));
            loop {
                let wanted = tokio::select! {
                    r = hup.recv() => match r {
                        Some(()) => None,
                        None => return,
                    },
                    d = next_announced(&mut announced) => Some(d),
                    _ = retry.tick(), if pending.is_some() => pending.as_ref().map(|(d, _)| d.clone()),
                };
                let config = match Config::load(&path) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::error!(error = %crate::config::Chain(&e), "tenants: reload failed, keeping the tenants in use");
                        continue;
                    }
                };
                if dev && config.tenants.is_empty() {
                    continue;
                }
                let next = Tenants::new(config.tenants);
                let digest = next.digest();
                if let Some(want) = &wanted {
                    if *want != hex(&digest) {
                        // Not applied: a file read because of an announcement takes effect only
                        // as the announced table. Otherwise a file caught half-copied (scp, cp)
                        // would serve for a second: a tenant table cut short refuses every key
                        // after the cut. SIGHUP still applies whatever the file says.
                        match &pending {
                            Some((d, until)) if d == want => {
                                if Instant::now() >= *until {
                                    tracing::warn!(
                                        announced = %want, file = %hex(&digest),
                                        "tenants: this gateway's tenant file is not the announced table; \
                                         copy the new file here (it is applied on SIGHUP or the next announcement)"
                                    );
                                    pending = None;
                                }
                            }
                            _ => pending = Some((want.clone(), Instant::now() + ANNOUNCED_WAIT)),
                        }
                        continue;
                    }
                    if pending.take().is_some() || digest != serving {
                        tracing::info!(digest = %want, "tenants: serving the announced tenant table");
                    }
                }
                if digest == serving {
                    continue;
                }
                serving = digest;
                if tx.send(next).is_err() {
                    return;
                }
            }
        });
        return Some(rx);
    }
    let _ = (path, dev, serving, announced);
    None
}

/// The next announced table digest; never, without announcements (or once they end).
async fn next_announced(rx: &mut Option<watch::Receiver<Option<String>>>) -> String {
    loop {
        let Some(r) = rx else { return std::future::pending().await };
        if r.changed().await.is_err() {
            *rx = None;
            continue;
        }
        if let Some(d) = r.borrow_and_update().clone() {
            return d;
        }
    }
}
