//! Revocation marks: which tenants were revoked and when, so that a request admitted before its
//! tenant's revocation ends while one admitted after runs. The facade records revocations and
//! hands out marks; the route of a request watches for a revocation that reaches it.

use std::collections::HashMap;

use types::TenantId;

/// Which tenants were revoked (removed, key rotated), and when, counted in revocations: a
/// request admitted before a revocation of its tenant ends; one admitted after runs.
#[derive(Debug, Default)]
pub(super) struct Revocations {
    pub(super) count: u64,
    at: HashMap<TenantId, u64>,
}

impl Revocations {
    pub(super) fn revoked_since(&self, tenant: TenantId, mark: u64) -> bool {
        self.at.get(&tenant).is_some_and(|&at| at > mark)
    }

    /// One revocation of all of `tenants`.
    pub(super) fn revoke(&mut self, tenants: &[TenantId]) {
        self.count += 1;
        for t in tenants {
            self.at.insert(*t, self.count);
        }
    }
}
