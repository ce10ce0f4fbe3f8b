//! The engine's door: [`door_check`] (the same rule at every door), [`Engine`] (starts and
//! stops the loop's thread) and [`EngineHandle`] (submit, prefill, reserve, resume, tenant
//! tables, stats).

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Instant;

use kv::{BlockTable, KvPool};
use model::Llama;
use tokio::sync::mpsc as tmpsc;

use crate::admission::{self, Pools};
use crate::inbox::{Kind, Msg, Pending, Resume, Shared};
use crate::scheduler::Loop;
use crate::settings::{page_runs, EngineConfig, TenantPolicy};
use crate::{Event, GenRequest, RequestStream};
use protocol::{AdmissionError, PageRun, PoolStats};

/// The door rule, the same at every door (gateway, prefill and decode workers): nothing is
/// queued, reserved, sent or computed for a request that fails it, and a failing request is
/// refused, never shortened.
pub fn door_check(
    prompt: &[u32],
    max_tokens: usize,
    context: usize,
    pool_capacity: usize,
    vocab: usize,
) -> Result<(), AdmissionError> {
    if prompt.is_empty() {
        return Err(AdmissionError::EmptyPrompt);
    }
    if max_tokens == 0 {
        return Err(AdmissionError::ZeroMaxTokens);
    }
    let needed = prompt.len().saturating_add(max_tokens);
    if needed > context {
        return Err(AdmissionError::ContextLengthExceeded { prompt: prompt.len(), max_tokens, needed, context });
    }
    if needed > pool_capacity {
        return Err(AdmissionError::ExceedsPool { needed, capacity: pool_capacity });
    }
    if let Some(&id) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(AdmissionError::InvalidToken { id, vocab });
    }
    Ok(())
}

/// A cheap, cloneable door to the engine.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Msg>,
    shared: Arc<Shared>,
    pool: KvPool,
    prefill_pool: KvPool,
    context: usize,
    vocab: usize,
    max_queued: usize,
    max_running: usize,
    prefix_cache: bool,
    grammars: Option<grammar::Grammars>,
}

pub struct Engine {
    handle: EngineHandle,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    /// Starts the engine thread. The pool must have been built for this model's layout.
    pub fn start(model: Llama, pool: KvPool, cfg: EngineConfig) -> Engine {
        Self::start_with_prefill_pool(model, pool.clone(), pool, cfg)
    }

    /// Like [`Engine::start`], with prompts of [`EngineHandle::prefill`] requests held in their
    /// own pool: one process playing both roles must not let decode reservations (which wait
    /// for transfers) starve the prefills those transfers come from.
    pub fn start_with_prefill_pool(model: Llama, pool: KvPool, prefill_pool: KvPool, cfg: EngineConfig) -> Engine {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let handle = EngineHandle {
            tx,
            shared: shared.clone(),
            pool: pool.clone(),
            prefill_pool: prefill_pool.clone(),
            context: model.config.context,
            vocab: model.config.vocab,
            max_queued: cfg.max_queued,
            max_running: cfg.max_running,
            prefix_cache: cfg.prefix_cache,
            grammars: cfg.grammars.clone(),
        };
        let mut lp = Loop::new(model, pool, prefill_pool, cfg, rx, shared);
        let thread = std::thread::Builder::new().name("pw-engine".into()).spawn(move || lp.run()).ok();
        Engine { handle, thread }
    }

    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }
}

impl Drop for Engine {
    /// Fails whatever is still queued or running (their pages are freed) and stops the thread.
    fn drop(&mut self) {
        self.handle.shared.stopping.store(true, Ordering::SeqCst);
        let _ = self.handle.tx.send(Msg::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl EngineHandle {
    /// The compiler of output formats for this engine's model, when it was given one.
    pub fn grammars(&self) -> Option<&grammar::Grammars> {
        self.grammars.as_ref()
    }

    pub fn context_window(&self) -> usize {
        self.context
    }

    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// The model's vocabulary size: every token id is below it.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The door check, shared with every other door: nothing is queued, reserved or computed
    /// for a request that fails it.
    pub fn check(&self, prompt: &[u32], max_tokens: usize) -> Result<(), AdmissionError> {
        door_check(prompt, max_tokens, self.context, self.pool.capacity_tokens(), self.vocab)
    }

    pub fn submit(&self, req: GenRequest) -> Result<RequestStream, AdmissionError> {
        self.enqueue(req, Kind::Full)
    }

    /// Prefill-worker half: after the door check, queues the request; once admitted its prompt
    /// is reserved (in the prefill pool), computed, and the stream ends with
    /// [`Event::Prefilled`] carrying the pages and the first sampled token.
    pub fn prefill(&self, req: GenRequest) -> Result<RequestStream, AdmissionError> {
        let capacity = self.prefill_pool.capacity_tokens();
        if req.prompt.len() > capacity {
            return Err(AdmissionError::ExceedsPool { needed: req.prompt.len(), capacity });
        }
        self.enqueue(req, Kind::Prefill)
    }

    /// Decode-worker half: after the door check, takes the pages at once when nothing waits
    /// (with the prefix cache on, the table starts with the tenant's cached whole pages of the
    /// prompt, [`kv::BlockTable::shared_pages`]: the sender sends only the rest)
    /// (`reserve_now`), else queues the request (fairly, with the queue timeout); once pages for the whole sequence are free the stream ends with
    /// [`Event::Reserved`]. Nothing is computed.
    pub fn reserve(&self, req: GenRequest) -> Result<RequestStream, AdmissionError> {
        self.enqueue(req, Kind::Reserve)
    }

    /// A reservation computes nothing, so it need not wait for the step the loop is in: when
    /// no request waits for the main pool's pages (so none is overtaken), a sequence slot is free and the tenant is
    /// live, within its share and its pages are free, it is made here, by the rules admission
    /// applies. Through the loop, every disaggregated request waited about half a step for
    /// its pages and then most of another before its prefill could start. A queued prefill
    /// held in its own pool does not stop it: in `serve` under load there nearly always is
    /// one, and requests arriving together then queued their reservations behind it.
    fn reserve_now(&self, req: &GenRequest) -> Option<RequestStream> {
        if self.shared.queued_for_pool.load(Ordering::SeqCst) != 0 {
            return None;
        }
        if self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()).running >= self.max_running {
            return None;
        }
        // Held while reserving: a new tenant table takes effect before or after this, never
        // during (the loop installs it before revoking anything).
        let policy = self.shared.policy.lock().unwrap_or_else(|e| e.into_inner());
        let pools = Pools { main: &self.pool, prefill: &self.prefill_pool, prefix_cache: self.prefix_cache };
        // Anything but success (a revoked tenant, no room, or an error admission reports)
        // takes the queue's way, where admission says it.
        let kv = admission::reserve(&pools, &policy, req, Kind::Reserve).ok()?.kv;
        drop(policy);
        let (tx, rx) = tmpsc::unbounded_channel();
        let _ = tx.send(Event::Reserved(kv));
        Some(RequestStream { rx, id: req.id })
    }

    /// Decodes `req` from `kv`, which must be this request's reservation with every prompt
    /// slot written (checked before any step: an unwritten slot fails the request as an
    /// isolation violation). `first` is the token the prefill side sampled; it is not emitted
    /// again, but it ends the request when it is a stop token or `max_tokens` is 1.
    pub fn resume(&self, req: GenRequest, kv: BlockTable, first: u32) -> Result<RequestStream, AdmissionError> {
        self.admissible(&req)?;
        let (tx, rx) = tmpsc::unbounded_channel();
        let id = req.id;
        if self.tx.send(Msg::Resume(Box::new(Resume { req, kv, first, tx }))).is_err() {
            return Err(AdmissionError::ShuttingDown);
        }
        Ok(RequestStream { rx, id })
    }

    /// The door rule, and the engine still taking requests.
    fn admissible(&self, req: &GenRequest) -> Result<(), AdmissionError> {
        self.check(&req.prompt, req.max_tokens)?;
        if self.shared.stopping.load(Ordering::SeqCst) {
            return Err(AdmissionError::ShuttingDown);
        }
        Ok(())
    }

    fn enqueue(&self, req: GenRequest, kind: Kind) -> Result<RequestStream, AdmissionError> {
        self.admissible(&req)?;
        if kind == Kind::Reserve {
            if let Some(stream) = self.reserve_now(&req) {
                return Ok(stream);
            }
        }
        let draws_on_pool = kind != Kind::Prefill || self.prefill_pool.same_pool(&self.pool);
        if !self.shared.enqueue(draws_on_pool, self.max_queued) {
            return Err(AdmissionError::QueueFull { limit: self.max_queued });
        }
        let (tx, rx) = tmpsc::unbounded_channel();
        let id = req.id;
        let pending = Pending { req, kind, tx, enqueued: Instant::now(), draws_on_pool };
        if self.tx.send(Msg::Submit(Box::new(pending))).is_err() {
            self.shared.dequeued(draws_on_pool);
            return Err(AdmissionError::ShuttingDown);
        }
        Ok(RequestStream { rx, id })
    }

    /// Applies the gateway's tenant table: revoked tenants' requests end with
    /// [`RequestError::TenantRevoked`] and their cached prefixes go, before any later request is
    /// admitted; tenants outside `live` are refused from then on.
    pub fn apply_tenants(&self, policy: TenantPolicy) {
        let _ = self.tx.send(Msg::Tenants(policy));
    }

    /// Stops admitting; queued and running requests continue (see `Engine`'s drop for the end).
    pub fn stop_admitting(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
    }

    /// Distinguishes engines across processes and hosts (a per-process random salt and this
    /// engine's address), so stats reported by two roles sharing one engine count once.
    pub fn instance_id(&self) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        static SALT: std::sync::OnceLock<std::collections::hash_map::RandomState> = std::sync::OnceLock::new();
        let mut h = SALT.get_or_init(std::collections::hash_map::RandomState::new).build_hasher();
        h.write_usize(Arc::as_ptr(&self.shared) as usize);
        h.write_u32(std::process::id());
        h.finish()
    }

    pub fn stats(&self) -> PoolStats {
        let mut s = self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()).clone();
        s.pages_total = self.pool.total_pages();
        // Idle cached pages belong to no request: a reservation takes them when it needs them.
        s.pages_used = self.pool.used_pages().saturating_sub(self.pool.idle_cached_pages());
        let mut cached = self.pool.cached_pages_by_tenant();
        if !self.prefill_pool.same_pool(&self.pool) {
            for (t, n) in self.prefill_pool.cached_pages_by_tenant() {
                *cached.entry(t).or_default() += n;
            }
        }
        s.cached_pages_by_tenant = cached.into_iter().collect();
        s.cached_pages_by_tenant.sort_by_key(|(t, _)| t.0);
        s
    }

    /// Route tags that became cached or were dropped since the last call, in the pools whose
    /// prefix cache prompts are sealed into (see [`kv::RouteTag`]).
    pub fn take_tag_changes(&self) -> kv::TagChanges {
        let mut c = self.prefill_pool.take_tag_changes();
        if !self.prefill_pool.same_pool(&self.pool) {
            let main = self.pool.take_tag_changes();
            if main.reset || c.reset {
                return kv::TagChanges { reset: true, cached: self.route_tags(), dropped: Vec::new() };
            }
            c.cached.extend(main.cached);
            c.dropped.extend(main.dropped);
        }
        c
    }

    /// Every route tag naming a cached page now.
    pub fn route_tags(&self) -> Vec<kv::RouteTag> {
        let mut all = self.prefill_pool.route_tags();
        if !self.prefill_pool.same_pool(&self.pool) {
            all.extend(self.pool.route_tags());
        }
        all
    }

    /// Who holds each page of the main pool, then of the prefill pool when it is another one,
    /// run-length coded: the admin dashboard's map. A pass over every page under the pools'
    /// free-list locks, so only the periodic worker report asks for it, not every scrape.
    pub fn page_map(&self) -> Vec<PageRun> {
        let mut runs = Vec::new();
        page_runs(&self.pool.page_map(), &mut runs);
        if !self.prefill_pool.same_pool(&self.pool) {
            page_runs(&self.prefill_pool.page_map(), &mut runs);
        }
        runs
    }
}
