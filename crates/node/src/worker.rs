//! `pagewarden prefill` and `pagewarden decode`: load the model and the pool (refusing to start
//! when the pool cannot hold one request of the context window), start the engine, register
//! with the gateway (or every gateway the membership lists) and serve routes until
//! SIGINT/SIGTERM, which drains.

use std::path::PathBuf;
use std::sync::Arc;

use cluster::{Gateways, Identity, Net, Worker, WorkerConfig, WorkerMetrics};
use engine::Engine;
use membership::WorkerRecord;
use wire::Role;

use crate::cli::{located, runtime};
use crate::config::{Config, PoolSize};
use crate::error::ServeError;
use crate::member;
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
    /// `cluster.node_key_file`: one config file can serve every node, each with its own key.
    pub node_key: Option<PathBuf>,
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
        if self.node_key.is_some() {
            c.node_key_file.clone_from(&self.node_key);
        }
        if let Some(t) = self.pool_tokens {
            config.pool.size = Some(PoolSize::Tokens(t));
        }
        Ok(config)
    }
}

/// Runs a prefill or decode worker until SIGINT/SIGTERM or a refused registration.
pub fn run(role: Role, overrides: &WorkerOverrides) -> Result<(), ServeError> {
    run_worker(role, overrides).map_err(located(overrides.config.as_deref()))
}

fn run_worker(role: Role, overrides: &WorkerOverrides) -> Result<(), ServeError> {
    let config = overrides.config()?;
    // Read before the model loads, so a missing or loose secret file fails at once.
    let secrets = cluster_secrets(&config)?;
    let role_name = if role == Role::Prefill { "prefill" } else { "decode" };
    let name = match (&config.cluster.name, &config.membership) {
        (Some(n), _) => n.clone(),
        (None, Some(_)) => member::default_name(role_name)?,
        (None, None) => format!("{role_name}-{}", std::process::id()),
    };
    let loaded = load_model(&config)?;
    let (digest, context) = (loaded.info.digest, loaded.info.context);
    let pairing = loaded.info.pairing()?;
    let engine = Engine::start(loaded.llama, loaded.pool, engine_config(&config, &loaded.grammars));
    let rt = runtime()?;
    let handle = engine.handle();
    let metrics = Arc::new(WorkerMetrics::default());
    let result = rt.block_on(async {
        reload_secrets_on_sighup(&config, &secrets);
        let wcfg = WorkerConfig {
            name: name.clone(),
            identity: Identity { secrets: secrets.clone(), role, pairing },
            kv_listen: (role == Role::Decode).then(|| config.cluster.kv_listen.clone()),
            kv_advertise: config.cluster.kv_advertise.clone(),
            handshake_timeout: config.cluster.handshake_timeout,
            transfer_timeout: config.cluster.transfer_timeout,
            max_pending_handshakes: config.cluster.max_pending_handshakes,
            max_pending_handshakes_per_source: config.cluster.max_pending_handshakes_per_source,
            drain_timeout: config.limits.drain_timeout,
            link_lifetime: config.cluster.link_lifetime,
        };
        if let Some(addr) = &config.cluster.metrics_listen {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| ServeError::Io(format!("metrics listener on {addr}: {e}")))?;
            let bound = l.local_addr().map_err(|e| ServeError::Io(e.to_string()))?;
            println!("metrics on http://{bound}/metrics");
            let (m, h) = (metrics.clone(), handle.clone());
            tokio::spawn(gateway::http::serve_worker_metrics(l, config.limits.connections, move || {
                cluster::metrics::render(role_name, &m.snapshot(&h))
            }));
        }
        let worker = Worker::bind(wcfg, handle.clone(), Net::default(), metrics)
            .await
            .map_err(|e| ServeError::Io(format!("{name}: {e}")))?;
        let (gateways, publication) = match &config.membership {
            None => {
                println!("{name}: {role_name} worker, registering with the gateway at {}", config.cluster.gateway);
                (Gateways::Fixed(config.cluster.gateway.clone()), None)
            }
            Some(m) => {
                let record = WorkerRecord {
                    name: name.clone(),
                    role: role_name.into(),
                    model: digest.iter().map(|b| format!("{b:02x}")).collect(),
                    kv_addr: worker.kv_addr().map(str::to_string),
                    capacity_tokens: handle.pool().capacity_tokens(),
                    context,
                };
                let (publication, listed) = member::join_as_worker(m, &record, &secrets)?;
                println!("{name}: {role_name} worker, registering with the gateways listed under {}", m.prefix);
                (Gateways::Listed(listed), Some(publication))
            }
        };
        // SIGINT/SIGTERM drains: the gateways stop routing here, the routes in flight finish;
        // then the worker leaves the membership.
        let result = worker.run(gateways, shutdown_signal()).await.map_err(|e| ServeError::Io(format!("{name}: {e}")));
        if let Some(p) = publication {
            member::withdraw(p, &name).await;
        }
        result
    });
    // Fails whatever is still running (pages freed) and stops the engine thread.
    drop(engine);
    result
}
