//! `pagewarden audit` as a library: drives a running deployment as several tenants at once
//! and reports every place a secret crossed a tenant boundary.
//!
//! A run ([`run_audit`]) is a [`run::Run`] that goes through seven phases, in order:
//! 1. **discover**: each tenant's model (among those `/v1/models` lists for its key, spread
//!    over every model: [`target`]), and per model the context window (given, listed, or read
//!    from the server's refusal of an impossible `max_tokens`), the audit's own prompt counter
//!    ([`meter`]) and how many tokens a word of filler costs; every `/metrics` endpoint.
//! 2. **plan**: the requests ([`workload`]), each carrying canaries only its tenant knows
//!    ([`canary`]), with near-window and over-long prompts, disconnects, pool-exhausting
//!    bursts and shared prefixes mixed in; every prompt counted by the audit before it is sent.
//! 3. **load**: send them with `concurrency` clients and judge every answer ([`examine`]):
//!    foreign canaries in text or raw bytes, over-long prompts answered, prompts under-reported.
//! 4. **re-run**: re-send requests of every category alone, one tenant at a time, and compare
//!    tokens and log-probs with the answer under load ([`rerun`]): any difference is a
//!    divergence when the target is batch-invariant.
//! 5. **probe**: the timing probe ([`timing`]): can one tenant tell another's cached prefixes
//!    from fresh ones by time to first token? One request at a time, nothing else in flight.
//! 6. **settle**: wait for every KV page gauge to return to zero and compare the metrics
//!    ([`settle`]).
//! 7. **report**: report.md, report.json and report.svg ([`report`]).
//!
//! Pass: no canary in another request's response, no divergence, no page left in use, no
//! over-long prompt accepted, no prefix-cache hit across tenants, no timing side channel.
//! Errors (including those caused by injected faults) are counted and reported, not failures.

#![forbid(unsafe_code)]

mod canary;
mod cli;
mod client;
mod discover;
mod error;
mod examine;
mod finding;
mod meter;
mod options;
mod own_prefix;
mod planning;
mod probe;
mod progress;
mod prom;
mod prose;
mod proxy;
pub mod relay;
mod report;
mod rerun;
mod rng;
mod run;
mod settle;
mod spawn;
pub mod stats;
mod svg;
mod sync;
mod target;
mod tenants;
mod timing;
mod workload;

pub use self::cli::{run, AuditArgs};
pub use self::error::{chain, AuditError};
pub use self::finding::Finding;
pub use self::options::{AuditHooks, AuditOptions, NoHooks, SkippedCheck, TokenizerFile};
pub use self::prose::filler;
pub use self::report::Counts;
/// Seeded filler prose, for other tools' prompts (`bench prefix-cache`).
pub use self::rng::Rng;
pub use self::run::{run_audit, AuditOutcome};
pub use self::spawn::INCIDENT_SELF_TEST_ENV;
pub use self::tenants::{load as load_tenants, TenantKey};
