//! Loading what the tools share: the model file, its tokenizer and template, and a KV pool.

use std::path::PathBuf;

use anyhow::{Context, Result};
use gguf::GgufFile;
use kv::{Capacity, KvDtype, KvPool, PoolConfig, ScrubPolicy};
use model::{Llama, LoadOptions};

use crate::ModelArgs;

pub const PAGE_SIZE: usize = 16;

pub fn model_path(m: &ModelArgs) -> Result<PathBuf> {
    match &m.model {
        Some(p) => Ok(p.clone()),
        None => Ok(fetch::ensure_default_model()?),
    }
}

pub fn open(m: &ModelArgs) -> Result<GgufFile> {
    let path = model_path(m)?;
    GgufFile::open(&path).with_context(|| format!("loading {}", path.display()))
}

pub fn tokenizer(f: &GgufFile) -> Result<text::Tokenizer> {
    text::Tokenizer::from_gguf(f).context("building the tokenizer from the model file")
}

pub fn load_model(f: &GgufFile, threads: usize) -> Result<Llama> {
    Llama::from_file(f, LoadOptions { threads }).context("loading the model")
}

/// A pool for at least `tokens` token slots in pages of 16, f16, scrubbed on free.
pub fn pool_for(model: &Llama, tokens: usize) -> Result<KvPool> {
    let layout = model.config.kv_layout(PAGE_SIZE, KvDtype::F16);
    let capacity = Capacity::Tokens(tokens.div_ceil(PAGE_SIZE) * PAGE_SIZE);
    Ok(KvPool::new(PoolConfig { layout, capacity, scrub: ScrubPolicy::OnFree })?)
}
