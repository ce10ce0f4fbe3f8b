//! `[limits]`: what one request may ask for (body size, tokens, time) and what one client
//! address may hold open, enforced by the gateway before a request reaches the engine.

use std::time::Duration;

use gateway::listener::{self, ConnLimits};
use gateway::settings::Limits;
use serde::Deserialize;

use crate::config_error::{invalid, positive, positive_u64, ConfigError};
use crate::engine_settings::millis;

pub const DEFAULT_MAX_TOKENS_CEILING: usize = 4096;
pub const DEFAULT_TENANT_POOL_SHARE: f64 = 0.5;

/// The section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    max_body_bytes: Option<usize>,
    request_timeout_s: Option<u64>,
    drain_timeout_s: Option<u64>,
    max_tokens_default: Option<usize>,
    max_tokens_ceiling: Option<usize>,
    tenant_pool_share: Option<f64>,
    body_timeout_ms: Option<u64>,
    header_timeout_ms: Option<u64>,
    max_connections_per_address: Option<usize>,
}

/// An empty `[limits]`.
pub(crate) fn defaults() -> Limits {
    Limits {
        max_body_bytes: 1 << 20,
        request_timeout: Duration::from_secs(300),
        drain_timeout: Duration::from_secs(30),
        max_tokens_default: 256,
        max_tokens_ceiling: DEFAULT_MAX_TOKENS_CEILING,
        tenant_pool_share: DEFAULT_TENANT_POOL_SHARE,
        body_timeout: Duration::from_millis(30_000),
        connections: ConnLimits::default(),
    }
}

impl RawLimits {
    pub(crate) fn settings(l: RawLimits) -> Result<Limits, ConfigError> {
        let d = defaults();
        Ok(Limits {
            max_body_bytes: positive("limits.max_body_bytes", l.max_body_bytes, d.max_body_bytes)?,
            request_timeout: Duration::from_secs(positive_u64(
                "limits.request_timeout_s",
                l.request_timeout_s,
                d.request_timeout.as_secs(),
            )?),
            drain_timeout: l.drain_timeout_s.map_or(d.drain_timeout, Duration::from_secs),
            max_tokens_default: positive("limits.max_tokens_default", l.max_tokens_default, d.max_tokens_default)?,
            max_tokens_ceiling: positive("limits.max_tokens_ceiling", l.max_tokens_ceiling, d.max_tokens_ceiling)?,
            tenant_pool_share: match l.tenant_pool_share {
                None => d.tenant_pool_share,
                Some(s) if s > 0.0 && s <= 1.0 => s,
                Some(s) => return Err(invalid("limits.tenant_pool_share", format!("must be in (0, 1], got {s}"))),
            },
            body_timeout: Duration::from_millis(positive_u64(
                "limits.body_timeout_ms",
                l.body_timeout_ms,
                millis(d.body_timeout),
            )?),
            connections: ConnLimits {
                header_timeout: Duration::from_millis(positive_u64(
                    "limits.header_timeout_ms",
                    l.header_timeout_ms,
                    millis(listener::DEFAULT_HEADER_TIMEOUT),
                )?),
                max_per_address: positive(
                    "limits.max_connections_per_address",
                    l.max_connections_per_address,
                    listener::DEFAULT_MAX_PER_ADDRESS,
                )?,
            },
        })
    }
}
