//! The one statistics helper the tools share: the median of a sample.

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
}
