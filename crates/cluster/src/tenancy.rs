//! A worker's view of its gateways' tenant tables. With several gateways each sends its own
//! table, and during a change (a tenant added, removed or its key rotated on one gateway
//! before another) they differ. A tenant may run when any linked gateway lists it; its
//! cached prefixes go when the set of key epochs the gateways give it changes. Its requests
//! end when the gateway that sent them re-keys or removes it: a gateway catching up with a
//! rotation another one made first must not end the requests that one admitted under the
//! new key. The cache scope of a route also carries the epoch its own gateway gives the
//! tenant ([`Tenancy::scoped_salt`]), so two gateways that disagree on who a tenant id is can
//! never share a cached prefix.

use std::collections::{BTreeSet, HashMap, HashSet};

use engine::{Revoke, TenantPolicy};
use types::TenantId;

use crate::proto::TenantTable;

type Epoch = [u8; 16];

/// What one gateway's new table changes on this worker.
pub(crate) struct Applied {
    pub policy: TenantPolicy,
    /// Tenants the table's gateway re-keyed or removed: their requests from it end.
    pub ended: Vec<TenantId>,
}

#[derive(Default)]
pub(crate) struct Tenancy {
    /// Each gateway link's last table (tenant id -> key epoch).
    by_link: HashMap<u64, HashMap<u64, Epoch>>,
    /// The epochs per tenant last applied to the engine; `None` before the first table.
    applied: Option<HashMap<u64, BTreeSet<Epoch>>>,
}

impl Tenancy {
    /// Records `link`'s table and returns what changes: the policy for the engine (the
    /// tenants of every link may run; the cached prefixes of those whose epochs changed go)
    /// and the tenants this link re-keyed or removed, whose requests on this link end. The
    /// first table ever drops every cached prefix: this worker cannot tell whose they were (a
    /// table from before a restart, or another deployment's, may have used the same ids).
    pub fn update(&mut self, link: u64, table: &TenantTable) -> Applied {
        let now: HashMap<u64, Epoch> = table.tenants.iter().map(|t| (t.id, t.epoch)).collect();
        let ended = self.by_link.get(&link).map_or_else(Vec::new, |before| {
            before.iter().filter(|(id, e)| now.get(id) != Some(e)).map(|(id, _)| TenantId(*id)).collect()
        });
        self.by_link.insert(link, now);
        let mut merged: HashMap<u64, BTreeSet<Epoch>> = HashMap::new();
        for t in self.by_link.values() {
            for (id, epoch) in t {
                merged.entry(*id).or_default().insert(*epoch);
            }
        }
        let revoke = match &self.applied {
            None => Revoke::AllCaches,
            Some(old) => Revoke::Caches(
                old.iter().filter(|(id, e)| merged.get(id) != Some(e)).map(|(id, _)| TenantId(*id)).collect(),
            ),
        };
        let max_share = if table.max_share > 0.0 && table.max_share <= 1.0 { table.max_share } else { 1.0 };
        let live: HashSet<TenantId> = merged.keys().map(|id| TenantId(*id)).collect();
        self.applied = Some(merged);
        Applied { policy: TenantPolicy { live: Some(live), revoke, max_share }, ended }
    }

    /// Forgets a link's table when the link ends (what was applied stays until a table changes).
    pub fn forget(&mut self, link: u64) {
        self.by_link.remove(&link);
    }

    /// The prefix-cache salt of a route of `tenant` that came over `link`: the key epoch that
    /// gateway gives the tenant, then the client's salt. `None`: that gateway does not list
    /// the tenant, and the route is refused.
    pub fn scoped_salt(&self, link: u64, tenant: u64, client: Option<&str>) -> Option<String> {
        let epoch = self.by_link.get(&link)?.get(&tenant)?;
        let mut s: String = epoch.iter().map(|b| format!("{b:02x}")).collect();
        if let Some(c) = client {
            // Fixed-length hex first, so no two (epoch, salt) pairs make the same string.
            s.push(':');
            s.push_str(c);
        }
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::TenantEntry;

    fn table(entries: &[(u64, u8)]) -> TenantTable {
        TenantTable {
            tenants: entries.iter().map(|&(id, e)| TenantEntry { id, epoch: [e; 16] }).collect(),
            max_share: 0.5,
        }
    }

    fn sorted(ts: &[TenantId]) -> Vec<u64> {
        let mut v: Vec<u64> = ts.iter().map(|t| t.0).collect();
        v.sort_unstable();
        v
    }

    /// The tenants whose cached prefixes go (`u64::MAX`: every one).
    fn forgotten(p: &TenantPolicy) -> Vec<u64> {
        match &p.revoke {
            Revoke::Caches(ts) => sorted(ts),
            Revoke::AllCaches => vec![u64::MAX],
            Revoke::These(_) => panic!("a worker's table never ends requests engine-wide"),
        }
    }

    #[test]
    fn the_first_table_drops_every_cache_and_an_equal_table_from_another_gateway_revokes_nothing() {
        let mut t = Tenancy::default();
        let a = t.update(1, &table(&[(1, 1), (2, 2)]));
        assert_eq!((forgotten(&a.policy), a.ended), (vec![u64::MAX], vec![]));
        let a = t.update(2, &table(&[(1, 1), (2, 2)]));
        assert_eq!((forgotten(&a.policy), a.ended), (vec![], vec![]));
        assert_eq!(a.policy.live.map(|l| l.len()), Some(2));
    }

    #[test]
    fn a_tenant_listed_by_any_gateway_runs_and_only_the_gateway_that_rekeys_it_ends_its_requests() {
        let mut t = Tenancy::default();
        t.update(1, &table(&[(1, 1), (2, 2)]));
        t.update(2, &table(&[(1, 1)]));
        // Gateway 1 rotates tenant 1's key and drops tenant 2: 1's epochs change, 2 is gone;
        // gateway 1's requests of both end.
        let a = t.update(1, &table(&[(1, 9)]));
        assert_eq!((forgotten(&a.policy), sorted(&a.ended)), (vec![1, 2], vec![1, 2]));
        assert_eq!(a.policy.live, Some([TenantId(1)].into_iter().collect()));
        // Gateway 2 catches up ({1, 9} -> {9}): the caches under the old key go, and only
        // gateway 2's requests of tenant 1 end, not those gateway 1 admitted under the new key.
        let a = t.update(2, &table(&[(1, 9)]));
        assert_eq!((forgotten(&a.policy), sorted(&a.ended)), (vec![1], vec![1]));
        // A table that changes nothing ends nothing.
        let a = t.update(1, &table(&[(1, 9)]));
        assert_eq!((forgotten(&a.policy), a.ended), (vec![], vec![]));
    }

    #[test]
    fn a_routes_cache_salt_carries_its_own_gateways_epoch_and_an_unlisted_tenant_gets_none() {
        let mut t = Tenancy::default();
        t.update(1, &table(&[(7, 1)]));
        t.update(2, &table(&[(7, 2)]));
        let a = t.scoped_salt(1, 7, Some("x")).expect("listed");
        let b = t.scoped_salt(2, 7, Some("x")).expect("listed");
        assert_ne!(a, b);
        assert_ne!(t.scoped_salt(1, 7, None), t.scoped_salt(1, 7, Some("")));
        assert_eq!(t.scoped_salt(1, 8, None), None);
        t.forget(1);
        assert_eq!(t.scoped_salt(1, 7, None), None);
    }
}
