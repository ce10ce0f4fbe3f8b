//! Validated sampling parameters.

use crate::SamplingError;

/// How many of the most recent history tokens `repetition_penalty` looks at
/// (llama.cpp's `penalty_last_n` default).
pub const PENALTY_LAST_N: usize = 64;
/// The most alternatives `top_logprobs` may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// The most tokens one `logit_bias` may name (OpenAI documents none; this bounds the work a
/// request adds to every step).
pub const MAX_LOGIT_BIAS: usize = 1024;
/// A bias lies in `[-100, 100]` (OpenAI's range: -100 bans a token, 100 all but forces it).
pub const LOGIT_BIAS_LIMIT: f32 = 100.0;

/// Unvalidated parameters as a request carries them. Integers are signed so
/// that a negative value from a client is reported instead of wrapping.
/// `Default` is greedy decoding with every filter and penalty off.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RawSamplingParams {
    /// `[0, 2]`; 0 = greedy.
    pub temperature: f32,
    /// `>= 0`; 0 = off.
    pub top_k: i64,
    /// `(0, 1]`; 1 = off.
    pub top_p: f32,
    /// `[0, 1]`; 0 = off.
    pub min_p: f32,
    /// `(0, 10]`; 1 = off.
    pub repetition_penalty: f32,
    /// `[-2, 2]`; 0 = off.
    pub frequency_penalty: f32,
    /// `[-2, 2]`; 0 = off.
    pub presence_penalty: f32,
    /// `0..=20`.
    pub top_logprobs: i64,
    /// The sampled token's log-probability is wanted (OpenAI `logprobs`); implied by
    /// `top_logprobs > 0`. Without it the sampler skips the pass over the vocabulary that the
    /// log-probability needs.
    #[serde(default)]
    pub logprobs: bool,
    /// `None` = a fresh seed from the OS per sampler.
    pub seed: Option<u64>,
    /// Window of `repetition_penalty`, in most recent history tokens.
    pub penalty_last_n: usize,
    /// `(token, bias)` added to the token's logit before anything else; each bias in
    /// `[-100, 100]`, at most [`MAX_LOGIT_BIAS`] tokens, each named once.
    #[serde(default)]
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for RawSamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            top_logprobs: 0,
            logprobs: false,
            seed: None,
            penalty_last_n: PENALTY_LAST_N,
            logit_bias: Vec::new(),
        }
    }
}

/// Parameters that passed validation. Only [`SamplingParams::new`] and
/// [`SamplingParamsBuilder::build`] produce one. `Default` = greedy. Serialized as
/// [`RawSamplingParams`] and validated again when deserialized: a peer cannot hand over a
/// value the validator would have refused.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "RawSamplingParams", into = "RawSamplingParams")]
pub struct SamplingParams {
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    repetition_penalty: f32,
    frequency_penalty: f32,
    presence_penalty: f32,
    top_logprobs: usize,
    logprobs: bool,
    seed: Option<u64>,
    penalty_last_n: usize,
    /// Sorted by token, each token once.
    logit_bias: std::sync::Arc<[(u32, f32)]>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            top_logprobs: 0,
            logprobs: false,
            seed: None,
            penalty_last_n: PENALTY_LAST_N,
            logit_bias: std::sync::Arc::new([]),
        }
    }
}

fn invalid(field: &'static str, value: impl ToString, allowed: &'static str) -> SamplingError {
    SamplingError::InvalidParam { field, value: value.to_string(), allowed }
}

/// `ok` is written so that NaN fails it.
fn check(field: &'static str, v: f32, ok: bool, allowed: &'static str) -> Result<(), SamplingError> {
    if ok && !v.is_nan() {
        Ok(())
    } else {
        Err(invalid(field, v, allowed))
    }
}

impl TryFrom<RawSamplingParams> for SamplingParams {
    type Error = SamplingError;

    fn try_from(raw: RawSamplingParams) -> Result<Self, SamplingError> {
        SamplingParams::new(raw)
    }
}

impl From<SamplingParams> for RawSamplingParams {
    fn from(p: SamplingParams) -> Self {
        p.to_raw()
    }
}

impl SamplingParams {
    /// Validates every field; the error names the first bad field and its range.
    pub fn new(raw: RawSamplingParams) -> Result<Self, SamplingError> {
        let t = raw.temperature;
        check("temperature", t, (0.0..=2.0).contains(&t), "[0, 2]")?;
        if raw.top_k < 0 {
            return Err(invalid("top_k", raw.top_k, ">= 0 (0 = off)"));
        }
        let p = raw.top_p;
        check("top_p", p, p > 0.0 && p <= 1.0, "(0, 1]")?;
        let m = raw.min_p;
        check("min_p", m, (0.0..=1.0).contains(&m), "[0, 1]")?;
        let r = raw.repetition_penalty;
        check("repetition_penalty", r, r > 0.0 && r <= 10.0, "(0, 10]")?;
        let f = raw.frequency_penalty;
        check("frequency_penalty", f, (-2.0..=2.0).contains(&f), "[-2, 2]")?;
        let pr = raw.presence_penalty;
        check("presence_penalty", pr, (-2.0..=2.0).contains(&pr), "[-2, 2]")?;
        if !(0..=MAX_TOP_LOGPROBS as i64).contains(&raw.top_logprobs) {
            return Err(invalid("top_logprobs", raw.top_logprobs, "0..=20"));
        }
        if raw.logit_bias.len() > MAX_LOGIT_BIAS {
            return Err(invalid("logit_bias", format!("{} tokens", raw.logit_bias.len()), "at most 1024 tokens"));
        }
        let mut bias = raw.logit_bias;
        for &(_, b) in &bias {
            check("logit_bias", b, (-LOGIT_BIAS_LIMIT..=LOGIT_BIAS_LIMIT).contains(&b), "[-100, 100] per token")?;
        }
        bias.sort_unstable_by_key(|&(t, _)| t);
        if let Some(w) = bias.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(invalid("logit_bias", format!("token {} twice", w[0].0), "each token once"));
        }
        Ok(Self {
            temperature: t,
            top_k: usize::try_from(raw.top_k).unwrap_or(usize::MAX),
            top_p: p,
            min_p: m,
            repetition_penalty: r,
            frequency_penalty: f,
            presence_penalty: pr,
            top_logprobs: raw.top_logprobs as usize,
            logprobs: raw.logprobs || raw.top_logprobs > 0,
            seed: raw.seed,
            penalty_last_n: raw.penalty_last_n,
            logit_bias: bias.into(),
        })
    }

    /// A builder starting from the greedy defaults.
    pub fn builder() -> SamplingParamsBuilder {
        SamplingParamsBuilder::default()
    }

    /// Greedy decoding (the default).
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Back to the raw form (e.g. to tweak one field and re-validate).
    pub fn to_raw(&self) -> RawSamplingParams {
        RawSamplingParams {
            temperature: self.temperature,
            top_k: self.top_k as i64,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            top_logprobs: self.top_logprobs as i64,
            logprobs: self.logprobs,
            seed: self.seed,
            penalty_last_n: self.penalty_last_n,
            logit_bias: self.logit_bias.to_vec(),
        }
    }

    pub fn temperature(&self) -> f32 {
        self.temperature
    }
    /// 0 = off.
    pub fn top_k(&self) -> usize {
        self.top_k
    }
    pub fn top_p(&self) -> f32 {
        self.top_p
    }
    pub fn min_p(&self) -> f32 {
        self.min_p
    }
    pub fn repetition_penalty(&self) -> f32 {
        self.repetition_penalty
    }
    pub fn frequency_penalty(&self) -> f32 {
        self.frequency_penalty
    }
    pub fn presence_penalty(&self) -> f32 {
        self.presence_penalty
    }
    pub fn top_logprobs(&self) -> usize {
        self.top_logprobs
    }
    /// Whether each sampled token carries its log-probability.
    pub fn logprobs(&self) -> bool {
        self.logprobs
    }
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }
    pub fn penalty_last_n(&self) -> usize {
        self.penalty_last_n
    }
    /// Temperature 0: argmax after penalties, no randomness.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
    /// Whether any penalty changes logits.
    /// The same parameters with another seed (`None`: fresh entropy per sampler).
    pub fn with_seed(&self, seed: Option<u64>) -> Self {
        Self { seed, ..self.clone() }
    }

    /// `(token, bias)` sorted by token.
    pub fn logit_bias(&self) -> &[(u32, f32)] {
        &self.logit_bias
    }

    pub fn has_penalties(&self) -> bool {
        (self.repetition_penalty != 1.0 && self.penalty_last_n > 0)
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
    }
}

/// Builder for [`SamplingParams`]; `build` validates.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingParamsBuilder {
    raw: RawSamplingParams,
}

impl SamplingParamsBuilder {
    pub fn temperature(mut self, v: f32) -> Self {
        self.raw.temperature = v;
        self
    }
    pub fn top_k(mut self, v: i64) -> Self {
        self.raw.top_k = v;
        self
    }
    pub fn top_p(mut self, v: f32) -> Self {
        self.raw.top_p = v;
        self
    }
    pub fn min_p(mut self, v: f32) -> Self {
        self.raw.min_p = v;
        self
    }
    pub fn repetition_penalty(mut self, v: f32) -> Self {
        self.raw.repetition_penalty = v;
        self
    }
    pub fn frequency_penalty(mut self, v: f32) -> Self {
        self.raw.frequency_penalty = v;
        self
    }
    pub fn presence_penalty(mut self, v: f32) -> Self {
        self.raw.presence_penalty = v;
        self
    }
    pub fn top_logprobs(mut self, v: i64) -> Self {
        self.raw.top_logprobs = v;
        self
    }
    pub fn logprobs(mut self, v: bool) -> Self {
        self.raw.logprobs = v;
        self
    }
    /// Accepts `42` or `None`.
    pub fn seed(mut self, v: impl Into<Option<u64>>) -> Self {
        self.raw.seed = v.into();
        self
    }
    pub fn penalty_last_n(mut self, v: usize) -> Self {
        self.raw.penalty_last_n = v;
        self
    }
    pub fn logit_bias(mut self, v: Vec<(u32, f32)>) -> Self {
        self.raw.logit_bias = v;
        self
    }
    pub fn build(self) -> Result<SamplingParams, SamplingError> {
        SamplingParams::new(self.raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(e: SamplingError) -> &'static str {
        match e {
            SamplingError::InvalidParam { field, .. } => field,
            other => panic!("not a parameter error: {other}"),
        }
    }

    #[test]
    fn default_params_are_greedy_and_valid() {
        let p = SamplingParams::default();
        assert!(p.is_greedy());
        assert!(!p.has_penalties());
        assert_eq!(SamplingParams::new(RawSamplingParams::default()), Ok(p.clone()));
        assert_eq!(SamplingParams::builder().build(), Ok(p));
    }

    #[test]
    fn boundary_values_are_accepted() {
        let p = SamplingParams::builder()
            .temperature(2.0)
            .top_k(0)
            .top_p(1.0)
            .min_p(1.0)
            .repetition_penalty(10.0)
            .frequency_penalty(-2.0)
            .presence_penalty(2.0)
            .top_logprobs(20)
            .seed(3)
            .build()
            .unwrap();
        assert_eq!(p.temperature(), 2.0);
        assert_eq!(p.top_logprobs(), 20);
        assert_eq!(p.seed(), Some(3));
        assert_eq!(SamplingParams::new(p.to_raw()), Ok(p));
        assert!(SamplingParams::builder().top_p(f32::MIN_POSITIVE).build().is_ok());
    }

    #[test]
    fn out_of_range_values_are_rejected_naming_the_field_and_range() {
        let b = SamplingParams::builder;
        let cases: Vec<(SamplingParamsBuilder, &str, &str)> = vec![
            (b().temperature(-0.1), "temperature", "[0, 2]"),
            (b().temperature(2.01), "temperature", "[0, 2]"),
            (b().top_k(-1), "top_k", ">= 0"),
            (b().top_p(0.0), "top_p", "(0, 1]"),
            (b().top_p(1.5), "top_p", "(0, 1]"),
            (b().min_p(-0.5), "min_p", "[0, 1]"),
            (b().min_p(1.01), "min_p", "[0, 1]"),
            (b().repetition_penalty(0.0), "repetition_penalty", "(0, 10]"),
            (b().repetition_penalty(10.5), "repetition_penalty", "(0, 10]"),
            (b().frequency_penalty(-2.5), "frequency_penalty", "[-2, 2]"),
            (b().presence_penalty(3.0), "presence_penalty", "[-2, 2]"),
            (b().top_logprobs(21), "top_logprobs", "0..=20"),
            (b().top_logprobs(-1), "top_logprobs", "0..=20"),
        ];
        for (builder, field, range) in cases {
            let err = builder.build().unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(field), "{msg} should name {field}");
            assert!(msg.contains(range), "{msg} should state {range}");
            assert_eq!(field_of(err), field);
        }
    }

    #[test]
    fn nan_is_rejected_in_every_float_field() {
        let b = SamplingParams::builder;
        let nan = f32::NAN;
        let cases = [
            (b().temperature(nan), "temperature"),
            (b().top_p(nan), "top_p"),
            (b().min_p(nan), "min_p"),
            (b().repetition_penalty(nan), "repetition_penalty"),
            (b().frequency_penalty(nan), "frequency_penalty"),
            (b().presence_penalty(nan), "presence_penalty"),
        ];
        for (builder, field) in cases {
            let err = builder.build().unwrap_err();
            assert!(err.to_string().contains("NaN"), "{err}");
            assert_eq!(field_of(err), field);
        }
    }

    #[test]
    fn infinities_are_rejected() {
        assert!(SamplingParams::builder().temperature(f32::INFINITY).build().is_err());
        assert!(SamplingParams::builder().frequency_penalty(f32::NEG_INFINITY).build().is_err());
    }
}
