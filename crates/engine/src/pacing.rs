//! When waiting prompts run in a step of their own, ahead of the decode step.
//!
//! A prompt that arrives during a step waits for it to end, then shares the next one with every
//! decoding sequence: its first token comes about two decode steps after it arrived. With a
//! large decode batch a step is long (tens of ms on a CPU), and its prompt rows are a small part
//! of it. Running those prompts first, in a step of their own, brings their first tokens forward
//! by a whole decode step. What it costs:
//! - every step has a fixed part (a read of the weights, starting and joining the compute
//!   threads); a second step pays it again, which is throughput lost;
//! - the running decodes' next token waits for the extra step.
//!
//! So prompts run ahead only while the fixed part, as measured on this machine under its current
//! load, is at most [`FIXED_SHARE`] of the decode step, and then hold at most [`AHEAD_SHARE`] as
//! many tokens as the decode step has rows: the decodes' next token waits at most that part of a
//! step more, plus the fixed part. Only prompts that finish in the extra step take part (its
//! point is their first token); a long prompt is chunked into the decode steps as before and
//! joins an extra step only for its last chunk.

use std::time::Duration;

/// The extra step's fixed part (measured) may be at most this part of the decode step.
const FIXED_SHARE: f64 = 1.0 / 4.0;

/// The extra step holds at most this many prompt tokens per decode row.
const AHEAD_SHARE: f64 = 1.0 / 2.0;

/// Until the fixed part is measured, an extra step takes at most this many prompt tokens.
const FIRST_TRY_TOKENS: usize = 8;

/// After this many decode steps without an extra step, one is tried even when the last
/// measurement said no: the load, and with it the fixed part, changes.
const RETRY_AFTER_STEPS: u32 = 64;

/// Weight of a new measurement in the running averages.
const SMOOTHING: f64 = 0.25;

/// A decode step carries at most this part of prompt tokens to count as one.
const DECODE_STEP_PROMPT_SHARE: usize = 8;

/// Step sizes (rows) the cost fit keeps apart; larger steps share the last slot.
const FIT_SIZES: usize = 256;

/// Steps of one size needed before its mean time enters the fit.
const FIT_MIN_STEPS: u32 = 4;

/// Measured step durations, and the rule drawn from them.
#[derive(Debug, Default)]
pub(crate) struct StepClock {
    /// Seconds per row of a decode step (its fixed part spread over its rows).
    per_row: Option<f64>,
    /// Seconds of an extra step beyond its rows at `per_row`: the fixed part.
    fixed: Option<f64>,
    /// Decode steps since the last extra step.
    since_ahead: u32,
    /// A step's time against its rows, from steps of every kind.
    cost: CostFit,
}

/// A step's time against its rows: the mean time of the steps of each size (smoothed, so it
/// follows the machine), and a line through those means by least squares, one point per size.
/// Its intercept is the fixed part every step pays, its slope a row's own cost. One point per
/// size, not per step: a long run of equal steps (the usual case under steady load) neither
/// drowns the other sizes nor, once they are gone, leaves nothing to fit.
#[derive(Debug, Default)]
struct CostFit {
    /// By rows: (smoothed seconds, steps seen).
    sizes: Vec<(f64, u32)>,
}

impl CostFit {
    fn add(&mut self, rows: usize, secs: f64) {
        if rows == 0 {
            return;
        }
        let at = rows.min(FIT_SIZES) - 1;
        if self.sizes.len() <= at {
            self.sizes.resize(at + 1, (0.0, 0));
        }
        let (mean, seen) = &mut self.sizes[at];
        *mean = if *seen == 0 { secs } else { *mean + SMOOTHING * (secs - *mean) };
        *seen = seen.saturating_add(1);
    }

    /// (fixed seconds, seconds per row), once two sizes have been seen often enough.
    fn line(&self) -> Option<(f64, f64)> {
        // Asked every step: sums in one pass, nothing allocated.
        let (mut k, mut sn, mut st, mut snn, mut snt) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for (i, &(mean, seen)) in self.sizes.iter().enumerate() {
            if seen >= FIT_MIN_STEPS {
                let n = (i + 1) as f64;
                (k, sn, st, snn, snt) = (k + 1.0, sn + n, st + mean, snn + n * n, snt + n * mean);
            }
        }
        if k < 2.0 {
            return None;
        }
        let (mn, mt) = (sn / k, st / k);
        let slope = (snt / k - mn * mt) / (snn / k - mn * mn);
        (slope > 0.0).then(|| ((mt - slope * mn).max(0.0), slope))
    }
}

impl StepClock {
    /// A step of every sequence: `decoding` decode rows and `prompt_tokens` prompt tokens.
    pub(crate) fn record_step(&mut self, decoding: usize, prompt_tokens: usize, took: Duration) {
        self.since_ahead = self.since_ahead.saturating_add(1);
        // A step with a large prompt chunk says little about a decode row's cost.
        if decoding == 0 || prompt_tokens * DECODE_STEP_PROMPT_SHARE > decoding {
            return;
        }
        self.cost.add(decoding + prompt_tokens, took.as_secs_f64());
        let sample = took.as_secs_f64() / (decoding + prompt_tokens) as f64;
        smooth(&mut self.per_row, sample);
    }

    /// An extra step of `prompt_tokens` prompt tokens alone.
    pub(crate) fn record_ahead(&mut self, prompt_tokens: usize, took: Duration) {
        self.since_ahead = 0;
        self.cost.add(prompt_tokens, took.as_secs_f64());
        let Some(per_row) = self.per_row else { return };
        let sample = (took.as_secs_f64() - per_row * prompt_tokens as f64).max(0.0);
        smooth(&mut self.fixed, sample);
    }

    /// How many prompt tokens may run in a step of their own before a step of `decoding`
    /// decode rows; `None`: none, the prompts join the decode step.
    pub(crate) fn ahead_budget(&self, decoding: usize) -> Option<usize> {
        let per_row = self.per_row?;
        if decoding == 0 {
            return None;
        }
        let tokens = ((decoding as f64 * AHEAD_SHARE) as usize).max(1);
        let first_try = tokens.min(FIRST_TRY_TOKENS);
        match self.fixed {
            None => Some(first_try),
            Some(f) if f > per_row * decoding as f64 * FIXED_SHARE => {
                (self.since_ahead >= RETRY_AFTER_STEPS).then_some(first_try)
            }
            Some(_) => Some(tokens),
        }
    }

    /// A step's fixed part in rows: how many rows cost as much as the part every step pays
    /// whatever its rows (`None` until steps of different sizes were measured).
    pub(crate) fn fixed_in_rows(&self) -> Option<f64> {
        self.cost.line().map(|(fixed, per_row)| fixed / per_row)
    }

    /// A clock as if it had measured these (tests of the scheduler).
    #[cfg(test)]
    pub(crate) fn measured(per_row: Duration, fixed: Duration) -> StepClock {
        let (per_row, fixed) = (per_row.as_secs_f64(), fixed.as_secs_f64());
        let mut cost = CostFit::default();
        for rows in [1, 2] {
            for _ in 0..FIT_MIN_STEPS {
                cost.add(rows, fixed + per_row * rows as f64);
            }
        }
        StepClock { per_row: Some(per_row), fixed: Some(fixed), since_ahead: 0, cost }
    }
}

fn smooth(avg: &mut Option<f64>, sample: f64) {
    *avg = Some(avg.map_or(sample, |a| a + SMOOTHING * (sample - a)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: f64) -> Duration {
        Duration::from_secs_f64(n / 1e3)
    }

    /// The reference machine at 64 clients: 56 ms decode steps, 5.5 ms for a one-token step.
    fn loaded() -> StepClock {
        let mut clock = StepClock::default();
        clock.record_step(64, 0, ms(56.0));
        clock.record_ahead(1, ms(5.5));
        clock
    }

    #[test]
    fn prompts_run_ahead_of_a_long_decode_step_with_half_as_many_tokens_as_it_has_rows() {
        let clock = loaded();
        assert_eq!(clock.ahead_budget(64), Some(32));
        assert_eq!(clock.ahead_budget(0), None, "no decode step to run ahead of");
    }

    #[test]
    fn prompts_join_a_decode_step_whose_fixed_part_an_extra_step_would_repeat_at_too_high_a_cost() {
        let clock = loaded();
        // A 4.6 ms fixed part: over a quarter of a step of 21 rows (18.4 ms), under one of 22.
        assert_eq!(clock.ahead_budget(16), None);
        assert_eq!(clock.ahead_budget(21), None);
        assert_eq!(clock.ahead_budget(22), Some(11));
    }

    #[test]
    fn nothing_runs_ahead_before_a_decode_step_is_measured_and_the_first_try_is_small() {
        let mut clock = StepClock::default();
        assert_eq!(clock.ahead_budget(64), None);
        clock.record_ahead(1, ms(5.0));
        assert_eq!(clock.ahead_budget(64), None, "an extra step alone measures nothing");
        clock.record_step(64, 0, ms(56.0));
        assert_eq!(clock.ahead_budget(64), Some(FIRST_TRY_TOKENS));
        assert_eq!(clock.ahead_budget(4), Some(2), "never more than half the decode rows");
    }

    #[test]
    fn a_step_with_a_long_prompt_chunk_is_not_taken_for_a_decode_step() {
        let mut clock = StepClock::default();
        clock.record_step(10, 500, ms(300.0));
        assert_eq!(clock.ahead_budget(64), None);
        clock.record_step(64, 8, ms(63.0));
        assert_eq!(clock.ahead_budget(64), Some(FIRST_TRY_TOKENS));
    }

    #[test]
    fn the_fixed_part_in_rows_is_fitted_from_steps_of_different_sizes_and_kept_through_equal_ones() {
        let mut clock = StepClock::default();
        // 3 ms every step, 0.75 ms a row.
        let step = |rows: usize| ms(3.0 + 0.75 * rows as f64);
        for _ in 0..10 {
            clock.record_step(9, 0, step(9));
        }
        assert_eq!(clock.fixed_in_rows(), None, "equal steps fit no line");
        for _ in 0..FIT_MIN_STEPS - 1 {
            clock.record_step(1, 0, step(1));
        }
        assert_eq!(clock.fixed_in_rows(), None, "a size seen too rarely is not fitted");
        clock.record_step(1, 0, step(1));
        for _ in 0..FIT_MIN_STEPS {
            clock.record_step(5, 0, ms(99.0));
        }
        clock.record_step(5, 0, step(5));
        for _ in 0..40 {
            clock.record_step(5, 0, step(5));
        }
        let f = clock.fixed_in_rows().expect("fitted");
        assert!((f - 4.0).abs() < 0.01, "a slow start at one size is smoothed away: {f}");
        for _ in 0..500 {
            clock.record_step(5, 0, step(5));
        }
        assert!((clock.fixed_in_rows().expect("kept") - 4.0).abs() < 1e-6);
        clock.record_step(10, 500, ms(10_000.0));
        assert!(
            (clock.fixed_in_rows().expect("kept") - 4.0).abs() < 1e-6,
            "a step with a long prompt chunk is not fitted"
        );
    }

    #[test]
    fn an_extra_step_that_measured_slow_is_tried_again_after_a_while() {
        let mut clock = loaded();
        // Under a burst of arrivals the other threads slowed an extra step down.
        for _ in 0..8 {
            clock.record_ahead(1, ms(30.0));
        }
        assert_eq!(clock.ahead_budget(64), None);
        for _ in 0..RETRY_AFTER_STEPS {
            clock.record_step(64, 0, ms(56.0));
        }
        assert_eq!(clock.ahead_budget(64), Some(FIRST_TRY_TOKENS));
        for _ in 0..30 {
            clock.record_ahead(1, ms(5.5));
        }
        assert_eq!(clock.ahead_budget(64), Some(32), "measured fast again: the whole budget");
    }
}
