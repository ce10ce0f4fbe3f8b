//! `[[tenants]]`: who may call the API (a name, the SHA-256 of their key, an id given once
//! and never reused) and each tenant's own limits. `pagewarden tenant add` writes these
//! entries; validation refuses anything that would let two tenants share a key, an id or a
//! name, since ids key caches, limits and metrics.

use gateway::settings::TenantConfig;
use serde::Deserialize;

use crate::config_error::{invalid, positive, ConfigError};

/// One entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTenant {
    id: Option<u64>,
    name: String,
    key_sha256: String,
    max_concurrent: Option<usize>,
    max_queued: Option<usize>,
    tokens_per_minute: Option<u64>,
    max_body_bytes: Option<usize>,
    models: Option<Vec<String>>,
}

impl RawTenant {
    /// `served`: the names a tenant's `models` may list. `last_tenant_id`: ids above it could
    /// be given out again by `tenant add`, so none may be.
    pub(crate) fn settings(
        raw: Vec<RawTenant>,
        last_tenant_id: Option<u64>,
        served: &[&str],
    ) -> Result<Vec<TenantConfig>, ConfigError> {
        let mut tenants: Vec<TenantConfig> = Vec::with_capacity(raw.len());
        for (i, t) in raw.into_iter().enumerate() {
            let field = |f: &str| format!("tenants[{i}].{f}");
            if !valid_tenant_name(&t.name) {
                return Err(invalid(
                    field("name"),
                    format!("`{}` must be 1-64 characters of A-Z a-z 0-9 - _ .", t.name),
                ));
            }
            if tenants.iter().any(|o| o.name == t.name) {
                return Err(invalid(field("name"), format!("`{}` appears twice", t.name)));
            }
            let key_sha256 = parse_digest(&t.key_sha256)
                .ok_or_else(|| invalid(field("key_sha256"), "must be 64 hexadecimal digits (a SHA-256 digest)"))?;
            if tenants.iter().any(|o| o.key_sha256 == key_sha256) {
                return Err(invalid(field("key_sha256"), "the same key digest is given to two tenants"));
            }
            let id = match t.id {
                None => {
                    return Err(invalid(
                        field("id"),
                        "is missing: every tenant needs a numeric id, given once and never reused (it keys \
                         caches, limits and metrics); `pagewarden tenant add` assigns one",
                    ))
                }
                Some(0) => return Err(invalid(field("id"), "must be at least 1, got 0")),
                Some(id) => id,
            };
            if tenants.iter().any(|o| o.id.0 == id) {
                return Err(invalid(field("id"), format!("{id} is given to two tenants")));
            }
            if last_tenant_id.is_some_and(|last| id > last) {
                return Err(invalid(
                    field("id"),
                    format!("{id} is above last_tenant_id; ids above it may be given out again by `tenant add`"),
                ));
            }
            tenants.push(TenantConfig {
                id: types::TenantId(id),
                name: t.name,
                key_sha256,
                max_concurrent: positive(&field("max_concurrent"), t.max_concurrent, 8)?,
                max_queued: positive(&field("max_queued"), t.max_queued, 32)?,
                tokens_per_minute: t.tokens_per_minute.unwrap_or(0),
                max_body_bytes: match t.max_body_bytes {
                    Some(0) => return Err(invalid(field("max_body_bytes"), "must be at least 1, got 0")),
                    v => v,
                },
                models: match t.models {
                    Some(list) => {
                        if let Some(m) = list.iter().find(|m| !served.contains(&m.as_str())) {
                            return Err(invalid(
                                field("models"),
                                format!("`{m}` is not a served model; models: {}", served.join(", ")),
                            ));
                        }
                        Some(list)
                    }
                    None => None,
                },
            });
        }

        Ok(tenants)
    }
}

/// Parses a 64-digit hex SHA-256 digest.
pub fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Tenant names appear in logs and metric labels: keep them plain.
pub fn valid_tenant_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}
