//! The activation quantizers (ggml's block dequantizers live in [`crate::dequant`]; the
//! 32-element ones are re-exported here).
//!
//! Activations are quantized exactly as llama.cpp does before its integer dot products
//! (Q8_1 against weights with a minimum: Q4_1, Q5_1; Q8_0 against Q8_0, Q4_0, Q5_0), because
//! numerical agreement with llama.cpp is part of the contract and the integer path is also the
//! fast one. K-quant weights take the same per-32 activations (Q8_1 for Q4_K and Q5_K, Q8_0
//! for Q6_K) where llama.cpp uses per-256 Q8_K.

use half::f16;

pub const QK: usize = 32;

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

impl QuantActs {
    /// Quantizes `rows` rows of length `k` (a multiple of 32) from `x`.
    pub fn quantize(&mut self, x: &[f32], rows: usize, k: usize, fmt: ActFormat) {
        if fmt == ActFormat::Q8K && k.is_multiple_of(QK_K) {
            return self.quantize_q8k(x, rows, k);
        }
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("f16c")
            {
                // SAFETY: features detected just above.
                return unsafe { self.quantize_avx512(x, rows, k, fmt) };
            }
            if is_x86_feature_detected!("avx2") {
                // SAFETY: as above.
                return unsafe { self.quantize_avx2(x, rows, k, fmt) };
            }
        }
        self.quantize_impl(x, rows, k, fmt)
    }

    /// One block of 32 per iteration in two registers: the per-block reductions (maximum, sum)
    /// are what the portable loop spends its time on. Same arithmetic, same bits.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    unsafe fn quantize_avx512(&mut self, x: &[f32], rows: usize, k: usize, fmt: ActFormat) {
        use std::arch::x86_64::*;
        self.prepare(x, rows, k);
        let abs = _mm512_set1_epi32(0x7fff_ffff);
        let sign = _mm512_set1_epi32(i32::MIN);
        // Largest float below 0.5: trunc(x + copysign(this, x)) rounds half away from zero
        // exactly, as `f32::round` does.
        let below_half = _mm512_set1_epi32(0.49999997f32.to_bits() as i32);
        for bi in 0..rows * k / QK {
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
            let qs = self.qs.as_mut_ptr().add(bi * QK) as *mut __m128i;
            _mm_storeu_si128(qs, _mm512_cvtepi32_epi8(ra));
            _mm_storeu_si128(qs.add(1), _mm512_cvtepi32_epi8(rb));
            *self.xsum16.get_unchecked_mut(2 * bi) = lo;
            *self.xsum16.get_unchecked_mut(2 * bi + 1) = hi;
            self.finish_block(bi, d, lo + hi, fmt);
        }
    }

    fn prepare(&mut self, x: &[f32], rows: usize, k: usize) {
        assert!(k.is_multiple_of(QK) && x.len() >= rows * k, "activations must be whole rows of whole blocks");
        let nb = k / QK;
        self.rows = rows;
        self.blocks_per_row = nb;
        self.qs.resize(rows * k, 0);
        self.xsum16.resize(2 * rows * nb, 0);
        self.d.resize(rows * nb, 0.0);
        self.s.resize(rows * nb, 0.0);
    }

    #[inline(always)]
    fn finish_block(&mut self, bi: usize, d: f32, sum: i32, fmt: ActFormat) {
        self.d[bi] = round_f16(d);
        self.s[bi] = match fmt {
            ActFormat::Q8_1 | ActFormat::Q8K => round_f16(d * sum as f32),
            ActFormat::Q8_0 => 0.0,
        };
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quantize_avx2(&mut self, x: &[f32], rows: usize, k: usize, fmt: ActFormat) {
        self.quantize_impl(x, rows, k, fmt)
    }

    /// ggml's `quantize_row_q8_K_ref`: per 256, the element of largest magnitude maps to -127
    /// (the scale keeps its sign and stays f32), values round half to even. Stored as eight
    /// blocks of 32 sharing that scale, each with its own sum, which is the shape the kernels
    /// read; the products they form are the ones llama.cpp's K-quant dot products form.
    fn quantize_q8k(&mut self, x: &[f32], rows: usize, k: usize) {
        self.prepare(x, rows, k);
        for (sb, src) in x[..rows * k].chunks_exact(QK_K).enumerate() {
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
                    self.qs[bi * QK + e] = r as i8;
                    sums[e / 16] += r;
                }
                let sum = sums[0] + sums[1];
                self.xsum16[2 * bi..2 * bi + 2].copy_from_slice(&sums);
                self.d[bi] = d;
                self.s[bi] = d * sum as f32;
            }
        }
    }

    /// The definition the SIMD path is tested against.
    #[inline(always)]
    fn quantize_impl(&mut self, x: &[f32], rows: usize, k: usize, fmt: ActFormat) {
        self.prepare(x, rows, k);
        for (bi, src) in x[..rows * k].chunks_exact(QK).enumerate() {
            // Lane-wise maximum: exact, so the order does not matter.
            // A compare-and-select maximum vectorizes where `f32::max` (NaN-aware) does not.
            let mut lanes = [0f32; 16];
            for half in src.chunks_exact(16) {
                for (m, v) in lanes.iter_mut().zip(half) {
                    let a = v.abs();
                    *m = if a > *m { a } else { *m };
                }
            }
            let amax = lanes.iter().fold(0f32, |a, &v| if v > a { v } else { a });
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let q = &mut self.qs[bi * QK..(bi + 1) * QK];
            let mut sums = [0i32; 2];
            for (e, (qi, &v)) in q.iter_mut().zip(src).enumerate() {
                // Round half away from zero, as roundf does in ggml's reference quantizer;
                // |v * id| <= 127 so the conversion cannot saturate.
                let r = (v * id).round() as i32;
                *qi = r as i8;
                sums[e / 16] += r;
            }
            self.xsum16[2 * bi..2 * bi + 2].copy_from_slice(&sums);
            self.finish_block(bi, d, sums[0] + sums[1], fmt);
        }
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
