//! The domain's shared vocabulary, at the bottom of the crate graph: who (tenant and request
//! identities, a page's owner, a node's role), what a generation yields (token events with
//! their log-probs, how it finished, its usage) and which isolation check failed
//! ([`ViolationKind`], a fixed set both ends of every link use). With the `serde` feature
//! they (de)serialize as themselves, so the control protocol carries them without mirrors.

#![forbid(unsafe_code)]

mod generation;
mod ids;
pub mod listening;
mod role;
mod violation;

pub use generation::{FinishReason, TokenEvent, TopLogprob, Usage};
pub use ids::{Owner, RequestId, TenantId};
pub use role::Role;
pub use violation::ViolationKind;
