//! What both worker roles share: registering with each gateway over an authenticated link,
//! the control loop that runs one task per route, cancellation, stats reporting, and the
//! drain (say so on every link, finish the routes in flight, then stop).

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::EngineHandle;
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinHandle};
use wire::{Role, WireError};

use crate::metrics::WorkerMetrics;
use crate::net::Net;
use crate::proto::{Failure, Register, Registered, Spec, TenantTable, ToGateway, ToWorker};
use crate::state::{Ctx, Gateways, WorkerConfig};
use crate::tickets::TicketTable;
use crate::{decode, prefill, ClusterError, Link};

/// Runs a worker until `drain` completes (then drains: see [`Gateways`] and the module doc)
/// or its engine stops: [`Worker::bind`], then [`Worker::run`].
pub async fn run_worker(
    cfg: WorkerConfig,
    gateways: Gateways,
    engine: EngineHandle,
    net: Net,
    metrics: Arc<WorkerMetrics>,
    drain: impl Future<Output = ()>,
) -> Result<(), ClusterError> {
    Worker::bind(cfg, engine, net, metrics).await?.run(gateways, drain).await
}

/// A worker whose KV listener (decode) is bound, not yet registered anywhere.
pub struct Worker {
    ctx: Arc<Ctx>,
}

impl Worker {
    /// Binds a decode worker's KV listener and starts accepting on it.
    pub async fn bind(
        cfg: WorkerConfig,
        engine: EngineHandle,
        net: Net,
        metrics: Arc<WorkerMetrics>,
    ) -> Result<Worker, ClusterError> {
        let mut kv = None;
        let mut kv_addr = None;
        if cfg.identity.role == Role::Decode {
            let listen = cfg.kv_listen.clone().unwrap_or_else(|| "127.0.0.1:0".into());
            let (listener, bound) = net.listen(&listen).await?;
            if !bound.starts_with("mem:") {
                // Operators (and tests) put proxies or load balancers in front of it.
                println!("{}: KV listening on {bound}", cfg.name);
            }
            kv_addr = Some(cfg.kv_advertise.clone().unwrap_or(bound));
            kv = Some(listener);
        }
        let ctx = Arc::new(Ctx {
            cfg,
            engine,
            net,
            metrics,
            tickets: TicketTable::default(),
            kv_addr,
            tenancy: Mutex::default(),
            links: Mutex::default(),
            draining: AtomicBool::new(false),
            active_routes: Arc::new(AtomicUsize::new(0)),
            constraints: Arc::default(),
        });
        if let Some(listener) = kv {
            tokio::spawn(decode::accept_kv(ctx.clone(), listener));
        }
        Ok(Worker { ctx })
    }

    /// Where prefill workers reach this decode worker's KV listener (as advertised).
    pub fn kv_addr(&self) -> Option<&str> {
        self.ctx.kv_addr.as_deref()
    }

    /// Registers with the gateways, serves routes, and re-registers (after a pause) whenever a
    /// link drops, having cancelled every route of the lost link; when `drain` completes,
    /// drains. Returns an error only for what retrying cannot fix (a refused registration with
    /// a fixed gateway).
    pub async fn run(self, gateways: Gateways, drain: impl Future<Output = ()>) -> Result<(), ClusterError> {
        let ctx = self.ctx;
        tokio::pin!(drain);
        let mut dialers: HashMap<String, JoinHandle<()>> = HashMap::new();
        match gateways {
            Gateways::Fixed(addr) => {
                // Its own task: the drain must not drop a session and its routes mid-flight.
                let mut h = tokio::spawn(dial(ctx.clone(), addr.clone(), None));
                tokio::select! {
                    r = &mut h => return r.unwrap_or_else(|e| Err(ClusterError::Message(format!("worker task failed: {e}")))),
                    () = &mut drain => {
                        dialers.insert(addr, tokio::spawn(async move { let _ = h.await; }));
                    }
                }
            }
            Gateways::Listed(mut listed) => loop {
                let now: BTreeSet<String> = listed.borrow_and_update().clone();
                // A finished dialer of a listed gateway refused us: not again until it is relisted.
                dialers.retain(|addr, h| now.contains(addr) || !h.is_finished());
                for addr in now {
                    if dialers.contains_key(&addr) {
                        continue;
                    }
                    let (ctx, list, a) = (ctx.clone(), listed.clone(), addr.clone());
                    let h = tokio::spawn(async move {
                        if let Err(e) = dial(ctx.clone(), a.clone(), Some(list)).await {
                            tracing::error!(worker = %ctx.cfg.name, gateway = %a, error = %e,
                                "this gateway refused the worker; not dialling it again until it is listed anew");
                        }
                    });
                    dialers.insert(addr, h);
                }
                tokio::select! {
                    changed = listed.changed() => if changed.is_err() {
                        // The membership watch is gone: keep the links we have until the drain.
                        (&mut drain).await;
                        break;
                    },
                    () = &mut drain => break,
                }
            },
        }
        drain_routes(&ctx).await;
        for h in dialers.values() {
            h.abort();
        }
        Ok(())
    }
}

/// Registers with the gateway at `addr` again and again (with a growing pause) while it is
/// listed (always, for a fixed gateway) and the worker is not draining. Returns the error no
/// retry can fix.
async fn dial(
    ctx: Arc<Ctx>,
    addr: String,
    listed: Option<watch::Receiver<BTreeSet<String>>>,
) -> Result<(), ClusterError> {
    let mut pause = Duration::from_millis(100);
    loop {
        if ctx.draining.load(Ordering::SeqCst) || listed.as_ref().is_some_and(|l| !l.borrow().contains(&addr)) {
            return Ok(());
        }
        match session(&ctx, &addr).await {
            Ok(()) => pause = Duration::from_millis(100),
            // A busy gateway is worth another try.
            Err(e @ ClusterError::Wire(WireError::Refused(wire::RefusalCode::Busy))) => {
                ctx.metrics.links.failure(crate::link::refusal_reason(&e));
                tracing::warn!(worker = %ctx.cfg.name, gateway = %addr, error = %e, retry_ms = pause.as_millis() as u64, "gateway link ended; retrying");
            }
            // Misconfiguration (another secret, role, model or KV layout; a refused
            // registration) or not a gateway at all: retrying cannot fix it.
            Err(
                e @ (ClusterError::Rejected(_)
                | ClusterError::WrongRole { .. }
                | ClusterError::Wire(
                    WireError::Pairing(_) | WireError::Refused(_) | WireError::BadProof | WireError::Reflection { .. },
                )),
            ) => {
                ctx.metrics.links.failure(crate::link::refusal_reason(&e));
                return Err(e);
            }
            Err(e) => {
                ctx.metrics.links.failure(crate::link::refusal_reason(&e));
                tracing::warn!(worker = %ctx.cfg.name, gateway = %addr, error = %e, retry_ms = pause.as_millis() as u64, "gateway link ended; retrying");
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// Says `Draining` on every link (gateways stop sending new routes), then waits for the
/// routes in flight to end, at most `drain_timeout`.
async fn drain_routes(ctx: &Ctx) {
    ctx.draining.store(true, Ordering::SeqCst);
    for out in ctx.links.lock().unwrap_or_else(|e| e.into_inner()).values() {
        let _ = out.send(ToGateway::Draining);
    }
    let until = Instant::now() + ctx.cfg.drain_timeout;
    let mut left = ctx.active_routes.load(Ordering::SeqCst);
    tracing::info!(worker = %ctx.cfg.name, routes = left, "draining");
    while left > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
        left = ctx.active_routes.load(Ordering::SeqCst);
    }
    if left > 0 {
        tracing::warn!(worker = %ctx.cfg.name, routes = left, "drain timeout: stopping with routes in flight");
    } else {
        tracing::info!(worker = %ctx.cfg.name, "drained: no route in flight");
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

/// Distinguishes the links of one worker (each gateway's tenant table is kept per link).
static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

async fn session(ctx: &Arc<Ctx>, addr: &str) -> Result<(), ClusterError> {
    let timeout = ctx.cfg.handshake_timeout;
    let io = tokio::time::timeout(timeout, ctx.net.dial(addr))
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
    let id = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
    match tokio::time::timeout(timeout, rd.recv::<Registered>()).await {
        Ok(Ok(Some(Registered::Accepted(table)))) => apply_tenants(ctx, id, &table),
        Ok(Ok(Some(Registered::Rejected(m)))) => return Err(ClusterError::Rejected(m)),
        Ok(Ok(None)) => return Err(ClusterError::Message("the gateway closed the link".into())),
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(ClusterError::Timeout("registering with the gateway")),
    }
    tracing::info!(worker = %ctx.cfg.name, gateway = %addr, "registered with the gateway");

    let (out, mut out_rx) = mpsc::unbounded_channel::<ToGateway>();
    ctx.links.lock().unwrap_or_else(|e| e.into_inner()).insert(id, out.clone());
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
    let routes = Routes::default();
    let result = loop {
        let msg = match rd.recv_routed::<ToWorker>().await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(u))) => {
                ctx.metrics.links.failure("undecodable_message");
                tracing::warn!(worker = %ctx.cfg.name, route = ?u.route, reason = %u.reason, "a control message did not decode; only its route fails");
                if let Some(route) = u.route {
                    let failure = Failure::Internal("the worker could not read this route's request".into());
                    let _ = out.send(ToGateway::Failed { route, failure });
                }
                continue;
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        match msg {
            ToWorker::Cancel { route } => routes.cancel(route),
            ToWorker::Tenants(table) => apply_tenants(ctx, id, &table),
            ToWorker::Reserve(spec) | ToWorker::Prefill { spec, .. } if ctx.draining.load(Ordering::SeqCst) => {
                let _ = out.send(ToGateway::Failed { route: spec.route, failure: Failure::ShuttingDown });
            }
            ToWorker::Reserve(spec) if ctx.role() == Role::Decode => {
                let Some(spec) = scoped(ctx, id, spec, &out) else { continue };
                spawn_route(ctx, &routes, spec.route, decode::reserve(ctx.clone(), spec, out.clone()));
            }
            ToWorker::Prefill { spec, ticket, decode_addr } if ctx.role() == Role::Prefill => {
                let Some(spec) = scoped(ctx, id, spec, &out) else { continue };
                let route = spec.route;
                let fut = prefill::run(ctx.clone(), spec, ticket.into(), decode_addr, out.clone());
                spawn_route(ctx, &routes, route, fut);
            }
            ToWorker::Reserve(spec) | ToWorker::Prefill { spec, .. } => {
                let failure = Failure::Internal(format!("a {:?} worker does not take this request", ctx.role()));
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
        spec.tenant,
        spec.cache_salt.as_deref(),
    );
    match salt {
        Some(s) => {
            spec.cache_salt = Some(s);
            Some(spec)
        }
        None => {
            let _ = out.send(ToGateway::Failed { route: spec.route, failure: Failure::Revoked });
            None
        }
    }
}

/// Applies a gateway's tenant table to this worker's engine before anything after it runs
/// (see `tenancy`: tenants whose key epochs changed lose their requests and cached prefixes).
fn apply_tenants(ctx: &Ctx, link: u64, table: &TenantTable) {
    let (policy, revoked) = ctx.tenancy.lock().unwrap_or_else(|e| e.into_inner()).update(link, table);
    let tenants = policy.live.as_ref().map_or(0, |l| l.len());
    match &policy.revoke {
        engine::Revoke::These(ts) => ts.iter().for_each(|t| ctx.constraints.forget(*t)),
        engine::Revoke::AllCaches => ctx.constraints.clear(),
    }
    ctx.engine.apply_tenants(policy);
    tracing::info!(worker = %ctx.cfg.name, tenants, revoked, "tenant table applied");
}

/// Counts a route while its task lives (ended, or aborted by a cancel or a lost link).
struct Active(Arc<AtomicUsize>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs one route as its own task, registered so a `Cancel` or the end of the session aborts it.
fn spawn_route<F>(ctx: &Ctx, routes: &Routes, route: u64, fut: F)
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
    routes.insert(route, h.abort_handle());
    if h.is_finished() {
        routes.remove(route);
    }
}
