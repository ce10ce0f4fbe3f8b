//! The engine: one thread that owns the model and the KV pool and runs the step loop.
//!
//! Requests are checked at the door ([`EngineHandle::submit`]) against the same rule as
//! everywhere else (prompt + max tokens within the context window and within the pool) before
//! anything is queued or reserved. Admitted requests wait in per-tenant queues; each step the
//! scheduler admits round-robin across tenants while the pool can hold a request's whole
//! sequence (reserved up front, all or nothing, so a running request can never run out of
//! pages), then runs one forward pass over every running sequence: one token for each decoding
//! sequence plus prefill chunks, within a token budget (before it, prompts that can finish in a
//! short step of their own may run ahead of a long decode step: `pacing`; while several tenants
//! decode, their decode rows share the step fairly: `row_share`). A dropped
//! [`RequestStream`] cancels its request, whose pages are freed before the next step.
//!
//! A decoding sequence's row may also carry tokens guessed from its own prompt and output
//! (`draft`, when configured), all verified in that one pass; only guesses equal to what
//! sampling draws are kept, so the output is the same as without them.
//!
//! For the disaggregated roles the same loop also runs the two halves of a request: a prefill
//! worker's [`EngineHandle::prefill`] (reserve the prompt, compute its KV, sample the first
//! token, hand the pages over) and a decode worker's [`EngineHandle::reserve`] (the whole
//! sequence, all or nothing, through the same fair queue) then [`EngineHandle::resume`] (decode
//! from KV that a verified transfer wrote).

#![forbid(unsafe_code)]

mod admission;
mod draft;
mod error;
mod handle;
mod inbox;
mod pacing;
mod request;
mod row_share;
mod scheduler;
mod sequence;
mod settings;

pub use handle::{door_check, Engine, EngineHandle};
pub use request::{Event, GenRequest, RequestStream};
pub use settings::{EngineConfig, Revoke, TenantPolicy};
pub use types::{FinishReason, TokenEvent, Usage, ViolationKind};
