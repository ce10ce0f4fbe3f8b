//! The sampler: penalties -> top_k -> top_p -> min_p -> temperature -> draw.

use std::cmp::Ordering;

use crate::rng::{entropy_seed, Rng};
use types::TopLogprob;

use crate::scan::{scan, Scan};
use crate::{argmax, SamplingError, SamplingParams};

/// The outcome of one sampling step.
///
/// `logprob` and `top` come from `log_softmax` of the *raw* logits (before
/// penalties, truncation and temperature), as OpenAI reports them. `top` holds
/// `top_logprobs` entries (fewer if fewer tokens are unmasked), sorted by
/// descending logprob, ties by lower id; masked (-inf) tokens never appear.
pub type Sampled = types::TokenEvent;

#[derive(Debug, Clone, Copy)]
struct Cand {
    logit: f32,
    id: u32,
}

/// The total order of candidates: higher logit first, then lower id.
/// Logits are never NaN here, so `partial_cmp` is total (and -0 == +0, as in
/// [`argmax`]).
fn before(a: &Cand, b: &Cand) -> Ordering {
    b.logit.partial_cmp(&a.logit).unwrap_or(Ordering::Equal).then(a.id.cmp(&b.id))
}

/// Where the tokens that survived truncation are.
enum Kept {
    /// Temperature 0: this token, probability 1.
    Greedy(u32),
    /// `cand` holds them sorted by id.
    ById,
    /// Every token at or before `pivot` in [`before`] order is kept; walk the
    /// logits row in id order (cheaper than sorting a large kept set).
    UpTo(Cand),
}

/// Samples tokens for one sequence. Holds the RNG and reusable buffers, so a
/// step allocates nothing but the returned `top` list.
///
/// The first `sample` fixes the vocabulary size; later rows of another length
/// are rejected.
#[derive(Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: Rng,
    vocab: Option<usize>,
    /// Penalised logits.
    work: Vec<f32>,
    /// Per-token scratch counters, all zero between calls.
    counts: Vec<u32>,
    cand: Vec<Cand>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Leave out the vocab-sized scratch buffers.
        f.debug_struct("Sampler")
            .field("params", &self.params)
            .field("seed", &self.seed)
            .field("vocab", &self.vocab)
            .finish_non_exhaustive()
    }
}

impl Sampler {
    /// A sampler seeded from `params.seed()`, or from OS entropy when unset.
    pub fn new(params: SamplingParams) -> Sampler {
        let seed = params.seed().unwrap_or_else(entropy_seed);
        Sampler {
            params,
            seed,
            rng: Rng::seed_from_u64(seed),
            vocab: None,
            work: Vec::new(),
            counts: Vec::new(),
            cand: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Advances the random stream past `n` draws: a decode worker continuing a sequence whose
    /// first token another node sampled with the same seed must not reuse that draw.
    pub fn skip_draws(&mut self, n: usize) {
        for _ in 0..n {
            self.rng.next_f64();
        }
    }

    /// The seed in use (drawn from entropy when the params had none), so an
    /// unseeded run can be logged and replayed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The next token. `history` is every token generated so far for this
    /// sequence: frequency/presence penalties count all of it,
    /// `repetition_penalty` only the last `penalty_last_n` tokens.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<Sampled, SamplingError> {
        let found = self.validate(logits, history)?;
        let token = match self.truncate(logits, history, &found)? {
            Kept::Greedy(t) => t,
            kept => self.draw(logits, &kept),
        };
        if !self.params.logprobs() {
            return Ok(Sampled { token, logprob: None, top: Vec::new() });
        }
        let lse = Lse::new(logits, found.max);
        let logprob = Some(lse.logprob(logits[token as usize]));
        let top = top_alternatives(logits, lse, self.params.top_logprobs());
        Ok(Sampled { token, logprob, top })
    }

    /// The distribution `sample` would draw from for these inputs, as
    /// `(token, probability)` in id order (after penalties, truncation and
    /// temperature). Does not advance the RNG. For tests and debugging.
    pub fn distribution(&mut self, logits: &[f32], history: &[u32]) -> Result<Vec<(u32, f64)>, SamplingError> {
        let found = self.validate(logits, history)?;
        let kept = self.truncate(logits, history, &found)?;
        if let Kept::Greedy(t) = kept {
            return Ok(vec![(t, 1.0)]);
        }
        let mut out = Vec::new();
        let row = self.row(logits);
        let temp = self.params.temperature();
        let max = max_kept(&self.cand);
        for_each_kept(row, &self.cand, &kept, |id, logit| {
            out.push((id, weight(logit, max, temp)));
            true
        });
        let total: f64 = out.iter().map(|(_, w)| w).sum();
        for (_, w) in &mut out {
            *w /= total;
        }
        Ok(out)
    }

    /// Checks shape and values in one pass that also finds the row's maximum and its first
    /// position (greedy's answer when nothing changes the row).
    fn validate(&mut self, logits: &[f32], history: &[u32]) -> Result<Scan, SamplingError> {
        if logits.is_empty() {
            return Err(SamplingError::EmptyLogits);
        }
        if let Some(expected) = self.vocab {
            if expected != logits.len() {
                return Err(SamplingError::LengthMismatch { expected, got: logits.len() });
            }
        }
        if u32::try_from(logits.len()).is_err() {
            return Err(SamplingError::VocabTooLarge { len: logits.len() });
        }
        let found = scan(logits);
        if let Some((index, value)) = found.invalid {
            return Err(SamplingError::InvalidLogit { index, value });
        }
        if found.max == f32::NEG_INFINITY {
            return Err(SamplingError::NoFiniteLogits);
        }
        if let Some(&token) = history.iter().find(|&&t| t as usize >= logits.len()) {
            return Err(SamplingError::TokenOutOfRange { token, vocab: logits.len() });
        }
        if let Some(&(token, _)) = self.params.logit_bias().iter().find(|&&(t, _)| t as usize >= logits.len()) {
            return Err(SamplingError::TokenOutOfRange { token, vocab: logits.len() });
        }
        self.vocab = Some(logits.len());
        Ok(found)
    }

    /// The row the chain works on: penalised copy or the raw logits.
    fn row<'a>(&'a self, logits: &'a [f32]) -> &'a [f32] {
        if !self.work.is_empty() {
            &self.work
        } else {
            logits
        }
    }

    /// Penalties, then top_k -> top_p -> min_p on `cand`. `found` is `logits`' scan.
    fn truncate(&mut self, logits: &[f32], history: &[u32], found: &Scan) -> Result<Kept, SamplingError> {
        let p = &self.params;
        self.work.clear();
        if p.has_penalties() && !history.is_empty() {
            apply_penalties(p, logits, history, &mut self.work, &mut self.counts);
        }
        if !p.logit_bias().is_empty() {
            if self.work.is_empty() {
                self.work.extend_from_slice(logits);
            }
            for &(t, b) in p.logit_bias() {
                // Ids past this vocabulary were refused by `validate`.
                self.work[t as usize] += b;
            }
        }
        let row: &[f32] = if self.work.is_empty() { logits } else { &self.work };

        if p.is_greedy() {
            // The raw row's first maximum is already known; a penalised one needs its own.
            let t = if self.work.is_empty() { found.first_max } else { argmax(row) };
            if row[t as usize] == f32::NEG_INFINITY {
                return Err(SamplingError::NoFiniteLogits);
            }
            return Ok(Kept::Greedy(t));
        }

        let max = if self.work.is_empty() { found.max } else { row.iter().copied().fold(f32::NEG_INFINITY, f32::max) };
        if max == f32::NEG_INFINITY {
            return Err(SamplingError::NoFiniteLogits);
        }
        let cand = &mut self.cand;
        cand.clear();
        let k = p.top_k();
        let top_p_on = p.top_p() < 1.0;
        // Sum of unnormalised temperature-1 weights of the top_k set, when known.
        let mut z = None;
        let sorted; // cand is fully sorted in `before` order
        if k > 0 && k <= SMALL_TOP_K && k < row.len() {
            // One pass keeping the best k sorted: O(V) compares, few inserts.
            for (i, &logit) in row.iter().enumerate() {
                if logit == f32::NEG_INFINITY || (cand.len() == k && cand.last().is_some_and(|w| logit <= w.logit)) {
                    continue;
                }
                let pos = cand.partition_point(|c| c.logit >= logit);
                cand.insert(pos, Cand { logit, id: i as u32 });
                cand.truncate(k);
            }
            sorted = true;
        } else {
            // Without top_k, top_p's nucleus lies within {p >= (1 - top_p) / V}:
            // the rest holds less than 1 - top_p of the mass. Filter before sorting.
            let mut floor = f32::NEG_INFINITY;
            if k == 0 && top_p_on {
                let zf = block_sum(row, 0, max, 1.0, &KEEP_ALL);
                let eps = (1.0 - f64::from(p.top_p())) / row.len() as f64;
                // A little below the bound, so exp rounding never drops a needed token.
                floor = (f64::from(max) + (zf * eps).ln() - 1e-3) as f32;
                z = Some(zf);
            }
            cand.extend(
                row.iter()
                    .enumerate()
                    .filter(|(_, &x)| x > f32::NEG_INFINITY && x >= floor)
                    .map(|(i, &logit)| Cand { logit, id: i as u32 }),
            );
            if k > 0 && k < cand.len() {
                cand.select_nth_unstable_by(k - 1, before);
                cand.truncate(k);
            }
            if k > 0 {
                cand.sort_unstable_by(before);
            }
            sorted = k > 0;
        }

        // top_p: smallest prefix with mass >= top_p (at least one token).
        if top_p_on {
            let z = z.unwrap_or_else(|| cand.iter().map(|c| weight(c.logit, max, 1.0)).sum());
            let target = f64::from(p.top_p()) * z;
            let mut cum = 0.0;
            let mut done = 0;
            let mut step = 64;
            'outer: while done < cand.len() {
                let take = step.min(cand.len() - done);
                if !sorted {
                    // Bring the next `take` best to the front of the rest, sort them.
                    let rest = &mut cand[done..];
                    if take < rest.len() {
                        rest.select_nth_unstable_by(take - 1, before);
                    }
                    rest[..take].sort_unstable_by(before);
                }
                for i in done..done + take {
                    cum += weight(cand[i].logit, max, 1.0);
                    if cum >= target {
                        cand.truncate(i + 1);
                        break 'outer;
                    }
                }
                done += take;
                step *= 4;
            }
        }

        // min_p: p / p_max >= min_p  <=>  logit - max >= ln(min_p).
        if p.min_p() > 0.0 {
            let threshold = f64::from(max) + f64::from(p.min_p()).ln();
            cand.retain(|c| f64::from(c.logit) >= threshold);
        }

        // Now `cand` is a prefix of the `before` order. Pick how to walk it in id order.
        if cand.len().saturating_mul(16) <= row.len() {
            cand.sort_unstable_by_key(|c| c.id);
            Ok(Kept::ById)
        } else {
            let pivot = cand.iter().copied().max_by(before).unwrap_or(Cand { logit: max, id: 0 });
            Ok(Kept::UpTo(pivot))
        }
    }

    /// Draws from the kept tokens with temperature applied. The walk is in id
    /// order with fixed-lane sums, so the result depends only on the seed and
    /// the inputs (not on std's sort/select or the platform's libm).
    fn draw(&mut self, logits: &[f32], kept: &Kept) -> u32 {
        let temp = self.params.temperature();
        let u = self.rng.next_f64();
        let row = self.row(logits);
        let cand = &self.cand;
        let max = max_kept(cand);
        let best = cand.iter().copied().min_by(before).map_or(0, |c| c.id);
        match kept {
            Kept::Greedy(t) => *t,
            Kept::ById => {
                let total: f64 = cand.iter().map(|c| weight(c.logit, max, temp)).sum();
                let r = u * total;
                let mut cum = 0.0;
                for c in cand {
                    cum += weight(c.logit, max, temp);
                    if r < cum {
                        return c.id;
                    }
                }
                best
            }
            Kept::UpTo(pivot) => {
                let total = block_sum(row, 0, max, temp, pivot);
                let r = u * total;
                let mut cum = 0.0;
                for (b, block) in row.chunks(DRAW_BLOCK).enumerate() {
                    let base = b * DRAW_BLOCK;
                    let s = block_sum(block, base, max, temp, pivot);
                    if r >= cum + s {
                        cum += s;
                        continue;
                    }
                    for (j, &logit) in block.iter().enumerate() {
                        cum += f64::from(kept_weight(logit, (base + j) as u32, max, temp, pivot));
                        if r < cum {
                            return (base + j) as u32;
                        }
                    }
                }
                best
            }
        }
    }
}

/// Block size of the draw's skip-ahead walk.
const DRAW_BLOCK: usize = 512;
const LANES: usize = 8;
/// A pivot that keeps every token (masked ones weigh 0 anyway).
const KEEP_ALL: Cand = Cand { logit: f32::NEG_INFINITY, id: u32::MAX };

/// Weight of a token if it is at or before `pivot`, else 0. Branch-free.
#[inline(always)]
fn kept_weight(logit: f32, id: u32, max: f32, temp: f32, pivot: &Cand) -> f32 {
    let keep = logit > pivot.logit || (logit == pivot.logit && id <= pivot.id);
    let w = fast_exp((logit - max) / temp);
    if keep {
        w
    } else {
        0.0
    }
}

/// Sum of [`kept_weight`] over `block` (ids from `base`), in fixed lanes so
/// it vectorises and always rounds the same way. This pass over the whole
/// vocabulary is most of a step's cost, so it is compiled for the widest
/// vectors the CPU has (the same operations in the same order: same bits).
fn block_sum(block: &[f32], base: usize, max: f32, temp: f32, pivot: &Cand) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature was just detected.
            return unsafe { block_sum_avx512(block, base, max, temp, pivot) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: as above.
            return unsafe { block_sum_avx2(block, base, max, temp, pivot) };
        }
    }
    block_sum_impl(block, base, max, temp, pivot)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn block_sum_avx512(block: &[f32], base: usize, max: f32, temp: f32, pivot: &Cand) -> f64 {
    block_sum_impl(block, base, max, temp, pivot)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block_sum_avx2(block: &[f32], base: usize, max: f32, temp: f32, pivot: &Cand) -> f64 {
    block_sum_impl(block, base, max, temp, pivot)
}

#[inline(always)]
fn block_sum_impl(block: &[f32], base: usize, max: f32, temp: f32, pivot: &Cand) -> f64 {
    let mut lanes = [0f64; LANES];
    let mut chunks = block.chunks_exact(LANES);
    for (c, chunk) in chunks.by_ref().enumerate() {
        let id0 = (base + c * LANES) as u32;
        for j in 0..LANES {
            lanes[j] += f64::from(kept_weight(chunk[j], id0.wrapping_add(j as u32), max, temp, pivot));
        }
    }
    let mut sum: f64 = lanes.iter().sum();
    let id0 = base + block.len() - chunks.remainder().len();
    for (j, &x) in chunks.remainder().iter().enumerate() {
        sum += f64::from(kept_weight(x, (id0 + j) as u32, max, temp, pivot));
    }
    sum
}

/// `exp((logit - max) / t)`: 1 for the best token, never overflows, 0 for
/// masked tokens. Plain f32 arithmetic ([`fast_exp`]), no libm, so every
/// platform computes the same bits; widened to f64 for accumulation.
fn weight(logit: f32, max: f32, temperature: f32) -> f64 {
    f64::from(fast_exp((logit - max) / temperature))
}

/// Tokens for which top_k takes the single-pass insertion path.
const SMALL_TOP_K: usize = 256;

/// `exp(x)` for f32 (Cephes `expf` polynomial, about 1 ulp), branch-free so it
/// vectorises, and bit-identical everywhere. Below -87 (and for -inf) it
/// returns 0.
#[inline(always)]
pub(crate) fn fast_exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let xc = x.clamp(-87.0, 88.0);
    let shifted = xc * LOG2E + ROUND;
    // The low mantissa bits of `shifted` hold n = round(x / ln 2) exactly.
    let n = shifted - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut y = 1.987_569_2e-4_f32;
    y = y * r + 1.398_199_9e-3;
    y = y * r + 8.333_452e-3;
    y = y * r + 4.166_579_6e-2;
    y = y * r + 1.666_666_5e-1;
    y = y * r + 0.5;
    y = y * r * r + r + 1.0;
    let scale = f32::from_bits(shifted.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
    if x < -87.0 {
        0.0
    } else {
        y * scale
    }
}

/// The best logit among the kept candidates (they always include the row max).
fn max_kept(cand: &[Cand]) -> f32 {
    cand.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max)
}

/// Calls `f(id, logit)` for each kept token in id order until it returns false.
fn for_each_kept(row: &[f32], cand: &[Cand], kept: &Kept, mut f: impl FnMut(u32, f32) -> bool) {
    match kept {
        Kept::Greedy(t) => {
            f(*t, row[*t as usize]);
        }
        Kept::ById => {
            for c in cand {
                if !f(c.id, c.logit) {
                    return;
                }
            }
        }
        Kept::UpTo(pivot) => {
            for (i, &logit) in row.iter().enumerate() {
                let c = Cand { logit, id: i as u32 };
                if logit > f32::NEG_INFINITY && before(&c, pivot) != Ordering::Greater && !f(c.id, logit) {
                    return;
                }
            }
        }
    }
}

/// Repetition penalty over the last `penalty_last_n` tokens (each distinct
/// token once: positive logits divided, negative multiplied), then OpenAI
/// frequency/presence penalties over the whole history. Writes into `work`.
fn apply_penalties(p: &SamplingParams, logits: &[f32], history: &[u32], work: &mut Vec<f32>, counts: &mut Vec<u32>) {
    work.extend_from_slice(logits);
    counts.resize(logits.len(), 0);
    let rep = p.repetition_penalty();
    if rep != 1.0 && p.penalty_last_n() > 0 {
        let recent = &history[history.len().saturating_sub(p.penalty_last_n())..];
        for &t in recent {
            let t = t as usize;
            if counts[t] == 0 {
                counts[t] = 1;
                let x = &mut work[t];
                if *x > 0.0 {
                    *x /= rep;
                } else {
                    *x *= rep;
                }
            }
        }
        for &t in recent {
            counts[t as usize] = 0;
        }
    }
    let (freq, presence) = (p.frequency_penalty(), p.presence_penalty());
    if freq != 0.0 || presence != 0.0 {
        for &t in history {
            counts[t as usize] = counts[t as usize].saturating_add(1);
        }
        for &t in history {
            let c = counts[t as usize];
            if c > 0 {
                work[t as usize] -= c as f32 * freq + presence;
                counts[t as usize] = 0;
            }
        }
    }
}

/// log-sum-exp kept as `max` and `ln(sum(exp(x - max)))`, so that
/// `(x - max) - ln_sum` stays exact for huge logits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lse {
    pub(crate) max: f64,
    pub(crate) ln_sum: f64,
}

impl Lse {
    /// `max` must be the row's maximum; the sum is accumulated in f64.
    pub(crate) fn new(logits: &[f32], max: f32) -> Self {
        let m = f64::from(max);
        let sum = block_sum(logits, 0, max, 1.0, &KEEP_ALL);
        Self { max: m, ln_sum: sum.ln() }
    }

    pub(crate) fn value(&self) -> f64 {
        self.max + self.ln_sum
    }

    pub(crate) fn logprob(&self, x: f32) -> f32 {
        ((f64::from(x) - self.max) - self.ln_sum) as f32
    }
}

/// The `n` best raw logits as log-probabilities; -inf tokens are skipped.
fn top_alternatives(logits: &[f32], lse: Lse, n: usize) -> Vec<TopLogprob> {
    if n == 0 {
        return Vec::new();
    }
    let mut top: Vec<Cand> = Vec::with_capacity(n + 1);
    for (i, &logit) in logits.iter().enumerate() {
        if logit == f32::NEG_INFINITY {
            continue;
        }
        if top.len() == n && top.last().is_some_and(|w| logit <= w.logit) {
            continue;
        }
        // After every equal logit: lower ids were seen first and stay ahead.
        let pos = top.partition_point(|c| c.logit >= logit);
        top.insert(pos, Cand { logit, id: i as u32 });
        top.truncate(n);
    }
    top.iter().map(|c| TopLogprob { token: c.id, logprob: lse.logprob(c.logit) }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn penalised(p: SamplingParams, logits: &[f32], history: &[u32]) -> Vec<f32> {
        let (mut work, mut counts) = (Vec::new(), Vec::new());
        apply_penalties(&p, logits, history, &mut work, &mut counts);
        assert!(counts.iter().all(|&c| c == 0), "scratch counters must be reset");
        work
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_logits_once_per_token() {
        let p = SamplingParams::builder().repetition_penalty(2.0).build().unwrap();
        let out = penalised(p, &[4.0, -4.0, 4.0, 0.0], &[0, 0, 0, 1, 3]);
        assert_eq!(out, [2.0, -8.0, 4.0, 0.0]);
    }

    #[test]
    fn repetition_penalty_only_sees_the_last_penalty_last_n_tokens() {
        let p = SamplingParams::builder().repetition_penalty(2.0).penalty_last_n(2).build().unwrap();
        let out = penalised(p, &[4.0, 4.0, 4.0], &[0, 1, 2, 2]);
        assert_eq!(out, [4.0, 4.0, 2.0]);
    }

    #[test]
    fn frequency_penalty_scales_with_count_and_presence_is_flat() {
        let p = SamplingParams::builder().frequency_penalty(0.5).presence_penalty(1.0).build().unwrap();
        let out = penalised(p, &[0.0; 4], &[1, 2, 2, 2]);
        assert_eq!(out, [0.0, -1.5, -2.5, 0.0]);
    }

    #[test]
    fn logit_bias_bans_and_forces_tokens_and_logprobs_stay_raw() {
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let ban = SamplingParams::builder().logit_bias(vec![(0, -100.0)]).build().unwrap();
        let s = Sampler::new(ban).sample(&logits, &[]).unwrap();
        assert_eq!(s.token, 1, "greedy skips the banned argmax");
        let force = SamplingParams::builder()
            .temperature(1.0)
            .seed(7)
            .logprobs(true)
            .logit_bias(vec![(3, 100.0)])
            .build()
            .unwrap();
        let mut sampler = Sampler::new(force);
        for _ in 0..50 {
            let s = sampler.sample(&logits, &[]).unwrap();
            assert_eq!(s.token, 3);
            // The log-probability reported is the model's own, before the bias.
            assert!(s.logprob.is_some_and(|l| (l - (0.0 - crate::logsumexp(&logits))).abs() < 1e-5));
        }
    }

    #[test]
    fn logit_bias_out_of_range_duplicated_or_naming_a_token_past_the_vocabulary_is_refused() {
        for bias in [vec![(1, 100.5)], vec![(1, f32::NAN)], vec![(1, 1.0), (1, 2.0)]] {
            let e = SamplingParams::builder().logit_bias(bias).build().unwrap_err();
            assert!(matches!(e, SamplingError::InvalidParam { field: "logit_bias", .. }), "{e}");
        }
        let past = SamplingParams::builder().logit_bias(vec![(9, 1.0)]).build().unwrap();
        let e = Sampler::new(past).sample(&[0.0; 4], &[]).unwrap_err();
        assert!(matches!(e, SamplingError::TokenOutOfRange { token: 9, vocab: 4 }), "{e}");
    }

    #[test]
    fn top_alternatives_break_ties_by_lower_id_and_skip_masked_tokens() {
        let logits = [1.0, 3.0, 3.0, f32::NEG_INFINITY, 2.0];
        let lse = Lse::new(&logits, 3.0);
        let ids: Vec<u32> = top_alternatives(&logits, lse, 5).iter().map(|t| t.token).collect();
        assert_eq!(ids, [1, 2, 4, 0]);
    }

    #[test]
    fn fast_exp_is_accurate_and_flushes_large_negatives_to_zero() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = f64::from(x).exp();
            let got = f64::from(fast_exp(x));
            assert!(((got - want) / want).abs() < 4e-7, "exp({x}) = {got}, want {want}");
            x += 0.0137;
        }
        assert_eq!(fast_exp(0.0), 1.0);
        assert_eq!(fast_exp(-100.0), 0.0);
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn candidate_order_is_higher_logit_then_lower_id() {
        let a = Cand { logit: 2.0, id: 5 };
        let b = Cand { logit: 1.0, id: 0 };
        let c = Cand { logit: 2.0, id: 6 };
        assert_eq!(before(&a, &b), Ordering::Less);
        assert_eq!(before(&a, &c), Ordering::Less);
        assert_eq!(before(&c, &a), Ordering::Greater);
    }
}
