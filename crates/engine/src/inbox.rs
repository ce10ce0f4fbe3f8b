//! What the engine's handles send its loop, and the counters both sides read.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use kv::BlockTable;
use tokio::sync::mpsc as tmpsc;

use crate::settings::TenantPolicy;
use crate::{Event, GenRequest};
use protocol::PoolStats;

/// State the handles and the loop share.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) queued: AtomicUsize,
    /// Of those, the ones that will take pages of the main pool (decode reservations and whole
    /// requests; prefills too when their pool is the main one): a handle may reserve there
    /// itself only when none would be overtaken.
    pub(crate) queued_for_pool: AtomicUsize,
    pub(crate) stopping: AtomicBool,
    pub(crate) stats: Mutex<PoolStats>,
    /// The tenant table the loop applies; handles read it to reserve pages without the loop.
    pub(crate) policy: Mutex<TenantPolicy>,
}

impl Shared {
    /// Counts a request into the queue unless `limit` are queued already; false: not counted.
    pub(crate) fn enqueue(&self, draws_on_pool: bool, limit: usize) -> bool {
        if self.queued.fetch_add(1, Ordering::SeqCst) >= limit {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        if draws_on_pool {
            self.queued_for_pool.fetch_add(1, Ordering::SeqCst);
        }
        true
    }

    /// Counts a request out of the queue (admitted, failed, expired or cancelled).
    pub(crate) fn dequeued(&self, draws_on_pool: bool) {
        self.queued.fetch_sub(1, Ordering::SeqCst);
        if draws_on_pool {
            self.queued_for_pool.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The queue is empty: every queued request failed at once.
    pub(crate) fn cleared(&self) {
        self.queued.store(0, Ordering::SeqCst);
        self.queued_for_pool.store(0, Ordering::SeqCst);
    }
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
    /// Counted in [`Shared::queued_for_pool`].
    pub(crate) draws_on_pool: bool,
}

/// A decode that starts from transferred KV.
pub(crate) struct Resume {
    pub(crate) req: GenRequest,
    pub(crate) kv: BlockTable,
    pub(crate) first: u32,
    pub(crate) tx: tmpsc::UnboundedSender<Event>,
}
