//! The pool's public handle: building a pool, reserving block tables (fresh or reusing a
//! tenant's cached prefix), the prefix-cache scope, accounting and cache upkeep.

use std::collections::HashMap;
use std::sync::Arc;

use crate::pages::{PageUse, PoolInner, Slot};
use crate::prefix::{CacheScope, SEALED};
use crate::{BlockTable, KvError, KvLayout, Owner, PoolConfig, ScrubPolicy, TenantId};

/// The KV cache pool. A cheap handle (`Arc`); clones share the same pages.
#[derive(Clone)]
pub struct KvPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for KvPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvPool")
            .field("layout", &self.inner.layout)
            .field("scrub", &self.inner.scrub)
            .field("total_pages", &self.inner.total_pages)
            .field("free_pages", &self.free_pages())
            .finish()
    }
}

impl KvPool {
    /// Builds a pool, allocating (zeroed) the whole arena up front.
    pub fn new(cfg: PoolConfig) -> Result<KvPool, KvError> {
        Ok(KvPool { inner: Arc::new(PoolInner::new(cfg)?) })
    }

    pub fn layout(&self) -> &KvLayout {
        &self.inner.layout
    }

    /// Whether both handles share the same pages.
    pub fn same_pool(&self, other: &KvPool) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub fn scrub_policy(&self) -> ScrubPolicy {
        self.inner.scrub
    }

    pub fn total_pages(&self) -> usize {
        self.inner.total_pages
    }

    pub fn free_pages(&self) -> usize {
        self.inner.free_count()
    }

    pub fn used_pages(&self) -> usize {
        self.total_pages() - self.free_pages()
    }

    /// Token slots in the whole pool (`total_pages * page_size`).
    pub fn capacity_tokens(&self) -> usize {
        self.inner.total_pages * self.inner.layout.page_size
    }

    /// Pages currently leased by `tenant` (all its requests).
    pub fn pages_used_by(&self, tenant: TenantId) -> usize {
        self.inner.pages_of(tenant)
    }

    /// Who holds each page now, in page order (the admin dashboard's map).
    pub fn page_map(&self) -> Vec<PageUse> {
        self.inner.page_map()
    }

    /// Pages zeroed so far (scrub cost accounting).
    pub fn pages_scrubbed(&self) -> u64 {
        self.inner.pages_scrubbed()
    }

    /// `Err(ExceedsPool)` when `tokens` could never fit in this pool, even empty.
    pub fn check_fits(&self, tokens: usize) -> Result<(), KvError> {
        if self.inner.layout.pages_for(tokens) > self.inner.total_pages {
            return Err(KvError::ExceedsPool { requested_tokens: tokens, capacity_tokens: self.capacity_tokens() });
        }
        Ok(())
    }

    /// All or nothing: a block table with room for at least `tokens` slots (whole pages), or
    /// `KvError::Exhausted` with nothing reserved. `tokens == 0` gives an empty table.
    pub fn reserve(&self, owner: Owner, tokens: usize) -> Result<BlockTable, KvError> {
        let n = self.inner.layout.pages_for(tokens);
        let leases = self.inner.lease_pages(owner, n)?;
        Ok(BlockTable::new(Arc::clone(&self.inner), owner, leases))
    }

    /// The prefix-cache scope of an authenticated tenant, optionally narrowed by a client's
    /// salt. Derived from a secret of this pool: a client can never name another tenant's.
    pub fn scope(&self, tenant: TenantId, client_salt: Option<&str>) -> CacheScope {
        self.inner.scope(tenant, client_salt)
    }

    /// Like [`KvPool::reserve`], reusing the longest run of `scope`'s cached pages that
    /// `prompt` starts with. The prompt's last token is never served from the cache (its
    /// logits must be computed): whole pages hit up to the page holding it, and when all of
    /// those hit and the same tenant's same prompt was sealed before, that page's other slots
    /// are copied from the cached tail (the page itself stays this table's, to write). So an
    /// identical prompt computes one token. Returns the table and how many leading positions
    /// are already written (cached).
    pub fn reserve_cached(
        &self,
        owner: Owner,
        tokens: usize,
        scope: &CacheScope,
        prompt: &[u32],
    ) -> Result<(BlockTable, usize), KvError> {
        self.reserve_from_cache(owner, tokens, scope, prompt, true)
    }

    /// Like [`KvPool::reserve_cached`] with whole pages only (no tail copy): the table starts
    /// with the shared pages, and the rest is empty. For a receiver of transferred KV, which
    /// is sent every page after the ones it holds. Returns the table and how many leading
    /// positions it holds (whole pages).
    pub fn reserve_held(
        &self,
        owner: Owner,
        tokens: usize,
        scope: &CacheScope,
        prompt: &[u32],
    ) -> Result<(BlockTable, usize), KvError> {
        self.reserve_from_cache(owner, tokens, scope, prompt, false)
    }

    fn reserve_from_cache(
        &self,
        owner: Owner,
        tokens: usize,
        scope: &CacheScope,
        prompt: &[u32],
        with_tail: bool,
    ) -> Result<(BlockTable, usize), KvError> {
        if scope.tenant() != owner.tenant {
            return Err(KvError::WrongOwner {
                page: 0,
                expected: owner,
                found: Owner { tenant: scope.tenant(), request: SEALED },
            });
        }
        let ps = self.inner.layout.page_size;
        // Index of the page holding the last token: the whole pages before it may hit.
        let last = prompt.len().saturating_sub(1) / ps;
        let keys = scope.chain(&prompt[..last * ps], ps);
        let (hits, tail) = {
            let mut cache = self.inner.cache();
            let hits = cache.lookup(owner.tenant, &keys);
            let tail = (with_tail && hits.len() == last && prompt.len() > last * ps + 1)
                .then(|| scope.tail(keys.last(), &prompt[last * ps..]))
                .and_then(|key| cache.lookup(owner.tenant, &[key]).pop());
            (hits, tail)
        };
        let need = self.inner.layout.pages_for(tokens).saturating_sub(hits.len());
        let leases = self.inner.lease_pages(owner, need)?;
        let mut cached = hits.len() * ps;
        let slots = hits.into_iter().map(Slot::Shared).chain(leases.into_iter().map(Slot::Own)).collect();
        let mut table = BlockTable::from_slots(Arc::clone(&self.inner), owner, slots);
        if let Some(tail) = tail {
            let rows = prompt.len() - 1 - cached;
            // A tail that fails its checks is a miss: the prompt is computed instead.
            if table.copy_tail(&tail, last, rows).is_ok() {
                cached += rows;
            }
        }
        Ok((table, cached))
    }

    /// Pages held by the prefix cache (in use by requests or idle).
    pub fn cached_pages(&self) -> usize {
        self.inner.cache().len()
    }

    /// Cached pages no request holds: a reservation may evict them.
    pub fn idle_cached_pages(&self) -> usize {
        self.inner.cache().idle()
    }

    /// Pages `tenant` holds that no one else could take: its requests' pages, not its idle
    /// cached ones (a reservation evicts those when it needs them). What a fair share counts.
    pub fn pages_held_by(&self, tenant: TenantId) -> usize {
        let idle = self.inner.cache().idle_of(tenant);
        self.pages_used_by(tenant).saturating_sub(idle)
    }

    /// Cached pages per tenant, idle or in use.
    pub fn cached_pages_by_tenant(&self) -> HashMap<TenantId, usize> {
        self.inner.cache().count_by_tenant()
    }

    /// Cached pages of `tenant`, idle or in use.
    pub fn cached_pages_of(&self, tenant: TenantId) -> usize {
        self.inner.cache().count_of(tenant)
    }

    /// Drops every cache entry of the tenants `forget` picks (a removed tenant, a rotated key):
    /// no later request can hit them, idle pages are freed now and pages still held by
    /// requests when those end. Returns how many entries went.
    pub fn forget_tenants(&self, forget: &dyn Fn(TenantId) -> bool) -> usize {
        let gone = self.inner.cache().forget(forget);
        let n = gone.len();
        // Dropped after the cache lock: each last reference frees its page.
        drop(gone);
        n
    }

    /// Drops every cache entry; pages still held by requests are freed when those end.
    pub fn clear_prefix_cache(&self) {
        let gone = self.inner.cache().clear();
        drop(gone);
    }

    /// Which route tags became cached or were dropped since the last call (see
    /// [`crate::RouteTag`]): a worker reports them to its gateways.
    pub fn take_tag_changes(&self) -> crate::TagChanges {
        self.inner.cache().take_tag_changes()
    }

    /// Every route tag naming a cached page now (a new gateway link's first report).
    pub fn route_tags(&self) -> Vec<crate::RouteTag> {
        self.inner.cache().tags()
    }

    /// Zeroes one free page, exactly as a scrub does, so benchmarks can time the scrub cost
    /// (`layout().page_bytes()` bytes). Returns false when no page is free. The page is off the
    /// free list for the duration of the call.
    pub fn scrub_one_page_for_bench(&self) -> bool {
        self.inner.scrub_one_free_page()
    }

    /// Test support: whether every free page is all-zero bytes (meaningful with `OnFree`).
    #[doc(hidden)]
    pub fn debug_free_pages_zeroed(&self) -> bool {
        self.inner.free_pages_zeroed()
    }

    /// Test support: whether `page` is currently off the free list.
    #[doc(hidden)]
    pub fn debug_is_leased(&self, page: u32) -> bool {
        self.inner.is_leased(page)
    }
}
