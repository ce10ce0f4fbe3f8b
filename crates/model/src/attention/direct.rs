//! A decode row's attention read straight from an f16 pool's pages (AVX-512).
//!
//! A page of sixteen positions holds each head's K transposed, which is the tile the scores
//! want, and its V rows, so keys and values are widened from f16 in registers as they are used.
//! The general path first widens the context into f32 scratch, block by block; at long
//! contexts those stores and reloads were most of a decode step's attention. The arithmetic is
//! the general path's, operation for operation (widening f16 is exact): the same scores (one
//! FMA chain per key in dimension order), the same softmax, the same even/odd accumulation of
//! values. Only where the widened numbers come from differs, so the bits are the same (tested).

use std::arch::x86_64::{_mm512_fmadd_ps, _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps};

use half::f16;
use kv::{KvSlice, LayerView};

use super::prefetch::prefetch;
use super::softmax::{softmax_exps, LANES};
use super::values::{weighted_sums, Lanes, Run};

/// Tiles scored per pass (a page each): `heads * TILES` accumulators hide the FMA latency.
const TILES: usize = 4;
/// Query heads scored per pass over the keys.
const SCORE_HEADS: usize = 4;

/// One page of the row's context: its first position, the head's K tile (`hd` runs of
/// sixteen) and the page's V rows (all heads, `row_len` apart).
struct Page<'a> {
    start: usize,
    k: &'a [f16],
    v: &'a [f16],
}

/// Attention of the query heads `q` (`group` rows of `hd`, already rounded to f16) of KV head
/// `kvh` at the keys `from..upto`: `group * hd` outputs. `None` when the view is not f16 in
/// pages of sixteen or does not hold the keys up to `upto`; the general path serves those.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_row(
    view: &LayerView<'_>,
    q: &[f32],
    hd: usize,
    kvh: usize,
    row_len: usize,
    from: usize,
    upto: usize,
    scale: f32,
) -> Option<Vec<f32>> {
    // The head sizes whose general path accumulates values in even/odd pairs (others in one
    // chain).
    if !matches!(hd, 64 | 128 | 256) || view.len() < upto || from >= upto {
        return None;
    }
    let group = q.len() / hd;
    let tile_from = from / LANES * LANES;
    let chunks: Vec<_> = view.chunks_from(tile_from).take_while(|ch| ch.start < upto).collect();
    if chunks.iter().any(|ch| ch.start % LANES != 0 || ch.len > LANES || !matches!(ch.v, KvSlice::F16(_))) {
        return None;
    }
    // A page cut short (the context's last) has no whole K block to borrow: its written slots
    // are copied into a zeroed tile, as the general path does.
    let mut partial = vec![f16::ZERO; hd * LANES];
    if let Some(last) = chunks.last().filter(|ch| ch.len < LANES) {
        for d in 0..hd {
            let KvSlice::F16(run) = last.k_run(kvh * hd + d) else { return None };
            partial[d * LANES..d * LANES + run.len()].copy_from_slice(run);
        }
    }
    let mut pages = Vec::with_capacity(chunks.len());
    for ch in &chunks {
        let (KvSlice::F16(v), k) = (ch.v, ch.k_block(kvh * hd, hd)) else { return None };
        let k = match k {
            Some(KvSlice::F16(k)) => k,
            Some(KvSlice::F32(_)) => return None,
            None => &partial[..],
        };
        pages.push(Page { start: ch.start, k, v });
    }
    let stride = pages.len() * LANES;
    let mut scores = vec![0f32; group * stride];
    let mut g0 = 0;
    while g0 < group {
        let heads = (group - g0).min(SCORE_HEADS);
        let q = &q[g0 * hd..(g0 + heads) * hd];
        let out = &mut scores[g0 * stride..(g0 + heads) * stride];
        match heads {
            1 => score_pages::<1>(q, &pages, hd, scale, out),
            2 => score_pages::<2>(q, &pages, hd, scale, out),
            3 => score_pages::<3>(q, &pages, hd, scale, out),
            _ => score_pages::<4>(q, &pages, hd, scale, out),
        }
        g0 += heads;
    }
    let (lo, hi) = (from - tile_from, upto - tile_from);
    let mut inv = Vec::with_capacity(group);
    for g in 0..group {
        inv.push(1.0 / softmax_exps(&mut scores[g * stride + lo..g * stride + hi]));
    }
    let runs: Vec<Run<'_, f16>> = pages
        .iter()
        .filter_map(|page| {
            let (lo, hi) = (from.max(page.start), upto.min(page.start + page.v.len() / row_len));
            (lo < hi).then(|| Run { first: lo - from, rows: &page.v[(lo - page.start) * row_len..], count: hi - lo })
        })
        .collect();
    let weights: Vec<&[f32]> = (0..group).map(|g| &scores[g * stride + lo..g * stride + hi]).collect();
    let mut out = vec![0f32; group * hd];
    weighted_sums(&runs, row_len, kvh * hd, &weights, &inv, hd, &mut out);
    Some(out)
}

/// Scores of the `G` heads of `q` against every page's keys, `scale`d, into `out` (`G` rows
/// of `pages.len() * 16`), `TILES` pages per pass over the dimensions.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
fn score_pages<const G: usize>(q: &[f32], pages: &[Page<'_>], hd: usize, scale: f32, out: &mut [f32]) {
    let stride = pages.len() * LANES;
    let mut first = 0;
    while first < pages.len() {
        let ahead = &pages[(first + TILES).min(pages.len())..(first + 2 * TILES).min(pages.len())];
        for p in ahead {
            prefetch(KvSlice::F16(p.k));
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
    pages: &[Page<'_>],
    hd: usize,
    scale: f32,
    out: &mut [f32],
    stride: usize,
    first: usize,
) {
    let q = &q[..G * hd];
    let tiles: [&[f16]; T] = std::array::from_fn(|t| &pages[t].k[..hd * LANES]);
    let mut acc = [[_mm512_setzero_ps(); T]; G];
    for d in 0..hd {
        for t in 0..T {
            let k = f16::load16(&tiles[t][d * LANES..]);
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
