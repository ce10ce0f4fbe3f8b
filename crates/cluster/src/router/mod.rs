//! The gateway's side of the cluster: registration of workers, routing of each request to a
//! decode and a prefill worker, the first-token gate, cancellation and the one retry.
//!
//! This module is the facade: [`Router`] and its public API. Each part lives in its own child,
//! and only this module puts them together (the children import leaves, never the facade):
//!
//! - `config`: [`RouterConfig`], the router's settings.
//! - `worker`: one registered worker as the router holds it (its link's sender, load, routes).
//! - `registry`: the registered workers: registration and the worker's messages until it
//!   leaves, eviction, the tenant table sent to every worker, the workers' stats.
//! - `pick`: choosing the least loaded worker of a role for a route, or for prefill the one
//!   with the least work once its cache of the request's tenant is counted.
//! - `cache_map`: the route tags naming a prompt's pages, and which each prefill worker holds.
//! - `route`: one request's route: the attempt, the first-token gate, the one retry, cancel.
//! - `revocations`: which tenants were revoked when, against the mark a request was admitted at.

mod cache_map;
mod config;
mod pick;
mod registry;
mod revocations;
mod route;
mod worker;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use protocol::{AdmissionError, Event, EventStream, PoolStats, RequestError, RouteRequest};
use types::TenantId;

use crate::link::{HandshakeGate, Identity};
use crate::metrics::LinkMetrics;
use crate::proto::TenantTable;
use crate::{ClusterError, Link};
use registry::Registry;
use revocations::Revocations;
use route::Routing;

pub use config::{RouterConfig, RoutingPolicy};
pub use registry::WorkerInfo;

struct Inner {
    cfg: RouterConfig,
    registry: Registry,
    next_route: AtomicU64,
    stopping: AtomicBool,
    gate: HandshakeGate,
    links: LinkMetrics,
    revocations: tokio::sync::watch::Sender<Revocations>,
    tag_key: cache_map::TagKey,
}

/// Cheap to clone; every clone is the same router.
#[derive(Clone)]
pub struct Router {
    inner: Arc<Inner>,
}

impl Router {
    pub fn new(cfg: RouterConfig) -> Router {
        Router {
            inner: Arc::new(Inner {
                gate: HandshakeGate::new(cfg.max_pending_handshakes, cfg.max_pending_handshakes_per_source),
                links: LinkMetrics::default(),
                cfg,
                registry: Registry::new(),
                next_route: AtomicU64::new(1),
                stopping: AtomicBool::new(false),
                revocations: tokio::sync::watch::Sender::new(Revocations::default()),
                tag_key: cache_map::TagKey::random(),
            }),
        }
    }

    pub fn context_window(&self) -> usize {
        self.inner.cfg.context
    }

    pub(crate) fn identity(&self) -> Identity {
        self.inner.cfg.identity.clone()
    }

    pub(crate) fn gate(&self) -> &HandshakeGate {
        &self.inner.gate
    }

    pub(crate) fn handshake_timeout(&self) -> Duration {
        self.inner.cfg.handshake_timeout
    }

    pub(crate) fn link_failure(&self, reason: &'static str) {
        self.inner.links.failure(reason);
    }

    /// A worker's registration on an authenticated link, then its messages until it leaves.
    pub(crate) async fn register(&self, link: Link) -> Result<(), ClusterError> {
        self.inner.registry.register(link, &self.inner.cfg, &self.inner.links).await
    }

    /// Waits until at least this many workers of each role are registered.
    pub async fn wait_for_workers(&self, prefill: usize, decode: usize, timeout: Duration) -> bool {
        self.inner.registry.wait_for_workers(prefill, decode, timeout).await
    }

    /// Links to this gateway that failed, by reason.
    pub fn link_failures(&self) -> Vec<(String, u64)> {
        self.inner.links.snapshot()
    }

    /// Whether a request could be routed now (a prefill and a decode worker are registered
    /// and not draining).
    pub fn can_route(&self) -> bool {
        self.inner.registry.can_route()
    }

    /// Closes the links of the workers called `name` (their lease in the membership store
    /// expired or was revoked): their routes fail over as a lost worker's do. A worker that
    /// drains says so over its link first, so its routes have finished by then.
    pub fn evict(&self, name: &str) {
        self.inner.registry.evict(name)
    }

    pub fn worker_info(&self) -> Vec<WorkerInfo> {
        self.inner.registry.worker_info()
    }

    /// The door rule, with the largest decode pool as the pool bound.
    pub fn check(&self, prompt: &[u32], max_tokens: usize) -> Result<(), AdmissionError> {
        let capacity = self.inner.registry.decode_capacity();
        let cfg = &self.inner.cfg;
        engine::door_check(prompt, max_tokens, cfg.context, capacity.unwrap_or(cfg.context), cfg.vocab)
    }

    /// Replaces the tenant table and sends it to every worker. The requests of the tenants in
    /// `revoke` (removed, or their key rotated) that were admitted before this call end with
    /// [`RequestError::TenantRevoked`]; workers drop those tenants' cached prefixes.
    pub fn set_tenants(&self, table: TenantTable, revoke: &[TenantId]) {
        self.inner.registry.set_tenants(table, || {
            if !revoke.is_empty() {
                self.inner.revocations.send_modify(|r| r.revoke(revoke));
            }
        });
    }

    /// Take this before authenticating a request and pass it to [`Router::submit`]: a
    /// revocation after it ends the request even if the key was valid when checked.
    pub fn revocation_mark(&self) -> u64 {
        self.inner.revocations.borrow().count
    }

    /// Checks the request, then runs it on the cluster; the stream has the engine's contract.
    /// `mark` is [`Router::revocation_mark`] from before the request's key was checked.
    pub fn submit(&self, req: RouteRequest, mark: u64) -> Result<EventStream, AdmissionError> {
        self.check(&req.prompt, req.max_tokens)?;
        if self.inner.stopping.load(Ordering::SeqCst) {
            return Err(AdmissionError::ShuttingDown);
        }
        let (tx, rs) = EventStream::channel(req.id);
        if self.inner.revocations.borrow().revoked_since(req.tenant, mark) {
            let _ = tx.send(Event::Failed(RequestError::TenantRevoked));
            return Ok(rs);
        }
        // The request's span (ids only) follows it into the task that routes it.
        let span = tracing::info_span!("request", request = req.id.0, tenant = req.tenant.0);
        let router = self.clone();
        let route = async move { router.routing().orchestrate(req, tx, mark).await };
        tokio::spawn(tracing::Instrument::instrument(route, span));
        Ok(rs)
    }

    pub fn stop_admitting(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
    }

    /// Sums of the workers' last reported stats, each engine counted once.
    pub fn stats(&self) -> PoolStats {
        self.inner.registry.stats()
    }

    /// Ends every route with an error (shutdown after the drain timeout).
    pub fn fail_all(&self) {
        self.inner.registry.fail_all()
    }

    /// What the route of a request reads of this router.
    fn routing(&self) -> Routing<'_> {
        Routing {
            cfg: &self.inner.cfg,
            registry: &self.inner.registry,
            next_route: &self.inner.next_route,
            revocations: &self.inner.revocations,
            tag_key: &self.inner.tag_key,
        }
    }
}
