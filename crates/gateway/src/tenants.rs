//! Tenants: API keys stored only as SHA-256 digests, looked up in constant time (invariant 11),
//! and the table in use, replaced whole when the deployment reloads it.
//!
//! Keys are never logged; logs carry tenant ids, metrics ids or (if configured) names.

use std::sync::{Arc, RwLock};

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};
use types::TenantId;

use crate::settings::TenantConfig;

/// An authenticated tenant: its id and configuration.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub id: TenantId,
    pub config: TenantConfig,
}

/// All tenants of the server.
#[derive(Debug, Clone)]
pub struct Tenants {
    list: Vec<Tenant>,
}

/// The tenant table in use, replaced whole on reload (SIGHUP): a request reads one table.
#[derive(Debug)]
pub struct TenantDirectory {
    current: RwLock<Arc<Tenants>>,
}

impl TenantDirectory {
    pub fn new(tenants: Tenants) -> TenantDirectory {
        TenantDirectory { current: RwLock::new(Arc::new(tenants)) }
    }

    pub fn current(&self) -> Arc<Tenants> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Installs `next`; returns the ids whose requests and cached prefixes must end: tenants
    /// no longer present and tenants whose key changed.
    pub fn replace(&self, next: Tenants) -> Vec<TenantId> {
        let mut cur = self.current.write().unwrap_or_else(|e| e.into_inner());
        let revoked = cur
            .iter()
            .filter(|old| next.by_id(old.id).is_none_or(|new| new.config.key_sha256 != old.config.key_sha256))
            .map(|t| t.id)
            .collect();
        *cur = Arc::new(next);
        revoked
    }
}

/// What workers learn of a tenant's key: a digest of its digest, so a rotated key is told
/// apart without the key's digest leaving the gateway.
pub fn key_epoch(key_sha256: &[u8; 32]) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update(b"pagewarden tenant key epoch v1");
    h.update(key_sha256);
    let d: [u8; 32] = h.finalize().into();
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Tenants {
    pub fn new(configs: Vec<TenantConfig>) -> Tenants {
        Tenants { list: configs.into_iter().map(|config| Tenant { id: config.id, config }).collect() }
    }

    /// The table workers get: ids and key epochs, and the pool share.
    pub fn table(&self, max_share: f64) -> cluster::proto::TenantTable {
        cluster::proto::TenantTable {
            tenants: self
                .list
                .iter()
                .map(|t| cluster::proto::TenantEntry { id: t.id.0, epoch: key_epoch(&t.config.key_sha256) })
                .collect(),
            max_share,
        }
    }

    /// The tenant whose key digest equals SHA-256(`key`). Every tenant's digest is compared, in
    /// constant time, with no early exit: the time taken does not depend on which tenant (if
    /// any) matched nor on how many leading bytes of a digest agree.
    pub fn authenticate(&self, key: &str) -> Option<&Tenant> {
        let digest = sha256(key.as_bytes());
        let mut found = subtle::Choice::from(0u8);
        let mut index = 0u64;
        for (i, t) in self.list.iter().enumerate() {
            let hit = t.config.key_sha256.ct_eq(&digest);
            index.conditional_assign(&(i as u64), hit);
            found |= hit;
        }
        if bool::from(found) {
            self.list.get(index as usize)
        } else {
            None
        }
    }

    /// A digest of the whole table (ids, names, key digests, limits, models; in id order):
    /// equal on two gateways exactly when they serve the same tenants the same way. It is
    /// what a tenant change announces (`[membership]`); keys stay unrecoverable from it.
    pub fn digest(&self) -> [u8; 32] {
        let mut list: Vec<&TenantConfig> = self.list.iter().map(|t| &t.config).collect();
        list.sort_by_key(|c| c.id.0);
        let mut h = Sha256::new();
        h.update(b"pagewarden tenant table v1");
        let field = |h: &mut Sha256, b: &[u8]| {
            h.update((b.len() as u64).to_le_bytes());
            h.update(b);
        };
        for c in list {
            h.update(c.id.0.to_le_bytes());
            field(&mut h, c.name.as_bytes());
            h.update(c.key_sha256);
            for v in [c.max_concurrent as u64, c.max_queued as u64, c.tokens_per_minute] {
                h.update(v.to_le_bytes());
            }
            match c.max_body_bytes {
                None => h.update([0]),
                Some(n) => {
                    h.update([1]);
                    h.update((n as u64).to_le_bytes());
                }
            }
            match &c.models {
                None => h.update([0]),
                Some(ms) => {
                    h.update([1]);
                    h.update((ms.len() as u64).to_le_bytes());
                    for m in ms {
                        field(&mut h, m.as_bytes());
                    }
                }
            }
        }
        h.finalize().into()
    }

    pub fn by_id(&self, id: TenantId) -> Option<&Tenant> {
        self.list.iter().find(|t| t.id == id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Tenant> {
        self.list.iter()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// Whether the request carries `Authorization: Bearer T` with SHA-256(T) equal to `digest`,
/// compared in constant time (comparing digests also hides the token's length).
pub fn bearer_matches(headers: &HeaderMap, digest: &[u8; 32]) -> bool {
    use subtle::ConstantTimeEq;
    let text = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or_default().trim();
    let presented = match text.split_once(' ') {
        Some((scheme, t)) if scheme.eq_ignore_ascii_case("bearer") => t.trim(),
        _ => return false,
    };
    bool::from(sha256(presented.as_bytes()).ct_eq(digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(id: u64, name: &str, key: &str) -> TenantConfig {
        TenantConfig {
            id: TenantId(id),
            name: name.into(),
            key_sha256: sha256(key.as_bytes()),
            max_concurrent: 1,
            max_queued: 1,
            tokens_per_minute: 0,
            max_body_bytes: None,
            models: None,
        }
    }

    #[test]
    fn constant_time_lookup_finds_the_right_tenant() {
        let ts = Tenants::new(vec![tenant(4, "a", "key-a"), tenant(2, "b", "key-b"), tenant(9, "c", "key-c")]);
        assert_eq!(ts.authenticate("key-a").map(|t| t.config.name.as_str()), Some("a"));
        assert_eq!(ts.authenticate("key-b").map(|t| t.config.name.as_str()), Some("b"));
        assert_eq!(ts.authenticate("key-c").map(|t| t.id), Some(TenantId(9)), "the configured id, not the position");
        assert!(ts.authenticate("key-d").is_none());
        assert!(ts.authenticate("").is_none());
        assert!(Tenants::new(vec![]).authenticate("key-a").is_none());
    }

    #[test]
    fn the_table_digest_ignores_order_and_changes_with_any_key_name_or_limit() {
        let a = || vec![tenant(4, "a", "key-a"), tenant(2, "b", "key-b")];
        let d = Tenants::new(a()).digest();
        assert_eq!(d, Tenants::new(a().into_iter().rev().collect()).digest());
        let changed: [fn(&mut TenantConfig); 6] = [
            |c| c.key_sha256 = sha256(b"key-z"),
            |c| c.name = "z".into(),
            |c| c.max_concurrent = 2,
            |c| c.tokens_per_minute = 100,
            |c| c.max_body_bytes = Some(10),
            |c| c.models = Some(vec!["m".into()]),
        ];
        for f in changed {
            let mut t = a();
            f(&mut t[1]);
            assert_ne!(Tenants::new(t).digest(), d);
        }
        assert_ne!(Tenants::new(vec![tenant(4, "a", "key-a")]).digest(), d, "a removed tenant");
    }
}
