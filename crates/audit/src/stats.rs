//! The one statistics module of the tools: the median of a sample, and the ROC AUC with its
//! interval that the audit's timing probe judges a side channel by.

/// The two-sided 95 % normal quantile.
pub const Z95: f64 = 1.959_963_985;
/// The one-sided 95 % normal quantile.
pub const Z95_ONE_SIDED: f64 = 1.644_853_627;

/// The middle of the finite values of a sample (the mean of the two middle ones when their
/// number is even); `None` when there is none.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    Some(if s.len() % 2 == 1 { s[m] } else { (s[m - 1] + s[m]) / 2.0 })
}

/// [`median`], NaN for an empty sample (a table cell that has no figure).
pub fn median_or_nan(v: &[f64]) -> f64 {
    median(v).unwrap_or(f64::NAN)
}

/// ROC AUC of telling `cached` from `fresh` by TTFT: the share of (cached, fresh) pairs where the
/// cached one was faster, ties counting one half (Mann-Whitney U over n1·n2). 0.5: no
/// difference; 1.0: every cached request faster than every fresh one.
pub fn auc(cached: &[f64], fresh: &[f64]) -> Option<f64> {
    if cached.is_empty() || fresh.is_empty() {
        return None;
    }
    let mut u = 0.0;
    for &c in cached {
        for &f in fresh {
            u += if c < f {
                1.0
            } else if c == f {
                0.5
            } else {
                0.0
            };
        }
    }
    Some(u / (cached.len() * fresh.len()) as f64)
}

/// Hanley and McNeil's (1982) standard error of an AUC from `n1` and `n2` samples.
pub fn hanley_mcneil_se(a: f64, n1: usize, n2: usize) -> f64 {
    if n1 == 0 || n2 == 0 {
        return f64::NAN;
    }
    let q1 = a / (2.0 - a);
    let q2 = 2.0 * a * a / (1.0 + a);
    let (n1f, n2f) = (n1 as f64, n2 as f64);
    let var = (a * (1.0 - a) + (n1f - 1.0) * (q1 - a * a) + (n2f - 1.0) * (q2 - a * a)) / (n1f * n2f);
    var.max(0.0).sqrt()
}

/// The 95 % interval of an AUC, clamped to [0, 1].
pub fn interval(a: f64, n1: usize, n2: usize) -> [f64; 2] {
    let se = hanley_mcneil_se(a, n1, n2);
    [(a - Z95 * se).max(0.0), (a + Z95 * se).min(1.0)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_or_the_mean_of_the_two_middle_values_of_the_finite_ones() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 4.0, f64::INFINITY]), Some(4.0));
        assert_eq!(median(&[]), None);
        assert!(median_or_nan(&[f64::NAN]).is_nan());
    }

    #[test]
    fn auc_of_known_samples() {
        let v = [10.0, 20.0, 30.0, 40.0];
        // Identical samples: every pair a tie or balanced.
        assert_eq!(auc(&v, &v), Some(0.5));
        assert_eq!(auc(&[5.0; 6], &[5.0; 3]), Some(0.5));
        // Every cached request faster: 1; every one slower: 0.
        assert_eq!(auc(&[1.0, 2.0, 3.0], &[4.0, 5.0]), Some(1.0));
        assert_eq!(auc(&[4.0, 5.0], &[1.0, 2.0, 3.0]), Some(0.0));
        // Ties count one half: pairs (1,2) 1, (1,1) ½, (2,2) ½, (2,1) 0 → 2/4.
        assert_eq!(auc(&[1.0, 2.0], &[2.0, 1.0]), Some(0.5));
        // (1 vs 2,3): 2; (3 vs 2,3): 0 + ½ → 2.5 / 4.
        assert_eq!(auc(&[1.0, 3.0], &[2.0, 3.0]), Some(0.625));
        assert_eq!(auc(&[], &[1.0]), None);
    }

    #[test]
    fn hanley_mcneil_interval() {
        // AUC 0.5 from 32 + 32: Q1 = Q2 = 1/3, var = (0.25 + 62/12) / 1024.
        let se = hanley_mcneil_se(0.5, 32, 32);
        assert!((se - ((0.25 + 62.0 / 12.0) / 1024.0f64).sqrt()).abs() < 1e-12);
        let [lo, hi] = interval(0.5, 32, 32);
        assert!((lo - (0.5 - Z95 * se)).abs() < 1e-12 && (hi - (0.5 + Z95 * se)).abs() < 1e-12);
        assert!(lo > 0.35 && hi < 0.65, "{lo} {hi}");
        // More samples, narrower; clamped to [0, 1].
        let [lo2, hi2] = interval(0.5, 320, 320);
        assert!(hi2 - lo2 < hi - lo);
        let [lo, hi] = interval(0.99, 4, 4);
        assert!(hi <= 1.0 && lo < 0.99);
        assert_eq!(interval(1.0, 10, 10), [1.0, 1.0]);
    }
}
