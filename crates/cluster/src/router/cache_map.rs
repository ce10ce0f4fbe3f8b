//! Where each tenant's cached prefixes are: the router names every whole page of a prompt by a
//! route tag (its own hash chain, scoped like the workers' caches by tenant, key epoch and
//! client salt), and keeps, per prefill worker, the tags the worker reported cached.
//!
//! Why a chain of the router's own: a worker's cache keys come from a secret that never leaves
//! its pool (kv::prefix), so the router could not compute them. The tags travel with the route
//! (`proto::Spec::cache_tags`), the worker attaches them to the pages it seals and reports them
//! back as they are cached and dropped (`ToGateway::CacheTags`). The chain is keyed by a secret
//! drawn when the router starts, with the tenant first: a request's tags can only ever match
//! pages its own tenant's requests sent, so another tenant's prefixes never weigh on where a
//! request goes (only their load does, as it always did). A tag is a hint: a stale or forged
//! one costs a miss, never a hit (the worker's own keys and owner checks decide hits).

use std::collections::HashSet;

use kv::RouteTag;
use types::TenantId;

const ROOT_DOMAIN: &[u8] = b"pagewarden route-tag root v1";
const PAGE_CONTEXT: &str = "pagewarden 2026-12 route-tag page v1";

/// The router's key for its tag chains, drawn at start (a restarted router names pages anew:
/// its old tags only cost misses until workers report the new ones).
pub(super) struct TagKey([u8; 32]);

impl TagKey {
    pub(super) fn random() -> TagKey {
        let mut k = [0u8; 32];
        // No randomness means no secret: a fixed key would still scope tags by tenant, and the
        // tags are hints, so routing goes on rather than failing every request.
        if getrandom::fill(&mut k).is_err() {
            tracing::warn!("no randomness for the route-tag key; tags are still scoped by tenant");
        }
        TagKey(k)
    }

    /// The tags of the whole pages of `prompt` that a prefix cache may share: every page before
    /// the one holding the prompt's last token (that one is always computed).
    pub(super) fn tags(
        &self,
        tenant: TenantId,
        epoch: Option<[u8; 16]>,
        salt: Option<&str>,
        prompt: &[u32],
        page_size: usize,
    ) -> Vec<RouteTag> {
        let ps = page_size.max(1);
        let shareable = prompt.len().saturating_sub(1) / ps;
        let mut h = blake3::Hasher::new_keyed(&self.0);
        // Every field length-prefixed (and the optional ones flagged), so no two scopes hash
        // the same bytes.
        for field in [ROOT_DOMAIN, &tenant.0.to_le_bytes()] {
            h.update(&(field.len() as u64).to_le_bytes());
            h.update(field);
        }
        for field in [epoch.as_ref().map(|e| &e[..]), salt.map(str::as_bytes)] {
            match field {
                None => h.update(&[0]),
                Some(f) => h.update(&[1]).update(&(f.len() as u64).to_le_bytes()).update(f),
            };
        }
        kv::prefix::page_chain(*h.finalize().as_bytes(), PAGE_CONTEXT, &prompt[..shareable * ps], ps)
            .into_iter()
            .map(|hash| {
                let mut tag = [0u8; 16];
                tag.copy_from_slice(&hash[..16]);
                RouteTag(tag)
            })
            .collect()
    }
}

/// The tags one worker holds, as it reported them and as the router expects from the routes
/// it finished there. Bounded: a worker (honest or not) cannot grow it past `limit`; past it,
/// new tags are not recorded (a miss later, nothing worse).
pub(super) struct CachedTags {
    tags: HashSet<RouteTag>,
    limit: usize,
    /// The worker has reported caching something: its prefix cache is on.
    caches: bool,
}

impl CachedTags {
    pub(super) fn new(limit: usize) -> CachedTags {
        CachedTags { tags: HashSet::new(), limit, caches: false }
    }

    /// Applies a worker's report: on `reset`, `cached` replaces everything known.
    pub(super) fn apply(&mut self, reset: bool, cached: &[RouteTag], dropped: &[RouteTag]) {
        if reset {
            self.tags.clear();
        }
        for t in dropped {
            self.tags.remove(t);
        }
        self.caches |= !cached.is_empty();
        self.insert(cached);
    }

    /// Records the tags of a prompt whose pages the worker has just sealed (a prefill worker
    /// that computed it, a decode worker that verified its transfer), without waiting for its
    /// report (up to 20 ms later): a client's next request, sent as soon as the answer
    /// arrives, finds its prefix. Only once the worker has shown that it caches; a report that
    /// drops the tags later removes them, and a wrong guess costs a miss, never a hit.
    pub(super) fn expect(&mut self, sealed: &[RouteTag]) {
        if self.caches {
            self.insert(sealed);
        }
    }

    fn insert(&mut self, tags: &[RouteTag]) {
        for t in tags {
            if self.tags.len() >= self.limit {
                break;
            }
            self.tags.insert(*t);
        }
    }

    /// How many of `tags` in a row, from the first, the worker holds.
    pub(super) fn matched(&self, tags: &[RouteTag]) -> usize {
        tags.iter().take_while(|t| self.tags.contains(t)).count()
    }

    pub(super) fn len(&self) -> usize {
        self.tags.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMPT: [u32; 10] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];

    #[test]
    fn tags_name_the_shareable_pages_and_differ_by_tenant_epoch_salt_and_router() {
        let k = TagKey::random();
        let a = k.tags(TenantId(1), None, None, &PROMPT, 4);
        assert_eq!(a.len(), 2, "pages 0-3 and 4-7; the page of the last token is never shared");
        assert_eq!(k.tags(TenantId(1), None, None, &PROMPT[..9], 4), a);
        assert_eq!(k.tags(TenantId(1), None, None, &PROMPT[..8], 4).len(), 1);
        // A chain: the second page's tag depends on the first page's tokens.
        let mut other = PROMPT;
        other[0] = 99;
        let b = k.tags(TenantId(1), None, None, &other, 4);
        assert_ne!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        for scoped in [
            k.tags(TenantId(2), None, None, &PROMPT, 4),
            k.tags(TenantId(1), Some([7; 16]), None, &PROMPT, 4),
            k.tags(TenantId(1), None, Some("conversation"), &PROMPT, 4),
            k.tags(TenantId(1), None, Some(""), &PROMPT, 4),
            TagKey::random().tags(TenantId(1), None, None, &PROMPT, 4),
        ] {
            assert!(scoped.iter().all(|t| !a.contains(t)), "no tag of another scope matches");
        }
    }

    #[test]
    fn a_worker_matches_the_leading_run_of_tags_it_reported_and_cannot_grow_the_map_past_its_limit() {
        let k = TagKey::random();
        let a = k.tags(TenantId(1), None, None, &[5; 41], 4);
        let mut m = CachedTags::new(6);
        m.apply(false, &a[..3], &[]);
        assert_eq!(m.matched(&a), 3);
        m.apply(false, &[], &a[1..2]);
        assert_eq!(m.matched(&a), 1, "a gap ends the run");
        m.apply(true, &a[..2], &[]);
        assert_eq!((m.matched(&a), m.len()), (2, 2));
        m.apply(false, &a, &[]);
        assert_eq!(m.len(), 6, "bounded");
        // Tenant B sending tenant A's exact prompt matches nothing of A's.
        assert_eq!(m.matched(&k.tags(TenantId(2), None, None, &[5; 41], 4)), 0);
    }

    #[test]
    fn a_finished_routes_pages_are_expected_cached_before_the_report_only_where_the_worker_caches() {
        let k = TagKey::random();
        let a = k.tags(TenantId(1), None, None, &[5; 41], 4);
        let mut m = CachedTags::new(6);
        // A worker that never reported caching anything (its prefix cache may be off).
        m.apply(true, &[], &[]);
        m.expect(&a);
        assert_eq!(m.matched(&a), 0);
        m.apply(false, &a[..1], &[]);
        m.expect(&a);
        assert_eq!(m.matched(&a), a.len().min(6));
        // Its report of an eviction wins over the expectation, and the bound holds.
        m.apply(false, &[], &a[..1]);
        assert_eq!(m.matched(&a), 0);
        m.expect(&k.tags(TenantId(1), None, None, &[7; 200], 4));
        assert!(m.len() <= 6);
    }
}
