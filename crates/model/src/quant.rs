//! Block quantization formats as ggml defines them, and the activation quantizers.
//!
//! Activations are quantized exactly as llama.cpp does before its integer dot products
//! (Q8_1 against Q4_1 weights, Q8_0 against Q8_0 weights), because numerical agreement with
//! llama.cpp is part of the contract and the integer path is also the fast one.

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

/// Dequantizes one Q4_1 block (20 bytes: d f16, m f16, 16 bytes of nibbles; byte j holds
/// element j in its low nibble and element j+16 in its high nibble).
pub fn dequant_q4_1(block: &[u8], out: &mut [f32]) {
    let d = f16_bits_to_f32(block[0], block[1]);
    let m = f16_bits_to_f32(block[2], block[3]);
    for j in 0..16 {
        let b = block[4 + j];
        out[j] = (b & 0x0F) as f32 * d + m;
        out[j + 16] = (b >> 4) as f32 * d + m;
    }
}

/// Dequantizes one Q8_0 block (34 bytes: d f16, 32 signed bytes).
pub fn dequant_q8_0(block: &[u8], out: &mut [f32]) {
    let d = f16_bits_to_f32(block[0], block[1]);
    for j in 0..QK {
        out[j] = block[2 + j] as i8 as f32 * d;
    }
}

/// Dequantizes one Q4_0 block (18 bytes: d f16, 16 bytes of nibbles, offset 8).
pub fn dequant_q4_0(block: &[u8], out: &mut [f32]) {
    let d = f16_bits_to_f32(block[0], block[1]);
    for j in 0..16 {
        let b = block[2 + j];
        out[j] = ((b & 0x0F) as i32 - 8) as f32 * d;
        out[j + 16] = ((b >> 4) as i32 - 8) as f32 * d;
    }
}

/// Rows of activations quantized to 8 bits per block of 32, kept in the shape the kernels read:
/// signed values, their offset-binary copy (value + 128, for unsigned x signed instructions),
/// the block scale `d` and, for Q8_1, `s = d * sum(q)`.
#[derive(Default)]
pub struct QuantActs {
    pub rows: usize,
    pub blocks_per_row: usize,
    pub qs: Vec<i8>,
    pub qs_offset: Vec<u8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
}

/// The two activation formats: Q8_1 keeps the block sum needed by Q4_1's offset term.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ActFormat {
    Q8_1,
    Q8_0,
}

impl QuantActs {
    /// Quantizes `rows` rows of length `k` (a multiple of 32) from `x`.
    pub fn quantize(&mut self, x: &[f32], rows: usize, k: usize, fmt: ActFormat) {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx2") {
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

    // The same code compiled for wider vectors: rounding and the block maximum vectorize.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn quantize_avx512(&mut self, x: &[f32], rows: usize, k: usize, fmt: ActFormat) {
        self.quantize_impl(x, rows, k, fmt)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quantize_avx2(&mut self, x: &[f32], rows: usize, k: usize, fmt: ActFormat) {
        self.quantize_impl(x, rows, k, fmt)
    }

    #[inline(always)]
    fn quantize_impl(&mut self, x: &[f32], rows: usize, k: usize, fmt: ActFormat) {
        debug_assert_eq!(k % QK, 0);
        debug_assert!(x.len() >= rows * k);
        let nb = k / QK;
        self.rows = rows;
        self.blocks_per_row = nb;
        self.qs.resize(rows * k, 0);
        self.qs_offset.resize(rows * k, 0);
        self.d.resize(rows * nb, 0.0);
        self.s.resize(rows * nb, 0.0);
        for (bi, src) in x[..rows * k].chunks_exact(QK).enumerate() {
            // Lane-wise maximum: `max` is exact, so the order does not matter, and the explicit
            // lanes let it vectorize (a plain fold cannot, because of NaN semantics).
            let mut lanes = [0f32; 16];
            for half in src.chunks_exact(16) {
                for (m, v) in lanes.iter_mut().zip(half) {
                    *m = m.max(v.abs());
                }
            }
            let amax = lanes.iter().fold(0f32, |a, &v| a.max(v));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let q = &mut self.qs[bi * QK..(bi + 1) * QK];
            let off = &mut self.qs_offset[bi * QK..(bi + 1) * QK];
            let mut sum = 0i32;
            for ((qi, oi), &v) in q.iter_mut().zip(off.iter_mut()).zip(src) {
                // Round half away from zero, as roundf does in ggml's reference quantizer;
                // |v * id| <= 127 so the conversion cannot saturate.
                let r = (v * id).round() as i32;
                *qi = r as i8;
                *oi = (r + 128) as u8;
                sum += r;
            }
            self.d[bi] = round_f16(d);
            self.s[bi] = match fmt {
                ActFormat::Q8_1 => round_f16(d * sum as f32),
                ActFormat::Q8_0 => 0.0,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_quantization_round_trips_within_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.1).collect();
        let mut a = QuantActs::default();
        a.quantize(&x, 2, 32, ActFormat::Q8_1);
        for (i, &v) in x.iter().enumerate() {
            let d = a.d[i / 32];
            let back = a.qs[i] as f32 * d;
            assert!((back - v).abs() <= d * 0.5 + 1e-3, "{i}: {v} vs {back}");
            assert_eq!(a.qs_offset[i] as i32 - 128, a.qs[i] as i32);
        }
        let sum0: i32 = a.qs[..32].iter().map(|&q| q as i32).sum();
        assert!((a.s[0] - a.d[0] * sum0 as f32).abs() < 1e-2);
    }
}
