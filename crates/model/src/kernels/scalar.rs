//! The portable kernel and the definition the SIMD kernels are tested against.
//!
//! Per block and row: integer sums of weight x activation values, then
//! `acc = fma(isum, d_w * d_x, acc)`; the min kinds (Q4_1, Q4K, Q5_1, Q5K) also
//! `macc = fma(m_w, s_x, macc)`; Q6K instead sums each half block apart and applies
//! `acc = fma(isum_lo, s_lo * d_x, acc)`, then `acc = fma(isum_hi, s_hi * d_x, acc)`.
//! The result is `acc + macc` (macc is 0 for Q8_0 and Q6K). A Q6K half block's scale is
//! `d * sc` in f32, which the wide layout stores formed and the packed one forms as it goes.

use crate::qmatrix::{QKind, QMatrix, GROUP};
use crate::quant::{QuantActs, QK};

fn dot(w: &[i32], x: &[i8]) -> i32 {
    w.iter().zip(x).map(|(&wv, &xv)| wv * xv as i32).sum()
}

/// # Safety
/// As for [`super::group_dot`].
pub unsafe fn group_dot(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    let nb = w.blocks();
    let with_min = w.kind.with_min();
    let mut acc = [[0f32; GROUP]; super::TOKENS_PER_TILE];
    let mut macc = [[0f32; GROUP]; super::TOKENS_PER_TILE];
    let mut row = [0i32; QK];
    for b in 0..nb {
        let gb = g * nb + b;
        for r in 0..GROUP {
            // Unpack the row's block once, then reuse it for every token of the tile.
            for (k, v) in row.iter_mut().enumerate() {
                *v = w.value(gb, r, k);
            }
            for tt in 0..nt {
                let ti = (t0 + tt) * nb + b;
                let x = &a.qs[ti * QK..(ti + 1) * QK];
                let acc = &mut acc[tt][r];
                if matches!(w.kind, QKind::Q6K | QKind::Q6KWide) {
                    let (lo, hi) = w.half_scales(g, b, r);
                    *acc = (dot(&row[..16], &x[..16]) as f32).mul_add(lo * a.d[ti], *acc);
                    *acc = (dot(&row[16..], &x[16..]) as f32).mul_add(hi * a.d[ti], *acc);
                } else {
                    let (dw, m) = w.scale_min(g, b, r);
                    *acc = (dot(&row, x) as f32).mul_add(dw * a.d[ti], *acc);
                    if with_min {
                        macc[tt][r] = m.mul_add(a.s[ti], macc[tt][r]);
                    }
                }
            }
        }
    }
    for tt in 0..nt {
        for r in 0..GROUP {
            out.add(tt * stride + r).write(acc[tt][r] + macc[tt][r]);
        }
    }
}
