//! Zero-copy read views over a block table's pages.

use half::f16;

use crate::BlockTable;

/// Elements of a page in the pool's dtype (V rows, or a run of one K element across slots).
#[derive(Debug, Clone, Copy)]
pub enum KvSlice<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
}

impl<'a> KvSlice<'a> {
    pub fn len(&self) -> usize {
        match self {
            KvSlice::F16(s) => s.len(),
            KvSlice::F32(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as f32 (panics when out of bounds, like slice indexing).
    pub fn get(&self, i: usize) -> f32 {
        match self {
            KvSlice::F16(s) => s[i].to_f32(),
            KvSlice::F32(s) => s[i],
        }
    }

    /// `len` elements from `start`.
    pub fn sub(&self, start: usize, len: usize) -> KvSlice<'a> {
        match *self {
            KvSlice::F16(s) => KvSlice::F16(&s[start..start + len]),
            KvSlice::F32(s) => KvSlice::F32(&s[start..start + len]),
        }
    }

    /// Copies the elements into `dst` as f32 (`dst.len()` must equal `self.len()`).
    pub fn copy_to_f32(&self, dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        match self {
            KvSlice::F16(s) => s.convert_to_f32_slice(dst),
            KvSlice::F32(s) => dst.copy_from_slice(s),
        }
    }
}

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

    /// Element `i` of slot `slot`'s K row (`slot < len`).
    pub fn k_at(&self, slot: usize, i: usize) -> f32 {
        assert!(slot < self.len, "slot {slot} outside the chunk's {} written slots", self.len);
        self.k.get(i * self.page_size + slot)
    }
}

/// Checked view of one layer over positions `[0, len)`; created by [`BlockTable::layer`].
#[derive(Debug, Clone, Copy)]
pub struct LayerView<'a> {
    table: &'a BlockTable,
    layer: usize,
    len: usize,
}

impl<'a> LayerView<'a> {
    pub(crate) fn new(table: &'a BlockTable, layer: usize, len: usize) -> Self {
        LayerView { table, layer, len }
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
        let table: &'a BlockTable = self.table;
        let (layer, len) = (self.layer, self.len);
        let pool = &*table.pool;
        let ps = pool.layout.page_size;
        let row = pool.layout.row_len();
        table.leases.iter().take(len.div_ceil(ps)).enumerate().map(move |(i, lease)| {
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
