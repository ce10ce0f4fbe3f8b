//! Token sampling for pagewarden: turns one row of logits into the next token.
//!
//! This crate owns everything between the model's output row and the chosen
//! token id: validated [`SamplingParams`] (the OpenAI/llama.cpp knobs, with
//! errors that name the field and range so the server can answer 400), the
//! llama.cpp default chain (penalties -> top_k -> top_p -> min_p ->
//! temperature -> draw), OpenAI-style logprobs of the raw logits, stop-token
//! sets, and a seeded PRNG of its own so that a request's `seed` reproduces
//! the same tokens everywhere. It is a leaf crate: it knows nothing of the
//! model, so the model, server and evaluation code can all share
//! [`log_softmax`] / [`argmax`] and test sampling without weights.

mod error;
mod params;
pub mod rng;
mod sampler;
mod scan;

pub use error::SamplingError;
pub use params::{RawSamplingParams, SamplingParams, SamplingParamsBuilder, MAX_TOP_LOGPROBS, PENALTY_LAST_N};
pub use rng::Rng;
pub use sampler::{Sampled, Sampler};
pub use types::TopLogprob;

/// `out[i] = logits[i] - logsumexp(logits)`, computed stably (max subtracted,
/// sum accumulated in f64). -inf logits give -inf. If no logit is finite or
/// any is NaN/+inf, `out` is filled with NaN.
///
/// # Panics
/// If `out.len() != logits.len()`.
pub fn log_softmax(logits: &[f32], out: &mut [f32]) {
    assert_eq!(logits.len(), out.len(), "log_softmax: output length must match input");
    let Some(lse) = lse_parts(logits) else {
        out.fill(f32::NAN);
        return;
    };
    for (o, &x) in out.iter_mut().zip(logits) {
        *o = lse.logprob(x);
    }
}

/// `ln(sum(exp(logits)))`, computed stably. -inf for an empty or fully
/// masked row, NaN if any logit is NaN or +inf.
pub fn logsumexp(logits: &[f32]) -> f32 {
    if logits.iter().any(|&x| x.is_nan() || x == f32::INFINITY) {
        return f32::NAN;
    }
    lse_parts(logits).map_or(f32::NEG_INFINITY, |l| l.value() as f32)
}

/// `None` if any logit is NaN/+inf or none is finite.
fn lse_parts(logits: &[f32]) -> Option<sampler::Lse> {
    let mut max = f32::NEG_INFINITY;
    for &x in logits {
        if x.is_nan() || x == f32::INFINITY {
            return None;
        }
        max = max.max(x);
    }
    (max > f32::NEG_INFINITY).then(|| sampler::Lse::new(logits, max))
}

/// Index of the largest logit; ties go to the lowest id. NaNs are ignored;
/// returns 0 for an empty or all-NaN row.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_val = f32::NEG_INFINITY;
    let mut found = false;
    for (i, &x) in logits.iter().enumerate() {
        if x.is_nan() {
            continue;
        }
        if !found || x > best_val {
            best = i;
            best_val = x;
            found = true;
        }
    }
    best as u32
}

/// Token ids that end generation (EOS, EOT, ...). Small sorted set; serialized as its ids.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "Vec<u32>", into = "Vec<u32>")]
pub struct StopTokens {
    ids: Vec<u32>,
}

impl From<Vec<u32>> for StopTokens {
    fn from(ids: Vec<u32>) -> Self {
        StopTokens::new(ids)
    }
}

impl From<StopTokens> for Vec<u32> {
    fn from(s: StopTokens) -> Self {
        s.ids
    }
}

impl StopTokens {
    pub fn new(ids: impl IntoIterator<Item = u32>) -> Self {
        let mut ids: Vec<u32> = ids.into_iter().collect();
        ids.sort_unstable();
        ids.dedup();
        Self { ids }
    }

    pub fn contains(&self, id: u32) -> bool {
        self.ids.binary_search(&id).is_ok()
    }

    /// Adds one id (e.g. a chat template's end-of-turn token).
    pub fn insert(&mut self, id: u32) {
        if let Err(pos) = self.ids.binary_search(&id) {
            self.ids.insert(pos, id);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// The ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.ids.iter().copied()
    }
}

impl FromIterator<u32> for StopTokens {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        Self::new(iter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_ties_go_to_the_lowest_id() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[0.0, -0.0]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    }

    #[test]
    fn argmax_ignores_nan_and_handles_empty() {
        assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 2.0]), 3);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn log_softmax_is_stable_for_huge_logits() {
        let logits = [1e30f32, 1e30, f32::NEG_INFINITY];
        let mut out = [0.0; 3];
        log_softmax(&logits, &mut out);
        assert!((out[0] - (-std::f32::consts::LN_2)).abs() < 1e-6);
        assert_eq!(out[0], out[1]);
        assert_eq!(out[2], f32::NEG_INFINITY);
    }

    #[test]
    fn log_softmax_of_a_masked_or_invalid_row_is_nan() {
        let mut out = [0.0; 2];
        log_softmax(&[f32::NEG_INFINITY; 2], &mut out);
        assert!(out.iter().all(|x| x.is_nan()));
        log_softmax(&[0.0, f32::NAN], &mut out);
        assert!(out.iter().all(|x| x.is_nan()));
    }

    #[test]
    fn stop_tokens_contain_exactly_their_ids() {
        let mut s = StopTokens::new([7, 2, 7]);
        assert_eq!(s.len(), 2);
        assert!(s.contains(2) && s.contains(7) && !s.contains(3));
        s.insert(3);
        assert_eq!(s.iter().collect::<Vec<_>>(), [2, 3, 7]);
        assert!(StopTokens::default().is_empty());
    }
}
