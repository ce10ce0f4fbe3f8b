//! `[engine]` and `[prefix_cache]`: how much the engine batches, runs and queues, how long a
//! request may wait, and whether a tenant's earlier prompt pages are reused.

use std::time::Duration;

use serde::Deserialize;

use crate::config_error::{invalid, positive, positive_u64, ConfigError};

/// `[engine]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEngine {
    max_batch_tokens: Option<usize>,
    max_running: Option<usize>,
    max_queued: Option<usize>,
    queue_timeout_ms: Option<u64>,
    speculative_draft: Option<usize>,
}

/// `[prefix_cache]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPrefixCache {
    enabled: Option<bool>,
}

#[derive(Debug, Clone)]
pub struct EngineSettings {
    pub max_batch_tokens: usize,
    pub max_running: usize,
    pub max_queued: usize,
    pub queue_timeout: Duration,
    /// `[prefix_cache] enabled`: reuse a tenant's own earlier prompt pages.
    pub prefix_cache: bool,
    /// Tokens guessed from a sequence's own text and verified per decode row (0: none).
    pub speculative_draft: usize,
}

/// The most guessed tokens a decode row may carry: past a few, a row's extra compute is no
/// longer hidden behind reading the weights, and long guesses are rarely right to the end.
pub const MAX_SPECULATIVE_DRAFT: usize = 16;

/// Empty `[engine]` and `[prefix_cache]` sections.
pub(crate) fn defaults() -> EngineSettings {
    EngineSettings {
        max_batch_tokens: 512,
        max_running: 64,
        max_queued: 256,
        queue_timeout: Duration::from_millis(30_000),
        prefix_cache: true,
        speculative_draft: 0,
    }
}

impl RawEngine {
    pub(crate) fn settings(e: RawEngine, prefix_cache: RawPrefixCache) -> Result<EngineSettings, ConfigError> {
        let d = defaults();
        Ok(EngineSettings {
            max_batch_tokens: positive("engine.max_batch_tokens", e.max_batch_tokens, d.max_batch_tokens)?,
            max_running: positive("engine.max_running", e.max_running, d.max_running)?,
            max_queued: positive("engine.max_queued", e.max_queued, d.max_queued)?,
            queue_timeout: Duration::from_millis(positive_u64(
                "engine.queue_timeout_ms",
                e.queue_timeout_ms,
                millis(d.queue_timeout),
            )?),
            prefix_cache: prefix_cache.enabled.unwrap_or(d.prefix_cache),
            speculative_draft: match e.speculative_draft {
                Some(n) if n > MAX_SPECULATIVE_DRAFT => {
                    let why = format!("at most {MAX_SPECULATIVE_DRAFT} tokens (0 turns it off), got {n}");
                    return Err(invalid("engine.speculative_draft", &why));
                }
                n => n.unwrap_or(d.speculative_draft),
            },
        })
    }
}

/// Whole milliseconds of a default (all of them are far below u64::MAX ms).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
