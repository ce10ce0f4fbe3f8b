//! What a generation yields: each token with its log-probability and alternatives, how it
//! finished, and its token counts.

/// One alternative at a sampled position.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TopLogprob {
    pub token: u32,
    pub logprob: f32,
}

/// A sampled token.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TokenEvent {
    pub token: u32,
    /// Present when the request asked for log-probabilities (computing it is a pass over the
    /// whole vocabulary).
    pub logprob: Option<f32>,
    pub top: Vec<TopLogprob>,
}

/// Why a generation ended normally (a failure is an error, never a finish reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum FinishReason {
    Stop,
    Length,
}

/// A request's token counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache (OpenAI's
    /// `prompt_tokens_details.cached_tokens`).
    pub cached_tokens: usize,
}
