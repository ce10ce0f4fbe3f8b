//! What a request is inside the engine, and what comes back from it: the client's events
//! and, for the worker roles, the handoff of pages (which never leave the workers).

use std::time::Instant;

use kv::{BlockTable, RequestId, TenantId};
use protocol::RequestError;
use sampling::{SamplingParams, StopTokens};
use tokio::sync::mpsc;
use types::{FinishReason, TokenEvent, Usage};

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
    /// A client's salt narrowing prefix-cache sharing within the tenant (never widening it:
    /// the cache scope is derived from `tenant` first).
    pub cache_salt: Option<String>,
    /// The grammar every sampled token must continue (`response_format`, tools); its state
    /// advances with each token.
    pub constraint: Option<grammar::Constraint>,
    /// A router's names for the prompt's whole pages, attached to them when they are sealed
    /// into the prefix cache (see [`kv::RouteTag`]); empty when no router asks.
    pub route_tags: Vec<kv::RouteTag>,
}

/// One message of a request's stream. A stream ends with exactly one `Finished` or `Failed`,
/// or (for the worker roles) one `Reserved` or `Prefilled`, which hands over the pages.
#[derive(Debug)]
pub enum Event {
    /// The request left the queue and its pages are reserved (prefill starts).
    Started,
    Token(TokenEvent),
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
    Failed(RequestError),
    /// [`crate::EngineHandle::reserve`]: the pages of the whole sequence, empty, for a transfer
    /// to fill. Dropping the table frees them.
    Reserved(BlockTable),
    /// [`crate::EngineHandle::prefill`]: the prompt's KV and the first sampled token (not
    /// checked against stop tokens: the decode side does that).
    Prefilled {
        first: TokenEvent,
        kv: BlockTable,
    },
    /// Right after `Started`, when the prefix cache was consulted: how many leading prompt
    /// tokens it served (0: a miss).
    PrefixCache {
        cached_tokens: usize,
    },
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
