//! The softmax and the weighted sum of values: one order of operations, shared by every
//! attention path (and by the plain reference the tests compare against), so a query's output
//! does not depend on which path computed it.

/// Keys scored together, and the lanes of the softmax's maximum and sum.
pub(super) const LANES: usize = 16;

/// e^x for x <= 0 (a score minus the row's maximum), to about one ulp: x = n ln 2 + r with
/// |r| <= ln 2 / 2, e^r by its Taylor polynomial to degree 7 (error under 1e-8 relative), times
/// 2^n built in the exponent bits. Only FMAs, adds and bit moves, so a run of them vectorizes
/// (libm's expf is a call per element, which dominated attention at long contexts); inputs
/// under -87 (weights below 2^-126, nothing next to the maximum's 1) give 2^-126 e^r.
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // 1.5 * 2^23: adding it rounds to an integer (to nearest even) in the low mantissa bits.
    const SHIFT: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.max(-87.0);
    let z = x.mul_add(LOG2E, SHIFT);
    let n = z - SHIFT;
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p: f32 = 1.0 / 5040.0;
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p.mul_add(r, c);
    }
    let k = (z.to_bits() as i32).wrapping_sub(SHIFT.to_bits() as i32);
    p * f32::from_bits(((k + 127) << 23) as u32)
}

/// `o[t] += p_j * v[j][t]` for every key `j`, with `o` held in registers: even and odd keys in
/// two accumulators (two FMA chains, where one waits on each FMA's latency), added at the end.
#[inline(always)]
fn weighted_sum_fixed<const N: usize>(scores: &[f32], v: &[f32], o: &mut [f32]) {
    let Ok(o) = <&mut [f32; N]>::try_from(o) else { unreachable!("o holds one head") };
    let (mut even, mut odd) = (*o, [0f32; N]);
    weighted_sum_pairs::<N>(scores, v, &mut even, &mut odd);
    for t in 0..N {
        o[t] = even[t] + odd[t];
    }
}

/// The accumulation of [`weighted_sum_fixed`], resumable: keys taken in runs of even length
/// (all but the last) pair up exactly as in one call over all of them.
#[inline(always)]
fn weighted_sum_pairs<const N: usize>(scores: &[f32], v: &[f32], even_out: &mut [f32; N], odd_out: &mut [f32; N]) {
    // Local copies: the compiler keeps these in registers, not a caller's memory (which it
    // would load and store around every FMA).
    let (mut even, mut odd) = (*even_out, *odd_out);
    let mut pairs = scores.chunks_exact(2);
    let mut j = 0;
    for pq in &mut pairs {
        let (Ok(va), Ok(vb)) =
            (<&[f32; N]>::try_from(&v[j * N..(j + 1) * N]), <&[f32; N]>::try_from(&v[(j + 1) * N..(j + 2) * N]))
        else {
            break;
        };
        for t in 0..N {
            even[t] = pq[0].mul_add(va[t], even[t]);
            odd[t] = pq[1].mul_add(vb[t], odd[t]);
        }
        j += 2;
    }
    if let [p] = pairs.remainder() {
        if let Ok(va) = <&[f32; N]>::try_from(&v[j * N..(j + 1) * N]) {
            for t in 0..N {
                even[t] = p.mul_add(va[t], even[t]);
            }
        }
    }
    *even_out = even;
    *odd_out = odd;
}

/// [`weighted_sum_pairs`] on slices of `N`; false if they are not. (At top level and inlined:
/// a nested function would not inherit the caller's target features.)
#[inline(always)]
fn weighted_sum_slices<const N: usize>(scores: &[f32], v: &[f32], even: &mut [f32], odd: &mut [f32]) -> bool {
    match (<&mut [f32; N]>::try_from(even), <&mut [f32; N]>::try_from(odd)) {
        (Ok(e), Ok(o)) => {
            weighted_sum_pairs::<N>(scores, v, e, o);
            true
        }
        _ => false,
    }
}

/// [`weighted_sum_pairs`] for any head size, on slices: the fixed sizes in registers, others
/// one chain per element (into `even` only, as [`softmax_weighted_sum`] does).
#[inline(always)]
pub(super) fn weighted_sum_run(scores: &[f32], v: &[f32], hd: usize, even: &mut [f32], odd: &mut [f32]) {
    let done = match hd {
        64 => weighted_sum_slices::<64>(scores, v, even, odd),
        128 => weighted_sum_slices::<128>(scores, v, even, odd),
        256 => weighted_sum_slices::<256>(scores, v, even, odd),
        _ => false,
    };
    if !done {
        for (j, &p) in scores.iter().enumerate() {
            for (oo, &vv) in even.iter_mut().zip(&v[j * hd..(j + 1) * hd]) {
                *oo = p.mul_add(vv, *oo);
            }
        }
    }
}

/// In place: each score becomes e^(score - max); returns their sum, added per lane and the
/// lanes in a fixed pairwise order.
#[inline(always)]
pub(super) fn softmax_exps(scores: &mut [f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = scores.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            lanes[l] = lanes[l].max(c[l]);
        }
    }
    for (l, &x) in chunks.remainder().iter().enumerate() {
        lanes[l] = lanes[l].max(x);
    }
    let max = lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut sums = [0f32; LANES];
    let mut chunks = scores.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            c[l] = exp_nonpositive(c[l] - max);
            sums[l] += c[l];
        }
    }
    for (l, x) in chunks.into_remainder().iter_mut().enumerate() {
        *x = exp_nonpositive(*x - max);
        sums[l] += *x;
    }
    // A fixed pairwise order.
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            sums[l] += sums[l + width];
        }
    }
    sums[0]
}

/// Softmax of `scores` (in place) and `o += softmax · v`, then `o /= sum`. The maximum, the
/// exponentials and their sum go sixteen lanes at a time (the sum per lane, lanes added in a
/// fixed order): the same for a query whatever else is in its batch or its prefill chunk.
/// Public as the definition a plain reference implementation shares (`v` holds one head's
/// values, key after key), so that only the KV path differs between the two.
#[inline(always)]
pub fn softmax_weighted_sum(scores: &mut [f32], v: &[f32], hd: usize, o: &mut [f32]) {
    let sum = softmax_exps(scores);
    match hd {
        // The common head sizes: the accumulators stay in registers instead of being loaded
        // and stored once per key.
        64 => weighted_sum_fixed::<64>(scores, v, o),
        128 => weighted_sum_fixed::<128>(scores, v, o),
        256 => weighted_sum_fixed::<256>(scores, v, o),
        // Other sizes: one chain per element, into `o`.
        _ => weighted_sum_run(scores, v, hd, o, &mut []),
    }
    let inv = 1.0 / sum;
    for oo in o.iter_mut() {
        *oo *= inv;
    }
}
