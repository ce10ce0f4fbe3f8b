//! One registered link to a gateway: opening it (dial, handshake, registration, the gateway's
//! tenant table), serving its routes (one task each, cancelled with the link), and retiring it.
//! A link retires when its worker opened a replacement (the dialling secret rotated, or the
//! link reached its maximum age): it says `Draining`, so the gateway sends its new routes to
//! the new link, refuses any that were already on their way (retryable), and closes once its
//! routes are over. A link whose secret this node no longer accepts, or whose gateway's node
//! key it no longer trusts, closes at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify};
use tokio::task::AbortHandle;
use wire::{ClusterSecret, NodePublicKey, Role};

use crate::link::{LinkReader, LinkWriter};
use crate::proto::{Register, Registered, Spec, TenantTable, ToGateway, ToWorker};
use crate::state::Ctx;
use crate::{decode, prefill, ClusterError, Link};
use protocol::RequestError;
use types::TenantId;

/// A session's route tasks, each with its tenant: a `Cancel`, the tenant's re-keying by this
/// link's gateway, or the end of the session aborts them (their pages are freed by the drops
/// that abort runs).
#[derive(Default, Clone)]
pub(crate) struct Routes(Arc<Mutex<HashMap<u64, (TenantId, AbortHandle)>>>);

impl Routes {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (TenantId, AbortHandle)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn insert(&self, route: u64, tenant: TenantId, h: AbortHandle) {
        self.map().insert(route, (tenant, h));
    }
    pub fn remove(&self, route: u64) {
        self.map().remove(&route);
    }
    fn cancel(&self, route: u64) {
        if let Some((_, h)) = self.map().remove(&route) {
            h.abort();
        }
    }
    /// Aborts the routes of `tenants` and returns their ids.
    fn end_tenants(&self, tenants: &[TenantId]) -> Vec<u64> {
        let mut ended = Vec::new();
        self.map().retain(|route, (t, h)| {
            let end = tenants.contains(t);
            if end {
                h.abort();
                ended.push(*route);
            }
            !end
        });
        ended
    }
    fn cancel_all(&self) {
        for (_, (_, h)) in self.map().drain() {
            h.abort();
        }
    }
    fn is_empty(&self) -> bool {
        self.map().is_empty()
    }
}

/// Distinguishes the links of one worker (each gateway's tenant table is kept per link).
static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

/// A registered link, not yet serving.
pub(crate) struct Opened {
    rd: LinkReader,
    wr: LinkWriter,
    /// The secret its handshake proved.
    pub secret: ClusterSecret,
    /// The gateway's node key its handshake proved.
    peer_key: NodePublicKey,
    pub at: Instant,
    id: u64,
}

/// Dials the gateway at `addr`, proves our secret and registers; the gateway's tenant table is
/// applied before this returns.
pub(crate) async fn open(ctx: &Arc<Ctx>, addr: &str) -> Result<Opened, ClusterError> {
    let timeout = ctx.cfg.handshake_timeout;
    let io = tokio::time::timeout(timeout, ctx.net.dial(addr))
        .await
        .map_err(|_| ClusterError::Timeout("connecting to the gateway"))??;
    let link = Link::connect(io, &ctx.cfg.identity, timeout).await?;
    if link.peer != Role::Gateway {
        return Err(ClusterError::WrongRole { got: link.peer, want: vec![Role::Gateway] });
    }
    let (secret, peer_key) = (link.secret().clone(), link.peer_key());
    let (mut rd, mut wr) = link.split();
    let reg = Register {
        name: ctx.cfg.name.clone(),
        kv_addr: ctx.kv_addr.clone(),
        context: ctx.engine.context_window(),
        capacity_tokens: ctx.engine.pool().capacity_tokens(),
    };
    wr.send(&reg).await?;
    let id = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
    match tokio::time::timeout(timeout, rd.recv::<Registered>()).await {
        Ok(Ok(Some(Registered::Accepted(table)))) => {
            // A new link has no routes to end yet.
            apply_tenants(ctx, id, &table);
        }
        Ok(Ok(Some(Registered::Rejected(m)))) => return Err(ClusterError::Rejected(m)),
        Ok(Ok(None)) => return Err(ClusterError::Message("the gateway closed the link".into())),
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(ClusterError::Timeout("registering with the gateway")),
    }
    tracing::info!(worker = %ctx.cfg.name, gateway = %addr, "registered with the gateway");
    Ok(Opened { rd, wr, secret, peer_key, at: Instant::now(), id })
}

/// Serves an opened link until it ends, its secret is withdrawn, or (after `retire` fires) its
/// last route is over.
pub(crate) async fn serve(ctx: Arc<Ctx>, link: Opened, retire: Arc<Notify>) -> Result<(), ClusterError> {
    let Opened { mut rd, mut wr, secret, peer_key, id, .. } = link;
    let (out, mut out_rx) = mpsc::unbounded_channel::<ToGateway>();
    {
        let mut links = ctx.links.lock().unwrap_or_else(|e| e.into_inner());
        links.insert(id, out.clone());
        crate::tag_report::first_report(&ctx, &out);
    }
    if ctx.draining.load(Ordering::SeqCst) {
        let _ = out.send(ToGateway::Draining);
    }
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
    let ring = ctx.cfg.identity.secrets.clone();
    let mut rotated = ring.changed();
    // Set once a replacement link is up: this one takes no new route and ends with its last.
    let mut retiring: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let routes = Routes::default();
    let result = loop {
        let msg = tokio::select! {
            m = rd.recv_routed::<ToWorker>() => m,
            Ok(()) = rotated.changed() => {
                let Err(reason) = ring.admits(&secret, &peer_key) else { continue };
                ctx.metrics.links.failure(reason);
                tracing::warn!(worker = %ctx.cfg.name, gateway_key = %peer_key.fingerprint(), reason, "this link's cluster secret is no longer accepted, or the gateway's node key no longer trusted: closed");
                break Err(ClusterError::Message(format!("the link is no longer admitted ({reason})")));
            }
            () = retire.notified(), if retiring.is_none() => {
                retiring = Some(Instant::now() + ctx.cfg.drain_timeout);
                let _ = out.send(ToGateway::Draining);
                tracing::info!(worker = %ctx.cfg.name, "a new link to this gateway is up: retiring the old one");
                continue;
            }
            _ = tick.tick(), if retiring.is_some() => {
                if routes.is_empty() || retiring.is_some_and(|t| Instant::now() >= t) {
                    break Ok(());
                }
                continue;
            }
        };
        let msg = match msg {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(u))) => {
                ctx.metrics.links.failure("undecodable_message");
                tracing::warn!(worker = %ctx.cfg.name, route = ?u.route, reason = %u.reason, "a control message did not decode; only its route fails");
                if let Some(route) = u.route {
                    let failure = RequestError::Internal("the worker could not read this route's request".into());
                    let _ = out.send(ToGateway::Failed { route, failure });
                }
                continue;
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        match msg {
            ToWorker::Cancel { route } => routes.cancel(route),
            ToWorker::Tenants(table) => {
                let ended = apply_tenants(&ctx, id, &table);
                for route in routes.end_tenants(&ended) {
                    let _ = out.send(ToGateway::Failed { route, failure: RequestError::TenantRevoked });
                }
            }
            ToWorker::Reserve(spec) | ToWorker::Prefill { spec, .. }
                if ctx.draining.load(Ordering::SeqCst) || retiring.is_some() =>
            {
                let _ = out.send(ToGateway::Failed { route: spec.route, failure: RequestError::ShuttingDown });
            }
            ToWorker::Reserve(spec) if ctx.role() == Role::Decode => {
                let Some(spec) = scoped(&ctx, id, spec, &out) else { continue };
                let (route, tenant) = (spec.route, spec.request.tenant);
                spawn_route(&ctx, &routes, route, tenant, decode::reserve(ctx.clone(), spec, out.clone()));
            }
            ToWorker::Prefill { spec, ticket, decode_addr } if ctx.role() == Role::Prefill => {
                let Some(spec) = scoped(&ctx, id, spec, &out) else { continue };
                let (route, tenant) = (spec.route, spec.request.tenant);
                let fut = prefill::run(ctx.clone(), spec, ticket.into(), decode_addr, out.clone());
                spawn_route(&ctx, &routes, route, tenant, fut);
            }
            ToWorker::Reserve(spec) | ToWorker::Prefill { spec, .. } => {
                let failure = RequestError::Internal(format!("a {:?} worker does not take this request", ctx.role()));
                let _ = out.send(ToGateway::Failed { route: spec.route, failure });
            }
        }
    };
    ctx.links.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    ctx.tenancy.lock().unwrap_or_else(|e| e.into_inner()).forget(id);
    routes.cancel_all();
    stats.abort();
    writer.abort();
    result
}

/// The route's spec with its prefix-cache scope bound to the key epoch its gateway gives the
/// tenant (see `tenancy`); `None` (and the route refused) when that gateway does not list it.
fn scoped(ctx: &Ctx, link: u64, mut spec: Spec, out: &mpsc::UnboundedSender<ToGateway>) -> Option<Spec> {
    let salt = ctx.tenancy.lock().unwrap_or_else(|e| e.into_inner()).scoped_salt(
        link,
        spec.request.tenant.0,
        spec.request.cache_salt.as_deref(),
    );
    match salt {
        Some(s) => {
            spec.request.cache_salt = Some(s);
            Some(spec)
        }
        None => {
            let _ = out.send(ToGateway::Failed { route: spec.route, failure: RequestError::TenantRevoked });
            None
        }
    }
}

/// Applies a gateway's tenant table to this worker's engine before anything after it runs
/// (see `tenancy`: the cached prefixes of tenants whose key epochs changed go) and returns the
/// tenants this gateway re-keyed or removed, whose routes on its link end.
fn apply_tenants(ctx: &Ctx, link: u64, table: &TenantTable) -> Vec<TenantId> {
    let applied = ctx.tenancy.lock().unwrap_or_else(|e| e.into_inner()).update(link, table);
    let tenants = applied.policy.live.as_ref().map_or(0, |l| l.len());
    let forgotten = match &applied.policy.revoke {
        engine::Revoke::These(ts) | engine::Revoke::Caches(ts) => {
            ts.iter().for_each(|t| ctx.constraints.forget(*t));
            ts.len()
        }
        engine::Revoke::AllCaches => {
            ctx.constraints.clear();
            0
        }
    };
    ctx.engine.apply_tenants(applied.policy);
    tracing::info!(worker = %ctx.cfg.name, tenants, forgotten, ended = applied.ended.len(), "tenant table applied");
    applied.ended
}

/// Counts a route while its task lives (ended, or aborted by a cancel or a lost link).
struct Active(Arc<AtomicUsize>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs one route as its own task, registered so a `Cancel` or the end of the session aborts it.
fn spawn_route<F>(ctx: &Ctx, routes: &Routes, route: u64, tenant: TenantId, fut: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    ctx.active_routes.fetch_add(1, Ordering::SeqCst);
    let active = Active(ctx.active_routes.clone());
    let routes2 = routes.clone();
    let h = tokio::spawn(async move {
        let _active = active;
        fut.await;
        routes2.remove(route);
    });
    routes.insert(route, tenant, h.abort_handle());
    if h.is_finished() {
        routes.remove(route);
    }
}
