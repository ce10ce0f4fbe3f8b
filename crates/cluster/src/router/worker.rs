//! One registered worker as the router holds it: its link's sender, its load, the routes it
//! takes part in and what it last reported. A leaf shared by the registry (which creates and
//! retires it), picking (which reads its load) and the route of a request (which sends to it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use wire::Role;

use super::cache_map::CachedTags;
use crate::proto::{Stats, ToGateway, ToWorker};

/// The most route tags the router keeps for one worker, whatever its pool claims to hold.
const MAX_TAGS: usize = 1 << 20;

/// What a worker's link delivers to one of its routes.
pub(super) enum RouteMsg {
    Msg(ToGateway),
    /// The worker's link is gone.
    Lost,
}

pub(super) struct WorkerConn {
    pub(super) id: u64,
    pub(super) name: String,
    pub(super) role: Role,
    /// Where prefill workers send this decode worker's KV (as it registered).
    pub(super) kv_addr: Option<String>,
    pub(super) capacity: usize,
    pub(super) tx: mpsc::UnboundedSender<ToWorker>,
    pub(super) inflight: AtomicUsize,
    /// Prefill: prompt tokens its routes in flight still compute (as estimated when routed).
    pub(super) queued_tokens: AtomicUsize,
    /// Decode: KV tokens its routes in flight reserve (prompt and `max_tokens` each).
    pub(super) reserved_tokens: AtomicUsize,
    /// Prefill: the route tags it reported cached.
    pub(super) cached: Mutex<CachedTags>,
    pub(super) routes: Mutex<HashMap<u64, mpsc::UnboundedSender<(Role, RouteMsg)>>>,
    pub(super) stats: Mutex<Stats>,
    /// The worker said it is draining: it finishes its routes but gets no new one.
    pub(super) draining: AtomicBool,
    /// Wakes the link's reader to close it: the worker left the membership.
    pub(super) evict: tokio::sync::Notify,
    pub(super) routed: AtomicU64,
    /// Control messages to and from it.
    pub(super) sent: Arc<AtomicU64>,
    pub(super) received: AtomicU64,
}

impl WorkerConn {
    /// A worker as it registers: no load, no routes, nothing reported yet.
    pub(super) fn new(
        id: u64,
        name: String,
        role: Role,
        kv_addr: Option<String>,
        capacity: usize,
        tx: mpsc::UnboundedSender<ToWorker>,
    ) -> Self {
        WorkerConn {
            id,
            name,
            role,
            kv_addr,
            capacity,
            tx,
            inflight: AtomicUsize::new(0),
            queued_tokens: AtomicUsize::new(0),
            reserved_tokens: AtomicUsize::new(0),
            // Each cached page carries at most a few tags (kv's TAGS_PER_PAGE) and a page holds
            // at least one token: a pool of `capacity` tokens never needs more.
            cached: Mutex::new(CachedTags::new(capacity.saturating_mul(4).min(MAX_TAGS))),
            routes: Mutex::new(HashMap::new()),
            stats: Mutex::new(Stats::default()),
            draining: AtomicBool::new(false),
            evict: tokio::sync::Notify::new(),
            routed: AtomicU64::new(0),
            sent: Arc::new(AtomicU64::new(0)),
            received: AtomicU64::new(0),
        }
    }

    pub(super) fn cached(&self) -> std::sync::MutexGuard<'_, CachedTags> {
        self.cached.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<u64, mpsc::UnboundedSender<(Role, RouteMsg)>>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }
}
