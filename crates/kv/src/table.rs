//! Block tables: one sequence's pages, the checked write and read paths.

use std::sync::Arc;

use crate::pages::{PageLease, PoolInner, SealedPage, Slot};
use crate::prefix::{CacheScope, SEALED};
use crate::{KvError, LayerView, Owner, PageRef};

/// A sequence's pages, in position order. Not Clone. Dropping it returns every page it owns to
/// the pool (scrubbed per policy) and its references to shared prefix-cache pages.
/// `&mut BlockTable` is the only way to write its own pages, and `&BlockTable` the only way to
/// read them; shared pages are never written.
pub struct BlockTable {
    pub(crate) pool: Arc<PoolInner>,
    owner: Owner,
    pub(crate) leases: Vec<Slot>,
}

impl std::fmt::Debug for BlockTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockTable")
            .field("owner", &self.owner)
            .field("pages", &self.page_refs().collect::<Vec<_>>())
            .finish()
    }
}

impl BlockTable {
    pub(crate) fn new(pool: Arc<PoolInner>, owner: Owner, leases: Vec<PageLease>) -> Self {
        BlockTable { pool, owner, leases: leases.into_iter().map(Slot::Own).collect() }
    }

    pub(crate) fn from_slots(pool: Arc<PoolInner>, owner: Owner, slots: Vec<Slot>) -> Self {
        BlockTable { pool, owner, leases: slots }
    }

    /// Pages shared read-only from the tenant's prefix cache.
    pub fn shared_pages(&self) -> usize {
        self.leases.iter().filter(|s| matches!(s, Slot::Shared(_))).count()
    }

    /// Checks a slot against the pool: generation, and the owner this table expects, derived
    /// from its own owner (a shared page must be sealed under this table's tenant), never
    /// from what the slot says.
    fn check_slot(&self, slot: &Slot) -> Result<(), KvError> {
        match slot {
            Slot::Own(_) => self.pool.check_lease(slot.page(), slot.generation(), self.owner),
            Slot::Shared(_) => self.check_sealed(slot.page(), slot.generation()),
        }
    }

    /// The page is a sealed (cached, read-only) page of this table's tenant.
    fn check_sealed(&self, page: u32, generation: u64) -> Result<(), KvError> {
        self.pool.check_lease(page, generation, Owner { tenant: self.owner.tenant, request: SEALED })
    }

    /// The own (writable) slot at page index `i`, checked.
    fn writable(&self, i: usize) -> Result<(), KvError> {
        match self.leases.get(i) {
            Some(s @ Slot::Own(_)) => self.check_slot(s),
            Some(s @ Slot::Shared(_)) => Err(KvError::ReadOnly { page: s.page() }),
            None => Err(KvError::OutOfRange { what: "page", index: i, limit: self.leases.len() }),
        }
    }

    /// Seals the whole pages of `prompt` (whose KV this table holds, written at every layer)
    /// into `scope`'s prefix cache, keyed by the hash chain of their tokens, and keeps a copy of
    /// the page holding the prompt's last token as the prompt's tail (the page itself stays
    /// this table's: decode writes after the prompt). Pages already shared stay as they are;
    /// a page whose key is already cached (sealed by another request first) stays private to
    /// this table; a tail is not kept when no page is free for it. `tags[i]` (where given) names
    /// whole page `i` for a router ([`crate::RouteTag`]), whether this table sealed it or found
    /// it cached. Returns how many pages were added to the cache.
    pub fn seal_prefix(
        &mut self,
        scope: &CacheScope,
        prompt: &[u32],
        tags: &[crate::RouteTag],
    ) -> Result<usize, KvError> {
        let (mut added, keys) = self.seal_whole_pages(scope, prompt, tags)?;
        let ps = self.pool.layout.page_size;
        let last = prompt.len().saturating_sub(1) / ps;
        if !prompt.is_empty() && last < self.leases.len() {
            let key = scope.tail(last.checked_sub(1).and_then(|i| keys.get(i)), &prompt[last * ps..]);
            if !self.pool.cache().contains(&key) && self.keep_tail(key, last, prompt.len() - last * ps)? {
                added += 1;
            }
        }
        Ok(added)
    }

    /// [`BlockTable::seal_prefix`] without the tail: only whole pages are sealed (a receiver
    /// of transferred KV reuses whole pages only). Returns how many pages were added.
    pub fn seal_pages(
        &mut self,
        scope: &CacheScope,
        prompt: &[u32],
        tags: &[crate::RouteTag],
    ) -> Result<usize, KvError> {
        Ok(self.seal_whole_pages(scope, prompt, tags)?.0)
    }

    fn seal_whole_pages(
        &mut self,
        scope: &CacheScope,
        prompt: &[u32],
        tags: &[crate::RouteTag],
    ) -> Result<(usize, Vec<crate::prefix::PrefixKey>), KvError> {
        if scope.tenant() != self.owner.tenant {
            return Err(KvError::WrongOwner {
                page: 0,
                expected: self.owner,
                found: Owner { tenant: scope.tenant(), request: SEALED },
            });
        }
        let ps = self.pool.layout.page_size;
        let full = (prompt.len() / ps).min(self.leases.len());
        let keys = scope.chain(&prompt[..full * ps], ps);
        for i in 0..full {
            self.check_slot(&self.leases[i])?;
            for layer in 0..self.pool.layout.n_layers {
                if let Some(slot) = self.pool.first_unwritten(self.leases[i].page(), layer, ps) {
                    return Err(KvError::Unwritten { layer, pos: i * ps + slot });
                }
            }
        }
        let mut added = 0;
        let slots = std::mem::take(&mut self.leases);
        self.leases = slots
            .into_iter()
            .enumerate()
            .map(|(i, slot)| match slot {
                Slot::Own(lease) if i < full => {
                    let sealed = Arc::new(lease.seal());
                    if self.pool.cache().insert(self.owner.tenant, keys[i], i, &sealed) {
                        added += 1;
                    }
                    Slot::Shared(sealed)
                }
                other => other,
            })
            .collect();
        {
            let mut cache = self.pool.cache();
            for (key, tag) in keys.iter().zip(tags) {
                cache.tag(key, *tag);
            }
        }
        Ok((added, keys))
    }

    /// Copies the first `rows` slots of page `index` into a page of the cache's own, sealed
    /// under `key`. False when no page is free or another request's tail got there first.
    fn keep_tail(&self, key: crate::prefix::PrefixKey, index: usize, rows: usize) -> Result<bool, KvError> {
        self.check_slot(&self.leases[index])?;
        let Ok(mut copy) = self.pool.lease_pages(self.owner, 1) else { return Ok(false) };
        let Some(copy) = copy.pop() else { return Ok(false) };
        // SAFETY: `&self` (the table's, which `seal_prefix` holds mutably) excludes every writer
        // of its page; the fresh lease is ours alone.
        unsafe { self.pool.copy_rows(self.leases[index].page(), copy.page(), rows)? };
        let sealed = Arc::new(copy.seal());
        Ok(self.pool.cache().insert(self.owner.tenant, key, index, &sealed))
    }

    /// Copies the first `rows` slots of a cached tail (sealed under this table's tenant) into
    /// this table's own page `index`.
    pub(crate) fn copy_tail(&mut self, tail: &SealedPage, index: usize, rows: usize) -> Result<(), KvError> {
        let src = &tail.lease;
        self.check_sealed(src.page(), src.generation())?;
        self.writable(index)?;
        // SAFETY: a sealed page is never written; `&mut self` makes its own page ours alone.
        unsafe { self.pool.copy_rows(src.page(), self.leases[index].page(), rows) }
    }

    pub fn owner(&self) -> Owner {
        self.owner
    }

    /// The layout of the pool these pages belong to.
    pub fn layout(&self) -> &crate::KvLayout {
        &self.pool.layout
    }

    /// Token slots held: `pages() * page_size`.
    pub fn capacity(&self) -> usize {
        self.leases.len() * self.pool.layout.page_size
    }

    pub fn pages(&self) -> usize {
        self.leases.len()
    }

    /// (page, generation) of every page, in position order.
    pub fn page_refs(&self) -> impl Iterator<Item = PageRef> + '_ {
        self.leases.iter().map(|s| s.lease().page_ref())
    }

    /// Ensures `capacity() >= tokens` by adding whole pages, all or nothing.
    pub fn grow(&mut self, tokens: usize) -> Result<(), KvError> {
        let need = self.pool.layout.pages_for(tokens).saturating_sub(self.leases.len());
        let new = self.pool.lease_pages(self.owner, need)?;
        self.leases.extend(new.into_iter().map(Slot::Own));
        Ok(())
    }

    fn check_layer(&self, layer: usize) -> Result<(), KvError> {
        let n_layers = self.pool.layout.n_layers;
        if layer >= n_layers {
            return Err(KvError::OutOfRange { what: "layer", index: layer, limit: n_layers });
        }
        Ok(())
    }

    /// The lease holding `pos` (checked against the pool's metadata) and the slot within it.
    fn locate(&self, layer: usize, pos: usize) -> Result<(&Slot, usize), KvError> {
        self.check_layer(layer)?;
        let ps = self.pool.layout.page_size;
        let Some(lease) = self.leases.get(pos / ps) else {
            return Err(KvError::OutOfRange { what: "position", index: pos, limit: self.capacity() });
        };
        self.check_slot(lease)?;
        Ok((lease, pos % ps))
    }

    fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), KvError> {
        if expected != got {
            return Err(KvError::LengthMismatch { what, expected, got });
        }
        Ok(())
    }

    /// Writes K and V (converted to the pool dtype) of one position at one layer and marks the
    /// slot written in the page's current generation.
    pub fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) -> Result<(), KvError> {
        let row = self.pool.layout.row_len();
        Self::check_len("k", row, k.len())?;
        Self::check_len("v", row, v.len())?;
        let (lease, slot) = self.locate(layer, pos)?;
        // `locate` checked the page against the pool; only its kind is left to check.
        if let Slot::Shared(_) = lease {
            return Err(KvError::ReadOnly { page: lease.page() });
        }
        let page = lease.page();
        let pool = &self.pool;
        // SAFETY: `&mut self` is the only writer of this table's pages and excludes every reader
        // (readers borrow the table); lease uniqueness means no other table holds `page`.
        unsafe {
            pool.arena.store_strided(pool.k_offset(page, layer) + slot, pool.layout.page_size, k);
            pool.arena.store(pool.v_offset(page, layer, slot), v);
        }
        pool.mark_written(page, layer, slot, slot + 1);
        Ok(())
    }

    /// Writes consecutive positions `[start, start + n)` at one layer, where `k` and `v` hold
    /// `n * row_len` elements each (`[pos][kv_head][head_dim]`). Validates everything first:
    /// on error nothing is written.
    pub fn write_range(&mut self, layer: usize, start: usize, k: &[f32], v: &[f32]) -> Result<(), KvError> {
        let row = self.pool.layout.row_len();
        let n = k.len() / row;
        Self::check_len("k", n * row, k.len())?;
        Self::check_len("v", k.len(), v.len())?;
        self.check_layer(layer)?;
        let end = start.saturating_add(n);
        if end > self.capacity() {
            return Err(KvError::BeyondCapacity { len: end, capacity: self.capacity() });
        }
        let ps = self.pool.layout.page_size;
        for i in start / ps..end.div_ceil(ps) {
            self.writable(i)?;
        }
        let pool = &self.pool;
        let mut pos = start;
        while pos < end {
            let (page, slot) = (self.leases[pos / ps].page(), pos % ps);
            let take = (ps - slot).min(end - pos);
            let src = (pos - start) * row..(pos - start + take) * row;
            // SAFETY: as in `write`: `&mut self` is the sole accessor of this table's pages.
            unsafe {
                for t in 0..take {
                    let krow = &k[src.start + t * row..src.start + (t + 1) * row];
                    pool.arena.store_strided(pool.k_offset(page, layer) + slot + t, ps, krow);
                }
                pool.arena.store(pool.v_offset(page, layer, slot), &v[src]);
            }
            pool.mark_written(page, layer, slot, slot + take);
            pos += take;
        }
        Ok(())
    }

    /// Checks `layer`, that `[start, start + n)` lies inside the table and that every page it
    /// touches is still this lease's; returns the end position.
    fn check_rows(&self, layer: usize, start: usize, n: usize) -> Result<usize, KvError> {
        self.check_layer(layer)?;
        let end = start.saturating_add(n);
        if end > self.capacity() {
            return Err(KvError::BeyondCapacity { len: end, capacity: self.capacity() });
        }
        let ps = self.pool.layout.page_size;
        for lease in self.leases.iter().take(end.div_ceil(ps)).skip(start / ps) {
            self.check_slot(lease)?;
        }
        Ok(end)
    }

    /// Appends the K rows then the V rows of positions `[start, start + n)` at `layer` to
    /// `out`, as little-endian elements of the pool dtype: the payload of a KV frame. Every
    /// slot must have been written in this lease (a sender never ships unwritten memory).
    pub fn export_rows(&self, layer: usize, start: usize, n: usize, out: &mut Vec<u8>) -> Result<(), KvError> {
        let end = self.check_rows(layer, start, n)?;
        let ps = self.pool.layout.page_size;
        for pos in start..end {
            let (lease, slot) = (&self.leases[pos / ps], pos % ps);
            if !self.pool.is_written(lease.page(), layer, slot) {
                return Err(KvError::Unwritten { layer, pos });
            }
        }
        let row = self.pool.layout.row_len();
        out.reserve(2 * n * row * self.pool.layout.dtype.bytes());
        let pool = &self.pool;
        // SAFETY: `&self` excludes the only writer of this table's pages (`&mut BlockTable`),
        // and lease uniqueness means no other table holds them.
        unsafe {
            for pos in start..end {
                let (page, slot) = (self.leases[pos / ps].page(), pos % ps);
                pool.arena.load_bytes_strided(pool.k_offset(page, layer) + slot, ps, row, out);
            }
            for pos in start..end {
                let (page, slot) = (self.leases[pos / ps].page(), pos % ps);
                pool.arena.load_bytes_strided(pool.v_offset(page, layer, slot), 1, row, out);
            }
        }
        Ok(())
    }

    /// Writes positions `[start, start + n)` at `layer` from `bytes` laid out as
    /// [`BlockTable::export_rows`] produces them, and marks the slots written. Validates
    /// everything first: on error nothing is written.
    pub fn import_rows(&mut self, layer: usize, start: usize, n: usize, bytes: &[u8]) -> Result<(), KvError> {
        let row_bytes = self.pool.layout.row_len() * self.pool.layout.dtype.bytes();
        Self::check_len("payload", 2 * n * row_bytes, bytes.len())?;
        let end = self.check_rows(layer, start, n)?;
        let ps = self.pool.layout.page_size;
        for i in start / ps..end.div_ceil(ps) {
            self.writable(i)?;
        }
        let (k, v) = bytes.split_at(n * row_bytes);
        let pool = &self.pool;
        for (i, pos) in (start..end).enumerate() {
            let (page, slot) = (self.leases[pos / ps].page(), pos % ps);
            let rows = i * row_bytes..(i + 1) * row_bytes;
            // SAFETY: as in `write`: `&mut self` is the sole accessor of this table's pages.
            unsafe {
                pool.arena.store_bytes_strided(pool.k_offset(page, layer) + slot, ps, &k[rows.clone()]);
                pool.arena.store_bytes_strided(pool.v_offset(page, layer, slot), 1, &v[rows]);
            }
            pool.mark_written(page, layer, slot, slot + 1);
        }
        Ok(())
    }

    /// Checked zero-copy view of positions `[0, len)` at `layer`: every page touched must still
    /// be this lease's (generation and owner) and every slot written at this layer.
    pub fn layer(&self, layer: usize, len: usize) -> Result<LayerView<'_>, KvError> {
        self.check_layer(layer)?;
        if len > self.capacity() {
            return Err(KvError::BeyondCapacity { len, capacity: self.capacity() });
        }
        let ps = self.pool.layout.page_size;
        for (i, lease) in self.leases.iter().take(len.div_ceil(ps)).enumerate() {
            self.check_slot(lease)?;
            let n = (len - i * ps).min(ps);
            if let Some(slot) = self.pool.first_unwritten(lease.page(), layer, n) {
                return Err(KvError::Unwritten { layer, pos: i * ps + slot });
            }
        }
        Ok(LayerView::new(&self.pool, &self.leases, layer, len))
    }

    /// Checks that positions `[0, len)` are written at every layer (e.g. before decode starts).
    pub fn verify_written(&self, len: usize) -> Result<(), KvError> {
        for layer in 0..self.pool.layout.n_layers {
            self.layer(layer, len)?;
        }
        Ok(())
    }

    /// Whether `(layer, pos)` was written in this lease (false when out of range or stale).
    pub fn is_written(&self, layer: usize, pos: usize) -> bool {
        self.locate(layer, pos).is_ok_and(|(lease, slot)| self.pool.is_written(lease.page(), layer, slot))
    }

    /// Reads back one slot as f32. Errors when the slot was not written in this lease.
    pub fn read(&self, layer: usize, pos: usize, k_out: &mut [f32], v_out: &mut [f32]) -> Result<(), KvError> {
        let row = self.pool.layout.row_len();
        Self::check_len("k_out", row, k_out.len())?;
        Self::check_len("v_out", row, v_out.len())?;
        let (lease, slot) = self.locate(layer, pos)?;
        let page = lease.page();
        if !self.pool.is_written(page, layer, slot) {
            return Err(KvError::Unwritten { layer, pos });
        }
        let pool = &self.pool;
        // SAFETY: `&self` excludes the only writer of this table's pages (`&mut BlockTable`),
        // and lease uniqueness means no other table holds `page`.
        unsafe {
            pool.arena.load_strided(pool.k_offset(page, layer) + slot, pool.layout.page_size, k_out);
            pool.arena.load(pool.v_offset(page, layer, slot), v_out);
        }
        Ok(())
    }

    /// The incident's bug, for the audit's self-test only: declares positions `[0, len)`
    /// written at every layer whatever they hold.
    #[cfg(feature = "incident-replay")]
    pub fn incident_mark_written(&mut self, len: usize) {
        let ps = self.pool.layout.page_size;
        for (i, lease) in self.leases.iter().take(len.div_ceil(ps)).enumerate() {
            let n = (len - i * ps).min(ps);
            for layer in 0..self.pool.layout.n_layers {
                self.pool.mark_written(lease.page(), layer, 0, n);
            }
        }
    }

    /// Test support: makes page `index` of this table stale (its generation moves on, as if
    /// the page had been freed and leased again), so the next access to it fails closed.
    #[doc(hidden)]
    pub fn debug_make_page_stale(&self, index: usize) {
        if let Some(lease) = self.leases.get(index) {
            self.pool.tamper(lease.page(), lease.generation() + 1, self.owner);
        }
    }

    /// Test support: whether every byte of every page of this table is zero.
    #[doc(hidden)]
    pub fn debug_pages_zeroed(&self) -> bool {
        self.leases.iter().all(|lease| {
            // SAFETY: `&self` excludes the table's only writer; the page is held by this table.
            unsafe { self.pool.page_is_zero(lease.page()) }
        })
    }
}
