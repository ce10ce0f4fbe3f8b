//! Causal attention reading K and V from the paged pool only.
//!
//! For each (sequence, KV head) the pages are gathered once into f32 scratch (K transposed, as
//! the pool stores it, so sixteen keys' scores are computed side by side with no horizontal
//! sums and the gather is contiguous runs), then every query
//! head of the group attends over it, sharing each load of K. With an f16 pool the queries are
//! rounded to f16 first, as llama.cpp does for an f16 KV cache, so scores agree with it.

use std::ops::Range;

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
    /// Sliding-window layers: a query at position p sees keys p - window + 1 ..= p.
    pub window: Option<usize>,
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
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
            // SAFETY: the features were just detected on this CPU.
            return unsafe { attend_avx512(inp, shape, kvh, rows) };
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
            // SAFETY: as above.
            return unsafe { attend_avx2(inp, shape, kvh, rows) };
        }
    }
    attend_impl::<Portable>(inp, shape, kvh, rows)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn attend_avx512(inp: &AttnInput<'_>, shape: &AttnShape, kvh: usize, rows: Range<usize>) -> Vec<f32> {
    attend_impl::<F16c>(inp, shape, kvh, rows)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2(inp: &AttnInput<'_>, shape: &AttnShape, kvh: usize, rows: Range<usize>) -> Vec<f32> {
    attend_impl::<F16c>(inp, shape, kvh, rows)
}

/// f16 to f32 for runs of elements, as wide as the CPU allows. Inlined into the
/// feature-enabled attention entry points, so the intrinsics compile with those features.
trait Widen {
    fn run(src: &[half::f16], dst: &mut [f32]);
}

struct Portable;

impl Widen for Portable {
    #[inline(always)]
    fn run(src: &[half::f16], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
}

#[cfg(target_arch = "x86_64")]
struct F16c;

#[cfg(target_arch = "x86_64")]
impl Widen for F16c {
    #[inline(always)]
    fn run(src: &[half::f16], dst: &mut [f32]) {
        use std::arch::x86_64::{_mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: only reached from `attend_avx2` / `attend_avx512`, which run after
            // detecting f16c; `i + 8 <= n` keeps both accesses in bounds.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i) as *const _);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        Portable::run(&src[i..n], &mut dst[i..n]);
    }
}

/// Copies a run of the pool's elements into f32.
#[inline(always)]
fn widen<W: Widen>(src: KvSlice<'_>, dst: &mut [f32]) {
    match src {
        KvSlice::F16(x) => W::run(x, dst),
        KvSlice::F32(x) => dst.copy_from_slice(x),
    }
}

/// Gathers head `kvh` of positions `[0, len)`: K transposed into `kt[d * stride + pos]` (the
/// pool already stores K transposed per page, so each element is a contiguous run), V as rows.
/// Returns whether the pool is f16.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gather<W: Widen>(
    view: &LayerView<'_>,
    len: usize,
    row_len: usize,
    kvh: usize,
    hd: usize,
    stride: usize,
    kt: &mut [f32],
    v: &mut [f32],
) -> bool {
    let mut f16 = false;
    for ch in view.chunks() {
        if ch.start >= len {
            break;
        }
        let n = ch.len.min(len - ch.start);
        f16 = matches!(ch.v, KvSlice::F16(_));
        for d in 0..hd {
            let run = ch.k_run(kvh * hd + d).sub(0, n);
            widen::<W>(run, &mut kt[d * stride + ch.start..d * stride + ch.start + n]);
        }
        for s in 0..n {
            let pos = ch.start + s;
            widen::<W>(ch.v.sub(s * row_len + kvh * hd, hd), &mut v[pos * hd..(pos + 1) * hd]);
        }
    }
    f16
}

/// Scores of `G` queries against keys `[from, upto)` (`from` a multiple of sixteen), sixteen
/// keys at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn scores_tile<const G: usize>(
    qs: [&[f32]; G],
    kt: &[f32],
    stride: usize,
    from: usize,
    upto: usize,
    scale: f32,
    out: &mut [Vec<f32>],
) {
    let hd = qs[0].len();
    for jb in (from..upto).step_by(LANES) {
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

/// `o[t] += p_j * v[j][t]` for every key `j` in order, with `o` held in an array of `N`.
#[inline(always)]
fn weighted_sum_fixed<const N: usize>(scores: &[f32], v: &[f32], o: &mut [f32]) {
    let Ok(o) = <&mut [f32; N]>::try_from(o) else { unreachable!("o holds one head") };
    let mut acc = *o;
    for (j, &p) in scores.iter().enumerate() {
        let Ok(vr) = <&[f32; N]>::try_from(&v[j * N..(j + 1) * N]) else { break };
        for t in 0..N {
            acc[t] += p * vr[t];
        }
    }
    *o = acc;
}

#[inline(always)]
fn softmax_weighted_sum(scores: &mut [f32], v: &[f32], hd: usize, o: &mut [f32]) {
    let max = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    match hd {
        // The common head sizes: the accumulator stays in registers instead of being loaded
        // and stored once per key. Same operations in the same order as the general loop.
        64 => weighted_sum_fixed::<64>(scores, v, o),
        128 => weighted_sum_fixed::<128>(scores, v, o),
        256 => weighted_sum_fixed::<256>(scores, v, o),
        _ => {
            for (j, &p) in scores.iter().enumerate() {
                for (oo, &vv) in o.iter_mut().zip(&v[j * hd..(j + 1) * hd]) {
                    *oo += p * vv;
                }
            }
        }
    }
    let inv = 1.0 / sum;
    for oo in o.iter_mut() {
        *oo *= inv;
    }
}

#[inline(always)]
fn attend_impl<W: Widen>(inp: &AttnInput<'_>, shape: &AttnShape, kvh: usize, rows: Range<usize>) -> Vec<f32> {
    let hd = shape.head_dim;
    let group = shape.n_heads / shape.n_kv_heads;
    // Keys up to the last query of these rows are all that is needed.
    let len = (inp.start + rows.end).min(inp.view.len());
    let stride = len.div_ceil(LANES) * LANES;
    let row_len = shape.n_kv_heads * hd;
    let (mut kt, mut v) = (vec![0f32; hd * stride], vec![0f32; len * hd]);
    let f16_queries = gather::<W>(&inp.view, len, row_len, kvh, hd, stride, &mut kt, &mut v);
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; rows.len() * group * hd];
    let mut scores: Vec<Vec<f32>> = (0..group).map(|_| vec![0f32; stride]).collect();
    let mut q = vec![0f32; group * hd];
    for (oi, i) in rows.enumerate() {
        let upto = inp.start + i + 1;
        // First key this query sees; scores are computed from the tile holding it.
        let from = shape.window.map_or(0, |w| upto.saturating_sub(w));
        let tile_from = from / LANES * LANES;
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
                1 => scores_tile::<1>([qh(0)], &kt, stride, tile_from, upto, scale, rest),
                2 => scores_tile::<2>([qh(0), qh(1)], &kt, stride, tile_from, upto, scale, rest),
                3 => scores_tile::<3>([qh(0), qh(1), qh(2)], &kt, stride, tile_from, upto, scale, rest),
                _ => scores_tile::<4>([qh(0), qh(1), qh(2), qh(3)], &kt, stride, tile_from, upto, scale, rest),
            }
            g0 += (group - g0).min(4);
        }
        for (g, s) in scores.iter_mut().enumerate() {
            let o = &mut out[(oi * group + g) * hd..][..hd];
            softmax_weighted_sum(&mut s[from..upto], &v[from * hd..], hd, o);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kv::{Capacity, KvDtype, KvLayout, KvPool, Owner, PoolConfig, RequestId, ScrubPolicy, TenantId};

    /// Every widening path (portable, F16C) gives the same attention output, bit for bit, on
    /// an f16 pool with a partial last page.
    #[test]
    fn fixed_size_weighted_sums_equal_the_general_loop_bit_for_bit() {
        for hd in [16, 64, 128, 256] {
            let keys = 37;
            let v: Vec<f32> = (0..keys * hd).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 97.0).collect();
            let scores: Vec<f32> = (0..keys).map(|j| ((j * 31 % 17) as f32 - 8.0) / 3.0).collect();
            let o0: Vec<f32> = (0..hd).map(|t| t as f32 / 7.0).collect();
            let (mut s1, mut got) = (scores.clone(), o0.clone());
            softmax_weighted_sum(&mut s1, &v, hd, &mut got);
            // The general loop, written out.
            let max = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let (mut sum, mut want) = (0f32, o0.clone());
            for (j, &s) in scores.iter().enumerate() {
                let p = (s - max).exp();
                sum += p;
                for (oo, &vv) in want.iter_mut().zip(&v[j * hd..(j + 1) * hd]) {
                    *oo += p * vv;
                }
            }
            let inv = 1.0 / sum;
            want.iter_mut().for_each(|x| *x *= inv);
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "head_dim {hd}");
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
        let shape = AttnShape { n_heads, n_kv_heads: n_kv, head_dim: hd, window: None };
        for kvh in 0..n_kv {
            let want = attend_impl::<Portable>(&inp, &shape, kvh, 0..3);
            let got = attend_group(&inp, &shape, kvh, 0..3);
            assert_eq!(want, got);
            assert!(want.iter().all(|x| x.is_finite()));
        }
    }

    /// A sliding window of w: each query attends to exactly its last w positions, as a direct
    /// softmax over those keys computes (windows smaller than, equal to and spanning tiles).
    #[test]
    fn a_sliding_window_attends_to_exactly_the_last_positions() {
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
        for window in [1, 5, 16, 17, 40, 100] {
            let shape = AttnShape { n_heads, n_kv_heads: n_kv, head_dim: hd, window: Some(window) };
            let got = attend_group(&inp, &shape, 0, 0..len);
            for p in 0..len {
                for h in 0..n_heads {
                    let qh = &q[(p * n_heads + h) * hd..][..hd];
                    let from = (p + 1).saturating_sub(window);
                    let sc: Vec<f32> =
                        (from..=p).map(|j| dot(qh, &k[j * hd..(j + 1) * hd]) / (hd as f32).sqrt()).collect();
                    let m = sc.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                    let e: Vec<f32> = sc.iter().map(|s| (s - m).exp()).collect();
                    let z: f32 = e.iter().sum();
                    for d in 0..hd {
                        let want: f32 = (from..=p).zip(&e).map(|(j, w)| w * v[j * hd + d]).sum::<f32>() / z;
                        let have = got[(p * n_heads + h) * hd + d];
                        assert!((want - have).abs() < 1e-4, "window {window} pos {p} head {h}: {want} vs {have}");
                    }
                }
            }
        }
    }
}
