//! The weighted sum of values for several query heads at once, in registers (AVX-512).
//!
//! The heads of a group weigh the same value rows, so each row is loaded (and widened, from an
//! f16 pool) once for all of them; one head at a time, a prefill row at a long context loaded
//! every value from L2 once per head, and those loads were its attention's largest cost. Each
//! head's arithmetic is [`super::softmax_weighted_sum`]'s, operation for operation: keys
//! alternate between an even and an odd accumulator counted from the first key, the two are
//! added, then multiplied by the inverse of the softmax's sum. So are the bits.

use std::arch::x86_64::{
    __m512, _mm256_loadu_si256, _mm512_add_ps, _mm512_cvtph_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mul_ps,
    _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
};

use std::ops::Range;

use half::f16;
use kv::KvSlice;

use super::prefetch::prefetch;
use super::softmax::LANES;

/// Value dimensions per pass: four vectors of a row (two where a split leaves 32).
const DIMS: usize = 64;
const VECS: usize = DIMS / LANES;
const HALF: usize = VECS / 2;
/// Query heads per pass: their even and odd accumulators (2 x 3 x 4) and the row being added
/// (4) fill 28 of the 32 vector registers.
const HEADS: usize = 3;

/// An element type value rows are stored in.
pub(super) trait Lanes: Copy {
    /// Sixteen elements from the start of `s` as f32 lanes.
    ///
    /// # Safety
    /// The CPU has AVX-512F and F16C (callers are functions that enable them, after detection).
    unsafe fn load16(s: &[Self]) -> __m512;
    fn slice(s: &[Self]) -> KvSlice<'_>;
}

impl Lanes for f16 {
    #[inline(always)]
    unsafe fn load16(s: &[f16]) -> __m512 {
        let s = &s[..LANES];
        // SAFETY: the features, by the caller's contract; `s` is sixteen f16, the 32 bytes
        // loaded.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr().cast())) }
    }

    fn slice(s: &[f16]) -> KvSlice<'_> {
        KvSlice::F16(s)
    }
}

impl Lanes for f32 {
    #[inline(always)]
    unsafe fn load16(s: &[f32]) -> __m512 {
        let s = &s[..LANES];
        // SAFETY: as for f16; `s` is sixteen f32, the 64 bytes loaded.
        unsafe { _mm512_loadu_ps(s.as_ptr()) }
    }

    fn slice(s: &[f32]) -> KvSlice<'_> {
        KvSlice::F32(s)
    }
}

/// Consecutive keys whose rows are `stride` apart in `rows`: keys `first..first + count`,
/// counted from the first key of the sum.
pub(super) struct Run<'a, T> {
    pub first: usize,
    pub rows: &'a [T],
    pub count: usize,
}

/// `out[g] = (sum_j weights[g][j] * v_j) * inv[g]` for each head `g`, over the elements `dims`
/// of the head (`out`: heads of `dims.len()`), where `v_j` is key `j`'s row in `runs` from `at`
/// (the head's first element) and `j` runs over `weights[g]`: heads may weigh fewer keys than
/// the runs hold (causal rows of a prefill, each a key shorter than the next). Any split of a
/// head's elements, or grouping of heads, gives the same bits: each element is its own chain.
/// `dims` are whole multiples of 32.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) fn weighted_sums<T: Lanes>(
    runs: &[Run<'_, T>],
    stride: usize,
    at: usize,
    weights: &[&[f32]],
    inv: &[f32],
    dims: Range<usize>,
    out: &mut [f32],
) {
    let (group, width) = (weights.len(), dims.len());
    // More heads than a full-width pass holds: half-width passes of up to twice as many, so
    // each value row is loaded once per pass for more heads (the rows of a prefill block).
    let narrow = group > HEADS;
    let cap = if narrow { 2 * HEADS } else { HEADS };
    let per_pass = group.div_ceil(group.div_ceil(cap));
    let mut dim = dims.start;
    while dim < dims.end {
        let wide = !narrow && dims.end - dim >= DIMS;
        let mut g0 = 0;
        while g0 < group {
            let heads = (group - g0).min(per_pass);
            let (w, inv) = (&weights[g0..g0 + heads], &inv[g0..g0 + heads]);
            let out = &mut out[g0 * width..(g0 + heads) * width];
            let rows = Rows { runs, stride, at: at + dim };
            let o = (width, dim - dims.start);
            match (heads, wide) {
                (1, true) => weigh::<1, VECS, T>(&rows, w, inv, o, out),
                (2, true) => weigh::<2, VECS, T>(&rows, w, inv, o, out),
                (_, true) => weigh::<3, VECS, T>(&rows, w, inv, o, out),
                (1, false) => weigh::<1, HALF, T>(&rows, w, inv, o, out),
                (2, false) => weigh::<2, HALF, T>(&rows, w, inv, o, out),
                (3, false) => weigh::<3, HALF, T>(&rows, w, inv, o, out),
                (4, false) => weigh::<4, HALF, T>(&rows, w, inv, o, out),
                (5, false) => weigh::<5, HALF, T>(&rows, w, inv, o, out),
                (_, false) => weigh::<6, HALF, T>(&rows, w, inv, o, out),
            }
            g0 += heads;
        }
        dim += if wide { DIMS } else { HALF * LANES };
    }
}

/// The rows, and where in each the pass's elements start.
struct Rows<'a, 'b, T> {
    runs: &'a [Run<'b, T>],
    stride: usize,
    at: usize,
}

/// One pass: `G` heads, `V` vectors of elements, written at `out[g * width + offset..]`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
#[allow(clippy::needless_range_loop)]
fn weigh<const G: usize, const V: usize, T: Lanes>(
    rows: &Rows<'_, '_, T>,
    weights: &[&[f32]],
    inv: &[f32],
    (width, offset): (usize, usize),
    out: &mut [f32],
) {
    let mut even = [[_mm512_setzero_ps(); V]; G];
    let mut odd = even;
    let p: [&[f32]; G] = std::array::from_fn(|g| weights[g]);
    // Keys every head weighs; past them, each head adds only the keys it has.
    let common = p.iter().map(|w| w.len()).min().unwrap_or(0);
    let (stride, at, n) = (rows.stride, rows.at, V * LANES);
    for (i, run) in rows.runs.iter().enumerate() {
        // Pages are scattered: the one after next loads while this one is added.
        if let Some(next) = rows.runs.get(i + 2) {
            for s in 0..next.count {
                prefetch(T::slice(&next.rows[s * stride + at..][..n]));
            }
        }
        let row = |k: usize| &run.rows[k * stride + at..][..n];
        let (mut k, j0) = (0, run.first);
        let all = run.count.min(common.saturating_sub(j0));
        if all > 0 && j0 % 2 == 1 {
            add_row::<G, V, T, false>(&mut odd, row(0), &p, j0);
            k = 1;
        }
        while k + 2 <= all {
            add_row::<G, V, T, false>(&mut even, row(k), &p, j0 + k);
            add_row::<G, V, T, false>(&mut odd, row(k + 1), &p, j0 + k + 1);
            k += 2;
        }
        if k < all {
            add_row::<G, V, T, false>(&mut even, row(k), &p, j0 + k);
            k += 1;
        }
        // The same accumulator a key's parity picks above, for the heads that weigh it.
        while k < run.count {
            let acc = if (j0 + k) % 2 == 0 { &mut even } else { &mut odd };
            add_row::<G, V, T, true>(acc, row(k), &p, j0 + k);
            k += 1;
        }
    }
    for g in 0..G {
        let inv = _mm512_set1_ps(inv[g]);
        for c in 0..V {
            let o = g * width + offset + c * LANES;
            let dst = &mut out[o..o + LANES];
            // SAFETY: `dst` is sixteen f32, the 64 bytes stored.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), _mm512_mul_ps(_mm512_add_ps(even[g][c], odd[g][c]), inv)) };
        }
    }
}

/// `acc[g] += p[g][j] * row` for each head; with `SOME`, only for the heads whose weights
/// reach key `j` (a const, so the all-heads add carries no test).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
#[allow(clippy::needless_range_loop)]
fn add_row<const G: usize, const V: usize, T: Lanes, const SOME: bool>(
    acc: &mut [[__m512; V]; G],
    row: &[T],
    p: &[&[f32]; G],
    j: usize,
) {
    let mut r = [_mm512_setzero_ps(); V];
    for c in 0..V {
        // SAFETY: this function enables AVX-512F and F16C.
        r[c] = unsafe { T::load16(&row[c * LANES..]) };
    }
    for g in 0..G {
        if !SOME || j < p[g].len() {
            let w = _mm512_set1_ps(p[g][j]);
            for c in 0..V {
                acc[g][c] = _mm512_fmadd_ps(w, r[c], acc[g][c]);
            }
        }
    }
}
