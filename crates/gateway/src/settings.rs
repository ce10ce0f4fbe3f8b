//! What the HTTP API is configured with: the served model's name, the request limits and each
//! tenant's identity and limits. The deployment (`node`) reads them from its configuration
//! file and hands them over; the API never reads a file.

use std::time::Duration;

/// The API's own settings.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    pub limits: Limits,
    /// Tenant labels in `/metrics` are names (true) or numeric ids (false, the default).
    pub tenant_names: bool,
}

#[derive(Debug, Clone)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub request_timeout: Duration,
    pub drain_timeout: Duration,
    pub max_tokens_default: usize,
    /// The largest `max_tokens` a request may ask for (400 beyond).
    pub max_tokens_ceiling: usize,
    /// The most of a decode pool one tenant may hold while the table has several tenants
    /// (its other requests wait in its own queue).
    pub tenant_pool_share: f64,
    /// The whole request body must arrive within this (a slow upload holds a tenant's slot).
    pub body_timeout: Duration,
    /// What every HTTP listener allows a connection: its request head's deadline and the
    /// connections one address may hold open.
    pub connections: crate::listener::ConnLimits,
}

/// One tenant: its id (what keys caches, limits, metrics and logs; given once and never
/// reused), its name, the SHA-256 digest of its key, and its limits.
#[derive(Clone)]
pub struct TenantConfig {
    pub id: types::TenantId,
    pub name: String,
    pub key_sha256: [u8; 32],
    pub max_concurrent: usize,
    pub max_queued: usize,
    /// 0 = unlimited.
    pub tokens_per_minute: u64,
    /// Overrides `[limits] max_body_bytes` for this tenant.
    pub max_body_bytes: Option<usize>,
    /// The models this tenant may use (`None`: every served model).
    pub models: Option<Vec<String>>,
}

impl TenantConfig {
    pub fn may_use(&self, model: &str) -> bool {
        self.models.as_ref().is_none_or(|m| m.iter().any(|n| n == model))
    }
}

impl std::fmt::Debug for TenantConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantConfig")
            .field("id", &self.id.0)
            .field("name", &self.name)
            .field("max_concurrent", &self.max_concurrent)
            .field("max_queued", &self.max_queued)
            .field("tokens_per_minute", &self.tokens_per_minute)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("models", &self.models)
            .finish_non_exhaustive()
    }
}
