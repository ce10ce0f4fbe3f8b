//! `[pool]`: the KV pool's size, page size, element type and when freed pages are scrubbed.
//! The checks that need the model (the pool must hold one request of the context window) run
//! once the model is open ([`crate::config::check_pool`]).

use kv::{KvDtype, ScrubPolicy};
use serde::Deserialize;

use crate::config_error::{invalid, positive, ConfigError};
use crate::model_list::PoolSize;

/// The section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPool {
    tokens: Option<usize>,
    bytes: Option<usize>,
    page_size: Option<usize>,
    dtype: Option<String>,
    scrub: Option<String>,
}

#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub size: Option<PoolSize>,
    pub page_size: usize,
    pub dtype: KvDtype,
    pub scrub: ScrubPolicy,
}

/// An empty `[pool]`.
pub(crate) fn defaults() -> PoolSettings {
    PoolSettings { size: None, page_size: 16, dtype: KvDtype::F16, scrub: ScrubPolicy::OnFree }
}

impl RawPool {
    pub(crate) fn settings(p: RawPool) -> Result<PoolSettings, ConfigError> {
        let d = defaults();
        let size = match (p.tokens, p.bytes) {
            (Some(_), Some(_)) => return Err(invalid("pool", "set either `tokens` or `bytes`, not both")),
            (Some(0), None) => return Err(invalid("pool.tokens", "must be at least 1, got 0")),
            (None, Some(0)) => return Err(invalid("pool.bytes", "must be at least 1, got 0")),
            (Some(t), None) => Some(PoolSize::Tokens(t)),
            (None, Some(b)) => Some(PoolSize::Bytes(b)),
            (None, None) => d.size,
        };
        let dtype = match p.dtype.as_deref() {
            None => d.dtype,
            Some("f16") => KvDtype::F16,
            Some("f32") => KvDtype::F32,
            Some(other) => return Err(invalid("pool.dtype", format!("`{other}` is not one of \"f16\", \"f32\""))),
        };
        let scrub = match p.scrub.as_deref() {
            None => d.scrub,
            Some("on_free") => ScrubPolicy::OnFree,
            Some("on_alloc") => ScrubPolicy::OnAlloc,
            Some(other) => {
                return Err(invalid("pool.scrub", format!("`{other}` is not one of \"on_free\", \"on_alloc\"")))
            }
        };
        Ok(PoolSettings { size, page_size: positive("pool.page_size", p.page_size, d.page_size)?, dtype, scrub })
    }
}
