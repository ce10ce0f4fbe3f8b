//! The router's settings: what a gateway hands its router for one served model. A leaf of its
//! own, so the registry (which checks a registering worker against it) and the route of a
//! request (its timeouts, the vocabulary) read it without going through the facade.

use std::time::Duration;

use crate::link::Identity;

#[derive(Clone)]
pub struct RouterConfig {
    pub identity: Identity,
    /// The served context window; workers must serve the same.
    pub context: usize,
    pub vocab: usize,
    pub handshake_timeout: Duration,
    /// How long after the prefill worker sent the KV the decode worker may take to verify it.
    pub transfer_timeout: Duration,
    /// Handshakes the cluster listener runs at once; more connections are turned away.
    pub max_pending_handshakes: usize,
    /// Handshakes the cluster listener runs at once for one source address.
    pub max_pending_handshakes_per_source: usize,
    /// How a route's prefill worker is chosen.
    pub routing: RoutingPolicy,
}

/// How a route's prefill worker is chosen (decode workers are always the least loaded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoutingPolicy {
    /// The least work once the worker's cache of the request's own tenant is counted
    /// (`router::pick::pick_prefill`).
    #[default]
    CacheAware,
    /// The fewest routes in flight, whatever is cached where.
    LeastLoaded,
}
