//! Drafts for speculative decoding, looked up in the sequence's own tokens.
//!
//! Batch-1 decode reads every weight once per token, so it is bound by memory bandwidth; a step
//! that feeds the last token and a few guessed ones reads the weights once for all of them and
//! costs little more. The guesses come from prompt lookup: the tokens that followed the latest
//! earlier occurrence of the sequence's last few tokens, in the sequence itself (its prompt and
//! what it generated). Summaries, edits, code and extraction repeat spans of their prompt, so
//! such guesses are often right; where nothing repeats, nothing is guessed and nothing is spent.
//!
//! A guess costs a row of the step whether or not it is kept, so each sequence feeds as many
//! as pay for themselves ([`DraftRate`]): while its guesses are kept it feeds more, when they
//! fail it feeds fewer and then none, and tries again some steps later.
//!
//! Drafts are taken from the request's own tokens only, never from another request's or
//! another tenant's (a shared lookup table would tell one tenant what another's text holds
//! through which guesses are accepted, which shows in speed). Verification (`sequence`) samples
//! every row as a step without drafts would and keeps a guess only where it equals that sample,
//! so the output is exactly what decoding without drafts gives.

/// Longest and shortest run of trailing tokens looked up; longer runs first (fewer, better
/// guesses). A single token repeats too often by chance to be worth a guess.
const NGRAM_MAX: usize = 4;
const NGRAM_MIN: usize = 2;

/// Writes into `out` (cleared first) up to `max` tokens continuing `prompt ++ generated`: those
/// that followed the latest earlier occurrence of its last `n` tokens, for the largest `n` in
/// `NGRAM_MIN..=NGRAM_MAX` that occurs earlier.
pub(crate) fn propose(prompt: &[u32], generated: &[u32], max: usize, out: &mut Vec<u32>) {
    out.clear();
    let len = prompt.len() + generated.len();
    let at = |i: usize| if i < prompt.len() { prompt[i] } else { generated[i - prompt.len()] };
    if max == 0 {
        return;
    }
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if len <= n {
            continue;
        }
        let tail = len - n;
        // Latest start first; a match must end before the sequence's last token, so at least
        // one token follows it.
        for start in (0..tail).rev() {
            if (0..n).all(|k| at(start + k) == at(tail + k)) {
                let from = start + n;
                out.extend((from..len.min(from + max)).map(at));
                return;
            }
        }
    }
}

/// What a step allows the next one's drafts: at most `max` per row, each worth its row only
/// if it is kept with a chance above `theta`, the share of the step's time one more row costs
/// weighed by the tokens the step yields (see [`DraftRate::length`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Drafting {
    pub(crate) max: usize,
    pub(crate) theta: f64,
}

impl Drafting {
    pub(crate) const OFF: Drafting = Drafting { max: 0, theta: 1.0 };

    /// For a step of `rows` decode rows whose fixed part costs as much as `fixed_in_rows` rows
    /// (`None` until measured): one more row costs `1 / (fixed + rows)` of the step, which
    /// yields `rows` tokens, so a guess pays when its chance of being kept exceeds
    /// `rows / (fixed + rows)`.
    pub(crate) fn new(max: usize, rows: usize, fixed_in_rows: Option<f64>) -> Drafting {
        let theta = match fixed_in_rows {
            Some(fixed) if fixed.is_finite() && fixed >= 0.0 => rows.max(1) as f64 / (fixed + rows.max(1) as f64),
            _ => UNMEASURED_THETA,
        };
        Drafting { max, theta: theta.min(MAX_THETA) }
    }
}

/// Until the step clock has measured a row's cost: guesses kept less often than this are not
/// worth a row (on the 2-vCPU reference machine a batch-1 SmolLM2 step has a fixed part of
/// about 2.4 rows, i.e. 0.29).
const UNMEASURED_THETA: f64 = 0.3;
/// The bar is never higher than this, below [`PRIOR_RATE`]: every sequence tries at least one
/// guess at its first chance, whatever the clock measured, and its own record decides after
/// that (so whether a sequence ever guesses does not hang on the machine's timing).
const MAX_THETA: f64 = 0.55;

/// A sequence's estimated chance that a guess is kept, given the guesses before it were.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DraftRate(f64);

/// Where a sequence starts, and what a sequence not guessing drifts back to.
const PRIOR_RATE: f64 = 0.6;
/// Weight of a step's outcome in the estimate.
const RATE_SMOOTHING: f64 = 0.3;
/// Per step without guesses, how far the estimate moves back toward the prior: a sequence
/// whose guesses failed tries again some steps later (its text may have started to repeat).
const RATE_RECOVERY: f64 = 0.02;

impl Default for DraftRate {
    fn default() -> Self {
        DraftRate(PRIOR_RATE)
    }
}

impl DraftRate {
    /// After a step that fed `drafted` guesses and kept the first `kept`: each kept guess is a
    /// success, and the first rejected one a failure (those after it were never judged).
    pub(crate) fn update(&mut self, drafted: usize, kept: usize) {
        if drafted == 0 {
            self.0 += RATE_RECOVERY * (PRIOR_RATE - self.0);
            return;
        }
        let trials = kept + usize::from(kept < drafted);
        self.0 += RATE_SMOOTHING * (kept as f64 / trials as f64 - self.0);
    }

    /// How many guesses to feed: the k-th is kept (and saves a step's worth of a token) with
    /// chance rate^k, so guesses are added while that exceeds `d.theta`, up to `d.max`.
    pub(crate) fn length(&self, d: Drafting) -> usize {
        let (mut k, mut chance) = (0, 1.0);
        while k < d.max {
            chance *= self.0;
            if chance <= d.theta {
                break;
            }
            k += 1;
        }
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guess(prompt: &[u32], generated: &[u32], max: usize) -> Vec<u32> {
        let mut out = vec![99];
        propose(prompt, generated, max, &mut out);
        out
    }

    #[test]
    fn the_tokens_after_the_latest_earlier_occurrence_of_the_tail_are_proposed() {
        // "1 2 3 4 5 ... 1 2 3" -> 4 5 6
        assert_eq!(guess(&[1, 2, 3, 4, 5, 6, 7, 9, 1, 2], &[3], 3), vec![4, 5, 6]);
        // The latest occurrence wins: "2 3 x" twice, the later followed by 8.
        assert_eq!(guess(&[2, 3, 7, 5, 2, 3, 8, 6, 2], &[3], 2), vec![8, 6]);
        // Across prompt and output alike.
        assert_eq!(guess(&[5, 6], &[7, 8, 5, 6], 4), vec![7, 8, 5, 6]);
    }

    #[test]
    fn longer_matches_are_preferred_and_a_single_token_is_never_enough() {
        // Tail "1 2 3": a 3-gram occurs (followed by 4) and a later 2-gram "2 3" (followed by 9).
        assert_eq!(guess(&[1, 2, 3, 4, 0, 2, 3, 9, 0, 1, 2, 3], &[], 1), vec![4]);
        // Only the last token repeats: no guess.
        assert!(guess(&[4, 1, 5, 6, 1], &[], 4).is_empty());
        assert!(guess(&[], &[], 4).is_empty());
        assert!(guess(&[1, 2, 1, 2], &[], 0).is_empty());
    }

    #[test]
    fn guesses_grow_while_they_are_kept_and_stop_after_they_fail_then_come_back_slowly() {
        let d = Drafting { max: 8, theta: 0.29 };
        let mut rate = DraftRate::default();
        assert_eq!(rate.length(d), 2, "a new sequence tries a guess or two");
        let mut lengths = Vec::new();
        for _ in 0..8 {
            let k = rate.length(d);
            lengths.push(k);
            rate.update(k, k);
        }
        assert!(lengths.windows(2).all(|w| w[0] <= w[1]) && lengths[7] == 8, "{lengths:?}");
        // Guesses that fail: fewer, then none.
        for _ in 0..6 {
            let k = rate.length(d);
            rate.update(k, 0);
        }
        assert_eq!(rate.length(d), 0);
        // Without guesses the estimate drifts back, and one guess is tried again.
        let steps = (1..200).find(|_| {
            rate.update(0, 0);
            rate.length(d) > 0
        });
        assert!(steps.is_some_and(|n| n > 3), "{steps:?}");
        assert_eq!(rate.length(Drafting::OFF), 0);
    }

    #[test]
    fn a_guess_pays_when_kept_more_often_than_a_rows_share_of_the_step() {
        // A fixed part of 2 rows: one more row is a third of a one-row step.
        assert!((Drafting::new(4, 1, Some(2.0)).theta - 1.0 / 3.0).abs() < 1e-12);
        // Four rows share the step's yield: a guess must be kept more often, but a new
        // sequence's first guess is always tried.
        assert!((Drafting::new(4, 2, Some(6.0)).theta - 2.0 / 8.0).abs() < 1e-12);
        assert_eq!(Drafting::new(4, 4, Some(2.0)).theta, MAX_THETA);
        assert!(DraftRate::default().length(Drafting::new(4, 4, Some(0.0))) >= 1);
        assert_eq!(Drafting::new(4, 1, None).theta, UNMEASURED_THETA);
        assert_eq!(Drafting::new(4, 1, Some(f64::NAN)).theta, UNMEASURED_THETA);
    }

    #[test]
    fn a_guess_stops_at_the_end_of_what_exists() {
        // "1 2 1 2": the match at 0 is followed by "1 2" only.
        assert_eq!(guess(&[1, 2, 1, 2], &[], 8), vec![1, 2]);
    }
}
