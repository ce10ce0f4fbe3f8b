//! How one layer's attention is spread over the compute threads, given each sequence's
//! queries and KV view: one task per (sequence, KV head, block of queries), so a long prefill
//! spreads over every thread; a decode step whose (sequence, KV head) pairs would leave threads
//! idle split by keys, then by output elements; and, failing that, each group's query heads
//! split. Every way computes each row's result bit for bit the same (batch invariance), so the
//! choice is speed only. The kernels themselves are in [`crate::attention`].

use crate::attention::{self, attend_heads_into, AttnInput, AttnShape};
use crate::threads::ComputePool;

/// Most query rows per attention task: small enough to balance threads on a long prefill,
/// large enough that gathering the keys is amortized.
const ATTN_ROWS_PER_TASK: usize = 128;

/// Attention for every sequence of a step into `attn` (row `offsets[s] + i` for sequence `s`'s
/// query `i`), `parts` being per-task buffers kept from step to step.
pub(crate) fn attend(
    pool: &ComputePool,
    inputs: &[AttnInput<'_>],
    shape: &AttnShape,
    offsets: &[usize],
    attn: &mut [f32],
    attn_parts: &mut Vec<Vec<f32>>,
) {
    let t: usize = inputs.iter().map(|i| i.n).sum();
    let hd = shape.head_dim;
    let q_dim = shape.n_heads * hd;
    let group = shape.n_heads / shape.n_kv_heads;
    // With few KV heads (Gemma 270M has one) blocks of 128 rows would leave threads
    // idle: aim for about eight tasks per thread, each row's result is the same anyway.
    let per_task = (t * shape.n_kv_heads).div_ceil(pool.threads() * 8).clamp(16, ATTN_ROWS_PER_TASK);
    let mut tasks: Vec<(usize, usize, std::ops::Range<usize>)> = Vec::new();
    for (si, inp) in inputs.iter().enumerate() {
        for h in 0..shape.n_kv_heads {
            for r0 in (0..inp.n).step_by(per_task) {
                tasks.push((si, h, r0..(r0 + per_task).min(inp.n)));
            }
        }
    }
    // A decode step whose (sequence, KV head) pairs would leave threads idle: each pair's
    // row split across the threads by keys, then by output elements (same bits).
    #[cfg(target_arch = "x86_64")]
    let split = attend_rows_split(pool, inputs, shape, tasks.len(), offsets, attn);
    #[cfg(not(target_arch = "x86_64"))]
    let split = false;
    if !split {
        // Fewer tasks than threads (a decode step with one KV head): split each group's
        // query heads, at the cost of gathering its K and V once per part.
        let parts = if tasks.len() < pool.threads() { pool.threads().div_ceil(tasks.len()).min(group) } else { 1 };
        let per_part = group.div_ceil(parts);
        let tasks: Vec<_> = tasks
            .into_iter()
            .flat_map(|(si, h, rows)| {
                (0..group).step_by(per_part).map(move |g0| (si, h, rows.clone(), g0..(g0 + per_part).min(group)))
            })
            .collect();
        // Kept from step to step, filled in place: fresh ones were allocated on one
        // compute thread and freed on the other (a contended allocator lock).
        if attn_parts.len() < tasks.len() {
            attn_parts.resize_with(tasks.len(), Vec::new);
        }
        let results = &mut attn_parts[..tasks.len()];
        pool.for_each_chunk_mut(results, 1, &|i, slot| {
            let (si, h, ref rows, ref heads) = tasks[i];
            attend_heads_into(&inputs[si], shape, h, heads.clone(), rows.clone(), &mut slot[0]);
        });
        for ((si, h, rows, heads), res) in tasks.iter().zip(results.iter()) {
            let off = offsets[*si];
            let width = heads.len() * hd;
            for (k, i) in rows.clone().enumerate() {
                let src = &res[k * width..(k + 1) * width];
                attn[(off + i) * q_dim + (h * group + heads.start) * hd..][..width].copy_from_slice(src);
            }
        }
    }
}

/// A decode step's attention split by [`attention::row_scores`] / [`attention::row_output`]
/// when its (sequence, KV head) pairs would leave threads idle (`pairs` not a multiple of
/// the threads, and fewer than two per thread), writing `attn`; false, writing nothing,
/// when it does not apply.
#[cfg(target_arch = "x86_64")]
fn attend_rows_split(
    pool: &ComputePool,
    inputs: &[AttnInput<'_>],
    shape: &AttnShape,
    pairs: usize,
    offsets: &[usize],
    attn: &mut [f32],
) -> bool {
    let threads = pool.threads();
    if threads < 2 || pairs >= 2 * threads || pairs.is_multiple_of(threads) || inputs.iter().any(|i| i.n != 1) {
        return false;
    }
    let (hd, nkv) = (shape.head_dim, shape.n_kv_heads);
    let group = shape.n_heads / nkv;
    let pair = |i: usize| (i / nkv, i % nkv);
    let n = inputs.len() * nkv;
    let mut scores: Vec<Option<Vec<f32>>> = vec![None; n * threads];
    pool.for_each_chunk_mut(&mut scores, 1, &|i, slot| {
        let (si, h) = pair(i / threads);
        slot[0] = attention::row_scores(&inputs[si], shape, h, i % threads, threads);
    });
    let Some(scores) = scores.into_iter().collect::<Option<Vec<_>>>() else { return false };
    let mut outs: Vec<Option<Vec<f32>>> = vec![None; n * threads];
    pool.for_each_chunk_mut(&mut outs, 1, &|i, slot| {
        let (si, h) = pair(i / threads);
        let parts = &scores[i / threads * threads..][..threads];
        slot[0] = attention::row_output(&inputs[si], shape, h, parts, i % threads);
    });
    let Some(outs) = outs.into_iter().collect::<Option<Vec<_>>>() else { return false };
    let q_dim = shape.n_heads * hd;
    for (i, out) in outs.iter().enumerate() {
        let ((si, h), dims) = (pair(i / threads), attention::row_output_dims(hd, i % threads, threads));
        for g in 0..group {
            let at = offsets[si] * q_dim + (h * group + g) * hd + dims.start;
            attn[at..at + dims.len()].copy_from_slice(&out[g * dims.len()..(g + 1) * dims.len()]);
        }
    }
    true
}
