//! Causal attention reading K and V from the paged pool only.
//!
//! For each (sequence, KV head) the pages are gathered once into f32 scratch (K transposed, so
//! sixteen keys' scores are computed side by side with no horizontal sums), then every query
//! head of the group attends over it, sharing each load of K. With an f16 pool the queries are
//! rounded to f16 first, as llama.cpp does for an f16 KV cache, so scores agree with it.

use std::ops::Range;

use half::slice::HalfFloatSliceExt;
use kv::{KvSlice, LayerView};

/// Keys scored together.
const LANES: usize = 16;

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
}

/// The score arithmetic, as a definition: fused multiply-adds in dimension order. The kernels
/// below compute exactly this for each key, so results do not depend on vector width.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0, |acc, (x, y)| x.mul_add(*y, acc))
}

/// Attention output of KV head `kvh`'s query heads for the queries `rows` of `inp`:
/// `rows.len()` rows of `group * head_dim`.
pub fn attend_group(inp: &AttnInput<'_>, shape: &AttnShape, kvh: usize, rows: Range<usize>) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx2") {
            // SAFETY: the features were just detected on this CPU.
            return unsafe { attend_avx512(inp, shape, kvh, rows) };
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
            // SAFETY: as above.
            return unsafe { attend_avx2(inp, shape, kvh, rows) };
        }
    }
    attend_impl(inp, shape, kvh, rows)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn attend_avx512(inp: &AttnInput<'_>, shape: &AttnShape, kvh: usize, rows: Range<usize>) -> Vec<f32> {
    attend_impl(inp, shape, kvh, rows)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2(inp: &AttnInput<'_>, shape: &AttnShape, kvh: usize, rows: Range<usize>) -> Vec<f32> {
    attend_impl(inp, shape, kvh, rows)
}

/// Gathers head `kvh` of positions `[0, len)`: K transposed into `kt[d * stride + pos]`, V as rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gather(
    view: &LayerView<'_>,
    len: usize,
    row_len: usize,
    kvh: usize,
    hd: usize,
    stride: usize,
    kt: &mut [f32],
    v: &mut [f32],
) -> bool {
    let mut tmp = vec![0f32; hd];
    let mut f16 = false;
    for ch in view.chunks() {
        if ch.start >= len {
            break;
        }
        for s in 0..ch.len.min(len - ch.start) {
            let pos = ch.start + s;
            let row = s * row_len + kvh * hd;
            match ch.k {
                KvSlice::F16(x) => {
                    f16 = true;
                    x[row..row + hd].convert_to_f32_slice(&mut tmp);
                }
                KvSlice::F32(x) => tmp.copy_from_slice(&x[row..row + hd]),
            }
            for (d, &val) in tmp.iter().enumerate() {
                kt[d * stride + pos] = val;
            }
            let dst = &mut v[pos * hd..(pos + 1) * hd];
            match ch.v {
                KvSlice::F16(x) => x[row..row + hd].convert_to_f32_slice(dst),
                KvSlice::F32(x) => dst.copy_from_slice(&x[row..row + hd]),
            }
        }
    }
    f16
}

/// Scores of `G` queries against keys `[0, upto)`, sixteen keys at a time.
#[inline(always)]
fn scores_tile<const G: usize>(
    qs: [&[f32]; G],
    kt: &[f32],
    stride: usize,
    upto: usize,
    scale: f32,
    out: &mut [Vec<f32>],
) {
    let hd = qs[0].len();
    for jb in (0..upto).step_by(LANES) {
        let mut acc = [[0f32; LANES]; G];
        for d in 0..hd {
            let k: &[f32; LANES] = match kt[d * stride + jb..d * stride + jb + LANES].try_into() {
                Ok(k) => k,
                Err(_) => return,
            };
            for g in 0..G {
                let qd = qs[g][d];
                for l in 0..LANES {
                    acc[g][l] = qd.mul_add(k[l], acc[g][l]);
                }
            }
        }
        for g in 0..G {
            let n = LANES.min(upto - jb);
            for l in 0..n {
                out[g][jb + l] = acc[g][l] * scale;
            }
        }
    }
}

#[inline(always)]
fn softmax_weighted_sum(scores: &mut [f32], v: &[f32], hd: usize, o: &mut [f32]) {
    let max = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    for (j, &p) in scores.iter().enumerate() {
        for (oo, &vv) in o.iter_mut().zip(&v[j * hd..(j + 1) * hd]) {
            *oo += p * vv;
        }
    }
    let inv = 1.0 / sum;
    for oo in o.iter_mut() {
        *oo *= inv;
    }
}

#[inline(always)]
fn attend_impl(inp: &AttnInput<'_>, shape: &AttnShape, kvh: usize, rows: Range<usize>) -> Vec<f32> {
    let hd = shape.head_dim;
    let group = shape.n_heads / shape.n_kv_heads;
    // Keys up to the last query of these rows are all that is needed.
    let len = (inp.start + rows.end).min(inp.view.len());
    let stride = len.div_ceil(LANES) * LANES;
    let row_len = shape.n_kv_heads * hd;
    let (mut kt, mut v) = (vec![0f32; hd * stride], vec![0f32; len * hd]);
    let f16_queries = gather(&inp.view, len, row_len, kvh, hd, stride, &mut kt, &mut v);
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; rows.len() * group * hd];
    let mut scores: Vec<Vec<f32>> = (0..group).map(|_| vec![0f32; stride]).collect();
    let mut q = vec![0f32; group * hd];
    for (oi, i) in rows.enumerate() {
        let upto = inp.start + i + 1;
        q.copy_from_slice(&inp.q[i * shape.n_heads * hd + kvh * group * hd..][..group * hd]);
        if f16_queries {
            for x in q.iter_mut() {
                *x = half::f16::from_f32(*x).to_f32();
            }
        }
        let mut g0 = 0;
        while g0 < group {
            let rest = &mut scores[g0..];
            let qh = |g: usize| &q[(g0 + g) * hd..(g0 + g + 1) * hd];
            match group - g0 {
                1 => scores_tile::<1>([qh(0)], &kt, stride, upto, scale, rest),
                2 => scores_tile::<2>([qh(0), qh(1)], &kt, stride, upto, scale, rest),
                3 => scores_tile::<3>([qh(0), qh(1), qh(2)], &kt, stride, upto, scale, rest),
                _ => scores_tile::<4>([qh(0), qh(1), qh(2), qh(3)], &kt, stride, upto, scale, rest),
            }
            g0 += (group - g0).min(4);
        }
        for (g, s) in scores.iter_mut().enumerate() {
            let o = &mut out[(oi * group + g) * hd..][..hd];
            softmax_weighted_sum(&mut s[..upto], &v, hd, o);
        }
    }
    out
}
