//! The gateway's cluster listener, for the routers of one or several models: a registering
//! worker's pairing record (its model file's digest, checked with its KV layout inside the
//! authenticated handshake) decides which model's router it joins, so a worker can only ever be
//! sent requests of the model it loaded, and a prefill and a decode worker of different models
//! never pair.

use crate::link::{refusal_reason, refuse_busy};
use crate::net::Listener;
use crate::{Link, Router};
use wire::Role;

/// Accepts worker registrations for `routers` (one per model, sharing the cluster secret)
/// until the listener fails; only workers may register (any other role is refused inside the
/// handshake). Handshake limits and link failures count on the first router.
pub async fn serve_models(routers: Vec<Router>, mut listener: Listener) {
    let Some(first) = routers.first().cloned() else { return };
    let pairings: Vec<wire::PairingInfo> = routers.iter().map(|r| r.identity().pairing).collect();
    loop {
        match listener.accept_with_source().await {
            Ok((io, source)) => {
                let permit = match first.gate().try_enter(source) {
                    Ok(p) => p,
                    Err(full) => {
                        first.link_failure(full.reason());
                        tokio::spawn(refuse_busy(io));
                        continue;
                    }
                };
                let (routers, pairings, first) = (routers.clone(), pairings.clone(), first.clone());
                tokio::spawn(async move {
                    let id = first.identity();
                    let timeout = first.handshake_timeout();
                    let accepted =
                        Link::accept_among(io, &id, &pairings, &[Role::Prefill, Role::Decode], timeout).await;
                    drop(permit);
                    let result = match accepted {
                        Ok((link, i)) => routers[i].register(link).await,
                        Err(e) => Err(e),
                    };
                    if let Err(e) = result {
                        first.link_failure(refusal_reason(&e));
                        tracing::warn!(error = %e, "worker link ended");
                    }
                });
            }
            Err(e) => {
                tracing::error!(error = %e, "cluster listener: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}
