use thiserror::Error;

/// Why a request was refused at the door. Nothing was queued, reserved or computed for it.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum AdmissionError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    #[error(
        "this model's maximum context length is {context} tokens; the request needs {needed} \
         ({prompt} in the prompt + {max_tokens} to generate)"
    )]
    ContextLengthExceeded { prompt: usize, max_tokens: usize, needed: usize, context: usize },
    #[error("the request needs {needed} KV slots but the whole pool holds {capacity}")]
    ExceedsPool { needed: usize, capacity: usize },
    #[error("token id {id} is outside the vocabulary ({vocab})")]
    InvalidToken { id: u32, vocab: usize },
    #[error("the queue is full ({limit} requests waiting)")]
    QueueFull { limit: usize },
    #[error("the engine is shutting down")]
    ShuttingDown,
}

/// Why an admitted request failed. It ends the request's stream; its pages are already freed.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum EngineError {
    #[error("no KV pages became free within the queue timeout")]
    QueueTimeout,
    #[error("the request's deadline passed")]
    DeadlineExceeded,
    #[error("the engine is shutting down")]
    ShuttingDown,
    #[error("internal error: {0}")]
    Internal(String),
}
