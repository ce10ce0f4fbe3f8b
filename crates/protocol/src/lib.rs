//! The request contract: what the gateway hands to whatever runs its requests (the cluster
//! router, whose workers run in this process or on other machines) and what comes back.
//!
//! - [`RouteRequest`]: a validated request as plain data. It travels to the workers as itself
//!   (the output format as an opaque bounded string, sampling parameters validated again when
//!   they are read), and each worker builds its engine's own request from it.
//! - [`Event`] on an [`EventStream`]: started, prefix cache, tokens, then exactly one
//!   finished or failed. Dropping the stream cancels the request.
//! - [`AdmissionError`] (refused at a door, nothing reserved) and [`RequestError`] (an admitted
//!   request failed), the same kinds at every hop and on the wire.
//! - [`PoolStats`]: one engine's pool and step counters, summed over workers by
//!   [`PoolStats::absorb`].
//!
//! The engine's own handoff events (a decode reservation, a prefilled prompt's pages) are not
//! here: they never leave the workers.

#![forbid(unsafe_code)]

mod error;
mod event;
mod request;
mod stats;

pub use error::{AdmissionError, RequestError};
pub use event::{Event, EventSender, EventStream};
pub use request::{after_ms, RouteRequest, DEFAULT_DEADLINE};
pub use stats::{PageKind, PageRun, PoolStats};
pub use types::{FinishReason, RequestId, TenantId, TokenEvent, TopLogprob, Usage, ViolationKind};
