//! Causal attention reading K and V from the paged pool only.
//!
//! For each (sequence, KV head) the pages are gathered once into f32 scratch, then every query
//! head of the group and every query token of the chunk attends over it. With an f16 pool the
//! queries are rounded to f16 first, as llama.cpp does for an f16 KV cache, so scores agree.

use half::slice::HalfFloatSliceExt;
use kv::{KvSlice, LayerView};

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

/// Attention output for one KV head group: `n` rows of `group * head_dim`.
pub fn attend_group(inp: &AttnInput<'_>, shape: &AttnShape, kvh: usize) -> Vec<f32> {
    let f16_queries = inp.view.chunks().next().is_some_and(|c| matches!(c.k, KvSlice::F16(_)));
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
            // SAFETY: the features were just detected on this CPU.
            return unsafe { attend_avx512(inp, shape, kvh, f16_queries) };
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: as above.
            return unsafe { attend_avx2(inp, shape, kvh, f16_queries) };
        }
    }
    attend_impl(inp, shape, kvh, f16_queries)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn attend_avx512(inp: &AttnInput<'_>, shape: &AttnShape, kvh: usize, f16q: bool) -> Vec<f32> {
    attend_impl(inp, shape, kvh, f16q)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2(inp: &AttnInput<'_>, shape: &AttnShape, kvh: usize, f16q: bool) -> Vec<f32> {
    attend_impl(inp, shape, kvh, f16q)
}

/// The dot product attention uses: 16 lanes summed in a fixed order, so that the result is the
/// same whatever vector width the compiler picks.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn gather(view: &LayerView<'_>, row_len: usize, kvh: usize, hd: usize, k: &mut [f32], v: &mut [f32]) {
    let mut tmp = vec![0f32; row_len];
    for ch in view.chunks() {
        for s in 0..ch.len {
            let dst = (ch.start + s) * hd;
            for (src, out) in [(&ch.k, &mut *k), (&ch.v, &mut *v)] {
                let row = s * row_len + kvh * hd;
                match src {
                    KvSlice::F16(x) => x[row..row + hd].convert_to_f32_slice(&mut tmp[..hd]),
                    KvSlice::F32(x) => tmp[..hd].copy_from_slice(&x[row..row + hd]),
                }
                out[dst..dst + hd].copy_from_slice(&tmp[..hd]);
            }
        }
    }
}

#[inline(always)]
fn attend_impl(inp: &AttnInput<'_>, shape: &AttnShape, kvh: usize, f16q: bool) -> Vec<f32> {
    let hd = shape.head_dim;
    let group = shape.n_heads / shape.n_kv_heads;
    let len = inp.view.len();
    let row_len = shape.n_kv_heads * hd;
    let (mut k, mut v) = (vec![0f32; len * hd], vec![0f32; len * hd]);
    gather(&inp.view, row_len, kvh, hd, &mut k, &mut v);
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; inp.n * group * hd];
    let mut scores = vec![0f32; len];
    let mut q = vec![0f32; hd];
    for i in 0..inp.n {
        let upto = inp.start + i + 1;
        for gi in 0..group {
            let h = kvh * group + gi;
            q.copy_from_slice(&inp.q[i * shape.n_heads * hd + h * hd..][..hd]);
            if f16q {
                for x in q.iter_mut() {
                    *x = half::f16::from_f32(*x).to_f32();
                }
            }
            let mut max = f32::NEG_INFINITY;
            for (j, s) in scores[..upto].iter_mut().enumerate() {
                *s = dot(&q, &k[j * hd..(j + 1) * hd]) * scale;
                max = max.max(*s);
            }
            let mut sum = 0f32;
            for s in scores[..upto].iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let o = &mut out[(i * group + gi) * hd..][..hd];
            for (j, &p) in scores[..upto].iter().enumerate() {
                for (oo, &vv) in o.iter_mut().zip(&v[j * hd..(j + 1) * hd]) {
                    *oo += p * vv;
                }
            }
            let inv = 1.0 / sum;
            for oo in o.iter_mut() {
                *oo *= inv;
            }
        }
    }
    out
}
