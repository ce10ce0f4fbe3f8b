//! Causal attention reading K and V from the paged pool only.
//!
//! On AVX-512 with an f16 pool of 16-slot pages, rows read K and V straight from the pages
//! (`direct`). Otherwise, for each (sequence, KV head) the pages are gathered once into f32
//! scratch (K transposed, as the pool stores it, so sixteen keys' scores are computed side by
//! side with no horizontal sums and the gather is contiguous runs), then every query head of
//! the group attends over it, sharing each load of K. With an f16 pool the queries are rounded
//! to f16 first, as llama.cpp does for an f16 KV cache, so scores agree with it.

use std::ops::Range;

use kv::{KvChunk, KvSlice, LayerView};

#[cfg(target_arch = "x86_64")]
mod direct;
mod prefetch;
mod softmax;
#[cfg(target_arch = "x86_64")]
mod split;
#[cfg(target_arch = "x86_64")]
mod values;
mod widen;

use prefetch::{prefetch_keys, prefetch_values};
pub use softmax::softmax_weighted_sum;
use softmax::{softmax_exps, weighted_sum_run, LANES};
#[cfg(target_arch = "x86_64")]
pub use split::{row_output, row_output_dims, row_scores};
use widen::{widen, Portable, Widen};
#[cfg(target_arch = "x86_64")]
use widen::{F16c, F16c512};

/// One sequence's share of a step: its queries (`n` rows of `n_heads * head_dim`, already
/// rotated) at positions `start..start + n`, and a checked view of its KV at this layer.
pub struct AttnInput<'a> {
    pub q: &'a [f32],
    pub start: usize,
    pub n: usize,
    pub view: LayerView<'a>,
}

pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Sliding-window layers: a query at position p sees keys p - window + 1 ..= p.
    pub window: Option<usize>,
    /// What each query-key product is multiplied by (1/sqrt(head_dim) for most models).
    pub scale: f32,
    /// Gemma 2: each scaled score becomes `cap * tanh(score / cap)` before the softmax. Only
    /// the gathered and streamed paths apply it; the page-reading ones step aside.
    pub softcap: Option<f32>,
}

impl AttnShape {
    /// Scores scaled by 1/sqrt(head_dim) and not capped: every model's attention but Gemma 2's.
    pub fn standard(n_heads: usize, n_kv_heads: usize, head_dim: usize, window: Option<usize>) -> AttnShape {
        AttnShape { n_heads, n_kv_heads, head_dim, window, scale: 1.0 / (head_dim as f32).sqrt(), softcap: None }
    }

    /// Soft-caps the scores about to enter a softmax, where the model asks for it.
    #[inline(always)]
    fn cap(&self, scores: &mut [f32]) {
        if let Some(cap) = self.softcap {
            crate::ops::softcap(scores, cap);
        }
    }
}

/// The score arithmetic, as a definition: fused multiply-adds in dimension order. The kernels
/// below compute exactly this for each key, so results do not depend on vector width.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0, |acc, (x, y)| x.mul_add(*y, acc))
}

/// Attention output of KV head `kvh`'s query heads for the queries `rows` of `inp`:
/// `rows.len()` rows of `group * head_dim`.
pub fn attend_group(inp: &AttnInput<'_>, shape: &AttnShape, kvh: usize, rows: Range<usize>) -> Vec<f32> {
    attend_heads(inp, shape, kvh, 0..shape.n_heads / shape.n_kv_heads, rows)
}

/// As [`attend_group`] for the query heads `heads` (indices within KV head `kvh`'s group) only:
/// `rows.len()` rows of `heads.len() * head_dim`. Each query head's arithmetic is the same
/// whichever heads share the call, so a group may be split across threads (one KV head and
/// few rows, as a decode step of Gemma 3, would otherwise keep one thread busy).
pub fn attend_heads(
    inp: &AttnInput<'_>,
    shape: &AttnShape,
    kvh: usize,
    heads: Range<usize>,
    rows: Range<usize>,
) -> Vec<f32> {
    let mut out = Vec::new();
    attend_heads_into(inp, shape, kvh, heads, rows, &mut out);
    out
}

/// As [`attend_heads`], into `out` (its contents replaced; a step keeps one per task, so the
/// rows read from the pages allocate nothing).
pub fn attend_heads_into(
    inp: &AttnInput<'_>,
    shape: &AttnShape,
    kvh: usize,
    heads: Range<usize>,
    rows: Range<usize>,
    out: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if avx512_detected() {
            // SAFETY: the features were just detected on this CPU.
            return unsafe { attend_avx512(inp, shape, kvh, heads, rows, out) };
        }
        if avx2_detected() {
            // SAFETY: as above.
            return unsafe { attend_avx2(inp, shape, kvh, heads, rows, out) };
        }
    }
    attend_impl::<Portable>(inp, shape, kvh, heads, rows, out)
}

/// AVX2 with FMA and F16C: what [`attend_avx2`] enables.
#[cfg(target_arch = "x86_64")]
fn avx2_detected() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// AVX-512F besides those: what [`attend_avx512`], the page reader and the split enable.
#[cfg(target_arch = "x86_64")]
fn avx512_detected() -> bool {
    is_x86_feature_detected!("avx512f") && avx2_detected()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn attend_avx512(
    inp: &AttnInput<'_>,
    shape: &AttnShape,
    kvh: usize,
    heads: Range<usize>,
    rows: Range<usize>,
    out: &mut Vec<f32>,
) {
    attend_impl::<F16c512>(inp, shape, kvh, heads, rows, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2(
    inp: &AttnInput<'_>,
    shape: &AttnShape,
    kvh: usize,
    heads: Range<usize>,
    rows: Range<usize>,
    out: &mut Vec<f32>,
) {
    attend_impl::<F16c>(inp, shape, kvh, heads, rows, out)
}

/// Where K element `d` of position `pos` lives in the gathered K: tile-major, each tile of
/// sixteen positions holding its `head_dim` runs of sixteen one after another. Scoring a tile
/// then reads 4 KB (head dim 64) in order; a plain transpose with the whole context as its
/// stride put every dimension of a tile a context length apart, the same L1 sets for all.
#[inline(always)]
fn kt_index(pos: usize, d: usize, hd: usize) -> usize {
    (pos / LANES) * hd * LANES + d * LANES + pos % LANES
}

/// Gathers head `kvh` of positions `[base, len)`, each at `pos - base`: K transposed into tiles
/// ([`kt_index`]; the pool already stores K transposed per page, so each element is a
/// contiguous run), V as rows; either may be left out. Returns whether the pool is f16.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gather<W: Widen>(
    view: &LayerView<'_>,
    base: usize,
    len: usize,
    row_len: usize,
    kvh: usize,
    hd: usize,
    mut kt: Option<&mut [f32]>,
    mut v: Option<&mut [f32]>,
) -> bool {
    let mut f16 = false;
    for ch in view.chunks_from(base) {
        if ch.start >= len {
            break;
        }
        let n = ch.len.min(len - ch.start);
        f16 = matches!(ch.v, KvSlice::F16(_));
        // Positions before `base` (outside every query's window) are not read at all.
        let skip = base.saturating_sub(ch.start);
        if skip >= n {
            continue;
        }
        if let Some(kt) = kt.as_deref_mut() {
            // A whole page that is one tile (page size 16, the pool's usual) holds the head's K
            // exactly as the tile does: one run, not `hd` runs of sixteen (whose per-call cost
            // dominated decode at long contexts).
            let pos = ch.start.saturating_sub(base);
            let one_tile = skip == 0 && ch.len == LANES && n == LANES && pos % LANES == 0;
            if let Some(block) = ch.k_block(kvh * hd, hd).filter(|_| one_tile) {
                let at = kt_index(pos, 0, hd);
                widen::<W>(block, &mut kt[at..at + hd * LANES]);
            } else {
                gather_k_runs::<W>(&ch, base, skip, n, kvh, hd, kt);
            }
        }
        if let Some(v) = v.as_deref_mut() {
            if row_len == hd {
                // One KV head: the chunk's V rows are one run.
                let pos = ch.start + skip - base;
                widen::<W>(ch.v.sub(skip * hd, (n - skip) * hd), &mut v[pos * hd..(pos + n - skip) * hd]);
            } else {
                for s in skip..n {
                    let pos = ch.start + s - base;
                    widen::<W>(ch.v.sub(s * row_len + kvh * hd, hd), &mut v[pos * hd..(pos + 1) * hd]);
                }
            }
        }
    }
    f16
}

/// K of head `kvh` for slots `skip..n` of a chunk, run by run (element by element), split at
/// tile boundaries (a page need not be one tile).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gather_k_runs<W: Widen>(
    ch: &KvChunk<'_>,
    base: usize,
    skip: usize,
    n: usize,
    kvh: usize,
    hd: usize,
    kt: &mut [f32],
) {
    for d in 0..hd {
        let run = ch.k_run(kvh * hd + d).sub(0, n);
        let mut p = skip;
        while p < n {
            let pos = ch.start + p - base;
            let piece = (LANES - pos % LANES).min(n - p);
            let at = kt_index(pos, d, hd);
            widen::<W>(run.sub(p, piece), &mut kt[at..at + piece]);
            p += piece;
        }
    }
}

/// Scores of `G` queries against keys `[from, upto)` (`from` a multiple of sixteen), `T`
/// tiles of sixteen keys at a time: `G * T` independent accumulators keep the FMA units busy
/// (one tile alone waits on each FMA's latency). Each key's score is the same FMA chain in
/// dimension order whatever the tiling, so the result does not depend on it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn scores_tile<const G: usize>(
    qs: [&[f32]; G],
    kt: &[f32],
    from: usize,
    upto: usize,
    scale: f32,
    out: &mut [Vec<f32>],
) {
    const T: usize = 4;
    let mut jb = from;
    while jb + T * LANES <= upto {
        scores_block::<G, T>(qs, kt, jb, upto, scale, out);
        jb += T * LANES;
    }
    while jb < upto {
        scores_block::<G, 1>(qs, kt, jb, upto, scale, out);
        jb += LANES;
    }
}

/// `T` tiles of sixteen keys from `jb` (only keys below `upto` are stored).
#[inline(always)]
// Indexed loops over fixed-size arrays are what the compiler turns into one vector per tile.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
fn scores_block<const G: usize, const T: usize>(
    qs: [&[f32]; G],
    kt: &[f32],
    jb: usize,
    upto: usize,
    scale: f32,
    out: &mut [Vec<f32>],
) {
    let hd = qs[0].len();
    let mut acc = [[[0f32; LANES]; T]; G];
    for d in 0..hd {
        for t in 0..T {
            let at = kt_index(jb + t * LANES, d, hd);
            let k: &[f32; LANES] = match kt.get(at..at + LANES).and_then(|r| r.try_into().ok()) {
                Some(k) => k,
                None => return,
            };
            for g in 0..G {
                let qd = qs[g][d];
                for l in 0..LANES {
                    acc[g][t][l] = qd.mul_add(k[l], acc[g][t][l]);
                }
            }
        }
    }
    for g in 0..G {
        for t in 0..T {
            let base = jb + t * LANES;
            let n = LANES.min(upto.saturating_sub(base));
            for l in 0..n {
                out[g][base + l] = acc[g][t][l] * scale;
            }
        }
    }
}

#[inline(always)]
fn attend_impl<W: Widen>(
    inp: &AttnInput<'_>,
    shape: &AttnShape,
    kvh: usize,
    heads: Range<usize>,
    rows: Range<usize>,
    out: &mut Vec<f32>,
) {
    let hd = shape.head_dim;
    if rows.len() == 1 {
        return attend_row_streamed::<W>(inp, shape, kvh, heads, rows.start, out);
    }
    // Rows that see their whole causal context (no window cuts it) read the pages directly.
    #[cfg(target_arch = "x86_64")]
    if W::AVX512 && shape.softcap.is_none() && shape.window.is_none_or(|w| w >= inp.start + rows.end) {
        let first_head = kvh * (shape.n_heads / shape.n_kv_heads) + heads.start;
        let width = heads.len() * hd;
        let mut qs = Vec::with_capacity(rows.len() * width);
        for i in rows.clone() {
            qs.extend_from_slice(&inp.q[(i * shape.n_heads + first_head) * hd..][..width]);
        }
        // The direct path reads only an f16 pool, whose keys want f16 queries.
        round_to_f16(&mut qs);
        let (row_len, scale) = (shape.n_kv_heads * hd, shape.scale);
        let start = inp.start + rows.start;
        // SAFETY: `W::AVX512` holds only for `F16c512`, used after the features were detected.
        if unsafe { direct::attend_rows(&inp.view, &qs, (heads.len(), hd), kvh, row_len, start, scale, out) } {
            return;
        }
    }
    // Keys up to the last query of these rows are all that is needed, and from the first key
    // the first row's window lets it see (the tile holding it): a sliding-window layer at a
    // long context gathers its window, not the context.
    let len = (inp.start + rows.end).min(inp.view.len());
    let base = shape.window.map_or(0, |w| (inp.start + rows.start + 1).saturating_sub(w)) / LANES * LANES;
    let base = base.min(len / LANES * LANES);
    let span = len - base;
    let stride = span.div_ceil(LANES) * LANES;
    let row_len = shape.n_kv_heads * hd;
    // Reused across calls: at long contexts a fresh zeroed buffer per (sequence, head, layer)
    // cost as much as the gather itself. Taken out of the thread's slot (not used inside a
    // closure, which would not inherit this function's target features) and put back.
    let (mut kt, mut v) = SCRATCH.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    // The gather writes every position below `len`; only the last tile's tail is zeroed here.
    kt.resize(hd * stride, 0.0);
    v.resize(span * hd, 0.0);
    if span < stride {
        for d in 0..hd {
            let at = kt_index(span, d, hd);
            kt[at..at + stride - span].fill(0.0);
        }
    }
    *out = attend_gathered::<W>(inp, shape, kvh, heads, rows, (base, len, stride, row_len), &mut kt, &mut v);
    SCRATCH.with(|cell| *cell.borrow_mut() = (kt, v));
}

thread_local! {
    /// Per compute thread: the gathered K (transposed) and V of the current (sequence, head).
    static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_gathered<W: Widen>(
    inp: &AttnInput<'_>,
    shape: &AttnShape,
    kvh: usize,
    heads: Range<usize>,
    rows: Range<usize>,
    (base, len, stride, row_len): (usize, usize, usize, usize),
    kt: &mut [f32],
    v: &mut [f32],
) -> Vec<f32> {
    let hd = shape.head_dim;
    let first_head = kvh * (shape.n_heads / shape.n_kv_heads) + heads.start;
    let group = heads.len();
    let f16_queries = gather::<W>(&inp.view, base, len, row_len, kvh, hd, Some(kt), Some(v));
    let scale = shape.scale;
    let mut out = vec![0f32; rows.len() * group * hd];
    let mut scores: Vec<Vec<f32>> = (0..group).map(|_| vec![0f32; stride]).collect();
    let mut q = vec![0f32; group * hd];
    for (oi, i) in rows.enumerate() {
        // Positions from here on are relative to `base` (a multiple of sixteen, so tiles are
        // the same as in absolute positions).
        let upto_abs = inp.start + i + 1;
        let upto = upto_abs - base;
        // First key this query sees; scores are computed from the tile holding it.
        let from = shape.window.map_or(0, |w| upto_abs.saturating_sub(w)) - base;
        let tile_from = from / LANES * LANES;
        q.copy_from_slice(&inp.q[i * shape.n_heads * hd + first_head * hd..][..group * hd]);
        if f16_queries {
            round_to_f16(&mut q);
        }
        scores_heads(&q, hd, kt, tile_from, upto, scale, &mut scores);
        for s in scores.iter_mut() {
            shape.cap(&mut s[from..upto]);
        }
        #[cfg(target_arch = "x86_64")]
        if W::AVX512 && matches!(hd, 64 | 128 | 256) {
            // The group's heads weigh each value row in one load (the same operations).
            let mut inv = Vec::with_capacity(group);
            for s in scores.iter_mut() {
                inv.push(1.0 / softmax_exps(&mut s[from..upto]));
            }
            let weights: Vec<&[f32]> = scores.iter().map(|s| &s[from..upto]).collect();
            let run = [values::Run { first: 0, rows: &v[from * hd..], count: upto - from }];
            let o = &mut out[oi * group * hd..(oi + 1) * group * hd];
            // SAFETY: `W::AVX512` holds only for `F16c512`, used after the features were detected.
            unsafe { values::weighted_sums(&run, hd, 0, &weights, &inv, 0..hd, o) };
            continue;
        }
        for (g, s) in scores.iter_mut().enumerate() {
            let o = &mut out[(oi * group + g) * hd..][..hd];
            softmax_weighted_sum(&mut s[from..upto], &v[from * hd..], hd, o);
        }
    }
    out
}

/// Queries against f16 keys are rounded to f16 first, as ggml's CPU attention does.
#[inline(always)]
fn round_to_f16(q: &mut [f32]) {
    for x in q.iter_mut() {
        *x = half::f16::from_f32(*x).to_f32();
    }
}

/// The scores of each head of a group (`q`: the heads' queries, `hd` apart) against the keys
/// `from..upto` of `kt`, four heads per pass over the keys. A function, not a closure, so it
/// inlines with its caller's target features.
#[inline(always)]
fn scores_heads(q: &[f32], hd: usize, kt: &[f32], from: usize, upto: usize, scale: f32, scores: &mut [Vec<f32>]) {
    let group = scores.len();
    let mut g0 = 0;
    while g0 < group {
        let rest = &mut scores[g0..];
        let qh = |g: usize| &q[(g0 + g) * hd..(g0 + g + 1) * hd];
        match group - g0 {
            1 => scores_tile::<1>([qh(0)], kt, from, upto, scale, rest),
            2 => scores_tile::<2>([qh(0), qh(1)], kt, from, upto, scale, rest),
            3 => scores_tile::<3>([qh(0), qh(1), qh(2)], kt, from, upto, scale, rest),
            _ => scores_tile::<4>([qh(0), qh(1), qh(2), qh(3)], kt, from, upto, scale, rest),
        }
        g0 += (group - g0).min(4);
    }
}

/// Keys per block of the single-row path: four tiles, whose widened K (or V) stays in cache.
const STREAM_BLOCK: usize = 4 * LANES;

/// One query row (a decode step) without gathering its whole context: K block by block into
/// a small buffer for the scores, then V block by block for the weighted sums. The widened K
/// and V of a long context (megabytes per head, written and read back) never exist, so the
/// step reads little more than the pool's pages. Every score, exponential and accumulation is
/// the one [`attend_gathered`] computes, in the same order, so a row gives the same bits alone
/// as among other rows (tested).
#[inline(always)]
fn attend_row_streamed<W: Widen>(
    inp: &AttnInput<'_>,
    shape: &AttnShape,
    kvh: usize,
    heads: Range<usize>,
    i: usize,
    out: &mut Vec<f32>,
) {
    let hd = shape.head_dim;
    let group = heads.len();
    let first_head = kvh * (shape.n_heads / shape.n_kv_heads) + heads.start;
    let row_len = shape.n_kv_heads * hd;
    let upto = inp.start + i + 1;
    let len = upto.min(inp.view.len());
    let from = shape.window.map_or(0, |w| upto.saturating_sub(w));
    let tile_from = from / LANES * LANES;
    let scale = shape.scale;
    let mut q = inp.q[i * shape.n_heads * hd + first_head * hd..][..group * hd].to_vec();
    if inp.view.chunks().next().is_some_and(|c| matches!(c.v, KvSlice::F16(_))) {
        round_to_f16(&mut q);
    }
    #[cfg(target_arch = "x86_64")]
    if W::AVX512 && shape.softcap.is_none() {
        // SAFETY: `W::AVX512` holds only for `F16c512`, used after the features were detected.
        if unsafe { direct::attend_row(&inp.view, &q, hd, kvh, row_len, (from, upto), scale, out) } {
            return;
        }
    }
    let (mut kt, mut v) = SCRATCH.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    kt.resize(hd * STREAM_BLOCK, 0.0);
    v.resize(hd * STREAM_BLOCK, 0.0);
    let mut scores: Vec<Vec<f32>> = (0..group).map(|_| vec![0f32; upto - tile_from]).collect();
    let mut block: Vec<Vec<f32>> = (0..group).map(|_| vec![0f32; STREAM_BLOCK]).collect();
    let mut jb = tile_from;
    while jb < upto {
        let n = (upto - jb).min(STREAM_BLOCK);
        // The next block's keys, or after the last one the first values, load while this
        // block is scored.
        if jb + n < len {
            prefetch_keys(&inp.view, jb + n, (jb + 2 * n).min(len), kvh, hd);
        } else {
            prefetch_values(&inp.view, from, (from + STREAM_BLOCK).min(len), row_len, kvh, hd);
        }
        if jb + n > len {
            // Keys past the view score against zeros, as in the gathered K.
            kt.fill(0.0);
        }
        gather::<W>(&inp.view, jb, (jb + n).min(len), row_len, kvh, hd, Some(&mut kt), None);
        scores_heads(&q, hd, &kt, 0, n, scale, &mut block);
        for (all, b) in scores.iter_mut().zip(&block) {
            all[jb - tile_from..][..n].copy_from_slice(&b[..n]);
        }
        jb += n;
    }
    // A loop, not a closure: a closure would not inherit this function's target features
    // (the exponentials' FMAs became library calls).
    let mut sums = Vec::with_capacity(group);
    for s in scores.iter_mut() {
        shape.cap(&mut s[from - tile_from..]);
        sums.push(softmax_exps(&mut s[from - tile_from..]));
    }
    let (mut even, mut odd) = (vec![0f32; group * hd], vec![0f32; group * hd]);
    // Runs of an even number of keys from `from`, so keys pair up as in one pass.
    let mut a = from;
    while a < upto {
        let n = (upto - a).min(STREAM_BLOCK);
        if a + n < len {
            prefetch_values(&inp.view, a + n, (a + 2 * n).min(len), row_len, kvh, hd);
        }
        gather::<W>(&inp.view, a, (a + n).min(len), row_len, kvh, hd, None, Some(&mut v));
        for (g, s) in scores.iter().enumerate() {
            let (e, o) = (&mut even[g * hd..(g + 1) * hd], &mut odd[g * hd..(g + 1) * hd]);
            weighted_sum_run(&s[a - tile_from..][..n], &v[..n * hd], hd, e, o);
        }
        a += n;
    }
    SCRATCH.with(|cell| *cell.borrow_mut() = (kt, v));
    let fixed = matches!(hd, 64 | 128 | 256);
    for (g, sum) in sums.iter().enumerate() {
        let inv = 1.0 / sum;
        for (e, o) in even[g * hd..(g + 1) * hd].iter_mut().zip(&odd[g * hd..(g + 1) * hd]) {
            // As `weighted_sum_fixed` ends (the other sizes accumulate in one chain).
            if fixed {
                *e += *o;
            }
            *e *= inv;
        }
    }
    *out = even;
}

#[cfg(test)]
mod tests {
    use super::softmax::exp_nonpositive;
    use super::*;
    use kv::{Capacity, KvDtype, KvLayout, KvPool, Owner, PoolConfig, RequestId, ScrubPolicy, TenantId};

    /// The portable kernel's rows, as a value.
    fn portable(
        inp: &AttnInput<'_>,
        shape: &AttnShape,
        kvh: usize,
        heads: Range<usize>,
        rows: Range<usize>,
    ) -> Vec<f32> {
        let mut out = Vec::new();
        attend_impl::<Portable>(inp, shape, kvh, heads, rows, &mut out);
        out
    }

    /// The AVX2 kernel's rows; only where `avx2_detected()`.
    #[cfg(target_arch = "x86_64")]
    fn avx2(inp: &AttnInput<'_>, shape: &AttnShape, kvh: usize, heads: Range<usize>, rows: Range<usize>) -> Vec<f32> {
        assert!(avx2_detected());
        let mut out = Vec::new();
        // SAFETY: the features were just checked.
        unsafe { attend_avx2(inp, shape, kvh, heads, rows, &mut out) };
        out
    }

    /// The vector exp is within 2 ulp of libm's over the range softmax feeds it, and exact at 0.
    #[test]
    fn the_softmax_exp_is_within_two_ulp_of_libm() {
        assert_eq!(exp_nonpositive(0.0), 1.0);
        let mut worst = 0i64;
        for i in 0..=870_000 {
            let x = -(i as f32) * 1e-4;
            let (got, want) = (exp_nonpositive(x), x.exp());
            let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
            worst = worst.max(ulps);
        }
        assert!(worst <= 2, "worst {worst} ulp");
        // Far below: tiny and positive, never NaN or garbage from the exponent bits.
        for x in [-87.5f32, -100.0, -1e4, f32::MIN] {
            let e = exp_nonpositive(x);
            assert!(e > 0.0 && e < 1e-37, "{x}: {e}");
        }
    }

    /// The fixed-size weighted sums (two accumulators) agree with the plain loop up to rounding,
    /// for even and odd key counts.
    #[test]
    fn fixed_size_weighted_sums_agree_with_the_general_loop() {
        for hd in [64, 128, 256] {
            for keys in [1, 36, 37] {
                let v: Vec<f32> = (0..keys * hd).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 97.0).collect();
                let scores: Vec<f32> = (0..keys).map(|j| ((j * 31 % 17) as f32 - 8.0) / 3.0).collect();
                let mut got = vec![0f32; hd];
                softmax_weighted_sum(&mut scores.clone(), &v, hd, &mut got);
                let max = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let e: Vec<f64> = scores.iter().map(|s| f64::from(s - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for t in 0..hd {
                    let want: f64 = e.iter().enumerate().map(|(j, p)| p * f64::from(v[j * hd + t])).sum::<f64>() / z;
                    assert!((want - f64::from(got[t])).abs() < 1e-5, "hd {hd} keys {keys} t {t}");
                }
            }
        }
    }

    #[test]
    fn every_widening_path_gives_identical_attention() {
        let (n_heads, n_kv, hd, ps) = (6, 2, 16, 5);
        let layout = KvLayout { n_layers: 1, n_kv_heads: n_kv, head_dim: hd, page_size: ps, dtype: KvDtype::F16 };
        let pool =
            KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(64), scrub: ScrubPolicy::OnFree }).unwrap();
        let mut t = pool.reserve(Owner { tenant: TenantId(1), request: RequestId(1) }, 23).unwrap();
        let val = |i: usize| ((i * 7919 % 1000) as f32 - 500.0) / 250.0;
        let row = n_kv * hd;
        let k: Vec<f32> = (0..23 * row).map(val).collect();
        let v: Vec<f32> = (0..23 * row).map(|i| val(i + 13)).collect();
        t.write_range(0, 0, &k, &v).unwrap();
        let q: Vec<f32> = (0..3 * n_heads * hd).map(|i| val(i + 101)).collect();
        let inp = AttnInput { q: &q, start: 20, n: 3, view: t.layer(0, 23).unwrap() };
        let shape = AttnShape::standard(n_heads, n_kv, hd, None);
        for kvh in 0..n_kv {
            let group = 0..shape.n_heads / shape.n_kv_heads;
            let want = portable(&inp, &shape, kvh, group.clone(), 0..3);
            let got = attend_group(&inp, &shape, kvh, 0..3);
            assert_eq!(want, got);
            #[cfg(target_arch = "x86_64")]
            if avx2_detected() {
                assert_eq!(want, avx2(&inp, &shape, kvh, group.clone(), 0..3));
            }
            assert!(want.iter().all(|x| x.is_finite()));
        }
    }

    /// A query's output is the same bit for bit whether it is computed with the other rows of
    /// its prefill chunk or alone (a decode step, another chunking): what batch invariance and
    /// chunked prefill rely on. Page sizes that are and are not a tile, with and without a
    /// window, contexts past several tiles.
    #[test]
    fn a_query_attends_identically_alone_among_other_rows_and_with_its_group_split() {
        let (n_heads, n_kv, len) = (6, 2, 150);
        // Head sizes of the register-held sums (64, 256) and of the plain loop (40).
        // Soft-capped scores (Gemma 2) too: the cap is applied wherever the row is computed.
        for (hd, ps, window, softcap) in [
            (64, 16, None, None),
            (64, 5, None, Some(2.0)),
            (64, 16, Some(40), None),
            (64, 7, Some(33), Some(2.0)),
            (256, 16, Some(97), Some(2.0)),
            (40, 3, None, None),
        ] {
            let layout = KvLayout { n_layers: 1, n_kv_heads: n_kv, head_dim: hd, page_size: ps, dtype: KvDtype::F16 };
            let pool = KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(256), scrub: ScrubPolicy::OnFree })
                .unwrap();
            let mut t = pool.reserve(Owner { tenant: TenantId(1), request: RequestId(1) }, len).unwrap();
            let val = |i: usize| ((i * 7919 % 1000) as f32 - 500.0) / 250.0;
            let row = n_kv * hd;
            let k: Vec<f32> = (0..len * row).map(val).collect();
            let v: Vec<f32> = (0..len * row).map(|i| val(i + 13)).collect();
            t.write_range(0, 0, &k, &v).unwrap();
            let (start, n) = (100, 50);
            let q: Vec<f32> = (0..n * n_heads * hd).map(|i| val(i + 101)).collect();
            let inp = AttnInput { q: &q, start, n, view: t.layer(0, len).unwrap() };
            let shape = AttnShape { softcap, ..AttnShape::standard(n_heads, n_kv, hd, window) };
            let width = (n_heads / n_kv) * hd;
            for kvh in 0..n_kv {
                let all = attend_group(&inp, &shape, kvh, 0..n);
                for i in [0, 1, 17, 49] {
                    let one = attend_group(&inp, &shape, kvh, i..i + 1);
                    assert_eq!(
                        bits(&one),
                        bits(&all[i * width..(i + 1) * width]),
                        "head dim {hd} page {ps} window {window:?} row {i}"
                    );
                }
                // Query heads split across calls (as threads take them) compute the same.
                for heads in [0..1, 1..3, 2..3, 0..2] {
                    let part = attend_heads(&inp, &shape, kvh, heads.clone(), 0..n);
                    let w = heads.len() * hd;
                    for i in 0..n {
                        let whole = &all[i * width + heads.start * hd..][..w];
                        assert_eq!(bits(&part[i * w..(i + 1) * w]), bits(whole), "heads {heads:?} row {i}");
                    }
                }
            }
        }
    }

    /// Values spread over [-2, 2) without structure a kernel could get right by accident.
    pub(super) fn pattern(i: usize) -> f32 {
        ((i * 7919 % 1000) as f32 - 500.0) / 250.0
    }

    /// A one-layer f16 pool of 16-slot pages and a table of `len` positions whose K and V hold
    /// [`pattern`].
    pub(super) fn filled_pages(n_kv: usize, hd: usize, len: usize) -> (KvPool, kv::BlockTable) {
        let layout = KvLayout { n_layers: 1, n_kv_heads: n_kv, head_dim: hd, page_size: 16, dtype: KvDtype::F16 };
        let pool = KvPool::new(PoolConfig {
            layout,
            capacity: Capacity::Tokens(len.div_ceil(16) * 16),
            scrub: ScrubPolicy::OnFree,
        })
        .unwrap();
        let mut t = pool.reserve(Owner { tenant: TenantId(1), request: RequestId(1) }, len).unwrap();
        let k: Vec<f32> = (0..len * n_kv * hd).map(pattern).collect();
        let v: Vec<f32> = (0..len * n_kv * hd).map(|i| pattern(i + 13)).collect();
        t.write_range(0, 0, &k, &v).unwrap();
        (pool, t)
    }

    pub(super) fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|f| f.to_bits()).collect()
    }

    /// A decode row read straight from the f16 pages (on AVX-512) gives the bits of the general
    /// path, which widens them into scratch first, and so do prompt rows whose heads share each
    /// value load: contexts ending on and off a page boundary,
    /// windows starting at odd and even keys, every head size with register-held sums, and query
    /// groups split as threads take them.
    #[test]
    fn a_decode_row_read_from_the_pages_matches_the_widened_path_bit_for_bit() {
        let (n_heads, n_kv) = (8, 2);
        for hd in [64, 128, 256] {
            let len = 83;
            let (_pool, t) = filled_pages(n_kv, hd, len);
            let q: Vec<f32> = (0..n_heads * hd).map(|i| pattern(i + 101) / 4.0).collect();
            let qs: Vec<f32> = (0..len * n_heads * hd).map(|i| pattern(i + 57) / 4.0).collect();
            for ctx in [1, 15, 16, 17, 32, 47, 64, 65, 83] {
                let inp = AttnInput { q: &q, start: ctx - 1, n: 1, view: t.layer(0, ctx).unwrap() };
                for window in [None, Some(1), Some(6), Some(17), Some(40)] {
                    let shape = AttnShape::standard(n_heads, n_kv, hd, window);
                    for kvh in 0..n_kv {
                        for heads in [0..4, 0..1, 1..3, 3..4, 0..3] {
                            let want = portable(&inp, &shape, kvh, heads.clone(), 0..1);
                            let got = attend_heads(&inp, &shape, kvh, heads.clone(), 0..1);
                            assert_eq!(
                                bits(&got),
                                bits(&want),
                                "head dim {hd} context {ctx} window {window:?} kv head {kvh} heads {heads:?}"
                            );
                        }
                        // And the context's prompt rows together (the weighted sums of a group's
                        // heads in one pass over the values).
                        let prompt = AttnInput { q: &qs[..ctx * n_heads * hd], start: 0, n: ctx, view: inp.view };
                        let want = portable(&prompt, &shape, kvh, 0..4, 0..ctx);
                        let got = attend_group(&prompt, &shape, kvh, 0..ctx);
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "head dim {hd} prompt {ctx} window {window:?} kv head {kvh}"
                        );
                    }
                }
            }
        }
    }

    /// Prompt rows read straight from the pages, several rows' queries to a pass, give the
    /// general path's bits: chunks starting on and off a page boundary, blocks of rows starting
    /// inside a chunk, query groups of every size that packs one to six rows into a pass, and
    /// windows that do and do not cut the rows' context (the latter served by the general path).
    #[test]
    fn prompt_rows_read_from_the_pages_match_the_widened_path_bit_for_bit() {
        let (n_heads, n_kv) = (12, 2);
        for hd in [64, 128, 256] {
            let len = 90;
            let (_pool, t) = filled_pages(n_kv, hd, len);
            let qs: Vec<f32> = (0..len * n_heads * hd).map(|i| pattern(i + 57) / 4.0).collect();
            for (chunk, end) in [(0, 2), (0, 33), (5, 22), (16, 48), (17, 90), (31, 33), (64, 90)] {
                let n = end - chunk;
                let inp = AttnInput { q: &qs[..n * n_heads * hd], start: chunk, n, view: t.layer(0, end).unwrap() };
                for window in [None, Some(end), Some(end - 1), Some(20)] {
                    let shape = AttnShape::standard(n_heads, n_kv, hd, window);
                    for kvh in 0..n_kv {
                        for heads in [0..6, 0..1, 1..3, 3..6, 2..6, 0..5] {
                            for rows in [0..n, n / 3..n, 0..n.div_ceil(2)] {
                                let want = portable(&inp, &shape, kvh, heads.clone(), rows.clone());
                                let got = attend_heads(&inp, &shape, kvh, heads.clone(), rows.clone());
                                assert_eq!(
                                    bits(&got),
                                    bits(&want),
                                    "head dim {hd} rows {rows:?} of {chunk}..{end} window {window:?} \
                                     kv head {kvh} heads {heads:?}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The page-reading rows reuse a per-thread scratch and the caller's output buffer: after
    /// longer and shorter contexts, a short last page and whole ones, decode rows and prompt
    /// blocks, on one thread into one buffer holding the previous call's values, every call
    /// gives the bits of the same call on a thread of its own into a fresh buffer.
    #[test]
    fn reused_scratch_and_output_buffers_give_the_bits_of_fresh_ones() {
        let (n_heads, n_kv, hd, len) = (6, 2, 64, 90);
        let (_pool, t) = filled_pages(n_kv, hd, len);
        let qs: Vec<f32> = (0..len * n_heads * hd).map(|i| pattern(i + 57) / 4.0).collect();
        let shape = AttnShape::standard(n_heads, n_kv, hd, None);
        let mut out = vec![f32::NAN; 7];
        for (start, end) in [(88, 89), (0, 33), (15, 16), (40, 90), (16, 17), (0, 5), (63, 64), (20, 70)] {
            let n = end - start;
            let inp = AttnInput { q: &qs[..n * n_heads * hd], start, n, view: t.layer(0, end).unwrap() };
            for kvh in 0..n_kv {
                attend_heads_into(&inp, &shape, kvh, 0..3, 0..n, &mut out);
                let fresh = std::thread::scope(|s| s.spawn(|| attend_heads(&inp, &shape, kvh, 0..3, 0..n)).join());
                assert_eq!(bits(&out), bits(&fresh.unwrap()), "rows {start}..{end} kv head {kvh}");
            }
        }
    }

    /// Attention of every row of a 45-position prompt against a direct softmax over the keys
    /// each query sees, scores scaled by `scale` and soft-capped by `softcap`; also each of
    /// three late rows alone (a decode step) gives the bits it has among the others.
    fn attends_as_a_direct_softmax(window: Option<usize>, scale: f32, softcap: Option<f32>) {
        let (n_heads, n_kv, hd, ps, len) = (2, 1, 8, 4, 45);
        let layout = KvLayout { n_layers: 1, n_kv_heads: n_kv, head_dim: hd, page_size: ps, dtype: KvDtype::F32 };
        let pool =
            KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(64), scrub: ScrubPolicy::OnFree }).unwrap();
        let mut t = pool.reserve(Owner { tenant: TenantId(1), request: RequestId(1) }, len).unwrap();
        let val = |i: usize| ((i * 7919 % 1000) as f32 - 500.0) / 250.0;
        let k: Vec<f32> = (0..len * hd).map(val).collect();
        let v: Vec<f32> = (0..len * hd).map(|i| val(i + 13)).collect();
        t.write_range(0, 0, &k, &v).unwrap();
        let q: Vec<f32> = (0..len * n_heads * hd).map(|i| val(i + 101)).collect();
        let inp = AttnInput { q: &q, start: 0, n: len, view: t.layer(0, len).unwrap() };
        let shape = AttnShape { n_heads, n_kv_heads: n_kv, head_dim: hd, window, scale, softcap };
        let got = attend_group(&inp, &shape, 0, 0..len);
        // Alone, a late row gathers only its window (from a tile past position 0).
        for p in [len - 1, len / 2, 20] {
            let one = attend_group(&inp, &shape, 0, p..p + 1);
            assert_eq!(one, got[p * n_heads * hd..(p + 1) * n_heads * hd], "window {window:?} row {p} alone");
        }
        for p in 0..len {
            for h in 0..n_heads {
                let qh = &q[(p * n_heads + h) * hd..][..hd];
                let from = window.map_or(0, |w| (p + 1).saturating_sub(w));
                let capped = |s: f32| softcap.map_or(s, |c| c * (s / c).tanh());
                let sc: Vec<f32> = (from..=p).map(|j| capped(dot(qh, &k[j * hd..(j + 1) * hd]) * scale)).collect();
                let m = sc.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let e: Vec<f32> = sc.iter().map(|s| (s - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for d in 0..hd {
                    let want: f32 = (from..=p).zip(&e).map(|(j, w)| w * v[j * hd + d]).sum::<f32>() / z;
                    let have = got[(p * n_heads + h) * hd + d];
                    assert!((want - have).abs() < 1e-4, "window {window:?} pos {p} head {h}: {want} vs {have}");
                }
            }
        }
    }

    /// A sliding window of w: each query attends to exactly its last w positions, as a direct
    /// softmax over those keys computes (windows smaller than, equal to and spanning tiles).
    #[test]
    fn a_sliding_window_attends_to_exactly_the_last_positions() {
        for window in [1, 5, 16, 17, 40, 100] {
            attends_as_a_direct_softmax(Some(window), 1.0 / 8f32.sqrt(), None);
        }
    }

    /// Gemma 2: scores multiplied by the model's scale, then `cap * tanh(score / cap)`, before
    /// the softmax, with and without a window; a cap of 1.5 flattens these scores (several
    /// units) a lot, so leaving it out fails the comparison.
    #[test]
    fn soft_capped_scores_with_the_models_scale_attend_as_a_direct_softmax() {
        for window in [None, Some(5), Some(17)] {
            attends_as_a_direct_softmax(window, 0.6, Some(1.5));
        }
    }
}
