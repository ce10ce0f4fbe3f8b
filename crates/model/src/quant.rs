//! The activation quantizers (ggml's block dequantizers live in [`crate::dequant`]; the
//! 32-element ones are re-exported here).
//!
//! Activations are quantized exactly as llama.cpp does before its integer dot products
//! (Q8_1 against weights with a minimum: Q4_1, Q5_1; Q8_0 against Q8_0, Q4_0, Q5_0), because
//! numerical agreement with llama.cpp is part of the contract and the integer path is also the
//! fast one. A matrix wholly of K-quants (Q4_K, Q5_K, Q6_K) meets per-256 Q8_K activations, as in
//! llama.cpp; a K-quant matrix mixed with other types takes the per-32 format of its kind.

use half::f16;

use crate::threads::ComputePool;

pub const QK: usize = 32;

/// Rows of a tile of tokens: the unit [`QuantActs`] pads its buffers to.
pub const TILE_ROWS: usize = 16;

/// f16 round trip: llama.cpp stores block scales as f16, so every scale we use must be too.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

#[inline]
pub fn f16_bits_to_f32(lo: u8, hi: u8) -> f32 {
    f16::from_bits(u16::from_le_bytes([lo, hi])).to_f32()
}

pub use crate::dequant::{dequant_q4_0, dequant_q4_1, dequant_q8_0};

/// Rows of activations quantized to 8 bits per block of 32, kept in the shape the kernels read:
/// signed values, the integer sums of each half block (elements 0..16 and 16..32: weights fed
/// as value + offset to an unsigned x signed instruction are corrected by offset x these), the
/// block scale `d` and, for Q8_1, `s = d * sum(q)`.
///
/// The buffers hold `rows` rounded up to whole [`TILE_ROWS`]: a tile load reads sixteen rows,
/// so a last, partial tile of tokens can go through the tiles with the rest rather than through
/// a kernel that streams the weights once more for a few tokens. Rows past `rows` are padding
/// (zeros, or what an earlier call left): read, multiplied, never stored.
#[derive(Default)]
pub struct QuantActs {
    pub rows: usize,
    pub blocks_per_row: usize,
    pub qs: Vec<i8>,
    /// `[block][half]`.
    pub xsum16: Vec<i32>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
}

/// The activation formats: Q8_1 keeps the block sum needed by Q4_1's offset term; Q8_K is
/// llama.cpp's format against K-quant weights (one f32 scale per 256, block sums kept).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ActFormat {
    Q8_1,
    Q8_0,
    Q8K,
}

/// ggml's `nearest_int`: round half to even through the float adder (|x| < 2^22), which
/// compiles to two instructions where `round_ties_even` may become a libm call.
#[inline(always)]
fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Elements per Q8_K block.
pub const QK_K: usize = 256;

/// The outputs of a run of whole blocks, as a quantizer writes them: one task's share of a
/// [`QuantActs`] when the rows are split across threads.
struct BlocksMut<'a> {
    qs: &'a mut [i8],
    xsum16: &'a mut [i32],
    d: &'a mut [f32],
    s: &'a mut [f32],
}

impl BlocksMut<'_> {
    fn reborrow(&mut self) -> BlocksMut<'_> {
        BlocksMut { qs: self.qs, xsum16: self.xsum16, d: self.d, s: self.s }
    }
}

/// Which quantizer runs, chosen once per call: every block of a call goes through the same one.
#[derive(Clone, Copy)]
enum Quantizer {
    Q8K,
    #[cfg(target_arch = "x86_64")]
    Q8KAvx512,
    #[cfg(target_arch = "x86_64")]
    Q8KAvx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Portable,
}

impl Quantizer {
    fn pick(fmt: ActFormat, k: usize) -> Quantizer {
        let q8k = fmt == ActFormat::Q8K && k.is_multiple_of(QK_K);
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("f16c")
            {
                return if q8k { Quantizer::Q8KAvx512 } else { Quantizer::Avx512 };
            }
            if is_x86_feature_detected!("avx2") {
                return if q8k { Quantizer::Q8KAvx2 } else { Quantizer::Avx2 };
            }
        }
        if q8k {
            Quantizer::Q8K
        } else {
            Quantizer::Portable
        }
    }

    /// Quantizes the blocks of `x` (whole rows) into `out`.
    fn run(self, x: &[f32], out: BlocksMut<'_>, fmt: ActFormat) {
        match self {
            Quantizer::Q8K => quantize_q8k(x, out),
            // SAFETY: `pick` chose these only where the features were detected.
            #[cfg(target_arch = "x86_64")]
            Quantizer::Q8KAvx512 => unsafe { quantize_q8k_avx512(x, out) },
            #[cfg(target_arch = "x86_64")]
            Quantizer::Q8KAvx2 => unsafe { quantize_q8k_avx2(x, out) },
            #[cfg(target_arch = "x86_64")]
            Quantizer::Avx512 => unsafe { quantize_avx512(x, out, fmt) },
            #[cfg(target_arch = "x86_64")]
            Quantizer::Avx2 => unsafe { quantize_avx2(x, out, fmt) },
            Quantizer::Portable => quantize_portable(x, out, fmt),
        }
    }
}

/// Fewest rows worth a parallel section: below this the section's hand-off costs about what
/// the second thread would save.
const PARALLEL_ROWS: usize = 4;

impl QuantActs {
    /// Bytes one token's row occupies across the buffers (its values, half-block sums, scales
    /// and block sums), as the kernels read them.
    pub fn row_bytes(&self) -> usize {
        self.blocks_per_row * (QK + 2 * size_of::<i32>() + 2 * size_of::<f32>())
    }

    /// Quantizes `rows` rows of length `k` (a multiple of 32) from `x`.
    pub fn quantize(&mut self, x: &[f32], rows: usize, k: usize, fmt: ActFormat) {
        self.prepare(x, rows, k);
        let q = Quantizer::pick(fmt, k);
        q.run(&x[..rows * k], self.blocks(), fmt);
    }

    /// As [`QuantActs::quantize`], the rows split across `pool`. Each block depends only on its
    /// own 32 (or 256) values, so the result is the same bits however the rows are split; on
    /// one thread this was the largest part of a batched step that kept the others waiting.
    pub fn quantize_on(&mut self, pool: &ComputePool, x: &[f32], rows: usize, k: usize, fmt: ActFormat) {
        if rows < PARALLEL_ROWS || pool.threads() == 1 {
            return self.quantize(x, rows, k, fmt);
        }
        self.prepare(x, rows, k);
        let q = Quantizer::pick(fmt, k);
        let per_task = rows.div_ceil(pool.threads() * 2);
        let nb = k / QK;
        let mut parts: Vec<(&[f32], BlocksMut<'_>)> = x[..rows * k]
            .chunks(per_task * k)
            .zip(self.qs.chunks_mut(per_task * k))
            .zip(self.xsum16.chunks_mut(2 * per_task * nb))
            .zip(self.d.chunks_mut(per_task * nb).zip(self.s.chunks_mut(per_task * nb)))
            .map(|(((x, qs), xsum16), (d, s))| (x, BlocksMut { qs, xsum16, d, s }))
            .collect();
        pool.for_each_chunk_mut(&mut parts, 1, &|_, part| {
            for (x, out) in part.iter_mut() {
                q.run(x, out.reborrow(), fmt);
            }
        });
    }

    fn blocks(&mut self) -> BlocksMut<'_> {
        BlocksMut { qs: &mut self.qs, xsum16: &mut self.xsum16, d: &mut self.d, s: &mut self.s }
    }

    fn prepare(&mut self, x: &[f32], rows: usize, k: usize) {
        assert!(k.is_multiple_of(QK) && x.len() >= rows * k, "activations must be whole rows of whole blocks");
        let nb = k / QK;
        self.rows = rows;
        self.blocks_per_row = nb;
        let padded = rows.next_multiple_of(TILE_ROWS);
        self.qs.resize(padded * k, 0);
        self.xsum16.resize(2 * padded * nb, 0);
        self.d.resize(padded * nb, 0.0);
        self.s.resize(padded * nb, 0.0);
    }

    /// The definition the SIMD path is tested against.
    #[cfg(test)]
    fn quantize_impl(&mut self, x: &[f32], rows: usize, k: usize, fmt: ActFormat) {
        self.prepare(x, rows, k);
        quantize_portable(&x[..rows * k], self.blocks(), fmt);
    }
}

#[inline(always)]
fn finish_block(out: &mut BlocksMut<'_>, bi: usize, d: f32, sum: i32, fmt: ActFormat) {
    out.d[bi] = round_f16(d);
    out.s[bi] = match fmt {
        ActFormat::Q8_1 | ActFormat::Q8K => round_f16(d * sum as f32),
        ActFormat::Q8_0 => 0.0,
    };
}

/// One block of 32 per iteration in two registers: the per-block reductions (maximum, sum)
/// are what the portable loop spends its time on. Same arithmetic, same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,f16c")]
unsafe fn quantize_avx512(x: &[f32], mut out: BlocksMut<'_>, fmt: ActFormat) {
    use std::arch::x86_64::*;
    let abs = _mm512_set1_epi32(0x7fff_ffff);
    let sign = _mm512_set1_epi32(i32::MIN);
    // Largest float below 0.5: trunc(x + copysign(this, x)) rounds half away from zero
    // exactly, as `f32::round` does.
    let below_half = _mm512_set1_epi32(0.49999997f32.to_bits() as i32);
    assert!(out.qs.len() >= x.len() && out.xsum16.len() >= x.len() / 16 && out.d.len() >= x.len() / QK);
    for bi in 0..x.len() / QK {
        let p = x.as_ptr().add(bi * QK);
        let (a, b) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
        let absf = |v: __m512| _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), abs));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(absf(a), absf(b)));
        let d = amax / 127.0;
        let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let q = |v: __m512| {
            let y = _mm512_mul_ps(v, id);
            let h = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(y), sign), below_half);
            let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(_mm512_add_ps(
                y,
                _mm512_castsi512_ps(h),
            ));
            _mm512_cvttps_epi32(r)
        };
        let (ra, rb) = (q(a), q(b));
        let (lo, hi) = (_mm512_reduce_add_epi32(ra), _mm512_reduce_add_epi32(rb));
        // In bounds: asserted above.
        let qs = out.qs.as_mut_ptr().add(bi * QK) as *mut __m128i;
        _mm_storeu_si128(qs, _mm512_cvtepi32_epi8(ra));
        _mm_storeu_si128(qs.add(1), _mm512_cvtepi32_epi8(rb));
        *out.xsum16.get_unchecked_mut(2 * bi) = lo;
        *out.xsum16.get_unchecked_mut(2 * bi + 1) = hi;
        finish_block(&mut out, bi, d, lo + hi, fmt);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_avx2(x: &[f32], out: BlocksMut<'_>, fmt: ActFormat) {
    quantize_portable(x, out, fmt)
}

/// ggml's `quantize_row_q8_K_ref`: per 256, the element of largest magnitude maps to -127
/// (the scale keeps its sign and stays f32), values round half to even. Stored as eight
/// blocks of 32 sharing that scale, each with its own sum, which is the shape the kernels
/// read; the products they form are the ones llama.cpp's K-quant dot products form.
///
/// Written so that it vectorizes (the reference's search for the largest element, one compare
/// and branch per value, was a twelfth of a K-quant model's prefill): the largest magnitude
/// lane-wise, then its first element for the sign, which is the element the reference keeps.
#[inline(always)]
fn quantize_q8k(x: &[f32], out: BlocksMut<'_>) {
    for (sb, src) in x.chunks_exact(QK_K).enumerate() {
        let amax = largest_magnitude(src);
        let max = src.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
        let iscale = if amax != 0.0 { -127.0 / max } else { 0.0 };
        let d = if amax != 0.0 { 1.0 / iscale } else { 0.0 };
        for (j, blk) in src.chunks_exact(QK).enumerate() {
            let bi = sb * (QK_K / QK) + j;
            let q = &mut out.qs[bi * QK..(bi + 1) * QK];
            let mut sums = [0i32; 2];
            for ((qh, xh), sum) in q.chunks_exact_mut(16).zip(blk.chunks_exact(16)).zip(&mut sums) {
                for (qi, &v) in qh.iter_mut().zip(xh) {
                    let r = nearest_int(iscale * v).min(127);
                    *qi = r as i8;
                    *sum += r;
                }
            }
            out.xsum16[2 * bi..2 * bi + 2].copy_from_slice(&sums);
            out.d[bi] = d;
            out.s[bi] = d * (sums[0] + sums[1]) as f32;
        }
    }
}

/// [`quantize_q8k`] compiled for AVX-512 (same arithmetic, same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_q8k_avx512(x: &[f32], out: BlocksMut<'_>) {
    quantize_q8k(x, out)
}

/// [`quantize_q8k`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_q8k_avx2(x: &[f32], out: BlocksMut<'_>) {
    quantize_q8k(x, out)
}

/// ggml's `quantize_row_q8_K_ref` as ggml writes it: the definition [`quantize_q8k`] is
/// tested against.
#[cfg(test)]
fn quantize_q8k_reference(x: &[f32], out: BlocksMut<'_>) {
    for (sb, src) in x.chunks_exact(QK_K).enumerate() {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in src {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let iscale = if amax != 0.0 { -127.0 / max } else { 0.0 };
        let d = if amax != 0.0 { 1.0 / iscale } else { 0.0 };
        for (j, blk) in src.chunks_exact(QK).enumerate() {
            let bi = sb * (QK_K / QK) + j;
            let mut sums = [0i32; 2];
            for (e, &v) in blk.iter().enumerate() {
                let r = nearest_int(iscale * v).min(127);
                out.qs[bi * QK + e] = r as i8;
                sums[e / 16] += r;
            }
            let sum = sums[0] + sums[1];
            out.xsum16[2 * bi..2 * bi + 2].copy_from_slice(&sums);
            out.d[bi] = d;
            out.s[bi] = d * sum as f32;
        }
    }
}

/// The largest `|v|` of `src` (a multiple of 16 long), 0 for none; a NaN is never larger, as
/// in ggml's reference quantizers. Lane-wise: exact, so the order does not matter; a
/// compare-and-select maximum vectorizes where `f32::max` (NaN-aware) does not.
#[inline(always)]
fn largest_magnitude(src: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    for part in src.chunks_exact(16) {
        for (m, v) in lanes.iter_mut().zip(part) {
            let a = v.abs();
            *m = if a > *m { a } else { *m };
        }
    }
    lanes.iter().fold(0f32, |a, &v| if v > a { v } else { a })
}

/// ggml's reference Q8_0 / Q8_1 quantizer, written so that it vectorizes.
#[inline(always)]
fn quantize_portable(x: &[f32], mut out: BlocksMut<'_>, fmt: ActFormat) {
    for (bi, src) in x.chunks_exact(QK).enumerate() {
        let amax = largest_magnitude(src);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = &mut out.qs[bi * QK..(bi + 1) * QK];
        let mut sums = [0i32; 2];
        for (e, (qi, &v)) in q.iter_mut().zip(src).enumerate() {
            // Round half away from zero, as roundf does in ggml's reference quantizer;
            // |v * id| <= 127 so the conversion cannot saturate.
            let r = (v * id).round() as i32;
            *qi = r as i8;
            sums[e / 16] += r;
        }
        out.xsum16[2 * bi..2 * bi + 2].copy_from_slice(&sums);
        finish_block(&mut out, bi, d, sums[0] + sums[1], fmt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_quantizer_matches_the_portable_definition_bit_for_bit() {
        // Random values plus exact half steps (x * id = k + 0.5), where rounding direction matters.
        let mut x: Vec<f32> = (0..4096).map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 97.0).collect();
        for (j, v) in x[..64].iter_mut().enumerate() {
            *v = (j as f32 - 32.0) + 0.5;
        }
        x[64..96].iter_mut().enumerate().for_each(|(j, v)| *v = if j == 0 { 127.0 } else { (j as f32) - 15.5 });
        x[96..128].iter_mut().for_each(|v| *v = 0.0);
        for fmt in [ActFormat::Q8_1, ActFormat::Q8_0] {
            let (mut want, mut got) = (QuantActs::default(), QuantActs::default());
            want.quantize_impl(&x, 8, 512, fmt);
            got.quantize(&x, 8, 512, fmt);
            assert_eq!(want.qs, got.qs);
            assert_eq!(want.xsum16, got.xsum16);
            assert_eq!(want.d, got.d);
            assert_eq!(want.s, got.s);
        }
    }

    #[test]
    fn q8k_matches_ggmls_reference_bit_for_bit() {
        let mut x: Vec<f32> = (0..16 * QK_K).map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 97.0).collect();
        // Superblocks whose largest magnitude appears with both signs (the first decides the
        // scale's sign), whose values hit half steps, that are all zero, hold a NaN (never the
        // largest), an infinity, a negative zero, or a largest value last.
        let sb = |i: usize| i * QK_K..(i + 1) * QK_K;
        x[sb(0)].iter_mut().for_each(|v| *v *= 0.01);
        x[5] = -3.0;
        x[200] = 3.0;
        x[sb(1)].iter_mut().for_each(|v| *v *= 0.01);
        x[QK_K + 7] = 3.0;
        x[QK_K + 9] = -3.0;
        x[sb(2)].iter_mut().enumerate().for_each(|(j, v)| *v = (j as f32 - 128.0) + 0.5);
        x[sb(3)].iter_mut().for_each(|v| *v = 0.0);
        x[4 * QK_K + 17] = f32::NAN;
        x[5 * QK_K + 3] = f32::INFINITY;
        x[sb(6)].iter_mut().for_each(|v| *v = -0.0);
        x[7 * QK_K + 255] = 1000.0;
        x[8 * QK_K] = f32::NAN;
        x[8 * QK_K + 1] = -f32::INFINITY;
        for rows in [1, 4, 16] {
            let k = 16 * QK_K / rows;
            let (mut want, mut got) = (QuantActs::default(), QuantActs::default());
            want.prepare(&x, rows, k);
            quantize_q8k_reference(&x, want.blocks());
            got.quantize(&x, rows, k, ActFormat::Q8K);
            assert_eq!(want.qs, got.qs, "{rows}x{k}");
            assert_eq!(want.xsum16, got.xsum16, "{rows}x{k}");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&want.d), bits(&got.d), "{rows}x{k}");
            assert_eq!(bits(&want.s), bits(&got.s), "{rows}x{k}");
        }
    }

    #[test]
    fn rows_split_across_threads_give_the_bits_of_one_thread() {
        let pool = ComputePool::new(2).unwrap();
        for (rows, k) in [(1, 512), (3, 512), (4, 512), (7, 256), (16, 576), (33, 1536)] {
            let x: Vec<f32> = (0..rows * k).map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 97.0).collect();
            for fmt in [ActFormat::Q8_1, ActFormat::Q8_0, ActFormat::Q8K] {
                let (mut one, mut split) = (QuantActs::default(), QuantActs::default());
                one.quantize(&x, rows, k, fmt);
                // A stale, larger result first: the split run must overwrite every block.
                split.quantize(&vec![3.0; 40 * 1536], 40, 1536, fmt);
                split.quantize_on(&pool, &x, rows, k, fmt);
                assert_eq!((split.rows, split.blocks_per_row), (rows, k / QK), "{rows}x{k} {fmt:?}");
                // The rows' blocks; past them is padding, which may keep the stale result.
                let nb = rows * k / QK;
                assert_eq!(one.qs[..rows * k], split.qs[..rows * k], "{rows}x{k} {fmt:?}");
                assert_eq!(one.xsum16[..2 * nb], split.xsum16[..2 * nb], "{rows}x{k} {fmt:?}");
                assert_eq!(one.d[..nb], split.d[..nb], "{rows}x{k} {fmt:?}");
                assert_eq!(one.s[..nb], split.s[..nb], "{rows}x{k} {fmt:?}");
                // And the buffers hold whole tiles of rows, for the tile loads.
                let padded = rows.next_multiple_of(TILE_ROWS);
                assert!(split.qs.len() >= padded * k && split.d.len() >= padded * k / QK, "{rows}x{k} {fmt:?}");
            }
        }
    }

    #[test]
    fn q8_quantization_round_trips_within_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.1).collect();
        let mut a = QuantActs::default();
        a.quantize(&x, 2, 32, ActFormat::Q8_1);
        for (i, &v) in x.iter().enumerate() {
            let d = a.d[i / 32];
            let back = a.qs[i] as f32 * d;
            assert!((back - v).abs() <= d * 0.5 + 1e-3, "{i}: {v} vs {back}");
        }
        for (h, &s) in a.xsum16.iter().enumerate() {
            assert_eq!(s, a.qs[h * 16..(h + 1) * 16].iter().map(|&q| q as i32).sum::<i32>());
        }
        let sum0: i32 = a.qs[..32].iter().map(|&q| q as i32).sum();
        assert!((a.s[0] - a.d[0] * sum0 as f32).abs() < 1e-2);
    }

    #[test]
    fn q8k_maps_the_largest_magnitude_to_minus_127_and_shares_one_scale_per_256() {
        let mut x: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01).collect();
        x[3] = 2.0;
        let mut a = QuantActs::default();
        a.quantize(&x, 1, 512, ActFormat::Q8K);
        assert_eq!(a.qs[3], -127);
        assert!(a.d[..8].iter().all(|&d| d == a.d[0]) && a.d[0] < 0.0);
        for (i, &v) in x.iter().enumerate() {
            let d = a.d[i / 32];
            assert!((a.qs[i] as f32 * d - v).abs() <= d.abs() * 0.5 + 1e-6, "{i}");
        }
        let sum0: i32 = a.qs[..32].iter().map(|&q| q as i32).sum();
        assert_eq!(a.s[0], a.d[0] * sum0 as f32);
    }
}
