//! What both worker roles share: registering with the gateway over an authenticated link,
//! the control loop that runs one task per route, cancellation, and stats reporting.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine::{EngineHandle, Revoke, TenantPolicy};
use kv::TenantId;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use wire::{Role, WireError};

use crate::metrics::WorkerMetrics;
use crate::net::Net;
use crate::proto::{Failure, Register, Registered, TenantTable, ToGateway, ToWorker};
use crate::state::{Ctx, WorkerConfig};
use crate::tickets::TicketTable;
use crate::{decode, prefill, ClusterError, Link};

/// Runs a worker until its engine stops: registers with the gateway, serves routes, and
/// re-registers (after a pause) whenever the link drops, having cancelled every route of the
/// lost link. Returns an error only for what retrying cannot fix (refused registration).
pub async fn run_worker(
    cfg: WorkerConfig,
    engine: EngineHandle,
    net: Net,
    metrics: Arc<WorkerMetrics>,
) -> Result<(), ClusterError> {
    let tickets = TicketTable::default();
    let mut kv_addr = None;
    if cfg.identity.role == Role::Decode {
        let listen = cfg.kv_listen.clone().unwrap_or_else(|| "127.0.0.1:0".into());
        let (listener, bound) = net.listen(&listen).await?;
        if !bound.starts_with("mem:") {
            // Operators (and tests) put proxies or load balancers in front of it.
            println!("{}: KV listening on {bound}", cfg.name);
        }
        kv_addr = Some(cfg.kv_advertise.clone().unwrap_or(bound));
        let ctx = Arc::new(Ctx {
            cfg: cfg.clone(),
            engine: engine.clone(),
            net: net.clone(),
            metrics: metrics.clone(),
            tickets: tickets.clone(),
            kv_addr: kv_addr.clone(),
            tenants: Mutex::new(None),
        });
        tokio::spawn(decode::accept_kv(ctx, listener));
    }
    let ctx = Arc::new(Ctx { cfg, engine, net, metrics, tickets, kv_addr, tenants: Mutex::new(None) });
    let mut pause = Duration::from_millis(100);
    loop {
        match session(&ctx).await {
            Ok(()) => pause = Duration::from_millis(100),
            // A busy gateway is worth another try.
            Err(e @ ClusterError::Wire(WireError::Refused(wire::RefusalCode::Busy))) => {
                ctx.metrics.links.failure(crate::link::refusal_reason(&e));
                tracing::warn!(worker = %ctx.cfg.name, error = %e, retry_ms = pause.as_millis() as u64, "gateway link ended; retrying");
            }
            // Misconfiguration (another secret, role, model or KV layout; a refused
            // registration): retrying cannot fix it, so stop and say why.
            Err(
                e @ (ClusterError::Rejected(_)
                | ClusterError::WrongRole { .. }
                | ClusterError::Wire(
                    WireError::Pairing(_) | WireError::Refused(_) | WireError::BadProof | WireError::Reflection { .. },
                )),
            ) => return Err(e),
            Err(e) => {
                ctx.metrics.links.failure(crate::link::refusal_reason(&e));
                tracing::warn!(worker = %ctx.cfg.name, error = %e, retry_ms = pause.as_millis() as u64, "gateway link ended; retrying");
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// Aborts every route task of a session when the session ends (their pages are freed by the
/// drops that abort runs).
#[derive(Default, Clone)]
pub(crate) struct Routes(Arc<Mutex<HashMap<u64, AbortHandle>>>);

impl Routes {
    fn insert(&self, route: u64, h: AbortHandle) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(route, h);
    }
    pub fn remove(&self, route: u64) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&route);
    }
    fn cancel(&self, route: u64) {
        if let Some(h) = self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&route) {
            h.abort();
        }
    }
    fn cancel_all(&self) {
        for (_, h) in self.0.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            h.abort();
        }
    }
}

async fn session(ctx: &Arc<Ctx>) -> Result<(), ClusterError> {
    let timeout = ctx.cfg.handshake_timeout;
    let io = tokio::time::timeout(timeout, ctx.net.dial(&ctx.cfg.gateway))
        .await
        .map_err(|_| ClusterError::Timeout("connecting to the gateway"))??;
    let link = Link::connect(io, &ctx.cfg.identity, timeout).await?;
    if link.peer != Role::Gateway {
        return Err(ClusterError::WrongRole { got: link.peer, want: vec![Role::Gateway] });
    }
    let (mut rd, mut wr) = link.split();
    let reg = Register {
        name: ctx.cfg.name.clone(),
        kv_addr: ctx.kv_addr.clone(),
        context: ctx.engine.context_window(),
        capacity_tokens: ctx.engine.pool().capacity_tokens(),
    };
    wr.send(&reg).await?;
    match tokio::time::timeout(timeout, rd.recv::<Registered>()).await {
        Ok(Ok(Some(Registered::Accepted(table)))) => apply_tenants(ctx, &table),
        Ok(Ok(Some(Registered::Rejected(m)))) => return Err(ClusterError::Rejected(m)),
        Ok(Ok(None)) => return Err(ClusterError::Message("the gateway closed the link".into())),
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(ClusterError::Timeout("registering with the gateway")),
    }
    tracing::info!(worker = %ctx.cfg.name, gateway = %ctx.cfg.gateway, "registered with the gateway");

    let (out, mut out_rx) = mpsc::unbounded_channel::<ToGateway>();
    let writer = tokio::spawn(async move {
        while let Some(m) = out_rx.recv().await {
            if wr.send(&m).await.is_err() {
                break;
            }
        }
    });
    let stats = {
        let (ctx, out) = (ctx.clone(), out.clone());
        tokio::spawn(async move {
            loop {
                if out.send(ToGateway::Stats(Box::new(ctx.metrics.snapshot(&ctx.engine)))).is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let routes = Routes::default();
    let result = loop {
        let msg = match rd.recv::<ToWorker>().await {
            Ok(Some(m)) => m,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        match msg {
            ToWorker::Cancel { route } => routes.cancel(route),
            ToWorker::Tenants(table) => apply_tenants(ctx, &table),
            ToWorker::Reserve(spec) if ctx.role() == Role::Decode => {
                spawn_route(&routes, spec.route, decode::reserve(ctx.clone(), spec, out.clone()));
            }
            ToWorker::Prefill { spec, ticket, decode_addr } if ctx.role() == Role::Prefill => {
                let fut = prefill::run(ctx.clone(), spec.clone(), ticket.into(), decode_addr, out.clone());
                spawn_route(&routes, spec.route, fut);
            }
            ToWorker::Reserve(spec) | ToWorker::Prefill { spec, .. } => {
                let failure = Failure::Internal(format!("a {:?} worker does not take this request", ctx.role()));
                let _ = out.send(ToGateway::Failed { route: spec.route, failure });
            }
        }
    };
    routes.cancel_all();
    stats.abort();
    writer.abort();
    result
}

/// Applies the gateway's tenant table to this worker's engine before anything after it runs:
/// tenants that left the table or whose key changed lose their requests and cached prefixes.
/// The first table a worker sees drops every cached prefix: it cannot tell whose they were
/// (another gateway's table, or one from before a restart, may have used the same ids).
fn apply_tenants(ctx: &Ctx, table: &TenantTable) {
    let new: HashMap<u64, [u8; 16]> = table.tenants.iter().map(|t| (t.id, t.epoch)).collect();
    let mut known = ctx.tenants.lock().unwrap_or_else(|e| e.into_inner());
    let revoke = match known.as_ref() {
        None => Revoke::AllCaches,
        Some(old) => Revoke::These(
            old.iter().filter(|(id, epoch)| new.get(id) != Some(epoch)).map(|(id, _)| TenantId(*id)).collect(),
        ),
    };
    let gone = match &revoke {
        Revoke::These(ts) => ts.len(),
        Revoke::AllCaches => 0,
    };
    let max_share = if table.max_share > 0.0 && table.max_share <= 1.0 { table.max_share } else { 1.0 };
    ctx.engine.apply_tenants(TenantPolicy {
        live: Some(new.keys().map(|id| TenantId(*id)).collect::<HashSet<_>>()),
        revoke,
        max_share,
    });
    tracing::info!(worker = %ctx.cfg.name, tenants = new.len(), revoked = gone, "tenant table applied");
    *known = Some(new);
}

/// Runs one route as its own task, registered so a `Cancel` or the end of the session aborts it.
fn spawn_route<F>(routes: &Routes, route: u64, fut: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let routes2 = routes.clone();
    let h = tokio::spawn(async move {
        fut.await;
        routes2.remove(route);
    });
    routes.insert(route, h.abort_handle());
    if h.is_finished() {
        routes.remove(route);
    }
}
