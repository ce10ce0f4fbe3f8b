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
    for tt in 0..nt {
        let t = t0 + tt;
        for r in 0..GROUP {
            let (mut acc, mut macc) = (0f32, 0f32);
            for b in 0..nb {
                let gb = g * nb + b;
                let tile = &w.qs[gb * tb..(gb + 1) * tb];
                let x = &a.qs[(t * nb + b) * QK..(t * nb + b + 1) * QK];
                let isum: i32 = (0..QK).map(|k| weight(w, tile, r, k) * x[k] as i32).sum();
                let dw = half::f16::from_bits(w.d[gb * GROUP + r]).to_f32();
                acc = (isum as f32).mul_add(dw * a.d[t * nb + b], acc);
                if w.kind == QKind::Q4_1 {
                    let m = half::f16::from_bits(w.m[gb * GROUP + r]).to_f32();
                    macc = m.mul_add(a.s[t * nb + b], macc);
                }
            }
            out.add(tt * stride + r).write(acc + macc);
        }
    }
}
