//! What the engine's handles send its loop, and the counters both sides read.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Mutex;
use std::time::Instant;

use kv::BlockTable;
use tokio::sync::mpsc as tmpsc;

use crate::settings::{EngineStats, TenantPolicy};
use crate::{Event, GenRequest};

/// State the handles and the loop share.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) queued: AtomicUsize,
    pub(crate) stopping: AtomicBool,
    pub(crate) stats: Mutex<EngineStats>,
    /// The tenant table the loop applies; handles read it to reserve pages without the loop.
    pub(crate) policy: Mutex<TenantPolicy>,
}

/// What a handle sends the loop.
pub(crate) enum Msg {
    Submit(Box<Pending>),
    Resume(Box<Resume>),
    Tenants(TenantPolicy),
    Shutdown,
}

/// What admission does for a queued request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Prefill and decode here.
    Full,
    /// Reserve the prompt in the prefill pool, prefill, sample the first token, hand over.
    Prefill,
    /// Reserve the whole sequence and hand the empty pages over (nothing runs).
    Reserve,
}

/// A queued request.
pub(crate) struct Pending {
    pub(crate) req: GenRequest,
    pub(crate) kind: Kind,
    pub(crate) tx: tmpsc::UnboundedSender<Event>,
    pub(crate) enqueued: Instant,
}

/// A decode that starts from transferred KV.
pub(crate) struct Resume {
    pub(crate) req: GenRequest,
    pub(crate) kv: BlockTable,
    pub(crate) first: u32,
    pub(crate) tx: tmpsc::UnboundedSender<Event>,
}
