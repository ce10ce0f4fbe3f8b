//! Matrices that share an input (Q, K and V; gate and up), stacked by rows, each part in its
//! own kernel format: a Q4_K_M file's Q4_K queries and keys beside its Q6_K values stay as the
//! file has them instead of being requantized to one format, so they read the file's bytes and
//! compute llama.cpp's products.

use crate::kernels::Isa;
use crate::matmul::matmul_into;
use crate::qmatrix::QMatrix;
use crate::quant::QuantActs;
use crate::threads::ComputePool;

pub struct QStack {
    /// Consecutive row ranges of the stack, in order; parts that share a format are one part.
    pub parts: Vec<QMatrix>,
}

impl QStack {
    pub fn rows(&self) -> usize {
        self.parts.iter().map(|p| p.rows).sum()
    }

    pub fn cols(&self) -> usize {
        self.parts.first().map_or(0, |p| p.cols)
    }

    /// Bytes the parts occupy (for reports).
    pub fn bytes(&self) -> usize {
        self.parts.iter().map(QMatrix::bytes).sum()
    }

    /// `out[i * rows + r]` = row `r` of the stack times row `i` of `x` (`t` rows of `cols`):
    /// each part's product in its columns, against `x` quantized as that part's format needs
    /// (once for consecutive parts that need the same).
    pub fn matmul(&self, pool: &ComputePool, isa: Isa, x: &[f32], t: usize, acts: &mut QuantActs, out: &mut [f32]) {
        let rows = self.rows();
        let mut col0 = 0;
        for (i, part) in self.parts.iter().enumerate() {
            if i == 0 || self.parts[i - 1].act != part.act {
                acts.quantize_on(pool, x, t, part.cols, part.act);
            }
            matmul_into(pool, isa, part, acts, out, rows, col0);
            col0 += part.rows;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::matmul::matmul;
    use crate::qmatrix::{quantize_for, QKind};
    use crate::synth::random_blocks;
    use gguf::GgmlType;

    #[test]
    fn a_stack_of_formats_gives_each_parts_own_product_in_its_columns_bit_for_bit() {
        // As a Q4_K_M layer's Q and K (Q4_K) beside its V (Q6_K), with a ragged last part.
        let cols = 512;
        let shape = [(GgmlType::Q4_K, 40), (GgmlType::Q6_K, 16), (GgmlType::Q4_1, 5)];
        let raw: Vec<Vec<u8>> = shape
            .iter()
            .enumerate()
            .map(|(i, &(ty, rows))| random_blocks(ty, rows * cols / ty.block().0, i as u64))
            .collect();
        let parts: Vec<QMatrix> = shape
            .iter()
            .zip(&raw)
            .map(|(&(ty, rows), data)| QMatrix::from_ggml(ty, rows, cols, data).unwrap())
            .collect();
        assert_eq!(parts.iter().map(|p| p.kind).collect::<Vec<_>>(), [QKind::Q4K, QKind::Q6K, QKind::Q4_1]);
        let stack = QStack { parts };
        let pool = ComputePool::new(2).unwrap();
        for t in [1, 3, 17] {
            let x: Vec<f32> = (0..t * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 300.0).collect();
            let (rows, mut acts) = (stack.rows(), QuantActs::default());
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; t * rows];
                stack.matmul(&pool, isa, &x, t, &mut acts, &mut got);
                let mut col0 = 0;
                for part in &stack.parts {
                    let mut own = vec![0.0; t * part.rows];
                    let mut a = QuantActs::default();
                    quantize_for(part, &x, t, &mut a);
                    matmul(&pool, isa, part, &a, &mut own);
                    for i in 0..t {
                        let want = &own[i * part.rows..(i + 1) * part.rows];
                        let have = &got[i * rows + col0..][..part.rows];
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(have), bits(want), "{isa:?} t={t} token {i} part {:?}", part.kind);
                    }
                    col0 += part.rows;
                }
            }
        }
    }
}
