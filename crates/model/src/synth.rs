//! Random but valid ggml blocks of every quantized type, for tests: scales are f16 values of
//! either sign in a sane range (so no product overflows or loses exactness), every other byte
//! is random (every bit pattern of the packed values and 6-bit scales is valid).

use gguf::GgmlType;
use half::f16;

/// A deterministic generator (64-bit LCG, high bits out).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    /// An f16 scale of magnitude in [1e-4, 2e-2] with random sign, as little-endian bytes.
    fn scale(&mut self) -> [u8; 2] {
        let v = (self.next_u32() % 1000) as f32 / 50_000.0 + 1e-4;
        let v = if self.next_u32().is_multiple_of(4) { -v } else { v };
        f16::from_f32(v).to_bits().to_le_bytes()
    }
}

/// `n_blocks` random blocks of `ty` (a quantized type), deterministic from `seed`.
pub fn random_blocks(ty: GgmlType, n_blocks: usize, seed: u64) -> Vec<u8> {
    let mut rng = Lcg(seed);
    let bb = ty.block().1;
    let mut out = Vec::with_capacity(n_blocks * bb);
    for _ in 0..n_blocks {
        let start = out.len();
        out.extend((0..bb).map(|_| rng.next_u32() as u8));
        let blk = &mut out[start..];
        // Where each type keeps its f16 fields.
        let f16_at: &[usize] = match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => &[],
        };
        for &i in f16_at {
            blk[i..i + 2].copy_from_slice(&rng.scale());
        }
    }
    out
}

/// The quantized types, each with its block encoding.
pub const QUANTIZED: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];
