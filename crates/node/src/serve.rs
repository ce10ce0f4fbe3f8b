//! `pagewarden serve`: the whole deployment in one process. The gateway, a prefill worker and
//! a decode worker share one engine and talk the cluster protocol over in-memory links
//! (handshake, tickets, encrypted frames, transfer checks: the same code as between processes).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cluster::{run_worker, Identity, Net, SecretRing, WorkerConfig, WorkerMetrics};
use engine::Engine;
use wire::{ClusterSecret, Role};

use crate::config::Config;
use crate::error::ServeError;
use crate::front::{http_setup, initial_tenants, router_config, tls_certificate};
use crate::model::{engine_config, load_model, pool_of, LoadedModel};

/// Runs the single-process server until `shutdown` completes, then drains and returns: the
/// gateway, a prefill worker and a decode worker sharing one engine, talking the cluster
/// protocol over in-memory links (handshake, tickets, MAC'd frames, transfer checks: the same
/// code as between processes). `ready` is called with the bound address (port 0 allowed) once
/// the server accepts requests; `listening on http://ADDR` is also printed to stdout.
pub async fn serve<F, R>(config: Config, shutdown: F, ready: R) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send,
    R: FnOnce(SocketAddr),
{
    let tls = tls_certificate(&config)?;
    let cfg = config.clone();
    let loaded = tokio::task::spawn_blocking(move || load_model(&cfg))
        .await
        .map_err(|e| ServeError::Io(format!("model loading task failed: {e}")))??;
    let LoadedModel { info, llama, pool, tokenizer, template, grammars } = loaded;
    // Prompts being prefilled get a pool of their own (one full context window), so decode
    // reservations waiting for transfers can never starve the prefills they wait for.
    let prefill_pool = pool_of(&config, info.layout, info.context)?;
    let engine = Engine::start_with_prefill_pool(llama, pool, prefill_pool, engine_config(&config, &grammars));

    // In one process the links are in-memory pipes; they run the same handshake and
    // encryption under a secret that never leaves the process.
    let secrets =
        SecretRing::single(ClusterSecret::from_bytes(cluster::random().map_err(|e| ServeError::Io(e.to_string()))?));
    let rcfg = router_config(&config, &info, secrets.clone())?;
    let router = cluster::Router::new(rcfg);
    let tenants = initial_tenants(&config)?;
    router.set_tenants(tenants.0.table(config.limits.tenant_pool_share), &[]);
    let net = Net::default();
    let (listener, _) = net.listen("mem:gateway").await.map_err(|e| ServeError::Io(e.to_string()))?;
    tokio::spawn(router.clone().serve(listener));
    let pairing = info.pairing()?;
    let mut workers = Vec::new();
    for (role, name) in [(Role::Prefill, "prefill-0"), (Role::Decode, "decode-0")] {
        let wcfg = WorkerConfig {
            name: name.into(),
            gateway: "mem:gateway".into(),
            identity: Identity { secrets: secrets.clone(), role, pairing },
            kv_listen: Some(format!("mem:{name}")),
            kv_advertise: None,
            handshake_timeout: config.cluster.handshake_timeout,
            transfer_timeout: config.cluster.transfer_timeout,
            max_pending_handshakes: config.cluster.max_pending_handshakes,
        };
        let (h, net) = (engine.handle(), net.clone());
        let metrics = Arc::new(WorkerMetrics::default());
        workers.push(tokio::spawn(async move {
            if let Err(e) = run_worker(wcfg, h, net, metrics).await {
                tracing::error!(error = %e, "in-process worker stopped");
            }
        }));
    }
    if !router.wait_for_workers(1, 1, Duration::from_secs(30)).await {
        return Err(ServeError::Io("the in-process workers did not register".into()));
    }
    let handle = engine.handle();
    let on_drain = move || {
        handle.stop_admitting();
    };
    let setup = http_setup(&config, router.clone(), tenants, (tokenizer, template, grammars), info.context, tls)?;
    let result = gateway::http::run(setup, shutdown, ready, on_drain).await.map_err(ServeError::from);
    // Dropping the engine fails whatever is still queued or running (their clients get an error
    // response or an error event) and frees their pages.
    let _ = tokio::task::spawn_blocking(move || drop(engine)).await;
    for w in workers {
        w.abort();
    }
    result
}
