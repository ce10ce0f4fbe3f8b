//! What both worker roles share: registering with each gateway over an authenticated link,
//! the control loop that runs one task per route, cancellation, stats reporting, and the
//! drain (say so on every link, finish the routes in flight, then stop).

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::EngineHandle;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use wire::{Role, WireError};

use crate::metrics::WorkerMetrics;
use crate::net::Net;
use crate::proto::ToGateway;
use crate::state::{Ctx, Gateways, WorkerConfig};
use crate::tickets::TicketTable;
use crate::{decode, session, tag_report, ClusterError};

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
                println!("{}: {}{bound}", cfg.name, types::listening::KV);
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
        tokio::spawn(tag_report::report_cache_tags(Arc::downgrade(&ctx)));
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

/// The longest pause between two tries of a listed gateway that keeps failing.
const LISTED_MAX_PAUSE: Duration = Duration::from_secs(60);

/// Registers with the gateway at `addr` again and again (with a growing pause) while it is
/// listed (always, for a fixed gateway) and the worker is not draining. A link whose dialling
/// secret is no longer the current one, or that reached its maximum age, is replaced
/// make-before-break: the new link is registered before the old one retires. Returns the
/// error no retry can fix.
async fn dial(
    ctx: Arc<Ctx>,
    addr: String,
    listed: Option<watch::Receiver<BTreeSet<String>>>,
) -> Result<(), ClusterError> {
    let mut pause = Duration::from_millis(100);
    // A listed address may be anyone's entry in the membership store: one that keeps failing
    // is tried less and less often, down to once a minute. A configured gateway is retried
    // every 2 s at most, so a restart is noticed at once.
    let max_pause = if listed.is_some() { LISTED_MAX_PAUSE } else { Duration::from_secs(2) };
    let mut next: Option<session::Opened> = None;
    loop {
        if ctx.draining.load(Ordering::SeqCst) || listed.as_ref().is_some_and(|l| !l.borrow().contains(&addr)) {
            return Ok(());
        }
        let opened = match next.take() {
            Some(o) => o,
            None => match session::open(&ctx, &addr).await {
                Ok(o) => o,
                Err(e) => {
                    retry_or_stop(&ctx, &addr, e, pause)?;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(max_pause);
                    continue;
                }
            },
        };
        pause = Duration::from_millis(100);
        let (secret, opened_at) = (opened.secret.clone(), opened.at);
        let retire = Arc::new(Notify::new());
        let mut serving = tokio::spawn(session::serve(ctx.clone(), opened, retire.clone()));
        let mut replace_after = Duration::ZERO;
        let ended = loop {
            tokio::select! {
                r = &mut serving => break r.unwrap_or_else(|e| Err(ClusterError::Message(format!("link task failed: {e}")))),
                () = needs_replacing(&ctx, &secret, opened_at, replace_after) => {
                    match session::open(&ctx, &addr).await {
                        Ok(new) => {
                            retire.notify_one();
                            // The old link finishes its routes on its own task.
                            tokio::spawn(serving);
                            next = Some(new);
                            break Ok(());
                        }
                        Err(e) => {
                            // The old link stays while it is accepted; try again later.
                            ctx.metrics.links.failure(crate::link::refusal_reason(&e));
                            tracing::warn!(worker = %ctx.cfg.name, gateway = %addr, error = %e, "could not open a replacement link; keeping the current one");
                            replace_after = (replace_after * 2).clamp(Duration::from_secs(1), Duration::from_secs(30));
                        }
                    }
                }
            }
        };
        if next.is_some() {
            continue;
        }
        match ended {
            Ok(()) => {}
            Err(e) => retry_or_stop(&ctx, &addr, e, pause)?,
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(max_pause);
    }
}

/// Returns once a link made at `at` with `secret` should be replaced: the dialling secret
/// changed, or the link reached `link_lifetime`; not before `after` has passed.
async fn needs_replacing(ctx: &Ctx, secret: &wire::ClusterSecret, at: Instant, after: Duration) {
    tokio::time::sleep(after).await;
    let ring = &ctx.cfg.identity.secrets;
    let mut changed = ring.changed();
    loop {
        let age = at.elapsed();
        if &ring.current() != secret || age >= ctx.cfg.link_lifetime {
            return;
        }
        tokio::select! {
            _ = changed.changed() => {}
            () = tokio::time::sleep(ctx.cfg.link_lifetime - age) => {}
        }
    }
}

/// Logs and counts a link that failed; `Err` for what no retry can fix.
fn retry_or_stop(ctx: &Ctx, addr: &str, e: ClusterError, pause: Duration) -> Result<(), ClusterError> {
    ctx.metrics.links.failure(crate::link::refusal_reason(&e));
    match e {
        // A busy gateway is worth another try.
        e @ ClusterError::Wire(WireError::Refused(wire::RefusalCode::Busy)) => {
            tracing::warn!(worker = %ctx.cfg.name, gateway = %addr, error = %e, retry_ms = pause.as_millis() as u64, "gateway link ended; retrying");
            Ok(())
        }
        // Misconfiguration (another secret, role, model or KV layout; a refused registration;
        // a node key either side does not trust, or revoked) or not a gateway at all:
        // retrying cannot fix it.
        e @ (ClusterError::Rejected(_)
        | ClusterError::WrongRole { .. }
        | ClusterError::Wire(
            WireError::Pairing(_)
            | WireError::Refused(_)
            | WireError::BadProof
            | WireError::Reflection { .. }
            | WireError::UntrustedNode(_),
        )) => Err(e),
        e => {
            tracing::warn!(worker = %ctx.cfg.name, gateway = %addr, error = %e, retry_ms = pause.as_millis() as u64, "gateway link ended; retrying");
            Ok(())
        }
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
