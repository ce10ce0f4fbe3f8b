//! The registered workers: a worker's registration on its link (checked against the router's
//! settings), its messages dispatched to its routes until it leaves or is evicted, the tenant
//! table every worker is sent, and what the dashboards and the stats read of the workers. Picking
//! a worker for a route reads this list; the route itself lives in `route`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protocol::PoolStats;
use tokio::sync::mpsc;
use wire::Role;

use super::config::RouterConfig;
use super::pick::{pick, pick_decode, pick_prefill};
use super::worker::{RouteMsg, WorkerConn};
use crate::metrics::LinkMetrics;
use crate::proto::{Register, Registered, Stats, TenantTable, ToGateway, ToWorker};
use crate::{ClusterError, Link};
use protocol::RequestError;

/// A registered worker, as the dashboards see it.
#[derive(Debug, Clone)]
pub struct WorkerInfo {
    pub name: String,
    pub role: &'static str,
    pub inflight: usize,
    /// Routes sent to it since it registered.
    pub routes: u64,
    /// Control messages sent to it and received from it since it registered.
    pub messages: (u64, u64),
    /// The route tags it reported cached.
    pub route_tags: usize,
    /// Prefill: the prompt tokens its routes in flight still compute.
    pub queued_prompt_tokens: usize,
    /// Decode: the KV tokens its routes in flight reserve.
    pub reserved_kv_tokens: usize,
    pub stats: Stats,
}

/// The workers registered with one router, and the tenant table they are all sent.
pub(super) struct Registry {
    workers: Mutex<Vec<Arc<WorkerConn>>>,
    next_worker: AtomicU64,
    /// The gateway's tenant table, sent to every worker at registration and on each change.
    tenants: Mutex<TenantTable>,
}

impl Registry {
    pub(super) fn new() -> Registry {
        Registry {
            workers: Mutex::new(Vec::new()),
            next_worker: AtomicU64::new(1),
            tenants: Mutex::new(TenantTable { tenants: Vec::new(), max_share: 1.0 }),
        }
    }

    fn workers(&self) -> std::sync::MutexGuard<'_, Vec<Arc<WorkerConn>>> {
        self.workers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A worker's registration on an authenticated link, then its messages until it leaves.
    pub(super) async fn register(
        &self,
        link: Link,
        cfg: &RouterConfig,
        links: &LinkMetrics,
    ) -> Result<(), ClusterError> {
        let role = link.peer;
        let (secret, peer_key) = (link.secret().clone(), link.peer_key());
        let ring = cfg.identity.secrets.clone();
        let mut rotated = ring.changed();
        let (mut rd, mut wr) = link.split();
        let reg = match tokio::time::timeout(cfg.handshake_timeout, rd.recv::<Register>()).await {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(ClusterError::Timeout("waiting for a worker's registration")),
        };
        let plain = |s: &str| {
            !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        let refusal = if !plain(&reg.name) {
            Some("a worker name must be 1-64 characters of A-Z a-z 0-9 - _ . (it labels metrics)".into())
        } else if reg.context != cfg.context {
            Some(format!(
                "the worker serves a context window of {} tokens, the gateway {}: configure the same context_window",
                reg.context, cfg.context
            ))
        } else if reg.capacity_tokens < cfg.context && !cfg!(feature = "incident-replay") {
            Some(format!(
                "the worker's KV pool holds {} tokens, under the context window {}",
                reg.capacity_tokens, cfg.context
            ))
        } else if role == Role::Decode && reg.kv_addr.is_none() {
            Some("a decode worker must give the address of its KV listener".into())
        } else {
            None
        };
        if let Some(m) = refusal {
            tracing::warn!(worker = %reg.name, reason = %m, "refused worker");
            wr.send(&Registered::Rejected(m.clone())).await?;
            return Err(ClusterError::Rejected(m));
        }
        let table = self.tenants.lock().unwrap_or_else(|e| e.into_inner()).clone();
        wr.send(&Registered::Accepted(table)).await?;
        let (tx, mut rx) = mpsc::unbounded_channel::<ToWorker>();
        let id = self.next_worker.fetch_add(1, Ordering::Relaxed);
        let w = Arc::new(WorkerConn::new(id, reg.name.clone(), role, reg.kv_addr, reg.capacity_tokens, tx));
        tracing::info!(role = role.name(), worker = %w.name, node_key = %peer_key.fingerprint(), "worker registered");
        self.workers().push(w.clone());
        let sent = w.sent.clone();
        let writer = tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if wr.send(&m).await.is_err() {
                    break;
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
        });
        let result = loop {
            let msg = tokio::select! {
                m = rd.recv_routed::<ToGateway>() => m,
                () = w.evict.notified() => break Err(ClusterError::Message("the worker left the membership".into())),
                Ok(()) = rotated.changed() => {
                    let Err(reason) = ring.admits(&secret, &peer_key) else { continue };
                    // The routes on this link end as lost: those before their first token run
                    // again on other workers.
                    links.failure(reason);
                    tracing::warn!(role = role.name(), worker = %w.name, node_key = %peer_key.fingerprint(), reason, "the worker's cluster secret is no longer accepted, or its node key no longer trusted: link closed");
                    break Err(ClusterError::Message(format!("the link is no longer admitted ({reason})")));
                }
            };
            let msg = match msg {
                Ok(Some(Err(u))) => {
                    links.failure("undecodable_message");
                    tracing::warn!(role = role.name(), worker = %w.name, route = ?u.route, reason = %u.reason, "a worker's message did not decode; only its route fails");
                    if let Some((route, t)) = u.route.and_then(|r| Some((r, w.routes().get(&r).cloned()?))) {
                        let failure =
                            RequestError::Internal(format!("the {} worker's message could not be read", role.name()));
                        let _ = t.send((role, RouteMsg::Msg(ToGateway::Failed { route, failure })));
                    }
                    continue;
                }
                Ok(Some(Ok(m))) => Ok(Some(m)),
                Ok(None) => Ok(None),
                Err(e) => Err(e),
            };
            if matches!(msg, Ok(Some(_))) {
                w.received.fetch_add(1, Ordering::Relaxed);
            }
            match msg {
                Ok(Some(ToGateway::Stats(s))) => *w.stats.lock().unwrap_or_else(|e| e.into_inner()) = *s,
                Ok(Some(ToGateway::CacheTags { reset, cached, dropped })) => {
                    let tags = |v: Vec<[u8; 16]>| v.into_iter().map(kv::RouteTag).collect::<Vec<_>>();
                    w.cached().apply(reset, &tags(cached), &tags(dropped));
                }
                Ok(Some(ToGateway::Draining)) => {
                    w.draining.store(true, Ordering::SeqCst);
                    tracing::info!(role = role.name(), worker = %w.name, "worker draining: no new routes");
                }
                Ok(Some(m)) => {
                    let Some(route) = m.route() else { continue };
                    if let Some(t) = w.routes().get(&route) {
                        let _ = t.send((role, RouteMsg::Msg(m)));
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        writer.abort();
        self.workers().retain(|x| x.id != w.id);
        for (_, t) in w.routes().drain() {
            let _ = t.send((role, RouteMsg::Lost));
        }
        tracing::info!(role = role.name(), worker = %w.name, "worker left");
        result
    }

    /// Waits until at least this many workers of each role are registered.
    pub(super) async fn wait_for_workers(&self, prefill: usize, decode: usize, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        loop {
            let (p, d) = {
                let ws = self.workers();
                (
                    ws.iter().filter(|w| w.role == Role::Prefill).count(),
                    ws.iter().filter(|w| w.role == Role::Decode).count(),
                )
            };
            if p >= prefill && d >= decode {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether a request could be routed now (a prefill and a decode worker are registered
    /// and not draining).
    pub(super) fn can_route(&self) -> bool {
        let ws = self.workers();
        let open = |role| ws.iter().any(|w| w.role == role && !w.draining.load(Ordering::SeqCst));
        open(Role::Prefill) && open(Role::Decode)
    }

    /// Closes the links of the workers called `name` (their lease in the membership store
    /// expired or was revoked): their routes fail over as a lost worker's do. A worker that
    /// drains says so over its link first, so its routes have finished by then.
    pub(super) fn evict(&self, name: &str) {
        for w in self.workers().iter().filter(|w| w.name == name) {
            tracing::warn!(role = w.role.name(), worker = %w.name, "worker left the membership; closing its link");
            w.evict.notify_one();
        }
    }

    pub(super) fn worker_info(&self) -> Vec<WorkerInfo> {
        self.workers()
            .iter()
            .map(|w| WorkerInfo {
                name: w.name.clone(),
                role: w.role.name(),
                inflight: w.inflight.load(Ordering::Relaxed),
                routes: w.routed.load(Ordering::Relaxed),
                messages: (w.sent.load(Ordering::Relaxed), w.received.load(Ordering::Relaxed)),
                route_tags: w.cached().len(),
                queued_prompt_tokens: w.queued_tokens.load(Ordering::Relaxed),
                reserved_kv_tokens: w.reserved_tokens.load(Ordering::Relaxed),
                stats: w.stats.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            })
            .collect()
    }

    /// The largest decode worker's pool, in tokens (the door rule's pool bound).
    pub(super) fn decode_capacity(&self) -> Option<usize> {
        self.workers().iter().filter(|w| w.role == Role::Decode).map(|w| w.capacity).max()
    }

    /// Replaces the tenant table and sends it to every worker; `while_locked` runs under the
    /// table's lock, after the replacement and before the sends.
    pub(super) fn set_tenants(&self, table: TenantTable, while_locked: impl FnOnce()) {
        // Workers get tables in the order they were set: the send happens under the lock.
        let mut current = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        *current = table.clone();
        while_locked();
        for w in self.workers().iter() {
            let _ = w.tx.send(ToWorker::Tenants(table.clone()));
        }
    }

    /// Sums of the workers' last reported stats, each engine counted once.
    pub(super) fn stats(&self) -> PoolStats {
        let mut s = PoolStats::default();
        let mut seen = Vec::new();
        for w in self.workers().iter() {
            let ws = w.stats.lock().unwrap_or_else(|e| e.into_inner());
            if seen.contains(&ws.engine) {
                continue;
            }
            seen.push(ws.engine);
            s.absorb(&ws.pool);
        }
        s
    }

    /// Ends every route with an error (shutdown after the drain timeout).
    pub(super) fn fail_all(&self) {
        for w in self.workers().iter() {
            for (_, t) in w.routes().drain() {
                let _ = t.send((w.role, RouteMsg::Lost));
            }
        }
    }

    /// The least loaded worker of `role`, preferring those not in `avoid`.
    pub(super) fn pick(&self, role: Role, avoid: &[u64]) -> Option<Arc<WorkerConn>> {
        pick(&self.workers(), role, avoid).cloned()
    }

    /// The decode worker for a prompt whose shareable pages are named `tags` ([`pick_decode`]).
    pub(super) fn pick_decode(
        &self,
        avoid: &[u64],
        tags: &[kv::RouteTag],
        page_size: usize,
        prompt_len: usize,
    ) -> Option<Arc<WorkerConn>> {
        pick_decode(&self.workers(), avoid, tags, page_size, prompt_len).cloned()
    }

    /// The prefill worker with the least work for a prompt of `prompt_len` tokens whose
    /// shareable pages are named `tags`, preferring those not in `avoid`, and the prompt
    /// tokens it will compute ([`pick_prefill`]).
    pub(super) fn pick_prefill(
        &self,
        avoid: &[u64],
        tags: &[kv::RouteTag],
        page_size: usize,
        prompt_len: usize,
    ) -> Option<(Arc<WorkerConn>, usize)> {
        pick_prefill(&self.workers(), avoid, tags, page_size, prompt_len).map(|(w, n)| (w.clone(), n))
    }

    /// The key epoch the current tenant table gives `tenant` (part of its route tags' scope).
    pub(super) fn epoch_of(&self, tenant: types::TenantId) -> Option<[u8; 16]> {
        let table = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        table.tenants.iter().find(|t| t.id == tenant.0).map(|t| t.epoch)
    }
}
