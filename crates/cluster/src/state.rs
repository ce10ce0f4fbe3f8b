//! A worker's configuration and what every route task of it shares.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine::EngineHandle;
use tokio::sync::mpsc;
use wire::Role;

use crate::constraints::ConstraintCache;
use crate::link::Identity;
use crate::metrics::WorkerMetrics;
use crate::net::Net;
use crate::proto::ToGateway;
use crate::tenancy::Tenancy;
use crate::tickets::TicketTable;

/// The gateways a worker registers with.
#[derive(Clone, Debug)]
pub enum Gateways {
    /// One gateway at a fixed address (`cluster.gateway`): a refusal no retry can fix (another
    /// secret, model or role) ends the worker.
    Fixed(String),
    /// The gateways the membership store lists now, kept current by its watch: the worker
    /// registers with each. One that refuses it is logged and not dialled again until it
    /// leaves the list and comes back; one that leaves the list is not redialled, but a live
    /// link to it stays until it ends (the store being away must not cut working links).
    Listed(tokio::sync::watch::Receiver<BTreeSet<String>>),
}

#[derive(Clone)]
pub struct WorkerConfig {
    pub name: String,
    /// Our role (prefill or decode), secret and pairing info.
    pub identity: Identity,
    /// Decode: where to accept KV connections (`HOST:PORT` or `mem:NAME`).
    pub kv_listen: Option<String>,
    /// Decode: the address prefill workers are told to dial (default: the bound address).
    pub kv_advertise: Option<String>,
    pub handshake_timeout: Duration,
    /// Decode: how long a reservation waits for its KV before it is freed.
    pub transfer_timeout: Duration,
    /// Decode: handshakes the KV listener runs at once; more connections are turned away.
    pub max_pending_handshakes: usize,
    /// Decode: handshakes the KV listener runs at once for one source address.
    pub max_pending_handshakes_per_source: usize,
    /// On drain: how long the routes in flight may take to finish before the worker stops anyway.
    pub drain_timeout: Duration,
    /// How long a gateway link lives before it is replaced (make-before-break) by one with a
    /// fresh handshake.
    pub link_lifetime: Duration,
}

/// What every route task of a worker shares.
pub(crate) struct Ctx {
    pub cfg: WorkerConfig,
    pub engine: EngineHandle,
    pub net: Net,
    pub metrics: Arc<WorkerMetrics>,
    pub tickets: TicketTable,
    pub kv_addr: Option<String>,
    /// Each gateway link's tenant table and what was applied to the engine.
    pub tenancy: Mutex<Tenancy>,
    /// Each registered link's outgoing messages, by link id (to say `Draining` on all).
    pub links: Mutex<HashMap<u64, mpsc::UnboundedSender<ToGateway>>>,
    /// Set once the worker drains: no new link, and each link says so.
    pub draining: AtomicBool,
    /// Routes running on any link (a drain waits for zero).
    pub active_routes: Arc<AtomicUsize>,
    /// Output formats compiled for recent routes, per tenant.
    pub constraints: Arc<ConstraintCache>,
}

impl Ctx {
    pub fn role(&self) -> Role {
        self.cfg.identity.role
    }
}
