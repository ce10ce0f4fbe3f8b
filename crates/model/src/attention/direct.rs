//! Attention read straight from an f16 pool's pages (AVX-512): a decode row, or a block of
//! prompt rows several at a time.
//!
//! A page of sixteen positions holds each head's K transposed, which is the tile the scores
//! want, and its V rows, so keys and values are widened from f16 in registers as they are used.
//! The general path first widens the context into f32 scratch; at long contexts those stores
//! and reloads were most of a decode step's attention, and a prompt row read the widened
//! context back once per row. The arithmetic is
//! the general path's, operation for operation (widening f16 is exact): the same scores (one
//! FMA chain per key in dimension order), the same softmax, the same even/odd accumulation of
//! values. Only where the widened numbers come from differs, so the bits are the same (tested).

use std::arch::x86_64::{_mm512_fmadd_ps, _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps};

use std::cell::RefCell;
use std::ops::Range;

use half::f16;
use kv::{KvSlice, LayerView};

use super::prefetch::prefetch;
use super::softmax::{softmax_exps, LANES};
use super::values::{weighted_sums, Lanes, Run};

/// Tiles scored per pass (a page each): `heads * TILES` accumulators hide the FMA latency.
const TILES: usize = 4;
/// Queries scored per pass over the keys (heads of a group, or of several prefill rows):
/// `SCORE_HEADS * TILES` accumulators and a tile's key vector fill 28 of the 32 registers.
const SCORE_HEADS: usize = 6;

/// One page of the row's context: its first position, the head's K tile (`hd` runs of
/// sixteen; `None` for a page cut short, whose tile is [`RowPages::partial`]) and the page's V
/// rows (all heads, `row_len` apart).
struct Page<'a> {
    start: usize,
    k: Option<&'a [f16]>,
    v: &'a [f16],
}

thread_local! {
    /// Per compute thread, reused from row to row: a short page's K tile and the scores. A
    /// step calls here once per (row, KV head, layer); fresh zeroed buffers each time went to
    /// `calloc`, which takes glibc's arena lock, and in `serve` (where other threads allocate
    /// and free too) the engine thread slept on that lock about 2,000 times a second, its
    /// core idle meanwhile.
    static SCRATCH: RefCell<(Vec<f16>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The thread's scratch, taken out of its slot (the functions using it enable target features
/// a closure would not inherit); [`give_back`] puts it back.
fn take_scratch() -> (Vec<f16>, Vec<f32>) {
    SCRATCH.with(|cell| std::mem::take(&mut *cell.borrow_mut()))
}

fn give_back(scratch: (Vec<f16>, Vec<f32>)) {
    SCRATCH.with(|cell| *cell.borrow_mut() = scratch);
}

/// The pages of KV head `kvh` that a decode row at keys `from..upto` reads.
pub(super) struct RowPages<'a> {
    pages: Vec<Page<'a>>,
    /// A page cut short (the context's last) has no whole K block to borrow: its written slots
    /// are copied into a zeroed tile, as the general path does.
    partial: Vec<f16>,
    hd: usize,
    row_len: usize,
    kvh: usize,
    from: usize,
    upto: usize,
}

impl<'a> RowPages<'a> {
    /// `None` when the view is not f16 in pages of sixteen, does not hold the keys up to
    /// `upto`, or the head size is not one whose general path accumulates values in even/odd
    /// pairs (64, 128, 256): the general path serves those. `partial` is the buffer (its
    /// contents do not matter) a short page's tile is copied into; [`Self::into_partial`] gives
    /// it back.
    pub(super) fn new(
        view: &LayerView<'a>,
        hd: usize,
        kvh: usize,
        row_len: usize,
        (from, upto): (usize, usize),
        mut partial: Vec<f16>,
    ) -> Option<Self> {
        if !matches!(hd, 64 | 128 | 256) || view.len() < upto || from >= upto {
            return None;
        }
        let mut pages = Vec::with_capacity((upto - from / LANES * LANES).div_ceil(LANES));
        partial.clear();
        for ch in view.chunks_from(from / LANES * LANES).take_while(|ch| ch.start < upto) {
            let KvSlice::F16(v) = ch.v else { return None };
            if ch.start % LANES != 0 || ch.len > LANES || !partial.is_empty() {
                return None;
            }
            let k = match ch.k_block(kvh * hd, hd) {
                Some(KvSlice::F16(k)) => Some(k),
                Some(KvSlice::F32(_)) => return None,
                None => {
                    partial.resize(hd * LANES, f16::ZERO);
                    for d in 0..hd {
                        let KvSlice::F16(run) = ch.k_run(kvh * hd + d) else { return None };
                        partial[d * LANES..d * LANES + run.len()].copy_from_slice(run);
                    }
                    None
                }
            };
            pages.push(Page { start: ch.start, k, v });
        }
        Some(RowPages { pages, partial, hd, row_len, kvh, from, upto })
    }

    /// The buffer given to [`Self::new`], for the next row.
    pub(super) fn into_partial(self) -> Vec<f16> {
        self.partial
    }

    /// Pages of the row's context (sixteen scores each).
    pub(super) fn len(&self) -> usize {
        self.pages.len()
    }

    /// Scores of the query heads `q` (rows of `hd`, rounded to f16) against the keys of the
    /// pages `part`, `scale`d: one row of `part.len() * 16` per head. A key's score is the same
    /// whichever part holds it.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) fn scores(&self, q: &[f32], scale: f32, part: Range<usize>) -> Vec<f32> {
        let mut scores = Vec::new();
        self.scores_into(q, scale, part, &mut scores);
        scores
    }

    /// As [`Self::scores`], into `scores` (its contents replaced).
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) fn scores_into(&self, q: &[f32], scale: f32, part: Range<usize>, scores: &mut Vec<f32>) {
        let (hd, group) = (self.hd, q.len() / self.hd);
        let tiles: Vec<&[f16]> = self.pages[part].iter().map(|p| p.k.unwrap_or(&self.partial)).collect();
        let stride = tiles.len() * LANES;
        scores.clear();
        scores.resize(group * stride, 0.0);
        let mut g0 = 0;
        while g0 < group {
            let heads = (group - g0).min(SCORE_HEADS);
            let q = &q[g0 * hd..(g0 + heads) * hd];
            let out = &mut scores[g0 * stride..(g0 + heads) * stride];
            match heads {
                1 => score_pages::<1>(q, &tiles, hd, scale, out),
                2 => score_pages::<2>(q, &tiles, hd, scale, out),
                3 => score_pages::<3>(q, &tiles, hd, scale, out),
                4 => score_pages::<4>(q, &tiles, hd, scale, out),
                5 => score_pages::<5>(q, &tiles, hd, scale, out),
                _ => score_pages::<6>(q, &tiles, hd, scale, out),
            }
            g0 += heads;
        }
    }

    /// The output elements `dims` of each head (rows of `dims.len()`), from `scores` (one row of
    /// `len() * 16` per head, as [`Self::scores`] gives for all pages; turned into the softmax's
    /// exponentials in place).
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) fn weigh(&self, scores: &mut [f32], dims: Range<usize>) -> Vec<f32> {
        let mut out = Vec::new();
        self.weigh_into(scores, dims, &mut out);
        out
    }

    /// As [`Self::weigh`], into `out` (its contents replaced).
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    fn weigh_into(&self, scores: &mut [f32], dims: Range<usize>, out: &mut Vec<f32>) {
        let group = scores.len() / (self.pages.len() * LANES);
        out.clear();
        out.resize(group * dims.len(), 0.0);
        self.weigh_upto(scores, self.pages.len(), &vec![self.upto; group], dims, out);
    }

    /// As [`Self::weigh`], for queries that see keys `from..uptos[g]` (each at most the row's
    /// `upto`), scored against the first `pages` pages (`scores`: one row of `pages * 16` per
    /// query), into `out` (`uptos.len()` rows of `dims.len()`, every element written).
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    fn weigh_upto(&self, scores: &mut [f32], pages: usize, uptos: &[usize], dims: Range<usize>, out: &mut [f32]) {
        let (from, row_len) = (self.from, self.row_len);
        let upto = uptos.iter().copied().max().unwrap_or(from);
        let stride = pages * LANES;
        let tile_from = from / LANES * LANES;
        let lo = from - tile_from;
        let mut inv = Vec::with_capacity(uptos.len());
        for (g, &u) in uptos.iter().enumerate() {
            inv.push(1.0 / softmax_exps(&mut scores[g * stride + lo..g * stride + u - tile_from]));
        }
        // Sized up front: growing it went through `realloc`, which takes the allocator's lock.
        let mut runs: Vec<Run<'_, f16>> = Vec::with_capacity(pages);
        for page in &self.pages[..pages] {
            let (lo, hi) = (from.max(page.start), upto.min(page.start + page.v.len() / row_len));
            if lo < hi {
                runs.push(Run { first: lo - from, rows: &page.v[(lo - page.start) * row_len..], count: hi - lo });
            }
        }
        let weights: Vec<&[f32]> =
            uptos.iter().enumerate().map(|(g, &u)| &scores[g * stride + lo..g * stride + u - tile_from]).collect();
        weighted_sums(&runs, row_len, self.kvh * self.hd, &weights, &inv, dims, out);
    }
}

/// Attention of consecutive query rows of KV head `kvh` (a prefill block: `qs` holds each
/// row's `group` queries of `hd`, rounded to f16; the first row at position `start`, each row
/// seeing every key up to its own position), into `out` (its contents replaced): rows of
/// `group * hd`. Several rows' queries are scored in one pass over the keys and weigh each
/// value row in one load, read straight from the pages: the general path widened the whole
/// context into f32 scratch and read it back once per row, and at long contexts that traffic
/// was most of a prefill's time. Each query's scores, softmax and sums are the general path's
/// operations, so are its bits (tested). False, `out` untouched, where [`RowPages::new`] is
/// `None`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_rows(
    view: &LayerView<'_>,
    qs: &[f32],
    (group, hd): (usize, usize),
    kvh: usize,
    row_len: usize,
    start: usize,
    scale: f32,
    out: &mut Vec<f32>,
) -> bool {
    let rows = qs.len() / (group * hd);
    let (partial, mut scores) = take_scratch();
    let Some(pages) = RowPages::new(view, hd, kvh, row_len, (0, start + rows), partial) else { return false };
    let per_pass = (SCORE_HEADS / group).max(1);
    out.clear();
    out.resize(qs.len(), 0.0);
    let mut r0 = 0;
    while r0 < rows {
        let r1 = (r0 + per_pass).min(rows);
        let uptos: Vec<usize> = (r0..r1).flat_map(|r| std::iter::repeat_n(start + r + 1, group)).collect();
        let n = (start + r1).div_ceil(LANES);
        let span = r0 * group * hd..r1 * group * hd;
        pages.scores_into(&qs[span.clone()], scale, 0..n, &mut scores);
        pages.weigh_upto(&mut scores, n, &uptos, 0..hd, &mut out[span]);
        r0 = r1;
    }
    give_back((pages.into_partial(), scores));
    true
}

/// Attention of the query heads `q` (rows of `hd`, already rounded to f16) of KV head `kvh`
/// at the keys `from..upto`, into `out` (its contents replaced): one row of `hd` per head.
/// False, `out` untouched, where [`RowPages::new`] is `None`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_row(
    view: &LayerView<'_>,
    q: &[f32],
    hd: usize,
    kvh: usize,
    row_len: usize,
    keys: (usize, usize),
    scale: f32,
    out: &mut Vec<f32>,
) -> bool {
    let (partial, mut scores) = take_scratch();
    let Some(pages) = RowPages::new(view, hd, kvh, row_len, keys, partial) else { return false };
    pages.scores_into(q, scale, 0..pages.len(), &mut scores);
    pages.weigh_into(&mut scores, 0..hd, out);
    give_back((pages.into_partial(), scores));
    true
}

/// Scores of the `G` heads of `q` against every page's keys, `scale`d, into `out` (`G` rows
/// of `pages.len() * 16`), `TILES` pages per pass over the dimensions.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
fn score_pages<const G: usize>(q: &[f32], pages: &[&[f16]], hd: usize, scale: f32, out: &mut [f32]) {
    let stride = pages.len() * LANES;
    let mut first = 0;
    while first < pages.len() {
        let ahead = &pages[(first + TILES).min(pages.len())..(first + 2 * TILES).min(pages.len())];
        for p in ahead {
            prefetch(KvSlice::F16(p));
        }
        if first + TILES <= pages.len() {
            score_tiles::<G, TILES>(q, &pages[first..first + TILES], hd, scale, out, stride, first);
            first += TILES;
        } else {
            score_tiles::<G, 1>(q, &pages[first..first + 1], hd, scale, out, stride, first);
            first += 1;
        }
    }
}

/// `T` pages from page `first`: one FMA chain per key in dimension order, as `dot` defines.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
// Indexed loops over fixed-size arrays are what keeps the accumulators in registers.
#[allow(clippy::needless_range_loop)]
fn score_tiles<const G: usize, const T: usize>(
    q: &[f32],
    pages: &[&[f16]],
    hd: usize,
    scale: f32,
    out: &mut [f32],
    stride: usize,
    first: usize,
) {
    let q = &q[..G * hd];
    let tiles: [&[f16]; T] = std::array::from_fn(|t| &pages[t][..hd * LANES]);
    let mut acc = [[_mm512_setzero_ps(); T]; G];
    for d in 0..hd {
        for t in 0..T {
            // SAFETY: this function enables AVX-512F and F16C.
            let k = unsafe { f16::load16(&tiles[t][d * LANES..]) };
            for g in 0..G {
                acc[g][t] = _mm512_fmadd_ps(_mm512_set1_ps(q[g * hd + d]), k, acc[g][t]);
            }
        }
    }
    let scale = _mm512_set1_ps(scale);
    for g in 0..G {
        for t in 0..T {
            let at = g * stride + (first + t) * LANES;
            let dst = &mut out[at..at + LANES];
            // SAFETY: `dst` is sixteen f32, the 64 bytes stored.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), _mm512_mul_ps(acc[g][t], scale)) };
        }
    }
}
