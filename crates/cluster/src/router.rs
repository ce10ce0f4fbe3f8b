//! The gateway's side of the cluster: registration of workers, routing of each request to a
//! decode and a prefill worker, the first-token gate, cancellation and the one retry.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::{
    AdmissionError, EngineError, EngineStats, Event, EventSender, GenRequest, RequestStream, TokenEvent, Usage,
    ViolationKind,
};
use kv::TenantId;
use tokio::sync::mpsc;
use wire::{Role, Ticket};

use crate::link::{HandshakeGate, Identity};
use crate::metrics::LinkMetrics;
use crate::proto::{Failure, Register, Registered, Spec, Stats, TenantTable, ToGateway, ToWorker};
use crate::{ClusterError, Link};

#[derive(Clone)]
pub struct RouterConfig {
    pub identity: Identity,
    /// The served context window; workers must serve the same.
    pub context: usize,
    pub vocab: usize,
    pub handshake_timeout: Duration,
    /// How long after the prefill worker sent the KV the decode worker may take to verify it.
    pub transfer_timeout: Duration,
    /// Handshakes the cluster listener runs at once; more connections are turned away.
    pub max_pending_handshakes: usize,
    /// Handshakes the cluster listener runs at once for one source address.
    pub max_pending_handshakes_per_source: usize,
}

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
    pub stats: Stats,
}

enum RouteMsg {
    Msg(ToGateway),
    /// The worker's link is gone.
    Lost,
}

struct WorkerConn {
    id: u64,
    name: String,
    role: Role,
    /// Where prefill workers send this decode worker's KV (as it registered).
    kv_addr: Option<String>,
    capacity: usize,
    tx: mpsc::UnboundedSender<ToWorker>,
    inflight: AtomicUsize,
    routes: Mutex<HashMap<u64, mpsc::UnboundedSender<(Role, RouteMsg)>>>,
    stats: Mutex<Stats>,
    /// The worker said it is draining: it finishes its routes but gets no new one.
    draining: AtomicBool,
    /// Wakes the link's reader to close it: the worker left the membership.
    evict: tokio::sync::Notify,
    routed: AtomicU64,
    /// Control messages to and from it.
    sent: Arc<AtomicU64>,
    received: AtomicU64,
}

impl WorkerConn {
    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<u64, mpsc::UnboundedSender<(Role, RouteMsg)>>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Inner {
    cfg: RouterConfig,
    workers: Mutex<Vec<Arc<WorkerConn>>>,
    next_route: AtomicU64,
    next_worker: AtomicU64,
    stopping: AtomicBool,
    gate: HandshakeGate,
    links: LinkMetrics,
    /// The gateway's tenant table, sent to every worker at registration and on each change.
    tenants: Mutex<TenantTable>,
    revocations: tokio::sync::watch::Sender<Revocations>,
}

/// Which tenants were revoked (removed, key rotated), and when, counted in revocations: a
/// request admitted before a revocation of its tenant ends; one admitted after runs.
#[derive(Debug, Default)]
struct Revocations {
    count: u64,
    at: HashMap<TenantId, u64>,
}

impl Revocations {
    fn revoked_since(&self, tenant: TenantId, mark: u64) -> bool {
        self.at.get(&tenant).is_some_and(|&at| at > mark)
    }
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
                workers: Mutex::new(Vec::new()),
                next_route: AtomicU64::new(1),
                next_worker: AtomicU64::new(1),
                stopping: AtomicBool::new(false),
                tenants: Mutex::new(TenantTable { tenants: Vec::new(), max_share: 1.0 }),
                revocations: tokio::sync::watch::Sender::new(Revocations::default()),
            }),
        }
    }

    fn workers(&self) -> std::sync::MutexGuard<'_, Vec<Arc<WorkerConn>>> {
        self.inner.workers.lock().unwrap_or_else(|e| e.into_inner())
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
        let cfg = &self.inner.cfg;
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
        let table = self.inner.tenants.lock().unwrap_or_else(|e| e.into_inner()).clone();
        wr.send(&Registered::Accepted(table)).await?;
        let (tx, mut rx) = mpsc::unbounded_channel::<ToWorker>();
        let w = Arc::new(WorkerConn {
            id: self.inner.next_worker.fetch_add(1, Ordering::Relaxed),
            name: reg.name.clone(),
            role,
            kv_addr: reg.kv_addr,
            capacity: reg.capacity_tokens,
            tx,
            inflight: AtomicUsize::new(0),
            routes: Mutex::new(HashMap::new()),
            stats: Mutex::new(Stats::default()),
            draining: AtomicBool::new(false),
            evict: tokio::sync::Notify::new(),
            routed: AtomicU64::new(0),
            sent: Arc::new(AtomicU64::new(0)),
            received: AtomicU64::new(0),
        });
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
                    self.inner.links.failure(reason);
                    tracing::warn!(role = role.name(), worker = %w.name, node_key = %peer_key.fingerprint(), reason, "the worker's cluster secret is no longer accepted, or its node key no longer trusted: link closed");
                    break Err(ClusterError::Message(format!("the link is no longer admitted ({reason})")));
                }
            };
            let msg = match msg {
                Ok(Some(Err(u))) => {
                    self.inner.links.failure("undecodable_message");
                    tracing::warn!(role = role.name(), worker = %w.name, route = ?u.route, reason = %u.reason, "a worker's message did not decode; only its route fails");
                    if let Some((route, t)) = u.route.and_then(|r| Some((r, w.routes().get(&r).cloned()?))) {
                        let failure =
                            Failure::Internal(format!("the {} worker's message could not be read", role.name()));
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
    pub async fn wait_for_workers(&self, prefill: usize, decode: usize, timeout: Duration) -> bool {
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

    /// Links to this gateway that failed, by reason.
    pub fn link_failures(&self) -> Vec<(String, u64)> {
        self.inner.links.snapshot()
    }

    /// Whether a request could be routed now (a prefill and a decode worker are registered
    /// and not draining).
    pub fn can_route(&self) -> bool {
        let ws = self.workers();
        let open = |role| ws.iter().any(|w| w.role == role && !w.draining.load(Ordering::SeqCst));
        open(Role::Prefill) && open(Role::Decode)
    }

    /// Closes the links of the workers called `name` (their lease in the membership store
    /// expired or was revoked): their routes fail over as a lost worker's do. A worker that
    /// drains says so over its link first, so its routes have finished by then.
    pub fn evict(&self, name: &str) {
        for w in self.workers().iter().filter(|w| w.name == name) {
            tracing::warn!(role = w.role.name(), worker = %w.name, "worker left the membership; closing its link");
            w.evict.notify_one();
        }
    }

    pub fn worker_info(&self) -> Vec<WorkerInfo> {
        self.workers()
            .iter()
            .map(|w| WorkerInfo {
                name: w.name.clone(),
                role: w.role.name(),
                inflight: w.inflight.load(Ordering::Relaxed),
                routes: w.routed.load(Ordering::Relaxed),
                messages: (w.sent.load(Ordering::Relaxed), w.received.load(Ordering::Relaxed)),
                stats: w.stats.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            })
            .collect()
    }

    /// The door rule, with the largest decode pool as the pool bound.
    pub fn check(&self, prompt: &[u32], max_tokens: usize) -> Result<(), AdmissionError> {
        let capacity = self.workers().iter().filter(|w| w.role == Role::Decode).map(|w| w.capacity).max();
        let cfg = &self.inner.cfg;
        engine::door_check(prompt, max_tokens, cfg.context, capacity.unwrap_or(cfg.context), cfg.vocab)
    }

    /// Replaces the tenant table and sends it to every worker. The requests of the tenants in
    /// `revoke` (removed, or their key rotated) that were admitted before this call end with
    /// [`EngineError::TenantRevoked`]; workers drop those tenants' cached prefixes.
    pub fn set_tenants(&self, table: TenantTable, revoke: &[TenantId]) {
        {
            // Workers get tables in the order they were set: the send happens under the lock.
            let mut current = self.inner.tenants.lock().unwrap_or_else(|e| e.into_inner());
            *current = table.clone();
            if !revoke.is_empty() {
                self.inner.revocations.send_modify(|r| {
                    r.count += 1;
                    for t in revoke {
                        r.at.insert(*t, r.count);
                    }
                });
            }
            for w in self.workers().iter() {
                let _ = w.tx.send(ToWorker::Tenants(table.clone()));
            }
        }
    }

    /// Take this before authenticating a request and pass it to [`Router::submit`]: a
    /// revocation after it ends the request even if the key was valid when checked.
    pub fn revocation_mark(&self) -> u64 {
        self.inner.revocations.borrow().count
    }

    /// Checks the request, then runs it on the cluster; the stream has the engine's contract.
    /// `mark` is [`Router::revocation_mark`] from before the request's key was checked.
    pub fn submit(&self, req: GenRequest, mark: u64) -> Result<RequestStream, AdmissionError> {
        self.check(&req.prompt, req.max_tokens)?;
        if self.inner.stopping.load(Ordering::SeqCst) {
            return Err(AdmissionError::ShuttingDown);
        }
        let (tx, rs) = RequestStream::channel(req.id);
        if self.inner.revocations.borrow().revoked_since(req.tenant, mark) {
            let _ = tx.send(Event::Failed(EngineError::TenantRevoked));
            return Ok(rs);
        }
        // The request's span (ids only) follows it into the task that routes it.
        let span = tracing::info_span!("request", request = req.id.0, tenant = req.tenant.0);
        tokio::spawn(tracing::Instrument::instrument(self.clone().orchestrate(req, tx, mark), span));
        Ok(rs)
    }

    pub fn stop_admitting(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
    }

    /// Sums of the workers' last reported stats, each engine counted once.
    pub fn stats(&self) -> EngineStats {
        let mut s = EngineStats::default();
        let mut seen = Vec::new();
        for w in self.workers().iter() {
            let ws = w.stats.lock().unwrap_or_else(|e| e.into_inner());
            if seen.contains(&ws.engine) {
                continue;
            }
            seen.push(ws.engine);
            s.absorb(&ws.engine_stats());
        }
        s
    }

    /// Ends every route with an error (shutdown after the drain timeout).
    pub fn fail_all(&self) {
        for w in self.workers().iter() {
            for (_, t) in w.routes().drain() {
                let _ = t.send((w.role, RouteMsg::Lost));
            }
        }
    }

    /// The least loaded worker of `role`, preferring those not in `avoid`.
    fn pick(&self, role: Role, avoid: &[u64]) -> Option<Arc<WorkerConn>> {
        pick(&self.workers(), role, avoid).cloned()
    }

    async fn orchestrate(self, req: GenRequest, ev: EventSender, mark: u64) {
        let mut avoid = Vec::new();
        for attempt in 0..2 {
            match self.attempt(&req, &ev, &mut avoid, mark).await {
                Outcome::Done => return,
                Outcome::Retry(e) if attempt == 0 => {
                    tracing::warn!(request = req.id.0, tenant = req.tenant.0, error = %e, "failed before its first token; retrying once");
                }
                Outcome::Retry(e) | Outcome::Fail(e) => {
                    let _ = ev.send(Event::Failed(e));
                    return;
                }
            }
        }
    }

    async fn attempt(&self, req: &GenRequest, ev: &EventSender, avoid: &mut Vec<u64>, mark: u64) -> Outcome {
        let mut revocations = self.inner.revocations.subscribe();
        if revocations.borrow_and_update().revoked_since(req.tenant, mark) {
            return Outcome::Fail(EngineError::TenantRevoked);
        }
        let Some(decode) = self.pick(Role::Decode, avoid) else {
            return Outcome::Fail(EngineError::Unavailable("no decode worker is registered".into()));
        };
        let Some(prefill) = self.pick(Role::Prefill, avoid) else {
            return Outcome::Fail(EngineError::Unavailable("no prefill worker is registered".into()));
        };
        let route = self.inner.next_route.fetch_add(1, Ordering::Relaxed);
        // The gateway's validation refused any format that cannot travel; were one to reach
        // here, it fails this request alone, before any worker hears of it.
        let spec = match Spec::of(route, req) {
            Ok(s) => s,
            Err(e) => return Outcome::Fail(EngineError::Internal(format!("the output format cannot be sent: {e}"))),
        };
        tracing::debug!(route, decode = %decode.name, prefill = %prefill.name, "route");
        let (tx, mut rx) = mpsc::unbounded_channel();
        let guard =
            RouteGuard { route, workers: [decode.clone(), prefill.clone()], prefill_released: false, done: false };
        for w in &guard.workers {
            w.inflight.fetch_add(1, Ordering::Relaxed);
            w.routed.fetch_add(1, Ordering::Relaxed);
            w.routes().insert(route, tx.clone());
        }
        drop(tx);
        let mut guard = guard;
        let _ = decode.tx.send(ToWorker::Reserve(spec.clone()));
        let deadline = req.deadline.unwrap_or_else(|| Instant::now() + crate::proto::DEFAULT_DEADLINE);
        let mut gate = FirstTokenGate::default();
        let mut verify_by: Option<tokio::time::Instant> = None;
        loop {
            let verify_sleep = async {
                match verify_by {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            let (from, msg) = tokio::select! {
                m = rx.recv() => match m {
                    Some(m) => m,
                    None => return Outcome::Fail(EngineError::Internal("route channel closed".into())),
                },
                _ = ev.closed() => return Outcome::Done,
                Ok(()) = revocations.changed() => {
                    if revocations.borrow_and_update().revoked_since(req.tenant, mark) {
                        return Outcome::Fail(EngineError::TenantRevoked);
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(deadline.into()) => return Outcome::Fail(EngineError::DeadlineExceeded),
                _ = verify_sleep => {
                    let e = EngineError::Unavailable("the decode worker did not verify the KV in time".into());
                    return if gate.released { Outcome::Fail(e) } else { Outcome::Retry(e) };
                }
            };
            let worker = if from == Role::Decode { &decode } else { &prefill };
            let msg = match msg {
                RouteMsg::Lost => {
                    avoid.push(worker.id);
                    let e = EngineError::Unavailable(format!("{} worker {} was lost", from.name(), worker.name));
                    return if gate.released { Outcome::Fail(e) } else { Outcome::Retry(e) };
                }
                RouteMsg::Msg(m) => m,
            };
            match (from, msg) {
                (Role::Decode, ToGateway::Reserved { ticket, .. }) => {
                    let t: Ticket = ticket.into();
                    if t.request != req.id || t.tenant != req.tenant || t.tokens as usize != req.prompt.len() {
                        return Outcome::Fail(EngineError::IsolationViolation { kind: ViolationKind::WrongTicket });
                    }
                    let _ = ev.send(Event::Started);
                    let decode_addr = decode.kv_addr.clone().unwrap_or_default();
                    let _ = prefill.tx.send(ToWorker::Prefill { spec: spec.clone(), ticket, decode_addr });
                }
                (Role::Prefill, ToGateway::First { token, cached_tokens, .. }) => {
                    gate.first = Some(token);
                    if let Some(n) = cached_tokens {
                        gate.cached_tokens = n;
                        let _ = ev.send(Event::PrefixCache { cached_tokens: n });
                    }
                }
                (Role::Prefill, ToGateway::Sent { .. }) => {
                    // The two workers' links race: decode's `Verified` may come first, and then
                    // there is nothing left to wait for (a deadline armed now would fire in the
                    // middle of decoding and start the request over).
                    if gate.verified.is_none() {
                        verify_by = Some(tokio::time::Instant::now() + self.inner.cfg.transfer_timeout);
                    }
                }
                (Role::Decode, ToGateway::Verified { first, .. }) => {
                    verify_by = None;
                    gate.verified = Some(first);
                }
                (Role::Decode, m @ (ToGateway::Token { .. } | ToGateway::Finished { .. })) => gate.pending.push_back(m),
                (_, ToGateway::Failed { failure, .. }) => {
                    // A worker that could not reach its peer, or is draining, before the
                    // first token: another pair may serve it.
                    if matches!(failure, Failure::Unreachable(_) | Failure::ShuttingDown) && !gate.released {
                        // A prefill worker that could not reach its decode worker names the
                        // decode worker as the one to pass over (after a rotation it may hold
                        // only the old secret); a draining worker names itself.
                        let unreachable = matches!(failure, Failure::Unreachable(_)) && from == Role::Prefill;
                        avoid.push(if unreachable { decode.id } else { worker.id });
                        return Outcome::Retry(failure.to_engine());
                    }
                    return Outcome::Fail(failure.to_engine());
                }
                (role, other) => {
                    let what = format!("{} sent an unexpected {:?}", role.name(), std::mem::discriminant(&other));
                    return Outcome::Fail(EngineError::Internal(what));
                }
            }
            match gate.release(req, ev, self.inner.cfg.vocab) {
                Err(kind) => return Outcome::Fail(EngineError::IsolationViolation { kind }),
                Ok(true) => {
                    guard.done = true;
                    return Outcome::Done;
                }
                Ok(false) => {}
            }
            if gate.released {
                // The KV is verified on the decode worker and the first token is out: the
                // prefill worker's part is over. Losing it now must not end a stream it no
                // longer carries, nor count against it when routing.
                guard.release_prefill();
            }
        }
    }
}

/// The least loaded worker of `role` (routes in flight), passing over those in `avoid` (the
/// workers a first attempt failed on) while another of the role is registered; a draining
/// worker is never picked.
fn pick<'a>(ws: &'a [Arc<WorkerConn>], role: Role, avoid: &[u64]) -> Option<&'a Arc<WorkerConn>> {
    let of_role = || ws.iter().filter(|w| w.role == role && !w.draining.load(Ordering::SeqCst));
    let fresh = of_role().filter(|w| !avoid.contains(&w.id)).min_by_key(|w| w.inflight.load(Ordering::Relaxed));
    fresh.or_else(|| of_role().min_by_key(|w| w.inflight.load(Ordering::Relaxed)))
}

enum Outcome {
    Done,
    /// Failed before the first token was released: may be retried once.
    Retry(EngineError),
    Fail(EngineError),
}

/// Holds the first token (from prefill) until decode verified the KV, then relays in order.
#[derive(Default)]
struct FirstTokenGate {
    first: Option<TokenEvent>,
    /// What the prefill worker's cache served (reported in usage).
    cached_tokens: usize,
    verified: Option<u32>,
    released: bool,
    pending: VecDeque<ToGateway>,
}

impl FirstTokenGate {
    /// Releases what can be; `Ok(true)` once the request finished.
    fn release(&mut self, req: &GenRequest, ev: &EventSender, vocab: usize) -> Result<bool, ViolationKind> {
        if !self.released {
            let (Some(first), Some(verified)) = (&self.first, self.verified) else { return Ok(false) };
            if first.token != verified {
                return Err(ViolationKind::FirstTokenMismatch);
            }
            if first.token as usize >= vocab {
                return Err(ViolationKind::BadFirstToken);
            }
            self.released = true;
            if !req.stop_tokens.contains(first.token) {
                let _ = ev.send(Event::Token(first.clone()));
            }
        }
        while let Some(m) = self.pending.pop_front() {
            match m {
                ToGateway::Token { token, .. } => {
                    // A token the model cannot have sampled (a rogue or broken decode worker).
                    if token.token as usize >= vocab {
                        return Err(ViolationKind::BadToken);
                    }
                    let _ = ev.send(Event::Token(token));
                }
                ToGateway::Finished { reason, usage, .. } => {
                    let usage =
                        Usage { prompt_tokens: usage.0, completion_tokens: usage.1, cached_tokens: self.cached_tokens };
                    let _ = ev.send(Event::Finished { reason, usage });
                    return Ok(true);
                }
                _ => {}
            }
        }
        Ok(false)
    }
}

/// Unregisters a route from its workers; unless it finished normally, tells both to cancel it
/// (idempotent on their side), so its pages are freed everywhere.
struct RouteGuard {
    route: u64,
    /// Decode first, then prefill, while the prefill worker still takes part.
    workers: [Arc<WorkerConn>; 2],
    prefill_released: bool,
    done: bool,
}

impl RouteGuard {
    /// Takes the prefill worker off the route once its transfer is verified: its loss no
    /// longer reaches the route, and it is no longer counted as carrying it.
    fn release_prefill(&mut self) {
        if std::mem::replace(&mut self.prefill_released, true) {
            return;
        }
        let w = &self.workers[1];
        w.routes().remove(&self.route);
        w.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        let taking_part = if self.prefill_released { 1 } else { 2 };
        for w in &self.workers[..taking_part] {
            w.routes().remove(&self.route);
            w.inflight.fetch_sub(1, Ordering::Relaxed);
            if !self.done {
                let _ = w.tx.send(ToWorker::Cancel { route: self.route });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::FinishReason;
    use engine::RequestStream;
    use kv::{RequestId, TenantId};

    fn worker(id: u64, role: Role, inflight: usize) -> Arc<WorkerConn> {
        let (tx, _) = mpsc::unbounded_channel();
        Arc::new(WorkerConn {
            id,
            name: format!("w{id}"),
            role,
            kv_addr: None,
            capacity: 4096,
            tx,
            inflight: AtomicUsize::new(inflight),
            routes: Mutex::new(HashMap::new()),
            stats: Mutex::new(Stats::default()),
            draining: AtomicBool::new(false),
            evict: tokio::sync::Notify::new(),
            routed: AtomicU64::new(0),
            sent: Arc::new(AtomicU64::new(0)),
            received: AtomicU64::new(0),
        })
    }

    #[test]
    fn a_draining_worker_is_never_picked_even_when_it_is_the_least_loaded() {
        let ws = vec![worker(1, Role::Decode, 0), worker(2, Role::Decode, 5)];
        ws[0].draining.store(true, Ordering::SeqCst);
        assert_eq!(pick(&ws, Role::Decode, &[]).map(|w| w.id), Some(2));
        assert_eq!(pick(&ws, Role::Decode, &[2]).map(|w| w.id), Some(2));
        ws[1].draining.store(true, Ordering::SeqCst);
        assert!(pick(&ws, Role::Decode, &[]).is_none());
    }

    #[test]
    fn pick_takes_the_least_loaded_worker_of_the_role_and_avoids_a_failed_one_while_another_exists() {
        let ws = vec![
            worker(1, Role::Decode, 3),
            worker(2, Role::Prefill, 0),
            worker(3, Role::Decode, 1),
            worker(4, Role::Decode, 2),
        ];
        assert_eq!(pick(&ws, Role::Decode, &[]).map(|w| w.id), Some(3));
        assert_eq!(pick(&ws, Role::Prefill, &[]).map(|w| w.id), Some(2));
        // A retry passes over the worker that failed, even though it is the least loaded.
        assert_eq!(pick(&ws, Role::Decode, &[3]).map(|w| w.id), Some(4));
        // With every worker of the role avoided, the least loaded of them is still better than none.
        assert_eq!(pick(&ws, Role::Prefill, &[2]).map(|w| w.id), Some(2));
        assert_eq!(pick(&ws, Role::Decode, &[1, 3, 4]).map(|w| w.id), Some(3));
        assert!(pick(&ws, Role::Gateway, &[]).is_none());
        assert!(pick(&[], Role::Decode, &[]).is_none());
    }

    const VOCAB: usize = 100;

    fn request(stop: &[u32]) -> GenRequest {
        GenRequest {
            id: RequestId(7),
            tenant: TenantId(2),
            prompt: vec![1, 2, 3],
            max_tokens: 8,
            sampling: sampling::SamplingParams::default(),
            stop_tokens: sampling::StopTokens::new(stop.iter().copied()),
            deadline: None,
            cache_salt: None,
            constraint: None,
        }
    }

    fn tok(t: u32) -> TokenEvent {
        TokenEvent { token: t, logprob: Some(-0.5), top: vec![] }
    }

    fn token_msg(t: u32) -> ToGateway {
        ToGateway::Token { route: 1, token: TokenEvent { token: t, logprob: Some(-0.5), top: vec![] } }
    }

    /// What the gate sent, once the sender is gone.
    fn sent(tx: EventSender, mut rs: RequestStream) -> Vec<String> {
        drop(tx);
        std::iter::from_fn(|| rs.blocking_next())
            .map(|e| match e {
                Event::Token(t) => format!("token {}", t.token),
                Event::Finished { reason, usage } => {
                    format!(
                        "finished {reason:?} {} {} {}",
                        usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens
                    )
                }
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_first_token_waits_for_the_decode_workers_verification_then_everything_follows_in_order() {
        let req = request(&[]);
        let (tx, rs) = RequestStream::channel(req.id);
        let mut gate = FirstTokenGate { first: Some(tok(42)), cached_tokens: 2, ..Default::default() };
        // Decode's tokens may arrive before its verification reaches the gateway: held too.
        gate.pending.push_back(token_msg(43));
        assert_eq!(gate.release(&req, &tx, VOCAB), Ok(false));
        assert!(!gate.released);
        gate.verified = Some(42);
        gate.pending.push_back(ToGateway::Finished { route: 1, reason: FinishReason::Length, usage: (3, 2) });
        assert_eq!(gate.release(&req, &tx, VOCAB), Ok(true));
        assert_eq!(sent(tx, rs), ["token 42", "token 43", "finished Length 3 2 2"]);
    }

    #[test]
    fn a_first_token_other_than_the_one_decode_verified_or_outside_the_vocabulary_releases_nothing() {
        let req = request(&[]);
        for (first, verified, kind) in
            [(42, 41, ViolationKind::FirstTokenMismatch), (VOCAB as u32, VOCAB as u32, ViolationKind::BadFirstToken)]
        {
            let (tx, rs) = RequestStream::channel(req.id);
            let mut gate = FirstTokenGate { first: Some(tok(first)), verified: Some(verified), ..Default::default() };
            gate.pending.push_back(token_msg(5));
            assert_eq!(gate.release(&req, &tx, VOCAB), Err(kind));
            assert!(!gate.released);
            assert!(sent(tx, rs).is_empty(), "{kind:?}");
        }
    }

    #[test]
    fn a_later_token_outside_the_vocabulary_fails_the_request_after_what_came_before_it() {
        let req = request(&[]);
        let (tx, rs) = RequestStream::channel(req.id);
        let mut gate = FirstTokenGate { first: Some(tok(1)), verified: Some(1), ..Default::default() };
        gate.pending.extend([token_msg(2), token_msg(VOCAB as u32 + 7), token_msg(3)]);
        assert_eq!(gate.release(&req, &tx, VOCAB), Err(ViolationKind::BadToken));
        assert_eq!(sent(tx, rs), ["token 1", "token 2"]);
    }

    #[test]
    fn a_first_token_that_is_a_stop_token_ends_the_text_without_being_sent() {
        let req = request(&[0]);
        let (tx, rs) = RequestStream::channel(req.id);
        let mut gate = FirstTokenGate { first: Some(tok(0)), verified: Some(0), ..Default::default() };
        gate.pending.push_back(ToGateway::Finished { route: 1, reason: FinishReason::Stop, usage: (3, 1) });
        assert_eq!(gate.release(&req, &tx, VOCAB), Ok(true));
        assert_eq!(sent(tx, rs), ["finished Stop 3 1 0"]);
    }
}
