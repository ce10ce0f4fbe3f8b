//! A worker's configuration and what every route task of it shares.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine::EngineHandle;
use wire::Role;

use crate::link::Identity;
use crate::metrics::WorkerMetrics;
use crate::net::Net;
use crate::tickets::TicketTable;

#[derive(Clone)]
pub struct WorkerConfig {
    pub name: String,
    /// Where the gateway listens for workers.
    pub gateway: String,
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
}

/// What every route task of a worker shares.
pub(crate) struct Ctx {
    pub cfg: WorkerConfig,
    pub engine: EngineHandle,
    pub net: Net,
    pub metrics: Arc<WorkerMetrics>,
    pub tickets: TicketTable,
    pub kv_addr: Option<String>,
    /// The last tenant table applied (id -> key epoch); `None` before the first.
    pub tenants: Mutex<Option<HashMap<u64, [u8; 16]>>>,
}

impl Ctx {
    pub fn role(&self) -> Role {
        self.cfg.identity.role
    }
}
