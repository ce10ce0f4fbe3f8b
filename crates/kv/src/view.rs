//! Zero-copy read views over a block table's pages.

use crate::pages::{PoolInner, Slot};
use crate::slice::KvSlice;

/// A run of consecutive positions inside one page.
#[derive(Debug, Clone, Copy)]
pub struct KvChunk<'a> {
    /// First position of the chunk.
    pub start: usize,
    /// Positions in the chunk.
    pub len: usize,
    /// V rows, `[slot][row element]`: `len * row_len` elements.
    pub v: KvSlice<'a>,
    /// The page's K block, transposed (`[row element][page_size]`). Private: only the runs of
    /// written slots (`k_run`, `k_at`) are reachable, never the page's unwritten tail.
    k: KvSlice<'a>,
    page_size: usize,
}

impl<'a> KvChunk<'a> {
    /// Element `i` of the K rows of the chunk's slots, for slots `0..len`: contiguous, so a
    /// score can be computed for consecutive keys at once.
    pub fn k_run(&self, i: usize) -> KvSlice<'a> {
        self.k.sub(i * self.page_size, self.len)
    }

    /// Elements `first..first + count` of the K rows as one contiguous run (`count` runs of
    /// `page_size`, one after another), for a full chunk only: a partial one would expose its
    /// page's unwritten tail. Readers that widen a head's K page by page take it whole.
    pub fn k_block(&self, first: usize, count: usize) -> Option<KvSlice<'a>> {
        (self.len == self.page_size).then(|| self.k.sub(first * self.page_size, count * self.page_size))
    }

    /// Element `i` of slot `slot`'s K row (`slot < len`).
    pub fn k_at(&self, slot: usize, i: usize) -> f32 {
        assert!(slot < self.len, "slot {slot} outside the chunk's {} written slots", self.len);
        self.k.get(i * self.page_size + slot)
    }
}

/// Checked view of one layer over positions `[0, len)`; created by [`BlockTable::layer`].
#[derive(Clone, Copy)]
pub struct LayerView<'a> {
    pool: &'a PoolInner,
    /// The table's pages, borrowed with the table.
    slots: &'a [Slot],
    layer: usize,
    len: usize,
}

impl std::fmt::Debug for LayerView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerView").field("layer", &self.layer).field("len", &self.len).finish_non_exhaustive()
    }
}

impl<'a> LayerView<'a> {
    pub(crate) fn new(pool: &'a PoolInner, slots: &'a [Slot], layer: usize, len: usize) -> Self {
        LayerView { pool, slots, layer, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn layer(&self) -> usize {
        self.layer
    }

    /// One chunk per page touched, in position order; the last may be partial.
    pub fn chunks(&self) -> impl Iterator<Item = KvChunk<'a>> + '_ {
        self.chunks_from(0)
    }

    /// As [`LayerView::chunks`], from the page holding position `pos` on: a reader of a window
    /// or of one block of a long context does not step through the pages before it.
    pub fn chunks_from(&self, pos: usize) -> impl Iterator<Item = KvChunk<'a>> + '_ {
        let (pool, slots) = (self.pool, self.slots);
        let (layer, len) = (self.layer, self.len);
        let ps = pool.layout.page_size;
        let row = pool.layout.row_len();
        let first = pos / ps.max(1);
        slots.iter().take(len.div_ceil(ps)).enumerate().skip(first).map(move |(i, lease)| {
            let start = i * ps;
            let n = (len - start).min(ps);
            let (k_off, v_off) = (pool.k_offset(lease.page(), layer), pool.v_offset(lease.page(), layer, 0));
            // SAFETY: the view borrows the table for 'a, so neither `&mut BlockTable` (the only
            // writer of these pages) nor its drop (the only path to scrub and reuse) can happen
            // during 'a; lease uniqueness means no other table holds these pages.
            let (k, v) = unsafe { (pool.arena.view(k_off, ps * row), pool.arena.view(v_off, n * row)) };
            KvChunk { start, len: n, v, k, page_size: ps }
        })
    }
}
