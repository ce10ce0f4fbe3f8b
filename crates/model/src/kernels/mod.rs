//! Integer dot-product kernels for one group of 16 weight rows against a few tokens.
//!
//! Each instruction set has its own implementation of the same arithmetic (integer block sums,
//! then `acc = fma(isum, d_w * d_x, acc)` per block in block order, plus the minimum term of the
//! kinds that have one; Q6K per half block, see `scalar.rs`), so every kernel returns
//! bit-identical results to the scalar one; the tests hold them to it.

use std::sync::OnceLock;

use crate::qmatrix::{QKind, QMatrix, GROUP};
use crate::quant::QuantActs;

#[cfg(target_arch = "x86_64")]
pub mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod scalar;

/// The most tokens of any set's kernel call ([`Isa::tokens_per_tile`]).
pub const TOKENS_PER_TILE: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512,
    /// AVX-512 VNNI, with AMX tiles for products of 16 tokens or more (every kind but Q6_K).
    Amx,
}

impl Isa {
    /// The best set this CPU supports, unless `PAGEWARDEN_ISA` (scalar, avx2, avx512, amx) asks
    /// for another (for comparisons and tests).
    pub fn detect() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            let available = Isa::available();
            let best = available.last().copied().unwrap_or(Isa::Scalar);
            let asked = match std::env::var("PAGEWARDEN_ISA").ok().as_deref() {
                Some("scalar") => Some(Isa::Scalar),
                Some("avx2") => Some(Isa::Avx2),
                Some("avx512") => Some(Isa::Avx512),
                Some("amx") => Some(Isa::Amx),
                _ => None,
            };
            asked.filter(|i| available.contains(i)).unwrap_or(best)
        })
    }

    /// Every set this CPU can run, lowest first.
    pub fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
                v.push(Isa::Avx2);
            }
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
            {
                v.push(Isa::Avx512);
                if amx::available() {
                    v.push(Isa::Amx);
                }
            }
        }
        v
    }

    /// Tokens per kernel call: enough to reuse each unpacked weight block several times while
    /// the accumulators stay in registers: 8 with AVX-512's 32 vector registers (a token's sum
    /// and minimum term take two), 4 with AVX2's 16. A prefill unpacks each weight block once
    /// per call, so on compute-bound steps this halves the unpacking.
    pub fn tokens_per_tile(self) -> usize {
        match self {
            Isa::Avx512 | Isa::Amx => 8,
            Isa::Scalar | Isa::Avx2 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512-vnni",
            Isa::Amx => "avx512-amx",
        }
    }
}

/// `*out.add(tt * stride + r)` = dot(row `g*16 + r` of `w`, token `t0 + tt` of `a`) for
/// `tt < nt`, `r < 16`. `a` must be quantized in `w.kind.act_format()` with `w.cols` columns;
/// `nt <= isa.tokens_per_tile()`.
///
/// # Safety
/// `out` must be valid for writes at every `tt * stride + r` above, and no other thread may
/// access those elements during the call. (Writes go through a pointer because parallel tasks
/// fill disjoint columns of one row-major output.)
#[allow(clippy::too_many_arguments)]
pub unsafe fn group_dot(
    isa: Isa,
    w: &QMatrix,
    g: usize,
    a: &QuantActs,
    t0: usize,
    nt: usize,
    out: *mut f32,
    stride: usize,
) {
    assert!(nt <= isa.tokens_per_tile() && t0 + nt <= a.rows && a.blocks_per_row == w.blocks());
    assert!(g < w.groups() && stride >= GROUP);
    match isa {
        Isa::Scalar => scalar::group_dot(w, g, a, t0, nt, out, stride),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Isa::Avx2 / Avx512 are only produced by `available()` after runtime detection
        // of every feature the kernels enable; the asserts above bound every index they read,
        // and the caller vouches for `out`.
        Isa::Avx2 => unsafe {
            match w.kind {
                QKind::Q4_1 => avx2::q4_1(w, g, a, t0, nt, out, stride),
                QKind::Q8_0 => avx2::q8_0(w, g, a, t0, nt, out, stride),
                QKind::Q4_0 => avx2::q4_0(w, g, a, t0, nt, out, stride),
                QKind::Q5_0 => avx2::q5_0(w, g, a, t0, nt, out, stride),
                QKind::Q4K => avx2::q4k(w, g, a, t0, nt, out, stride),
                QKind::Q5_1 => avx2::q5_1(w, g, a, t0, nt, out, stride),
                QKind::Q5K => avx2::q5k(w, g, a, t0, nt, out, stride),
                QKind::Q6K => avx2::q6k(w, g, a, t0, nt, out, stride),
                QKind::Q6KWide => avx2::q6k_wide(w, g, a, t0, nt, out, stride),
            }
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above (Amx implies every AVX-512 feature; its tiles are driven by `matmul`).
        Isa::Avx512 | Isa::Amx => unsafe {
            match w.kind {
                QKind::Q4_1 => avx512::q4_1(w, g, a, t0, nt, out, stride),
                QKind::Q8_0 => avx512::q8_0(w, g, a, t0, nt, out, stride),
                QKind::Q4_0 => avx512::q4_0(w, g, a, t0, nt, out, stride),
                QKind::Q5_0 => avx512::q5_0(w, g, a, t0, nt, out, stride),
                QKind::Q4K => avx512::q4k(w, g, a, t0, nt, out, stride),
                QKind::Q5_1 => avx512::q5_1(w, g, a, t0, nt, out, stride),
                QKind::Q5K => avx512::q5k(w, g, a, t0, nt, out, stride),
                QKind::Q6K => avx512::q6k(w, g, a, t0, nt, out, stride),
                QKind::Q6KWide => avx512::q6k_wide(w, g, a, t0, nt, out, stride),
            }
        },
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar::group_dot(w, g, a, t0, nt, out, stride),
    }
}
