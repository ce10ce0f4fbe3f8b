//! Disaggregation: the gateway's router and the prefill and decode worker roles, talking over
//! authenticated, encrypted links (TCP between processes, in-memory pipes inside `serve`: the same code).
//!
//! The path of one request (see `docs/wire.md` for the bytes):
//!
//! 1. The router checks the request at its door (the engine's rule) and asks the least loaded
//!    decode worker to reserve the whole sequence. The decode worker checks again at its own
//!    door, reserves all pages or none through its engine's fair queue, and answers with a
//!    [`wire::Ticket`] (its nonce a fresh random capability).
//! 2. The router hands prompt and ticket to a prefill worker (the one with the least work once
//!    its cache of the request's own tenant is counted: `router::cache_map`), which checks
//!    again at its door, computes the prompt's KV, reports the first sampled token and streams
//!    KV frames straight to the decode worker over an encrypted link; the frames' keys are
//!    derived on both ends of that link, never sent.
//! 3. The decode worker verifies every frame against *its* reservation and the admitted prompt
//!    ([`wire::Transfer`]), writes it, and only on a complete transfer reports `Verified` and
//!    decodes. Any violation fails the request, frees its pages and counts
//!    `pagewarden_isolation_violations_total{kind}`.
//! 4. The router releases the first token only once decode verified the KV, then relays tokens.
//!    A client that goes away, a deadline, or a lost worker cancels the route on every node;
//!    a failure before the first token is retried once on other workers.

#![forbid(unsafe_code)]

mod constraints;
mod decode;
mod error;
pub mod exposition;
pub mod link;
pub mod metric_names;
pub mod metrics;
mod models;
pub mod net;
mod prefill;
pub mod proto;
mod router;
pub mod secrets;
mod session;
mod state;
mod tag_report;
mod tenancy;
mod tickets;
mod worker;

pub use error::{random, ClusterError};
pub use link::{
    GateFull, HandshakeGate, HandshakePermit, Identity, Link, MAX_PENDING_HANDSHAKES,
    MAX_PENDING_HANDSHAKES_PER_SOURCE, PREAUTH_TIMEOUT,
};
pub use metrics::WorkerMetrics;
pub use models::serve_models;
pub use net::{BoxIo, Listener, Net};
pub use router::{Router, RouterConfig, RoutingPolicy, WorkerInfo};
pub use secrets::SecretRing;
pub use state::{Gateways, WorkerConfig};
pub use worker::{run_worker, Worker};

/// BLAKE3 of a model file: what nodes compare at pairing.
pub fn model_digest(path: &std::path::Path) -> std::io::Result<[u8; 32]> {
    model_digest_of(&std::fs::File::open(path)?)
}

/// BLAKE3 of an open model file, from its first byte whatever its read position.
pub fn model_digest_of(mut file: &std::fs::File) -> std::io::Result<[u8; 32]> {
    use std::io::Seek;
    file.rewind()?;
    let mut h = blake3::Hasher::new();
    h.update_reader(std::io::BufReader::with_capacity(1 << 20, file))?;
    Ok(*h.finalize().as_bytes())
}
