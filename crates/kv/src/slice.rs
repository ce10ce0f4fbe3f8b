//! A run of KV elements in the pool's dtype, borrowed from the arena.

use half::f16;

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
