//! A decode row's attention split across threads in two phases that give the bits of one
//! [`super::attend_heads`] call: first the keys' scores, by parts of the context (each key's
//! score is its own chain), then the output, by parts of the head's elements (each element is
//! its own chain), every part taking the softmax of all the scores. A decode step with fewer
//! (sequence, KV head) pairs than threads can keep, otherwise, only some threads busy: SmolLM2's
//! three KV heads on two threads, Gemma 3's one; and splitting its query heads instead reads
//! the whole context once per part.

use std::ops::Range;

use super::direct::RowPages;
use super::softmax::LANES;
use super::{avx512_detected, round_to_f16, AttnInput, AttnShape};

/// The row's pages, where they can be read directly (AVX-512, an f16 pool of 16-slot pages).
fn row<'a>(inp: &AttnInput<'a>, shape: &AttnShape, kvh: usize) -> Option<RowPages<'a>> {
    if inp.n != 1 || !avx512_detected() || shape.softcap.is_some() {
        return None;
    }
    let hd = shape.head_dim;
    let upto = inp.start + 1;
    let from = shape.window.map_or(0, |w| upto.saturating_sub(w));
    RowPages::new(&inp.view, hd, kvh, shape.n_kv_heads * hd, (from, upto), Vec::new())
}

/// The pages of part `part` of `parts` of `n` pages.
fn pages_of(n: usize, part: usize, parts: usize) -> Range<usize> {
    n * part / parts..n * (part + 1) / parts
}

/// Phase one: the scores of KV head `kvh`'s query heads against part `part` of `parts` of the
/// context of `inp` (a single row). `None` where the row's pages cannot be read directly (the
/// caller then uses [`super::attend_heads`]).
pub fn row_scores(inp: &AttnInput<'_>, shape: &AttnShape, kvh: usize, part: usize, parts: usize) -> Option<Vec<f32>> {
    let pages = row(inp, shape, kvh)?;
    let (hd, group) = (shape.head_dim, shape.n_heads / shape.n_kv_heads);
    // The group's queries, rounded to f16 as the f16 pool's keys require.
    let mut q = inp.q.get(kvh * group * hd..(kvh + 1) * group * hd)?.to_vec();
    round_to_f16(&mut q);
    let scale = shape.scale;
    // SAFETY: `row` returned pages only after detecting the features.
    Some(unsafe { pages.scores(&q, scale, pages_of(pages.len(), part, parts)) })
}

/// The elements of each head that part `part` of `parts` of phase two computes: whole runs of
/// 32 (empty for parts past the head's).
pub fn row_output_dims(head_dim: usize, part: usize, parts: usize) -> Range<usize> {
    let units = head_dim / 32;
    let parts = parts.min(units);
    if part >= parts {
        return 0..0;
    }
    units * part / parts * 32..units * (part + 1) / parts * 32
}

/// Phase two: the elements [`row_output_dims`] of each query head of KV head `kvh` (one row of
/// them per head), from every part's [`row_scores`] in order.
pub fn row_output(
    inp: &AttnInput<'_>,
    shape: &AttnShape,
    kvh: usize,
    scores: &[Vec<f32>],
    part: usize,
) -> Option<Vec<f32>> {
    let pages = row(inp, shape, kvh)?;
    let (parts, group) = (scores.len(), shape.n_heads / shape.n_kv_heads);
    let stride = pages.len() * LANES;
    let mut all = vec![0f32; group * stride];
    for (p, s) in scores.iter().enumerate() {
        let r = pages_of(pages.len(), p, parts);
        let n = r.len() * LANES;
        if s.len() != group * n {
            return None;
        }
        for g in 0..group {
            all[g * stride + r.start * LANES..][..n].copy_from_slice(&s[g * n..(g + 1) * n]);
        }
    }
    let dims = row_output_dims(shape.head_dim, part, parts);
    // SAFETY: as in `row_scores`.
    Some(if dims.is_empty() { Vec::new() } else { unsafe { pages.weigh(&mut all, dims) } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::attend_heads;
    use crate::attention::tests::{bits, filled_pages, pattern};

    /// Any number of parts, for contexts shorter and longer than the parts' pages, with and
    /// without a window, gives the bits of one `attend_heads` call.
    #[test]
    fn a_row_split_in_any_number_of_parts_matches_the_whole_row_bit_for_bit() {
        if !avx512_detected() {
            return;
        }
        let (n_heads, n_kv) = (6, 2);
        for hd in [64, 128, 256] {
            let (_pool, t) = filled_pages(n_kv, hd, 100);
            let q: Vec<f32> = (0..n_heads * hd).map(|i| pattern(i + 101) / 4.0).collect();
            for ctx in [1, 16, 17, 40, 100] {
                let inp = AttnInput { q: &q, start: ctx - 1, n: 1, view: t.layer(0, ctx).unwrap() };
                for window in [None, Some(7), Some(33)] {
                    let shape = AttnShape::standard(n_heads, n_kv, hd, window);
                    for kvh in 0..n_kv {
                        let want = attend_heads(&inp, &shape, kvh, 0..3, 0..1);
                        for parts in 1..=5 {
                            let scores: Vec<Vec<f32>> =
                                (0..parts).map(|p| row_scores(&inp, &shape, kvh, p, parts).unwrap()).collect();
                            let mut got = vec![f32::NAN; 3 * hd];
                            for p in 0..parts {
                                let out = row_output(&inp, &shape, kvh, &scores, p).unwrap();
                                let dims = row_output_dims(hd, p, parts);
                                for g in 0..3 {
                                    got[g * hd + dims.start..g * hd + dims.end]
                                        .copy_from_slice(&out[g * dims.len()..(g + 1) * dims.len()]);
                                }
                            }
                            assert_eq!(
                                bits(&got),
                                bits(&want),
                                "head dim {hd} context {ctx} window {window:?} kv head {kvh} parts {parts}"
                            );
                        }
                    }
                }
            }
        }
    }
}
