//! `pagewarden serve`: the whole deployment in one process. For each served model, the gateway,
//! a prefill worker and a decode worker share one engine and talk the cluster protocol over
//! in-memory links (handshake, tickets, encrypted frames, transfer checks: the same code as
//! between processes).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cluster::{run_worker, Identity, Net, SecretRing, WorkerConfig, WorkerMetrics};
use engine::Engine;
use gateway::served::ServedModel;
use gateway::tenants::Tenants;
use tokio::task::JoinHandle;
use wire::{ClusterSecret, NodeKey, Role};

use crate::config::Config;
use crate::error::ServeError;
use crate::front::{http_setup, initial_tenants, router_config, tls_certificate};
use crate::model::{engine_config, load_model, pool_of, LoadedModel};

/// Runs the single-process server until `shutdown` completes, then drains and returns. Each
/// model of the configuration gets its own engine, pools, router and in-process workers; the
/// gateway routes a request to the model it names. `ready` is called with the bound address
/// (port 0 allowed) once the server accepts requests; `listening on http://ADDR` is also
/// printed to stdout.
pub async fn serve<F, R>(config: Config, shutdown: F, ready: R) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send,
    R: FnOnce(SocketAddr),
{
    let tls = tls_certificate(&config)?;
    let tenants = initial_tenants(&config)?;
    let net = Net::default();
    let mut running = Vec::new();
    let mut served = Vec::new();
    for (index, m) in config.served_models().iter().enumerate() {
        let cfg = config.for_model(m);
        let (model, started) = start_model(cfg, index, &net, &tenants.0).await?;
        served.push(model);
        running.push(started);
    }
    let handles: Vec<_> = running.iter().map(|r| r.engine.handle()).collect();
    let on_drain = move || handles.iter().for_each(|h| h.stop_admitting());
    let setup = http_setup(&config, served, tenants, tls, None)?;
    let result = gateway::http::run(setup, shutdown, ready, on_drain).await.map_err(ServeError::from);
    for r in running {
        // Dropping an engine fails whatever is still queued or running (their clients get an
        // error response or an error event) and frees their pages.
        let _ = tokio::task::spawn_blocking(move || drop(r.engine)).await;
        r.workers.iter().for_each(JoinHandle::abort);
    }
    result
}

/// One model's engine and the tasks of its in-process workers.
struct Running {
    engine: Engine,
    workers: Vec<JoinHandle<()>>,
}

/// Loads model `index` (`cfg` is the configuration as it applies to it), starts its engine,
/// router and in-process prefill and decode workers, and waits for them to register.
async fn start_model(
    cfg: Config,
    index: usize,
    net: &Net,
    tenants: &Tenants,
) -> Result<(ServedModel, Running), ServeError> {
    let c2 = cfg.clone();
    let loaded = tokio::task::spawn_blocking(move || load_model(&c2))
        .await
        .map_err(|e| ServeError::Io(format!("model loading task failed: {e}")))??;
    let LoadedModel { info, llama, pool, tokenizer, template, grammars } = loaded;
    // Prompts being prefilled get a pool of their own (one full context window), so decode
    // reservations waiting for transfers can never starve the prefills they wait for.
    let prefill_pool = pool_of(&cfg, info.layout, info.context)?;
    let engine = Engine::start_with_prefill_pool(llama, pool, prefill_pool, engine_config(&cfg, &grammars));

    // In one process the links are in-memory pipes; they run the same handshake and
    // encryption under a secret and node keys that never leave the process, each role its own
    // key, the three trusting each other only.
    let io_err = |e: wire::WireError| ServeError::Io(e.to_string());
    let secret = ClusterSecret::from_bytes(cluster::random().map_err(|e| ServeError::Io(e.to_string()))?);
    let keys = [
        NodeKey::generate().map_err(io_err)?,
        NodeKey::generate().map_err(io_err)?,
        NodeKey::generate().map_err(io_err)?,
    ];
    let trusted: Vec<_> = keys.iter().map(NodeKey::identity).collect();
    let [gateway_key, prefill_key, decode_key] = keys;
    let ring = |key| SecretRing::single(secret.clone(), key, trusted.clone());
    let router = cluster::Router::new(router_config(&cfg, &info, ring(gateway_key))?);
    router.set_tenants(tenants.table(cfg.limits.tenant_pool_share), &[]);
    let gateway_addr = format!("mem:gateway-{index}");
    let (listener, _) = net.listen(&gateway_addr).await.map_err(|e| ServeError::Io(e.to_string()))?;
    tokio::spawn(cluster::serve_models(vec![router.clone()], listener));
    let pairing = info.pairing()?;
    let mut workers = Vec::new();
    for (role, name, key) in [
        (Role::Prefill, format!("prefill-{index}"), prefill_key),
        (Role::Decode, format!("decode-{index}"), decode_key),
    ] {
        let wcfg = WorkerConfig {
            name: name.clone(),
            identity: Identity { secrets: ring(key), role, pairing },
            kv_listen: Some(format!("mem:{name}")),
            kv_advertise: None,
            handshake_timeout: cfg.cluster.handshake_timeout,
            transfer_timeout: cfg.cluster.transfer_timeout,
            max_pending_handshakes: cfg.cluster.max_pending_handshakes,
            max_pending_handshakes_per_source: cfg.cluster.max_pending_handshakes_per_source,
            // In one process the gateway's own drain (`[limits] drain_timeout_s`) comes first.
            drain_timeout: cfg.limits.drain_timeout,
            link_lifetime: cfg.cluster.link_lifetime,
        };
        let (h, net) = (engine.handle(), net.clone());
        let metrics = Arc::new(WorkerMetrics::default());
        let gateways = cluster::Gateways::Fixed(gateway_addr.clone());
        workers.push(tokio::spawn(async move {
            if let Err(e) = run_worker(wcfg, gateways, h, net, metrics, std::future::pending()).await {
                tracing::error!(error = %e, "in-process worker stopped");
            }
        }));
    }
    if !router.wait_for_workers(1, 1, Duration::from_secs(30)).await {
        return Err(ServeError::Io(format!("the in-process workers of {} did not register", cfg.model_name)));
    }
    let model = ServedModel::new(cfg.model_name.clone(), router, (tokenizer, template, grammars), info.context);
    Ok((model, Running { engine, workers }))
}
