//! What a request is, and what comes back from it.

use std::time::Instant;

use kv::{RequestId, TenantId};
use sampling::{SamplingParams, StopTokens, TopLogprob};
use tokio::sync::mpsc;

/// A tokenized generation request.
#[derive(Debug, Clone)]
pub struct GenRequest {
    pub id: RequestId,
    pub tenant: TenantId,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation ends (finish reason `stop`) when one of these is sampled; it is not emitted.
    pub stop_tokens: StopTokens,
    /// The request fails with `DeadlineExceeded` (pages freed) if it is still running then.
    pub deadline: Option<Instant>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

#[derive(Debug, Clone)]
pub struct TokenEvent {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<TopLogprob>,
}

/// One message of a request's stream. A stream ends with exactly one `Finished` or `Failed`.
#[derive(Debug, Clone)]
pub enum Event {
    /// The request left the queue and its pages are reserved (prefill starts).
    Started,
    Token(TokenEvent),
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
    Failed(crate::EngineError),
}

/// The receiving end of a request. Dropping it cancels the request: the engine frees its pages
/// before its next step.
pub struct RequestStream {
    pub(crate) rx: mpsc::UnboundedReceiver<Event>,
    pub(crate) id: RequestId,
}

impl RequestStream {
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next event, or None once the stream has ended.
    pub async fn next(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// Blocking variant, for non-async callers (tests, tools). Must not be called inside an
    /// async runtime.
    pub fn blocking_next(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }
}
