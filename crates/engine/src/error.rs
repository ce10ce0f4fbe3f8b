use thiserror::Error;

use crate::ViolationKind;

/// Why a request was refused at the door. Nothing was queued, reserved or computed for it.
#[derive(Debug, Clone, Error, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    /// No worker could take the request, or one was lost before the first token.
    #[error("no worker available: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl EngineError {
    /// Classifies a failed forward pass: KV ownership and written-slot checks are isolation
    /// violations, anything else is internal.
    pub fn from_model(e: &model::ModelError) -> EngineError {
        use kv::KvError;
        match e {
            model::ModelError::Kv(KvError::StaleGeneration { .. }) => {
                EngineError::IsolationViolation { kind: ViolationKind::GenerationMismatch }
            }
            model::ModelError::Kv(KvError::WrongOwner { .. }) => {
                EngineError::IsolationViolation { kind: ViolationKind::OwnerMismatch }
            }
            model::ModelError::Kv(KvError::Unwritten { .. }) => {
                EngineError::IsolationViolation { kind: ViolationKind::UnwrittenRead }
            }
            other => EngineError::Internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kv::{KvError, Owner, RequestId, TenantId};
    use model::ModelError;

    #[test]
    fn ownership_and_written_slot_failures_are_isolation_violations() {
        let o = |t| Owner { tenant: TenantId(t), request: RequestId(t) };
        let cases = [
            (KvError::StaleGeneration { page: 3, expected: 1, found: 2 }, ViolationKind::GenerationMismatch),
            (KvError::WrongOwner { page: 3, expected: o(1), found: o(2) }, ViolationKind::OwnerMismatch),
            (KvError::Unwritten { layer: 0, pos: 5 }, ViolationKind::UnwrittenRead),
        ];
        for (e, kind) in cases {
            assert_eq!(EngineError::from_model(&ModelError::Kv(e)), EngineError::IsolationViolation { kind });
        }
        let other = ModelError::Input("x".into());
        assert!(matches!(EngineError::from_model(&other), EngineError::Internal(_)));
    }
}
