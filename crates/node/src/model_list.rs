//! `[[models]]`: the models one deployment serves, each under the name requests give, from a
//! file or a packaged model fetched by name, with its own context window and pool size. Without
//! the section the top-level `model`, `model_name`, `context_window` and `[pool]` describe the
//! one served model, as before.

use std::path::PathBuf;

use serde::Deserialize;

use crate::config_error::{invalid, ConfigError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawModel {
    name: String,
    file: Option<PathBuf>,
    package: Option<String>,
    context_window: Option<usize>,
    pool: Option<RawModelPool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModelPool {
    tokens: Option<usize>,
    bytes: Option<usize>,
}

/// Pool size as configured; `None` in a pool setting means the default, 2x the context window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolSize {
    Tokens(usize),
    Bytes(usize),
}

/// One served model.
#[derive(Debug, Clone)]
pub struct ModelSettings {
    /// What requests name as `model`, what `/v1/models` lists and tenants' `models` allow.
    pub name: String,
    pub source: ModelSource,
    /// `None`: the model's.
    pub context_window: Option<usize>,
    /// `None`: `[pool]`'s size, else twice the context window.
    pub pool_size: Option<PoolSize>,
}

/// Where a model's file comes from.
#[derive(Debug, Clone)]
pub enum ModelSource {
    File(PathBuf),
    /// Fetched with pip from its PyPI packages and checked against its digest.
    Package(&'static fetch::KnownModel),
}

pub(crate) fn parse(raw: Vec<RawModel>, default_pool: Option<PoolSize>) -> Result<Vec<ModelSettings>, ConfigError> {
    let mut out: Vec<ModelSettings> = Vec::with_capacity(raw.len());
    for (i, m) in raw.into_iter().enumerate() {
        let field = |f: &str| format!("models[{i}].{f}");
        if m.name.trim().is_empty() || m.name.len() > 128 || m.name.chars().any(char::is_control) {
            return Err(invalid(field("name"), "must be 1-128 printable characters"));
        }
        if out.iter().any(|o| o.name == m.name) {
            return Err(invalid(field("name"), format!("`{}` appears twice", m.name)));
        }
        let source = match (m.file, m.package) {
            (Some(f), None) => ModelSource::File(f),
            (None, Some(p)) => ModelSource::Package(fetch::known(&p).ok_or_else(|| {
                let known: Vec<&str> = fetch::KNOWN.iter().map(|k| k.name).collect();
                invalid(field("package"), format!("`{p}` is not a packaged model; known: {}", known.join(", ")))
            })?),
            _ => return Err(invalid(field("file"), "set either `file` (a GGUF path) or `package` (a packaged model)")),
        };
        if m.context_window == Some(0) {
            return Err(invalid(field("context_window"), "must be at least 1, got 0"));
        }
        let pool_size = match m.pool {
            None => default_pool,
            Some(RawModelPool { tokens: Some(t), bytes: None }) if t > 0 => Some(PoolSize::Tokens(t)),
            Some(RawModelPool { tokens: None, bytes: Some(b) }) if b > 0 => Some(PoolSize::Bytes(b)),
            Some(_) => return Err(invalid(field("pool"), "set one of `tokens` or `bytes`, at least 1")),
        };
        out.push(ModelSettings { name: m.name, source, context_window: m.context_window, pool_size });
    }
    Ok(out)
}
