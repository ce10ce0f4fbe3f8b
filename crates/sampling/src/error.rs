//! The one error type of the crate.

/// Why parameters could not be validated or a token could not be sampled.
///
/// Parameter errors name the field and its allowed range so the server can
/// pass the message straight back to the client (HTTP 400).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// A sampling parameter is NaN or outside its allowed range.
    #[error("invalid sampling parameter `{field}` = {value}: must be in {allowed}")]
    InvalidParam {
        /// Field name as the API spells it (`temperature`, `top_p`, ...).
        field: &'static str,
        /// The rejected value, formatted.
        value: String,
        /// The allowed range, e.g. `[0, 2]`.
        allowed: &'static str,
    },
    /// The logits row is empty.
    #[error("logits are empty")]
    EmptyLogits,
    /// The logits row does not have the vocabulary size this sampler saw first.
    #[error("logits have length {got}, expected the vocabulary size {expected}")]
    LengthMismatch { expected: usize, got: usize },
    /// More logits than a `u32` token id can address.
    #[error("vocabulary of {len} tokens is larger than u32 token ids allow")]
    VocabTooLarge { len: usize },
    /// A logit is NaN or +inf (-inf is allowed: it masks a token).
    #[error("logit {index} is {value}: logits must be finite or -inf")]
    InvalidLogit { index: usize, value: f32 },
    /// Every token is masked (-inf): nothing can be sampled.
    #[error("every logit is -inf: no token can be sampled")]
    NoFiniteLogits,
    /// A token id in the history is not in the vocabulary.
    #[error("history token {token} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { token: u32, vocab: usize },
}
