//! `pagewarden prefill` and `pagewarden decode`: load the model and the pool (refusing to start
//! when the pool cannot hold one request of the context window), start the engine, register
//! with the gateway and serve routes until SIGINT/SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use cluster::{run_worker, Identity, Net, WorkerConfig, WorkerMetrics};
use engine::Engine;
use gateway::Config;
use wire::Role;

#[derive(Args, Clone)]
pub struct WorkerArgs {
    /// The deployment's TOML configuration (shared by every role).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The gateway's cluster address, overriding `cluster.gateway`.
    #[arg(long)]
    gateway: Option<String>,
    /// Name in logs and metrics, overriding `cluster.name`.
    #[arg(long)]
    name: Option<String>,
    /// Decode: where to accept KV connections, overriding `cluster.kv_listen`.
    #[arg(long)]
    kv_listen: Option<String>,
    /// Decode: the address prefill workers are told to use, overriding `cluster.kv_advertise`.
    #[arg(long)]
    kv_advertise: Option<String>,
    /// Serve /metrics here, overriding `cluster.metrics_listen`.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// KV pool size in tokens, overriding `pool.tokens` / `pool.bytes`.
    #[arg(long)]
    pool_tokens: Option<usize>,
}

pub fn run(role: Role, args: &WorkerArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let c = &mut config.cluster;
    let set = |dst: &mut String, v: &Option<String>| {
        if let Some(v) = v {
            dst.clone_from(v);
        }
    };
    set(&mut c.gateway, &args.gateway);
    set(&mut c.kv_listen, &args.kv_listen);
    if args.kv_advertise.is_some() {
        c.kv_advertise.clone_from(&args.kv_advertise);
    }
    if args.name.is_some() {
        c.name.clone_from(&args.name);
    }
    if args.metrics_listen.is_some() {
        c.metrics_listen.clone_from(&args.metrics_listen);
    }
    if let Some(t) = args.pool_tokens {
        config.pool.size = Some(gateway::config::PoolSize::Tokens(t));
    }
    // Read before the model loads, so a missing or loose secret file fails at once.
    let secrets = gateway::server::cluster_secrets(&config)?;
    let role_name = if role == Role::Prefill { "prefill" } else { "decode" };
    let name = config.cluster.name.clone().unwrap_or_else(|| format!("{role_name}-{}", std::process::id()));
    let loaded = gateway::load_model(&config)?;
    let pairing = loaded.info.pairing()?;
    let engine = Engine::start(loaded.llama, loaded.pool, gateway::engine_config(&config));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    let handle = engine.handle();
    let metrics = Arc::new(WorkerMetrics::default());
    let result = rt.block_on(async {
        gateway::server::reload_secrets_on_sighup(&config, &secrets);
        let wcfg = WorkerConfig {
            name: name.clone(),
            gateway: config.cluster.gateway.clone(),
            identity: Identity { secrets: secrets.clone(), role, pairing },
            kv_listen: (role == Role::Decode).then(|| config.cluster.kv_listen.clone()),
            kv_advertise: config.cluster.kv_advertise.clone(),
            handshake_timeout: config.cluster.handshake_timeout,
            transfer_timeout: config.cluster.transfer_timeout,
            max_pending_handshakes: config.cluster.max_pending_handshakes,
        };
        if let Some(addr) = &config.cluster.metrics_listen {
            let l = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("metrics listener on {addr}"))?;
            println!("metrics on http://{}/metrics", l.local_addr()?);
            let (m, h) = (metrics.clone(), handle.clone());
            tokio::spawn(gateway::server::serve_worker_metrics(l, move || {
                cluster::metrics::render(role_name, &m.snapshot(&h))
            }));
        }
        println!("{name}: {role_name} worker, registering with the gateway at {}", config.cluster.gateway);
        tokio::select! {
            r = run_worker(wcfg, handle, Net::default(), metrics) => r.map_err(anyhow::Error::from),
            _ = gateway::server::shutdown_signal() => Ok(()),
        }
    });
    // Fails whatever is still running (pages freed) and stops the engine thread.
    drop(engine);
    match result {
        Err(e) => bail!("{name}: {e:#}"),
        Ok(()) => Ok(()),
    }
}
