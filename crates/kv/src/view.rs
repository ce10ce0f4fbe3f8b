//! Zero-copy read views over a block table's pages.

use half::f16;

use crate::BlockTable;

/// K or V rows of a chunk: `[slot][kv_head][head_dim]` row-major, in the pool's dtype.
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
    /// `len * row_len` elements.
    pub k: KvSlice<'a>,
    /// `len * row_len` elements.
    pub v: KvSlice<'a>,
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
            let (k_off, v_off) = (pool.k_offset(lease.page(), layer, 0), pool.v_offset(lease.page(), layer, 0));
            // SAFETY: the view borrows the table for 'a, so neither `&mut BlockTable` (the only
            // writer of these pages) nor its drop (the only path to scrub and reuse) can happen
            // during 'a; lease uniqueness means no other table holds these pages.
            let (k, v) = unsafe { (pool.arena.view(k_off, n * row), pool.arena.view(v_off, n * row)) };
            KvChunk { start, len: n, k, v }
        })
    }
}
