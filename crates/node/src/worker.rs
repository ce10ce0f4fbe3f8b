//! `pagewarden prefill` and `pagewarden decode`: load the model and the pool (refusing to start
//! when the pool cannot hold one request of the context window), start the engine, register
//! with the gateway and serve routes until SIGINT/SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;

use cluster::{run_worker, Identity, Net, WorkerConfig, WorkerMetrics};
use engine::Engine;
use wire::Role;

use crate::cli::runtime;
use crate::config::{Config, PoolSize};
use crate::error::ServeError;
use crate::model::{engine_config, load_model};
use crate::secrets::{cluster_secrets, reload_secrets_on_sighup};
use crate::signals::shutdown_signal;

/// What a worker's command line may override in the configuration.
#[derive(Debug, Clone, Default)]
pub struct WorkerOverrides {
    /// The deployment's TOML configuration (shared by every role); none: the defaults.
    pub config: Option<PathBuf>,
    /// `cluster.gateway`.
    pub gateway: Option<String>,
    /// `cluster.name`.
    pub name: Option<String>,
    /// `cluster.kv_listen` (decode).
    pub kv_listen: Option<String>,
    /// `cluster.kv_advertise` (decode).
    pub kv_advertise: Option<String>,
    /// `cluster.metrics_listen`.
    pub metrics_listen: Option<String>,
    /// `pool.tokens` (replacing `pool.bytes`).
    pub pool_tokens: Option<usize>,
    /// The `[[models]]` entry to load (required when there are several).
    pub model: Option<String>,
}

impl WorkerOverrides {
    /// The configuration file (or the defaults) with these overrides applied.
    fn config(&self) -> Result<Config, ServeError> {
        let config = match &self.config {
            Some(p) => Config::load(p)?,
            None => Config::default(),
        };
        let mut config = match &self.model {
            None => config.single_model("a prefill or decode worker (without --model NAME)")?,
            Some(name) => config.model_named(name)?,
        };
        let c = &mut config.cluster;
        if let Some(v) = &self.gateway {
            c.gateway.clone_from(v);
        }
        if let Some(v) = &self.kv_listen {
            c.kv_listen.clone_from(v);
        }
        if self.kv_advertise.is_some() {
            c.kv_advertise.clone_from(&self.kv_advertise);
        }
        if self.name.is_some() {
            c.name.clone_from(&self.name);
        }
        if self.metrics_listen.is_some() {
            c.metrics_listen.clone_from(&self.metrics_listen);
        }
        if let Some(t) = self.pool_tokens {
            config.pool.size = Some(PoolSize::Tokens(t));
        }
        Ok(config)
    }
}

/// Runs a prefill or decode worker until SIGINT/SIGTERM or a refused registration.
pub fn run(role: Role, overrides: &WorkerOverrides) -> Result<(), ServeError> {
    let config = overrides.config()?;
    // Read before the model loads, so a missing or loose secret file fails at once.
    let secrets = cluster_secrets(&config)?;
    let role_name = if role == Role::Prefill { "prefill" } else { "decode" };
    let name = config.cluster.name.clone().unwrap_or_else(|| format!("{role_name}-{}", std::process::id()));
    let loaded = load_model(&config)?;
    let pairing = loaded.info.pairing()?;
    let engine = Engine::start(loaded.llama, loaded.pool, engine_config(&config, &loaded.grammars));
    let rt = runtime()?;
    let handle = engine.handle();
    let metrics = Arc::new(WorkerMetrics::default());
    let result = rt.block_on(async {
        reload_secrets_on_sighup(&config, &secrets);
        let wcfg = WorkerConfig {
            name: name.clone(),
            gateways: cluster::Gateways::Fixed(config.cluster.gateway.clone()),
            identity: Identity { secrets: secrets.clone(), role, pairing },
            kv_listen: (role == Role::Decode).then(|| config.cluster.kv_listen.clone()),
            kv_advertise: config.cluster.kv_advertise.clone(),
            handshake_timeout: config.cluster.handshake_timeout,
            transfer_timeout: config.cluster.transfer_timeout,
            max_pending_handshakes: config.cluster.max_pending_handshakes,
            drain_timeout: config.limits.drain_timeout,
        };
        if let Some(addr) = &config.cluster.metrics_listen {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| ServeError::Io(format!("metrics listener on {addr}: {e}")))?;
            let bound = l.local_addr().map_err(|e| ServeError::Io(e.to_string()))?;
            println!("metrics on http://{bound}/metrics");
            let (m, h) = (metrics.clone(), handle.clone());
            tokio::spawn(gateway::http::serve_worker_metrics(l, move || {
                cluster::metrics::render(role_name, &m.snapshot(&h))
            }));
        }
        println!("{name}: {role_name} worker, registering with the gateway at {}", config.cluster.gateway);
        // SIGINT/SIGTERM drains: the gateways stop routing here, the routes in flight finish.
        run_worker(wcfg, handle, Net::default(), metrics, shutdown_signal())
            .await
            .map_err(|e| ServeError::Io(format!("{name}: {e}")))
    });
    // Fails whatever is still running (pages freed) and stops the engine thread.
    drop(engine);
    result
}
