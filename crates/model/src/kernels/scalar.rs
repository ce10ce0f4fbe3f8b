//! The portable kernel and the definition the SIMD kernels are tested against.

use crate::qmatrix::{QKind, QMatrix, GROUP};
use crate::quant::{QuantActs, QK};

fn weight(w: &QMatrix, tile: &[u8], r: usize, k: usize) -> i32 {
    match w.kind {
        QKind::Q4_1 => {
            let (j, e) = (k / 4, k % 4);
            if j < 4 {
                (tile[j * 64 + r * 4 + e] & 0x0F) as i32
            } else {
                (tile[(j - 4) * 64 + r * 4 + e] >> 4) as i32
            }
        }
        QKind::Q8_0 => tile[(k / 4) * 64 + r * 4 + k % 4] as i8 as i32,
    }
}

/// # Safety
/// As for [`super::group_dot`].
pub unsafe fn group_dot(w: &QMatrix, g: usize, a: &QuantActs, t0: usize, nt: usize, out: *mut f32, stride: usize) {
    let nb = w.blocks();
    let tb = w.kind.tile_bytes();
    let mut acc = [[0f32; GROUP]; super::TOKENS_PER_TILE];
    let mut macc = [[0f32; GROUP]; super::TOKENS_PER_TILE];
    let mut row = [0i32; QK];
    for b in 0..nb {
        let gb = g * nb + b;
        let tile = &w.qs[gb * tb..(gb + 1) * tb];
        for r in 0..GROUP {
            // Unpack the row's block once, then reuse it for every token of the tile.
            for (k, v) in row.iter_mut().enumerate() {
                *v = weight(w, tile, r, k);
            }
            let dw = half::f16::from_bits(w.d[gb * GROUP + r]).to_f32();
            let m = if w.kind == QKind::Q4_1 { half::f16::from_bits(w.m[gb * GROUP + r]).to_f32() } else { 0.0 };
            for tt in 0..nt {
                let ti = (t0 + tt) * nb + b;
                let x = &a.qs[ti * QK..(ti + 1) * QK];
                let isum: i32 = row.iter().zip(x).map(|(&wv, &xv)| wv * xv as i32).sum();
                acc[tt][r] = (isum as f32).mul_add(dw * a.d[ti], acc[tt][r]);
                if w.kind == QKind::Q4_1 {
                    macc[tt][r] = m.mul_add(a.s[ti], macc[tt][r]);
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
