//! Element-wise pieces of the llama block, written to follow ggml's arithmetic (where it sums in
//! f64, how it steps the rotary angle) because agreement with llama.cpp is measured.

use crate::config::RopeStyle;

/// `out = (x / rms(x)) * w` per row of `w.len()`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let sum: f64 = xr.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = (v * scale) * g;
        }
    }
}

/// Rotary angles for one position: `(cos, sin)` for each pair, stepping the angle by repeated
/// multiplication as ggml does; with `factors` (Llama 3.1's `rope_freqs`, Phi-3's LongRoPE),
/// each pair's angle divided by its factor, as ggml divides it; both multiplied by `mscale`
/// (LongRoPE's attention factor; 1 elsewhere, which changes no bit).
pub fn rope_table(
    pos: usize,
    head_dim: usize,
    base: f32,
    (factors, mscale): (Option<&[f32]>, f32),
    out: &mut [(f32, f32)],
) {
    let scale = base.powf(-2.0 / head_dim as f32);
    let mut theta = pos as f32;
    for (i, slot) in out.iter_mut().take(head_dim / 2).enumerate() {
        let t = factors.map_or(theta, |f| theta / f[i]);
        *slot = (t.cos() * mscale, t.sin() * mscale);
        theta *= scale;
    }
}

/// Rotates every head of `row` by the angles of `table`, pairing dimensions as `style` says
/// (llama GGUF converters permute Q and K for adjacent pairs; Gemma pairs the two halves).
pub fn rope_apply(row: &mut [f32], head_dim: usize, table: &[(f32, f32)], style: RopeStyle) {
    let rot = |x0: f32, x1: f32, c: f32, s: f32| (x0 * c - x1 * s, x0 * s + x1 * c);
    for head in row.chunks_exact_mut(head_dim) {
        match style {
            RopeStyle::Interleaved => {
                for (pair, &(c, s)) in head.chunks_exact_mut(2).zip(table) {
                    (pair[0], pair[1]) = rot(pair[0], pair[1], c, s);
                }
            }
            RopeStyle::Halves => {
                let (lo, hi) = head.split_at_mut(head_dim / 2);
                for ((a, b), &(c, s)) in lo.iter_mut().zip(hi.iter_mut()).zip(table) {
                    (*a, *b) = rot(*a, *b, c, s);
                }
            }
        }
    }
}

/// `x = cap * tanh(x / cap)` for each value, as ggml computes it (a scale by the reciprocal, a
/// tanh, a scale back): Gemma 2's soft-capping of attention scores and logits.
pub fn softcap(x: &mut [f32], cap: f32) {
    let inv = 1.0 / cap;
    for v in x.iter_mut() {
        *v = (*v * inv).tanh() * cap;
    }
}

/// `gate = silu(gate) * up`, in place.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// ggml's tanh approximation of GELU in f32.
fn gelu_f32(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044_715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

/// GELU of every f16 value, as f16 bits: ggml's CPU backend computes GELU by looking up the f16
/// value of its input in such a table; the same table gives the same values, and a lookup is
/// cheaper than `tanh`.
fn gelu_table() -> &'static [u16] {
    use half::f16;
    static TABLE: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    TABLE
        .get_or_init(|| (0..=u16::MAX).map(|b| f16::from_f32(gelu_f32(f16::from_bits(b).to_f32())).to_bits()).collect())
}

/// `gate = gelu(gate) * up`, in place, as ggml computes it (see [`gelu_table`]).
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    use half::f16;
    let table = gelu_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let y = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x
        } else {
            f16::from_bits(table[f16::from_f32(x).to_bits() as usize]).to_f32()
        };
        *g = y * u;
    }
}

pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_makes_unit_rms_rows() {
        let x = [3.0f32, 4.0, 0.0, 0.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut out);
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm_elsewhere() {
        let mut t = vec![(0.0, 0.0); 4];
        rope_table(0, 8, 10000.0, (None, 1.0), &mut t);
        let mut row: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let orig = row.clone();
        rope_apply(&mut row, 8, &t, RopeStyle::Interleaved);
        assert_eq!(row, orig);
        rope_table(37, 8, 10000.0, (None, 1.0), &mut t);
        rope_apply(&mut row, 8, &t, RopeStyle::Interleaved);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = row.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3);
    }

    #[test]
    fn rope_factors_divide_each_pairs_angle_and_factors_of_one_change_nothing() {
        let (mut plain, mut ones, mut scaled) = (vec![(0.0, 0.0); 4], vec![(0.0, 0.0); 4], vec![(0.0, 0.0); 4]);
        rope_table(37, 8, 500_000.0, (None, 1.0), &mut plain);
        rope_table(37, 8, 500_000.0, (Some(&[1.0; 4]), 1.0), &mut ones);
        assert_eq!(plain, ones);
        let factors = [1.0, 2.0, 4.0, 8.0];
        rope_table(37, 8, 500_000.0, (Some(&factors), 1.0), &mut scaled);
        let scale = 500_000f32.powf(-2.0 / 8.0);
        let mut theta = 37f32;
        for (i, &(c, s)) in scaled.iter().enumerate() {
            let t = theta / factors[i];
            assert_eq!((c, s), (t.cos(), t.sin()), "pair {i}");
            theta *= scale;
        }
    }

    #[test]
    fn geglu_uses_gelu_of_the_f16_input_rounded_to_f16() {
        let x: Vec<f32> = (-1200..1200).map(|i| i as f32 * 0.01 + 0.003).collect();
        let mut g = x.clone();
        geglu(&mut g, &vec![1.0; x.len()]);
        for (&xi, &gi) in x.iter().zip(&g) {
            let want = if xi <= -10.0 {
                0.0
            } else if xi >= 10.0 {
                xi
            } else {
                half::f16::from_f32(gelu_f32(half::f16::from_f32(xi).to_f32())).to_f32()
            };
            assert_eq!(gi, want, "{xi}");
        }
    }
}
