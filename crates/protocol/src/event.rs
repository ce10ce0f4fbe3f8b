//! A request's stream of events, as the gateway receives it.

use tokio::sync::mpsc;
use types::{FinishReason, RequestId, TokenEvent, Usage};

use crate::RequestError;

/// One message of a request's stream. A stream ends with exactly one `Finished` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The request left the queue and its pages are reserved (its prompt is being computed).
    Started,
    /// Right after `Started`, when a prefix cache was consulted: how many leading prompt
    /// tokens it served (0: a miss).
    PrefixCache {
        cached_tokens: usize,
    },
    Token(TokenEvent),
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
    Failed(RequestError),
}

/// The receiving end of a request. Dropping it cancels the request: whatever runs it frees
/// its pages.
#[derive(Debug)]
pub struct EventStream {
    rx: mpsc::UnboundedReceiver<Event>,
    id: RequestId,
}

/// The sending end: `is_closed` once the receiver was dropped (the request must then be
/// cancelled).
#[derive(Debug, Clone)]
pub struct EventSender(mpsc::UnboundedSender<Event>);

impl EventSender {
    /// False when the receiving side is gone.
    pub fn send(&self, ev: Event) -> bool {
        self.0.send(ev).is_ok()
    }

    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }

    /// Completes when the receiving side is dropped.
    pub async fn closed(&self) {
        self.0.closed().await
    }
}

impl EventStream {
    /// A new stream for request `id` and the sender that feeds it.
    pub fn channel(id: RequestId) -> (EventSender, EventStream) {
        let (tx, rx) = mpsc::unbounded_channel();
        (EventSender(tx), EventStream { rx, id })
    }

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
