//! Loading what the tools share: the model file, its tokenizer and template, and a KV pool.

use std::path::PathBuf;

use gguf::GgufFile;
use kv::{Capacity, KvDtype, KvPool, PoolConfig, ScrubPolicy};
use model::{Llama, LoadOptions};

use crate::{ModelArgs, ToolError};

pub const PAGE_SIZE: usize = 16;

pub fn model_path(m: &ModelArgs) -> Result<PathBuf, ToolError> {
    match &m.model {
        Some(p) => Ok(p.clone()),
        None => fetch::ensure_default_model().map_err(ToolError::Fetch),
    }
}

pub fn open(m: &ModelArgs) -> Result<GgufFile, ToolError> {
    let path = model_path(m)?;
    model::mapped::open(&path).map_err(|source| ToolError::ModelFile { path, source })
}

pub fn tokenizer(f: &GgufFile) -> Result<text::Tokenizer, ToolError> {
    text::Tokenizer::from_gguf(f).map_err(ToolError::Tokenizer)
}

pub fn load_model(f: &GgufFile, threads: usize) -> Result<Llama, ToolError> {
    Llama::from_file(f, LoadOptions { threads, ..Default::default() }).map_err(ToolError::LoadModel)
}

/// [`load_model`] while `beside` runs (see [`Llama::from_file_beside`]).
pub fn load_model_beside<T>(f: &GgufFile, threads: usize, beside: impl FnOnce() -> T) -> (Result<Llama, ToolError>, T) {
    let (llama, other) = Llama::from_file_beside(f, LoadOptions { threads, ..Default::default() }, beside);
    (llama.map_err(ToolError::LoadModel), other)
}

/// A pool for at least `tokens` token slots in pages of 16, f16, scrubbed on free.
pub fn pool_for(model: &Llama, tokens: usize) -> Result<KvPool, ToolError> {
    let layout = model.config.kv_layout(PAGE_SIZE, KvDtype::F16);
    let capacity = Capacity::Tokens(tokens.div_ceil(PAGE_SIZE) * PAGE_SIZE);
    Ok(KvPool::new(PoolConfig { layout, capacity, scrub: ScrubPolicy::OnFree })?)
}
