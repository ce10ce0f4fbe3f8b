//! `out = x · Wᵀ` for a batch of tokens, parallel over groups of weight rows.

use crate::kernels::{self, Isa, TOKENS_PER_TILE};
use crate::qmatrix::{QMatrix, GROUP};
use crate::quant::QuantActs;
use crate::threads::ComputePool;

/// `out[t * w.rows + r]` for every token `t` of `a` and row `r` of `w`.
pub fn matmul(pool: &ComputePool, isa: Isa, w: &QMatrix, a: &QuantActs, out: &mut [f32]) {
    let t = a.rows;
    let rows = w.rows;
    assert_eq!(a.blocks_per_row, w.blocks(), "activation width does not match the matrix");
    assert!(out.len() >= t * rows);
    // Enough tasks to balance the threads, few enough that each amortizes its dispatch.
    let groups = w.groups();
    let per_task = groups.div_ceil(pool.threads() * 4).max(1);
    let base = OutPtr(out.as_mut_ptr());
    pool.run(groups.div_ceil(per_task), &|task| {
        let base = &base;
        for g in task * per_task..((task + 1) * per_task).min(groups) {
            let valid = GROUP.min(rows - g * GROUP);
            for t0 in (0..t).step_by(TOKENS_PER_TILE) {
                let nt = TOKENS_PER_TILE.min(t - t0);
                if valid == GROUP {
                    // SAFETY: rows t0..t0+nt, columns g*16..g*16+16 lie inside `out` (asserted
                    // above) and belong to group g, which only this task computes.
                    unsafe { kernels::group_dot(isa, w, g, a, t0, nt, base.0.add(t0 * rows + g * GROUP), rows) };
                } else {
                    // A partial last group goes through a buffer so its padding rows are never
                    // stored into another task's columns.
                    let mut buf = [0f32; GROUP * TOKENS_PER_TILE];
                    // SAFETY: `buf` holds nt rows of 16.
                    unsafe { kernels::group_dot(isa, w, g, a, t0, nt, buf.as_mut_ptr(), GROUP) };
                    for tt in 0..nt {
                        for r in 0..valid {
                            // SAFETY: inside `out`, in this task's columns, as above.
                            unsafe { base.0.add((t0 + tt) * rows + g * GROUP + r).write(buf[tt * GROUP + r]) };
                        }
                    }
                }
            }
        }
    });
}

struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint column blocks of the output through it (see `matmul`).
unsafe impl Sync for OutPtr {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qmatrix::QKind;

    /// A ggml-encoded random matrix, deterministic from `seed`.
    pub(crate) fn random_ggml(kind: QKind, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut next = move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as u32
        };
        let nb = cols / 32;
        let mut out = Vec::new();
        for _ in 0..rows * nb {
            let d = half::f16::from_f32((next() % 1000) as f32 / 50_000.0 + 1e-4);
            out.extend_from_slice(&d.to_bits().to_le_bytes());
            match kind {
                QKind::Q4_1 => {
                    let m = half::f16::from_f32(-((next() % 1000) as f32) / 10_000.0);
                    out.extend_from_slice(&m.to_bits().to_le_bytes());
                    out.extend((0..16).map(|_| next() as u8));
                }
                QKind::Q8_0 => out.extend((0..32).map(|_| next() as u8)),
            }
        }
        out
    }

    fn check_isa(isa: Isa, kind: QKind) {
        for &(rows, cols, t) in &[(16, 32, 1), (40, 96, 3), (192, 576, 7), (33, 64, 4), (17, 1536, 9)] {
            let w = QMatrix::from_ggml(kind, rows, cols, &random_ggml(kind, rows, cols, rows as u64)).unwrap();
            let x: Vec<f32> = (0..t * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 300.0).collect();
            let mut a = QuantActs::default();
            crate::qmatrix::quantize_for(&w, &x, t, &mut a);
            let (mut want, mut got) = (vec![0.0; t * rows], vec![0.0; t * rows]);
            let pool = ComputePool::new(2).unwrap();
            matmul(&pool, Isa::Scalar, &w, &a, &mut want);
            matmul(&pool, isa, &w, &a, &mut got);
            assert_eq!(want, got, "{isa:?} {kind:?} {rows}x{cols} t={t}");
            // And the scalar kernel itself agrees with a dequantized float dot product.
            let mut row = vec![0.0; cols];
            for r in 0..rows {
                w.row_f32(r, &mut row);
                for ti in 0..t {
                    let exact: f32 = row.iter().zip(&x[ti * cols..]).map(|(a, b)| a * b).sum();
                    let tol = 0.02 * row.iter().map(|v| v.abs()).sum::<f32>() + 1e-3;
                    assert!((exact - want[ti * rows + r]).abs() < tol, "{exact} vs {}", want[ti * rows + r]);
                }
            }
        }
    }

    #[test]
    fn every_available_kernel_matches_scalar_bit_for_bit_q4_1() {
        for isa in Isa::available() {
            check_isa(isa, QKind::Q4_1);
        }
    }

    #[test]
    fn every_available_kernel_matches_scalar_bit_for_bit_q8_0() {
        for isa in Isa::available() {
            check_isa(isa, QKind::Q8_0);
        }
    }

    #[test]
    fn repacked_rows_dequantize_to_ggml_values() {
        for kind in [QKind::Q4_1, QKind::Q8_0] {
            let (rows, cols) = (20, 64);
            let raw = random_ggml(kind, rows, cols, 3);
            let w = QMatrix::from_ggml(kind, rows, cols, &raw).unwrap();
            let bb = if kind == QKind::Q4_1 { 20 } else { 34 };
            let mut want = vec![0.0; 32];
            let mut got = vec![0.0; cols];
            for r in 0..rows {
                w.row_f32(r, &mut got);
                for b in 0..2 {
                    let blk = &raw[(r * 2 + b) * bb..][..bb];
                    match kind {
                        QKind::Q4_1 => crate::quant::dequant_q4_1(blk, &mut want),
                        QKind::Q8_0 => crate::quant::dequant_q8_0(blk, &mut want),
                    }
                    assert_eq!(&got[b * 32..(b + 1) * 32], &want[..]);
                }
            }
        }
    }
}
