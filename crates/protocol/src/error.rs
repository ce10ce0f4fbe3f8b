//! Why a request was refused or failed: the same kinds at every door and on the wire. A peer
//! sends one of these as itself, so it can never mint a kind (or a metrics label) of its own.

use serde::{Deserialize, Serialize};
use thiserror::Error;
use types::ViolationKind;

/// Why a request was refused at the door. Nothing was queued, reserved or computed for it.
#[derive(Debug, Clone, Error, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Error, PartialEq, Eq, Serialize, Deserialize)]
pub enum RequestError {
    #[error("no KV pages became free within the queue timeout")]
    QueueTimeout,
    #[error("the request's deadline passed")]
    DeadlineExceeded,
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// A page ownership or integrity check failed (invariant 10): the request is failed and
    /// its pages freed; `kind` names the check for metrics.
    #[error("isolation check failed ({kind}); the request was stopped")]
    IsolationViolation { kind: ViolationKind },
    /// The tenant was removed or its key rotated while the request ran.
    #[error("the API key of this request was revoked")]
    TenantRevoked,
    /// A worker refused the request at its own door (the gateway's check should have).
    #[error("a worker refused the request: {0}")]
    Refused(AdmissionError),
    /// No worker could take the request, or one was lost before the first token (a route
    /// failing this way is tried once more elsewhere).
    #[error("no worker available: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}
