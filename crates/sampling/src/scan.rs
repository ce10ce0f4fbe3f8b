//! One pass over a logits row: is every value valid, what is the maximum, and where is it
//! first. Serving samples every running sequence every step, and a row is the whole
//! vocabulary, so the checks the sampler needs and greedy's argmax share one vectorized pass
//! instead of two scalar ones.

/// What one pass over a row found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scan {
    /// The largest value (-inf for an empty or fully masked row).
    pub max: f32,
    /// The lowest index holding a value equal to `max` (-0 == +0, as in [`crate::argmax`]).
    pub first_max: u32,
    /// The first NaN or +inf, which no sampling step may use.
    pub invalid: Option<(usize, f32)>,
}

/// Lanes the row is walked in: wide enough for one AVX-512 register of f32.
const LANES: usize = 16;

/// Scans `row`. Same result on every instruction set (only comparisons, no arithmetic).
pub(crate) fn scan(row: &[f32]) -> Scan {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature was just detected.
            return unsafe { scan_avx512(row) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: as above.
            return unsafe { scan_avx2(row) };
        }
    }
    scan_impl(row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn scan_avx512(row: &[f32]) -> Scan {
    scan_impl(row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scan_avx2(row: &[f32]) -> Scan {
    scan_impl(row)
}

#[inline(always)]
fn scan_impl(row: &[f32]) -> Scan {
    // Each lane keeps its own maximum and the first index (in that lane) that reached it, with
    // selects rather than branches so the loop vectorizes; the lanes are merged at the end.
    let mut max = [f32::NEG_INFINITY; LANES];
    let mut at = [0u32; LANES];
    let mut bad = [0u32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for (c, chunk) in chunks.by_ref().enumerate() {
        let base = (c * LANES) as u32;
        for j in 0..LANES {
            let v = chunk[j];
            bad[j] |= u32::from(v.is_nan() | (v == f32::INFINITY));
            let gt = v > max[j];
            max[j] = if gt { v } else { max[j] };
            at[j] = if gt { base + j as u32 } else { at[j] };
        }
    }
    let tail = row.len() - chunks.remainder().len();
    let mut best = f32::NEG_INFINITY;
    // Stays 0 when no value rose above -inf.
    let mut first = 0u32;
    for j in 0..LANES {
        // A lane that never rose above -inf holds no candidate of its own.
        if max[j] > best || (max[j] == best && max[j] > f32::NEG_INFINITY && at[j] < first) {
            best = max[j];
            first = at[j];
        }
    }
    let mut any_bad = bad.iter().any(|&b| b != 0);
    for (k, &v) in chunks.remainder().iter().enumerate() {
        any_bad |= v.is_nan() || v == f32::INFINITY;
        // Every index here is past every lane's, so only a strictly larger value wins.
        if v > best {
            best = v;
            first = (tail + k) as u32;
        }
    }
    let invalid = if any_bad { row.iter().position(|v| v.is_nan() || *v == f32::INFINITY) } else { None };
    Scan { max: best, first_max: first, invalid: invalid.map(|i| (i, row[i])) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition: a plain walk.
    fn reference(row: &[f32]) -> Scan {
        let invalid = row.iter().position(|v| v.is_nan() || *v == f32::INFINITY).map(|i| (i, row[i]));
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let first_max = if max == f32::NEG_INFINITY { 0 } else { row.iter().position(|&v| v == max).unwrap() as u32 };
        Scan { max, first_max, invalid }
    }

    fn same(a: Scan, b: Scan) -> bool {
        // -0 and +0 are one maximum (which of them a fold keeps is not specified).
        a.max == b.max
            && a.first_max == b.first_max
            && a.invalid.map(|(i, v)| (i, v.to_bits())) == b.invalid.map(|(i, v)| (i, v.to_bits()))
    }

    #[test]
    fn the_first_of_tied_maxima_wins_across_lanes_and_the_tail() {
        let mut row = vec![0.0f32; 53];
        row[40] = 5.0;
        row[7] = 5.0;
        row[50] = 5.0;
        assert_eq!(scan(&row).first_max, 7);
        let mut row = vec![-1.0f32; 35];
        row[34] = 2.0;
        assert_eq!((scan(&row).first_max, scan(&row).max), (34, 2.0));
        // -0 and +0 are equal: the first one counts.
        assert_eq!(scan(&[-0.0, 0.0]).first_max, 0);
        assert_eq!(scan(&[f32::NEG_INFINITY; 40]).first_max, 0);
        assert_eq!(scan(&[]).max, f32::NEG_INFINITY);
    }

    #[test]
    fn the_first_nan_or_positive_infinity_is_reported() {
        let mut row = vec![1.0f32; 100];
        row[70] = f32::INFINITY;
        row[90] = f32::NAN;
        assert_eq!(scan(&row).invalid.map(|(i, _)| i), Some(70));
        row[3] = f32::NAN;
        assert_eq!(scan(&row).invalid.map(|(i, _)| i), Some(3));
    }

    fn value() -> impl Strategy<Value = f32> {
        prop_oneof![
            8 => (-4i32..4).prop_map(|v| v as f32 * 0.5),
            2 => Just(f32::NEG_INFINITY),
            1 => Just(-0.0f32),
            1 => Just(f32::NAN),
            1 => Just(f32::INFINITY),
        ]
    }

    proptest! {
        #[test]
        fn one_pass_equals_the_plain_walk(row in prop::collection::vec(value(), 0..80)) {
            let (got, want) = (scan(&row), reference(&row));
            prop_assert!(same(got, want), "{got:?} vs {want:?}");
            prop_assert!(same(scan_impl(&row), want));
        }
    }
}
