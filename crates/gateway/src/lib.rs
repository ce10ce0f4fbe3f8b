//! The gateway: pagewarden's OpenAI-compatible HTTP server.
//!
//! A request's path: [`api`] authenticates the key ([`tenants`], constant-time digest lookup),
//! takes the tenant's concurrency and queue slots ([`limits`]) before any work for it, reads
//! the body (size-limited, with a deadline), parses and validates it into a request only the
//! validator can build ([`api::validate`]: bad JSON or a bad field is a 400 naming it; the
//! door check runs there, so a request that cannot be served whole is refused before any page
//! is reserved), charges the tenant's tokens per minute, submits each choice as a
//! `protocol::RouteRequest` to the model's `cluster::Router`, and waits for the first event
//! before answering, so that errors up to then are proper HTTP errors built by one function
//! ([`error::ApiError::response`]). Streams are server-sent events in OpenAI's chunk format; a
//! failure after streaming began ends with an error event and no `[DONE]`. A client that
//! disconnects drops its `protocol::EventStream`, which cancels the request on its workers.
//!
//! The deployment around it (configuration, model loading, topologies, signals) is the `node`
//! crate's; [`http::run`] is what it starts.

#![forbid(unsafe_code)]

pub mod admin;
pub mod api;
pub mod error;
pub mod http;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod served;
pub mod settings;
pub mod state;
pub mod tenants;
pub mod tls;
pub mod usage;
