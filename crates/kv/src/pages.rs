//! The pages of a pool: the arena, per-page metadata (generation, owner, written bits), the
//! free list and per-tenant accounting, and the leases that hold pages. A lease is taken from
//! and given back to [`PoolInner`] here; [`crate::KvPool`] is the public handle over it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::arena::Arena;
use crate::prefix::{CacheScope, PrefixCache, SEALED};
use crate::{Capacity, KvError, KvLayout, Owner, PageRef, PoolConfig, RequestId, ScrubPolicy, TenantId};

/// Metadata of one page, read lock-free on every access to check the lease against it.
struct PageMeta {
    generation: AtomicU64,
    tenant: AtomicU64,
    request: AtomicU64,
}

/// What one page holds, as an operator's map shows it (never its content).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageUse {
    Free,
    /// Leased to a request of this tenant.
    Request(TenantId),
    /// A sealed prefix page in this tenant's cache (read-only, shared within the tenant).
    Sealed(TenantId),
}

/// Mutable pool state; locked only to reserve and free pages, never to read or write KV.
struct FreeState {
    /// Free pages, used as a stack (most recently freed page is reused first).
    free: Vec<u32>,
    /// `leased[p]` is true while page `p` is off the free list.
    leased: Vec<bool>,
    by_tenant: HashMap<TenantId, usize>,
}

pub(crate) struct PoolInner {
    pub(crate) layout: KvLayout,
    pub(crate) scrub: ScrubPolicy,
    pub(crate) total_pages: usize,
    page_elems: usize,
    /// u64 words of written bits per (page, layer).
    mask_words: usize,
    pub(crate) arena: Arena,
    meta: Box<[PageMeta]>,
    /// Written bits, indexed by `((page * n_layers) + layer) * mask_words + word`.
    written: Box<[AtomicU64]>,
    state: Mutex<FreeState>,
    scrubbed: AtomicU64,
    /// Locked after `state` is released, never while holding it: evicted pages are freed
    /// (which takes `state`) once this lock is dropped too.
    cache: Mutex<PrefixCache<SealedPage>>,
    /// Keys the roots of every tenant's prefix-cache chain; drawn at random, never leaves.
    cache_secret: [u8; 32],
}

impl PoolInner {
    /// The pages of a pool, the whole arena allocated (zeroed) up front.
    pub(crate) fn new(cfg: PoolConfig) -> Result<PoolInner, KvError> {
        let layout = cfg.layout;
        layout.validate()?;
        let page_bytes = layout.page_bytes();
        let pages = match cfg.capacity {
            Capacity::Tokens(t) => t / layout.page_size,
            Capacity::Bytes(b) => b / page_bytes,
        };
        if pages == 0 {
            let detail = match cfg.capacity {
                Capacity::Tokens(t) => format!("{t} tokens is less than one page of {} tokens", layout.page_size),
                Capacity::Bytes(b) => {
                    format!("{b} bytes is less than one page of {page_bytes} bytes")
                }
            };
            return Err(KvError::InvalidConfig { field: "capacity", detail });
        }
        if pages > u32::MAX as usize {
            return Err(KvError::InvalidConfig {
                field: "capacity",
                detail: format!("{pages} pages exceeds the maximum of {}", u32::MAX),
            });
        }
        let page_elems = layout.page_elems();
        let elems = pages.checked_mul(page_elems).ok_or(KvError::AllocationFailed { bytes: usize::MAX })?;
        let arena = Arena::zeroed(layout.dtype, elems)?;
        let mask_words = layout.page_size.div_ceil(64);
        let meta = (0..pages)
            .map(|_| PageMeta { generation: AtomicU64::new(0), tenant: AtomicU64::new(0), request: AtomicU64::new(0) })
            .collect();
        let written = (0..pages * layout.n_layers * mask_words).map(|_| AtomicU64::new(0)).collect();
        let state = FreeState {
            free: (0..pages as u32).rev().collect(),
            leased: vec![false; pages],
            by_tenant: HashMap::new(),
        };
        let mut cache_secret = [0u8; 32];
        getrandom::fill(&mut cache_secret).map_err(|e| KvError::InvalidConfig {
            field: "prefix cache",
            detail: format!("no randomness for the cache key: {e}"),
        })?;
        Ok(PoolInner {
            layout,
            scrub: cfg.scrub,
            total_pages: pages,
            page_elems,
            mask_words,
            arena,
            meta,
            written,
            state: Mutex::new(state),
            scrubbed: AtomicU64::new(0),
            cache: Mutex::new(PrefixCache::default()),
            cache_secret,
        })
    }

    fn lock(&self) -> MutexGuard<'_, FreeState> {
        // The state is updated with plain stores that cannot panic half-way; a poisoned lock
        // still holds consistent data.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn cache(&self) -> MutexGuard<'_, PrefixCache<SealedPage>> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Frees up to `n` idle prefix-cache pages (least recently used first).
    fn evict(&self, n: usize) {
        let gone = self.cache().evict(n);
        // Dropped here, after the cache lock: each last reference frees its page.
        drop(gone);
    }

    /// Offset of `layer`'s K block in page `page`. K is stored transposed, `[row element][slot]`
    /// (element `i` of slot `s` at `i * page_size + s`), so attention reads the same element of
    /// consecutive keys contiguously; V follows as rows, `[slot][row element]`.
    pub(crate) fn k_offset(&self, page: u32, layer: usize) -> usize {
        let row = self.layout.row_len();
        page as usize * self.page_elems + layer * 2 * self.layout.page_size * row
    }

    pub(crate) fn v_offset(&self, page: u32, layer: usize, slot: usize) -> usize {
        let row = self.layout.row_len();
        self.k_offset(page, layer) + self.layout.page_size * row + slot * row
    }

    fn mask(&self, page: u32, layer: usize) -> &[AtomicU64] {
        let base = (page as usize * self.layout.n_layers + layer) * self.mask_words;
        &self.written[base..base + self.mask_words]
    }

    // The written bits of a page are only touched by its lease holder (or by the pool while it
    // holds the page exclusively); cross-thread hand-over goes through the free-list mutex or
    // through moving the BlockTable, both of which synchronise. Relaxed is therefore enough.

    /// Marks slots `[from, to)` of `page` written at `layer`.
    pub(crate) fn mark_written(&self, page: u32, layer: usize, from: usize, to: usize) {
        let mask = self.mask(page, layer);
        let mut s = from;
        while s < to {
            let (w, b) = (s / 64, s % 64);
            let n = (64 - b).min(to - s);
            let bits = if n == 64 { u64::MAX } else { ((1u64 << n) - 1) << b };
            mask[w].fetch_or(bits, Ordering::Relaxed);
            s += n;
        }
    }

    /// Copies slots `[0, rows)` of every layer from page `src` into page `dst` and marks them
    /// written there: a cached prompt tail handed to a table, or a table's tail kept by the
    /// cache. Fails, copying nothing, if a source slot was never written.
    ///
    /// # Safety
    /// `src != dst`; nobody writes `src` during the call, and the caller holds `dst`'s lease
    /// exclusively.
    pub(crate) unsafe fn copy_rows(&self, src: u32, dst: u32, rows: usize) -> Result<(), KvError> {
        let (ps, row) = (self.layout.page_size, self.layout.row_len());
        assert!(src != dst && rows <= ps);
        for layer in 0..self.layout.n_layers {
            if let Some(slot) = self.first_unwritten(src, layer, rows) {
                return Err(KvError::Unwritten { layer, pos: slot });
            }
        }
        for layer in 0..self.layout.n_layers {
            // SAFETY: distinct pages, so disjoint ranges; exclusivity per the caller's contract.
            unsafe {
                // K is transposed: the first `rows` slots of each element's run of page_size.
                for e in 0..row {
                    self.arena.copy(self.k_offset(src, layer) + e * ps, self.k_offset(dst, layer) + e * ps, rows);
                }
                self.arena.copy(self.v_offset(src, layer, 0), self.v_offset(dst, layer, 0), rows * row);
            }
            self.mark_written(dst, layer, 0, rows);
        }
        Ok(())
    }

    /// First slot in `[0, n)` of `page` not written at `layer`, if any.
    pub(crate) fn first_unwritten(&self, page: u32, layer: usize, n: usize) -> Option<usize> {
        let mask = self.mask(page, layer);
        for (w, word) in mask.iter().enumerate().take(n.div_ceil(64)) {
            let in_word = (n - w * 64).min(64);
            let want = if in_word == 64 { u64::MAX } else { (1u64 << in_word) - 1 };
            let missing = !word.load(Ordering::Relaxed) & want;
            if missing != 0 {
                return Some(w * 64 + missing.trailing_zeros() as usize);
            }
        }
        None
    }

    pub(crate) fn is_written(&self, page: u32, layer: usize, slot: usize) -> bool {
        self.mask(page, layer)[slot / 64].load(Ordering::Relaxed) & (1u64 << (slot % 64)) != 0
    }

    fn clear_written(&self, page: u32) {
        let base = page as usize * self.layout.n_layers * self.mask_words;
        for w in &self.written[base..base + self.layout.n_layers * self.mask_words] {
            w.store(0, Ordering::Relaxed);
        }
    }

    /// Checks that `page` is still at `generation` and owned by `owner`.
    pub(crate) fn check_lease(&self, page: u32, generation: u64, owner: Owner) -> Result<(), KvError> {
        let meta = &self.meta[page as usize];
        let found = meta.generation.load(Ordering::Acquire);
        if found != generation {
            return Err(KvError::StaleGeneration { page, expected: generation, found });
        }
        let found = Owner {
            tenant: TenantId(meta.tenant.load(Ordering::Acquire)),
            request: RequestId(meta.request.load(Ordering::Acquire)),
        };
        if found != owner {
            return Err(KvError::WrongOwner { page, expected: owner, found });
        }
        Ok(())
    }

    /// Zeroes every element of `page`. Caller holds the page exclusively.
    fn scrub(&self, page: u32) {
        if cfg!(feature = "incident-replay") {
            return;
        }
        // SAFETY: callers own the page exclusively: it is either being released by its dropped
        // lease (no borrow of the lease can outlive the drop), or was just popped from the free
        // list under the mutex and not yet handed out.
        unsafe { self.arena.zero(page as usize * self.page_elems, self.page_elems) };
        self.scrubbed.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes `n` pages for `owner`, all or nothing.
    pub(crate) fn lease_pages(self: &Arc<Self>, owner: Owner, n: usize) -> Result<Vec<PageLease>, KvError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        // Idle cached pages count as free: a reservation evicts what it needs, so whether a
        // request waits never depends on what other tenants keep cached.
        let short = n.saturating_sub(self.lock().free.len());
        if short > 0 {
            self.evict(short);
        }
        let pages = {
            let mut st = self.lock();
            if st.free.len() < n {
                return Err(KvError::Exhausted { requested_pages: n, free_pages: st.free.len() });
            }
            let at = st.free.len() - n;
            let pages = st.free.split_off(at);
            for &p in &pages {
                st.leased[p as usize] = true;
            }
            *st.by_tenant.entry(owner.tenant).or_insert(0) += n;
            pages
        };
        Ok(pages.into_iter().rev().map(|page| self.hand_out(page, owner)).collect())
    }

    /// Prepares a page just taken off the free list: scrub (OnAlloc), reset written bits,
    /// bump the generation, record the owner.
    fn hand_out(self: &Arc<Self>, page: u32, owner: Owner) -> PageLease {
        if self.scrub == ScrubPolicy::OnAlloc {
            self.scrub(page);
        }
        self.clear_written(page);
        let meta = &self.meta[page as usize];
        let generation = meta.generation.load(Ordering::Relaxed) + 1;
        meta.tenant.store(owner.tenant.0, Ordering::Release);
        meta.request.store(owner.request.0, Ordering::Release);
        meta.generation.store(generation, Ordering::Release);
        PageLease { pool: Arc::clone(self), page, generation, owner }
    }

    fn release(&self, page: u32, tenant: TenantId) {
        if self.scrub == ScrubPolicy::OnFree {
            self.scrub(page);
        }
        self.clear_written(page);
        let mut st = self.lock();
        st.leased[page as usize] = false;
        st.free.push(page);
        if let Some(count) = st.by_tenant.get_mut(&tenant) {
            *count -= 1;
            if *count == 0 {
                st.by_tenant.remove(&tenant);
            }
        }
    }

    /// Whether every byte of `page` is zero.
    ///
    /// # Safety
    /// Nobody may write the page during the call (the caller holds its lease by shared borrow).
    pub(crate) unsafe fn page_is_zero(&self, page: u32) -> bool {
        // SAFETY: no writer per the caller's contract.
        unsafe { self.arena.is_zero(page as usize * self.page_elems, self.page_elems) }
    }

    pub(crate) fn tamper(&self, page: u32, generation: u64, owner: Owner) {
        let meta = &self.meta[page as usize];
        meta.generation.store(generation, Ordering::Release);
        meta.tenant.store(owner.tenant.0, Ordering::Release);
        meta.request.store(owner.request.0, Ordering::Release);
    }

    /// Zeroes one free page, exactly as a scrub does (for `KvPool::scrub_one_page_for_bench`).
    /// The page is off the free list for the duration of the call.
    pub(crate) fn scrub_one_free_page(&self) -> bool {
        let page = {
            let mut st = self.lock();
            let Some(page) = st.free.pop() else {
                return false;
            };
            st.leased[page as usize] = true;
            page
        };
        self.scrub(page);
        let mut st = self.lock();
        st.leased[page as usize] = false;
        st.free.push(page);
        true
    }

    /// Whether every free page is all-zero bytes.
    pub(crate) fn free_pages_zeroed(&self) -> bool {
        let inner = self;
        let st = inner.lock();
        st.free.iter().all(|&p| {
            // SAFETY: a page on the free list is touched only by whoever pops it under the
            // mutex, which we hold for the whole check.
            unsafe { inner.arena.is_zero(p as usize * inner.page_elems, inner.page_elems) }
        })
    }

    /// Scrubs done since the pool was built.
    pub(crate) fn pages_scrubbed(&self) -> u64 {
        self.scrubbed.load(Ordering::Relaxed)
    }

    /// The prefix-cache scope of `tenant`, keyed by this pool's secret (which never leaves).
    pub(crate) fn scope(&self, tenant: TenantId, client_salt: Option<&str>) -> CacheScope {
        CacheScope::derive(&self.cache_secret, tenant, client_salt)
    }

    /// Whether `page` is off the free list.
    pub(crate) fn is_leased(&self, page: u32) -> bool {
        self.lock().leased.get(page as usize).copied().unwrap_or(false)
    }

    pub(crate) fn free_count(&self) -> usize {
        self.lock().free.len()
    }

    /// Who holds each page, in page order: a snapshot taken under the free-list lock, so a page
    /// is either free or has the one owner its lease recorded.
    pub(crate) fn page_map(&self) -> Vec<PageUse> {
        let st = self.lock();
        st.leased
            .iter()
            .zip(self.meta.iter())
            .map(|(&leased, meta)| {
                if !leased {
                    return PageUse::Free;
                }
                let tenant = TenantId(meta.tenant.load(Ordering::Acquire));
                if meta.request.load(Ordering::Acquire) == SEALED.0 {
                    PageUse::Sealed(tenant)
                } else {
                    PageUse::Request(tenant)
                }
            })
            .collect()
    }

    /// Pages leased by `tenant` (its requests' and its sealed cached ones).
    pub(crate) fn pages_of(&self, tenant: TenantId) -> usize {
        self.lock().by_tenant.get(&tenant).copied().unwrap_or(0)
    }
}

/// Exclusive lease of one page. Not Clone; dropping it scrubs (per policy) and frees the page.
pub struct PageLease {
    pool: Arc<PoolInner>,
    page: u32,
    generation: u64,
    owner: Owner,
}

impl PageLease {
    /// Turns this lease into a read-only page of its tenant's prefix cache: the pool records
    /// the page under the sealed owner, which no live request has, so no table can write it
    /// and only tables of the same tenant can read it.
    pub(crate) fn seal(mut self) -> SealedPage {
        let meta = &self.pool.meta[self.page as usize];
        meta.request.store(SEALED.0, Ordering::Release);
        self.owner.request = SEALED;
        SealedPage { lease: self }
    }

    pub fn page(&self) -> u32 {
        self.page
    }
    pub fn generation(&self) -> u64 {
        self.generation
    }
    pub fn owner(&self) -> Owner {
        self.owner
    }
    pub fn page_ref(&self) -> PageRef {
        PageRef { page: self.page, generation: self.generation }
    }
}

impl std::fmt::Debug for PageLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageLease")
            .field("page", &self.page)
            .field("generation", &self.generation)
            .field("owner", &self.owner)
            .finish()
    }
}

impl Drop for PageLease {
    fn drop(&mut self) {
        self.pool.release(self.page, self.owner.tenant);
    }
}

/// A page sealed into a tenant's prefix cache: read-only, shared by every block table of that
/// tenant that reuses it; scrubbed and freed when the last holder drops it.
#[derive(Debug)]
pub struct SealedPage {
    pub(crate) lease: PageLease,
}

/// One page of a table: its own (exclusive, writable), or a sealed page of its tenant's
/// prefix cache (shared, read-only).
#[derive(Debug)]
pub(crate) enum Slot {
    Own(PageLease),
    Shared(Arc<SealedPage>),
}

impl Slot {
    pub(crate) fn lease(&self) -> &PageLease {
        match self {
            Slot::Own(l) => l,
            Slot::Shared(s) => &s.lease,
        }
    }

    pub(crate) fn page(&self) -> u32 {
        self.lease().page()
    }

    pub(crate) fn generation(&self) -> u64 {
        self.lease().generation()
    }
}
