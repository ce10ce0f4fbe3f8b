//! The step loop: admission, continuous batching, chunked prefill, sampling, cancellation.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use kv::{KvPool, Owner, TenantId};
use model::{Llama, Logits, SeqStep};
use sampling::Sampler;

use crate::admission::{self, Pools, Refusal, Reservation};
use crate::draft::{DraftRate, Drafting};
use crate::inbox::{Kind, Msg, Pending, Resume, Shared};
use crate::pacing::StepClock;
use crate::row_share;
use crate::sequence::{end, sample_step, End, Running};
use crate::settings::{EngineConfig, Revoke, TenantPolicy};
use crate::{Event, FinishReason, Usage, ViolationKind};
use protocol::{PoolStats, RequestError};

/// The most decoding sequences a step may have for their rows to carry drafts.
const SPECULATE_UP_TO_ROWS: usize = 4;

/// A queue: (is it the prefill lane, tenant).
type QueueKey = (bool, TenantId);

/// Which running sequences a step takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rows {
    /// One token of every decoding sequence, then prompt chunks within the step's budget.
    All,
    /// Only prompts that finish within this many tokens, ahead of the decode step
    /// ([`crate::pacing`]).
    PromptsAhead(usize),
}

pub(crate) struct Loop {
    model: Llama,
    pool: KvPool,
    prefill_pool: KvPool,
    cfg: EngineConfig,
    rx: mpsc::Receiver<Msg>,
    shared: Arc<Shared>,
    /// Per (lane, tenant) FIFO queues. Prefills wait in their own lane: in a process playing
    /// both roles, a decode reservation waiting for pages must not hold up the prefills whose
    /// transfers would let earlier reservations finish and free theirs.
    queues: HashMap<QueueKey, VecDeque<Pending>>,
    /// Tenants with waiting requests, in admission order (round-robin).
    rotation: VecDeque<QueueKey>,
    running: Vec<Running>,
    prefill_cursor: usize,
    stats: PoolStats,
    /// Measured steps: whether waiting prompts run ahead of the decode step.
    clock: StepClock,
    /// Decode rows handed out while tenants shared steps (the source of `Running::row_turn`).
    row_turns: u64,
}

impl Loop {
    pub(crate) fn new(
        model: Llama,
        pool: KvPool,
        prefill_pool: KvPool,
        cfg: EngineConfig,
        rx: mpsc::Receiver<Msg>,
        shared: Arc<Shared>,
    ) -> Loop {
        Loop {
            model,
            pool,
            prefill_pool,
            cfg,
            rx,
            shared,
            queues: HashMap::new(),
            rotation: VecDeque::new(),
            running: Vec::new(),
            prefill_cursor: 0,
            stats: PoolStats::default(),
            clock: StepClock::default(),
            row_turns: 0,
        }
    }

    pub(crate) fn run(&mut self) {
        loop {
            if !self.receive() {
                break;
            }
            self.expire();
            self.admit();
            self.prompts_ahead();
            if !self.running.is_empty() {
                self.step();
            }
            self.publish();
        }
        self.fail_all(RequestError::ShuttingDown);
        self.publish();
    }

    fn idle(&self) -> bool {
        self.running.is_empty() && self.rotation.is_empty()
    }

    /// Takes new requests; blocks only when there is nothing to do. False on shutdown.
    fn receive(&mut self) -> bool {
        loop {
            let msg = if self.idle() {
                match self.rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(m) => m,
                    Err(mpsc::RecvTimeoutError::Timeout) => return true,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return false,
                }
            } else {
                match self.rx.try_recv() {
                    Ok(m) => m,
                    Err(mpsc::TryRecvError::Empty) => return true,
                    Err(mpsc::TryRecvError::Disconnected) => return false,
                }
            };
            match msg {
                Msg::Shutdown => return false,
                Msg::Resume(r) => self.resume(*r),
                Msg::Tenants(p) => self.apply_tenants(p),
                Msg::Submit(p) => {
                    let t = (p.kind == Kind::Prefill, p.req.tenant);
                    let q = self.queues.entry(t).or_default();
                    if q.is_empty() {
                        self.rotation.push_back(t);
                    }
                    q.push_back(*p);
                }
            }
        }
    }

    /// Drops cancelled requests and fails expired ones, freeing their pages.
    fn expire(&mut self) {
        let now = Instant::now();
        let timeout = self.cfg.queue_timeout;
        let shared = &self.shared;
        for q in self.queues.values_mut() {
            q.retain(|p| {
                let verdict = if p.tx.is_closed() {
                    Some(None)
                } else if p.req.deadline.is_some_and(|d| now >= d) {
                    Some(Some(RequestError::DeadlineExceeded))
                } else if now.duration_since(p.enqueued) >= timeout {
                    Some(Some(RequestError::QueueTimeout))
                } else {
                    None
                };
                match verdict {
                    None => true,
                    Some(err) => {
                        if let Some(e) = err {
                            let _ = p.tx.send(Event::Failed(e));
                        }
                        shared.dequeued(p.draws_on_pool);
                        false
                    }
                }
            });
        }
        self.rotation.retain(|t| self.queues.get(t).is_some_and(|q| !q.is_empty()));
        for i in (0..self.running.len()).rev() {
            let r = &self.running[i];
            if r.tx.is_closed() {
                self.running.remove(i);
            } else if r.req.deadline.is_some_and(|d| now >= d) {
                end(self.running.remove(i), Event::Failed(RequestError::DeadlineExceeded));
            }
        }
    }

    /// Round-robin across tenants: each turn admits one request of the next tenant whose head
    /// fits in the pool. A tenant whose head does not fit does not block the others.
    fn admit(&mut self) {
        let mut misses = 0;
        while self.running.len() < self.cfg.max_running && misses < self.rotation.len() {
            let Some(key) = self.rotation.pop_front() else { break };
            let Some(q) = self.queues.get_mut(&key) else { continue };
            let Some(head) = q.front() else { continue };
            let pools = Pools { main: &self.pool, prefill: &self.prefill_pool, prefix_cache: self.cfg.prefix_cache };
            let policy = self.shared.policy.lock().unwrap_or_else(|e| e.into_inner());
            let verdict = admission::reserve(&pools, &policy, &head.req, head.kind);
            drop(policy);
            let Reservation { kv, cached, scope } = match verdict {
                Ok(r) => r,
                Err(Refusal::Wait) => {
                    // Over its share or no room: this tenant waits, the others go on.
                    misses += 1;
                    self.rotation.push_back(key);
                    continue;
                }
                Err(Refusal::Revoked) => {
                    fail_head(q, &self.shared, RequestError::TenantRevoked);
                    if !q.is_empty() {
                        self.rotation.push_back(key);
                    }
                    continue;
                }
                Err(Refusal::Failed(e)) => {
                    tracing::warn!(request = head.req.id.0, tenant = key.1.0, error = %e, "the pool refused a reservation (not for capacity); the request fails, the others go on");
                    fail_head(q, &self.shared, RequestError::Internal(e.to_string()));
                    if !q.is_empty() {
                        self.rotation.push_back(key);
                    }
                    continue;
                }
            };
            misses = 0;
            let Some(p) = q.pop_front() else { continue };
            if !q.is_empty() {
                self.rotation.push_back(key);
            }
            self.shared.dequeued(p.draws_on_pool);
            if p.kind == Kind::Reserve {
                // Dropped (pages freed) if the requester is gone.
                let _ = p.tx.send(Event::Reserved(kv));
                continue;
            }
            let _ = p.tx.send(Event::Started);
            if scope.is_some() {
                let _ = p.tx.send(Event::PrefixCache { cached_tokens: cached });
            }
            let sampler = Sampler::new(p.req.sampling.clone());
            self.stats.cached_tokens += cached as u64;
            self.running.push(Running {
                req: p.req,
                kind: p.kind,
                tx: p.tx,
                kv,
                sampler,
                prefilled: cached,
                cached,
                scope,
                generated: Vec::new(),
                input: vec![0],
                drafted: 0,
                accepted: 0,
                draft_rate: DraftRate::default(),
                logits: Vec::new(),
                end: None,
                row_turn: 0,
            });
        }
    }

    fn is_live(&self, tenant: TenantId) -> bool {
        self.policy().is_live(tenant)
    }

    /// The tenant table in force, shared with the handles (which reserve pages themselves
    /// when nothing is queued: see `EngineHandle::reserve`).
    fn policy(&self) -> std::sync::MutexGuard<'_, TenantPolicy> {
        self.shared.policy.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn apply_tenants(&mut self, p: TenantPolicy) {
        // In force before anything is revoked: a handle reserving under the old table does so
        // before the revocation below, as a request admitted just before it would have.
        *self.policy() = TenantPolicy { revoke: Revoke::These(Vec::new()), ..p.clone() };
        let revoked = |t: TenantId, p: &TenantPolicy| match &p.revoke {
            Revoke::These(ts) => ts.contains(&t),
            Revoke::Caches(_) | Revoke::AllCaches => false,
        } || p.live.as_ref().is_some_and(|l| !l.contains(&t));
        let forgotten =
            |t: TenantId, p: &TenantPolicy| revoked(t, p) || matches!(&p.revoke, Revoke::Caches(ts) if ts.contains(&t));
        // Caches first: whoever sees a request's end event sees its tenant's cache gone.
        let pools = [&self.pool, &self.prefill_pool];
        let pools = if self.prefill_pool.same_pool(&self.pool) { &pools[..1] } else { &pools[..] };
        for pool in pools {
            match &p.revoke {
                Revoke::AllCaches => pool.clear_prefix_cache(),
                Revoke::These(_) | Revoke::Caches(_) => {
                    pool.forget_tenants(&|t| forgotten(t, &p));
                }
            }
        }
        let mut ended = 0usize;
        for i in (0..self.running.len()).rev() {
            if revoked(self.running[i].req.tenant, &p) {
                end(self.running.remove(i), Event::Failed(RequestError::TenantRevoked));
                ended += 1;
            }
        }
        for (key, q) in self.queues.iter_mut() {
            if revoked(key.1, &p) {
                for pending in q.drain(..) {
                    let _ = pending.tx.send(Event::Failed(RequestError::TenantRevoked));
                    self.shared.dequeued(pending.draws_on_pool);
                    ended += 1;
                }
            }
        }
        if ended > 0 {
            tracing::info!(requests = ended, "a new tenant table ended the revoked tenants' requests");
        }
        self.rotation.retain(|t| self.queues.get(t).is_some_and(|q| !q.is_empty()));
    }

    /// Runs the prompts that can finish in a step of their own before the decode step, when
    /// the clock says that is worth it: their first tokens then do not wait for it.
    fn prompts_ahead(&mut self) {
        let decoding = self.running.iter().filter(|r| r.decoding()).count();
        if decoding == self.running.len() {
            return;
        }
        if let Some(budget) = self.clock.ahead_budget(decoding) {
            self.run_step(Rows::PromptsAhead(budget));
        }
    }

    /// One forward pass over every running sequence, then sampling.
    fn step(&mut self) {
        self.run_step(Rows::All);
    }

    fn run_step(&mut self, rows: Rows) {
        let began = Instant::now();
        let plan = self.plan(rows);
        if plan.is_empty() {
            return;
        }
        let decoding = plan.iter().filter(|&&(i, _)| self.running[i].decoding()).count();
        let prompt_tokens = plan.iter().map(|&(_, take)| take).sum::<usize>() - decoding;
        let guessed: usize = plan
            .iter()
            .filter(|&&(i, _)| self.running[i].decoding())
            .map(|&(i, _)| self.running[i].input.len() - 1)
            .sum();
        // Each sequence's logits buffer goes into the step and comes back filled: kept across
        // steps, it is not a fresh vocabulary-sized allocation per sequence per step.
        let mut outputs: Vec<Vec<f32>> =
            plan.iter().map(|&(i, _)| std::mem::take(&mut self.running[i].logits)).collect();
        let mut steps = Vec::with_capacity(plan.len());
        let mut rest: &mut [Running] = &mut self.running;
        let mut base = 0;
        for &(i, take) in &plan {
            let (_, tail) = rest.split_at_mut(i - base);
            let Some((r, tail)) = tail.split_first_mut() else { break };
            rest = tail;
            base = i + 1;
            (r.drafted, r.accepted) = (0, 0);
            let (tokens, start, logits) = if r.decoding() {
                // With drafts, every position's logits: each is sampled in turn.
                let want = if r.input.len() > 1 { Logits::All } else { Logits::Last };
                (&r.input[..], r.req.prompt.len() + r.generated.len() - 1, want)
            } else {
                let end = r.prefilled + take;
                let want = if end == r.req.prompt.len() { Logits::Last } else { Logits::None };
                (&r.req.prompt[r.prefilled..end], r.prefilled, want)
            };
            steps.push(SeqStep { tokens, start, kv: &mut r.kv, logits });
        }
        let mut failed = Vec::new();
        if self.model.forward_into(&mut steps, &mut outputs).is_err() {
            // One sequence's failure must not end the others': run each alone (every
            // sequence's KV and logits depend only on itself, so a rerun writes the same
            // values), and fail closed only the ones that fail on their own.
            for (at, (step, out)) in steps.iter_mut().zip(outputs.iter_mut()).enumerate() {
                let alone = SeqStep { tokens: step.tokens, start: step.start, kv: &mut *step.kv, logits: step.logits };
                if let Err(e) = self.model.forward_into(&mut [alone], std::slice::from_mut(out)) {
                    out.clear();
                    failed.push((at, crate::error::model_failure(&e)));
                }
            }
        }
        drop(steps);
        for (at, err) in failed {
            let r = &mut self.running[plan[at].0];
            // Once per failing sequence, never per token: ids and the error only.
            tracing::warn!(request = r.req.id.0, tenant = r.req.tenant.0, error = %err, "a sequence failed its step on its own; its batch mates went on");
            r.end = Some(End::Event(Event::Failed(err)));
        }
        self.stats.steps += 1;
        let mut sealing_failed = Vec::new();
        for (&(i, take), logits) in plan.iter().zip(outputs) {
            let r = &mut self.running[i];
            if r.end.is_some() {
                continue;
            }
            if r.decoding() {
                self.stats.decode_tokens += 1;
            } else {
                r.prefilled += take;
                self.stats.prefill_tokens += take as u64;
                if r.decoding() {
                    if let Some(scope) = &r.scope {
                        // The prompt's whole pages are final now (decode writes after them).
                        if let Err(e) = r.kv.seal_prefix(scope, &r.req.prompt, &r.req.route_tags) {
                            sealing_failed.push((i, e));
                        }
                    }
                }
            }
            r.logits = logits;
        }
        // Fail closed: a prompt whose pages cannot be sealed holds KV it should not.
        for (i, e) in sealing_failed.into_iter().rev() {
            let r = &self.running[i];
            tracing::warn!(request = r.req.id.0, tenant = r.req.tenant.0, error = %e, "a prompt's pages could not be sealed into its tenant's cache; the request fails closed");
            self.running[i].logits.clear();
            self.running[i].end =
                Some(End::Event(Event::Failed(crate::error::model_failure(&model::ModelError::Kv(e)))));
        }
        // Drafts only while few sequences decode: a step of few rows is bound by reading the
        // weights, so guessed tokens ride along almost free; in a wide step they would cost
        // every batch mate compute.
        let next_decoding = self.running.iter().filter(|r| r.decoding() && r.end.is_none()).count();
        let draft = match next_decoding {
            1..=SPECULATE_UP_TO_ROWS => {
                Drafting::new(self.cfg.speculative_draft, next_decoding, self.clock.fixed_in_rows())
            }
            _ => Drafting::OFF,
        };
        let vocab = self.model.config.vocab;
        // Sampling is a pass over the vocabulary per sequence: spread it over the compute
        // threads. Each sequence has its own sampler, so the result does not depend on how.
        self.model.compute_pool().for_each_chunk_mut(&mut self.running, 1, &|_, rs| {
            for r in rs {
                if !r.logits.is_empty() {
                    let mut logits = std::mem::take(&mut r.logits);
                    r.end = sample_step(r, &mut logits, vocab, draft);
                    // Empty until the next step fills it; its allocation is kept for that.
                    logits.clear();
                    r.logits = logits;
                }
            }
        });
        for &(i, _) in &plan {
            let r = &self.running[i];
            self.stats.decode_tokens += r.accepted as u64;
            self.stats.draft_tokens += r.drafted as u64;
            self.stats.draft_tokens_accepted += r.accepted as u64;
        }
        for i in (0..self.running.len()).rev() {
            if let Some(how) = self.running[i].end.take() {
                let r = self.running.remove(i);
                match how {
                    End::Event(ev) => end(r, ev),
                    End::Handoff(first) => {
                        let _ = r.tx.send(Event::Prefilled { first, kv: r.kv });
                    }
                }
            }
        }
        match rows {
            // Guessed tokens are rows of the step like any other.
            Rows::All => self.clock.record_step(decoding + guessed, prompt_tokens, began.elapsed()),
            Rows::PromptsAhead(_) => self.clock.record_ahead(prompt_tokens, began.elapsed()),
        }
    }

    /// Which sequences take part in a step, with how many tokens, in running order.
    fn plan(&mut self, rows: Rows) -> Vec<(usize, usize)> {
        let mut plan: Vec<(usize, usize)> = Vec::new();
        let n = self.running.len();
        match rows {
            Rows::All => {
                let mut budget = self.cfg.max_batch_tokens.max(1);
                let rows = self.decode_rows();
                for i in rows.iter().copied() {
                    // Guesses made for a step of few rows are dropped when it has grown.
                    if rows.len() > SPECULATE_UP_TO_ROWS {
                        self.running[i].input.truncate(1);
                    }
                    plan.push((i, 1));
                    budget = budget.saturating_sub(self.running[i].input.len());
                }
                for k in 0..n {
                    if budget == 0 {
                        break;
                    }
                    let i = (self.prefill_cursor + k) % n;
                    let r = &self.running[i];
                    if !r.decoding() {
                        let take = budget.min(r.req.prompt.len() - r.prefilled);
                        plan.push((i, take));
                        budget -= take;
                    }
                }
                self.prefill_cursor = self.prefill_cursor.wrapping_add(1);
            }
            Rows::PromptsAhead(mut budget) => {
                // Whole remainders only: a prompt that cannot finish here gains nothing from
                // running ahead, and keeps its turn in the chunked decode steps.
                for k in 0..n {
                    let i = (self.prefill_cursor + k) % n;
                    let r = &self.running[i];
                    let left = r.req.prompt.len() - r.prefilled;
                    if !r.decoding() && left <= budget {
                        plan.push((i, left));
                        budget -= left;
                    }
                }
            }
        }
        plan.sort_unstable();
        plan
    }

    /// The decoding sequences that get a row in this step: all of them, or, while tenants
    /// share the step ([`crate::row_share`]), each tenant's first ones in turn up to the cap.
    fn decode_rows(&mut self) -> Vec<usize> {
        let decoding = (0..self.running.len()).filter(|&i| self.running[i].decoding());
        // Until the clock has a fixed part there is nothing to share by: no grouping per step.
        let Some(fixed) = self.clock.fixed_in_rows() else { return decoding.collect() };
        let mut by_tenant: HashMap<TenantId, Vec<usize>> = HashMap::new();
        for i in decoding.clone() {
            by_tenant.entry(self.running[i].req.tenant).or_default().push(i);
        }
        let rows: Vec<usize> = by_tenant.values().map(Vec::len).collect();
        let Some(cap) = row_share::tenant_row_cap(&rows, Some(fixed)) else {
            return decoding.collect();
        };
        let mut chosen = Vec::new();
        for mut seqs in by_tenant.into_values() {
            seqs.sort_by_key(|&i| self.running[i].row_turn);
            for &i in seqs.iter().take(cap) {
                self.row_turns += 1;
                self.running[i].row_turn = self.row_turns;
                chosen.push(i);
            }
        }
        chosen
    }

    /// Starts decoding from transferred KV, after checking that the pages are this request's
    /// and hold every prompt slot.
    fn resume(&mut self, r: Resume) {
        let Resume { mut req, mut kv, first, tx } = r;
        let owner = Owner { tenant: req.tenant, request: req.id };
        let n = req.prompt.len();
        let refused = if kv.owner() != owner {
            Some(RequestError::IsolationViolation { kind: ViolationKind::OwnerMismatch })
        } else if kv.capacity() < n + req.max_tokens {
            Some(RequestError::IsolationViolation { kind: ViolationKind::ShortReservation })
        } else if first as usize >= self.model.config.vocab {
            // A first token the model cannot embed would fail the step it joins.
            Some(RequestError::IsolationViolation { kind: ViolationKind::BadFirstToken })
        } else if !self.is_live(req.tenant) {
            Some(RequestError::TenantRevoked)
        } else if !req.stop_tokens.contains(first) && req.constraint.as_mut().is_some_and(|c| c.accept(first).is_err())
        {
            // The prefill side drew a first token its grammar does not allow.
            Some(RequestError::Internal("the first token breaks the request's output format".into()))
        } else {
            kv.verify_written(n).err().map(|e| crate::error::model_failure(&model::ModelError::Kv(e)))
        };
        // The prompt's whole pages are verified and final (decode writes after them): they go
        // into the tenant's cache here, so its next turn is sent only what is new. Fail closed
        // like a prefill: a prompt whose pages cannot be sealed holds KV it should not.
        let refused = refused.or_else(|| {
            let scope = self.cfg.prefix_cache.then(|| self.pool.scope(req.tenant, req.cache_salt.as_deref()))?;
            let e = kv.seal_pages(&scope, &req.prompt, &req.route_tags).err()?;
            tracing::warn!(request = req.id.0, tenant = req.tenant.0, error = %e, "a verified prompt's pages could not be sealed into its tenant's cache; the request fails closed");
            Some(crate::error::model_failure(&model::ModelError::Kv(e)))
        });
        if let Some(e) = refused {
            drop(kv);
            let _ = tx.send(Event::Failed(e));
            return;
        }
        let _ = tx.send(Event::Started);
        let usage = |completion_tokens| Usage { prompt_tokens: n, completion_tokens, cached_tokens: 0 };
        let done = if req.stop_tokens.contains(first) {
            Some(Event::Finished { reason: FinishReason::Stop, usage: usage(0) })
        } else if req.max_tokens <= 1 {
            Some(Event::Finished { reason: FinishReason::Length, usage: usage(1) })
        } else {
            None
        };
        if let Some(ev) = done {
            drop(kv);
            let _ = tx.send(ev);
            return;
        }
        let mut sampler = Sampler::new(req.sampling.clone());
        // The prefill side drew the first token from the same seeded stream.
        sampler.skip_draws(1);
        self.running.push(Running {
            req,
            kind: Kind::Full,
            tx,
            kv,
            sampler,
            prefilled: n,
            cached: 0,
            scope: None,
            generated: vec![first],
            input: vec![first],
            drafted: 0,
            accepted: 0,
            draft_rate: DraftRate::default(),
            logits: Vec::new(),
            end: None,
            row_turn: 0,
        });
    }

    fn fail_all(&mut self, e: RequestError) {
        for r in std::mem::take(&mut self.running) {
            end(r, Event::Failed(e.clone()));
        }
        for (_, q) in self.queues.drain() {
            for p in q {
                let _ = p.tx.send(Event::Failed(e.clone()));
            }
        }
        self.rotation.clear();
        self.shared.cleared();
    }

    fn publish(&mut self) {
        let mut by_tenant: HashMap<TenantId, usize> = HashMap::new();
        for r in &self.running {
            *by_tenant.entry(r.req.tenant).or_default() += r.kv.pages();
        }
        let mut s = self.shared.stats.lock().unwrap_or_else(|e| e.into_inner());
        s.queued = self.shared.queued.load(Ordering::SeqCst);
        s.running = self.running.len();
        s.pages_by_tenant = by_tenant.into_iter().collect();
        s.pages_by_tenant.sort_by_key(|(t, _)| t.0);
        s.steps = self.stats.steps;
        s.prefill_tokens = self.stats.prefill_tokens;
        s.decode_tokens = self.stats.decode_tokens;
        s.draft_tokens = self.stats.draft_tokens;
        s.draft_tokens_accepted = self.stats.draft_tokens_accepted;
        s.cached_tokens = self.stats.cached_tokens;
        s.cached_pages = self.pool.cached_pages()
            + if self.prefill_pool.same_pool(&self.pool) { 0 } else { self.prefill_pool.cached_pages() };
    }
}

/// Ends a running request: its pages are freed before the final event, so whoever sees the
/// event sees them free.
/// Ends the request at the head of `q` with `e`.
fn fail_head(q: &mut VecDeque<Pending>, shared: &Shared, e: RequestError) {
    if let Some(p) = q.pop_front() {
        shared.dequeued(p.draws_on_pool);
        let _ = p.tx.send(Event::Failed(e));
    }
}

#[cfg(test)]
mod tests {
    //! Drives the loop by hand, one step at a time, so which sequences share a step is certain.
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::GenRequest;
    use gguf::GgufFile;
    use kv::{Capacity, KvDtype, PoolConfig, RequestId, ScrubPolicy};
    use model::tiny::{tiny_gguf, TinySpec};
    use model::LoadOptions;
    use sampling::{SamplingParams, StopTokens};
    use tokio::sync::mpsc as tmpsc;

    fn new_loop() -> (Loop, mpsc::Sender<Msg>) {
        let f = GgufFile::from_bytes(tiny_gguf(&TinySpec::default())).unwrap();
        let model = Llama::from_file(&f, LoadOptions { threads: 1, ..Default::default() }).unwrap();
        let layout = model.config.kv_layout(16, KvDtype::F16);
        let pool =
            KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(1024), scrub: ScrubPolicy::OnFree }).unwrap();
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        (Loop::new(model, pool.clone(), pool, EngineConfig::default(), rx, shared), tx)
    }

    fn req(id: u64, tenant: u64, prompt_len: usize, max_tokens: usize) -> GenRequest {
        GenRequest {
            id: RequestId(id),
            tenant: TenantId(tenant),
            prompt: (0..prompt_len).map(|i| ((i * 7 + id as usize) % 80) as u32).collect(),
            max_tokens,
            sampling: SamplingParams::greedy(),
            stop_tokens: StopTokens::new([]),
            deadline: None,
            cache_salt: None,
            constraint: None,
            route_tags: Vec::new(),
        }
    }

    /// Queues `r` as a full (prefill and decode) request; returns its event stream.
    fn submit(lp: &mut Loop, tx: &mpsc::Sender<Msg>, r: GenRequest) -> tmpsc::UnboundedReceiver<Event> {
        let (etx, erx) = tmpsc::unbounded_channel();
        assert!(lp.shared.enqueue(true, usize::MAX));
        let pending = Pending { req: r, kind: Kind::Full, tx: etx, enqueued: Instant::now(), draws_on_pool: true };
        tx.send(Msg::Submit(Box::new(pending))).unwrap();
        assert!(lp.receive());
        erx
    }

    fn drain(rx: &mut tmpsc::UnboundedReceiver<Event>) -> Vec<Event> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    fn tokens(events: &[Event]) -> Vec<u32> {
        events.iter().filter_map(|e| if let Event::Token(t) = e { Some(t.token) } else { None }).collect()
    }

    /// The tokens of `r` run alone on a fresh loop.
    fn alone(r: GenRequest) -> Vec<u32> {
        let (mut lp, tx) = new_loop();
        let mut rx = submit(&mut lp, &tx, r);
        lp.admit();
        let mut events = Vec::new();
        while !lp.running.is_empty() {
            lp.step();
            events.extend(drain(&mut rx));
        }
        assert!(matches!(events.last(), Some(Event::Finished { .. })), "{events:?}");
        tokens(&events)
    }

    /// Drafts come from the request's own tokens: every guess a step feeds is a run of its own
    /// prompt and output, right after an earlier occurrence of its last tokens, also while
    /// another tenant runs a prompt holding this request's whole continuation (a lookup shared
    /// across requests would guess tokens this request has not produced yet, and keeping them
    /// would show in its speed).
    #[test]
    fn every_guess_is_a_run_of_its_own_sequence_even_beside_a_tenant_holding_its_continuation() {
        let mine: Vec<u32> = (0..30).map(|i| ((i * 13 + 5) % 80) as u32).collect();
        let mut r1 = req(1, 1, 0, 40);
        r1.prompt = mine.clone();
        let continuation = alone(r1.clone());
        let mut r2 = req(2, 2, 0, 40);
        r2.prompt = [&mine[..], &continuation[..], &mine[..]].concat();
        let (mut lp, tx) = new_loop();
        lp.cfg.speculative_draft = 8;
        let mut rx1 = submit(&mut lp, &tx, r1);
        let _rx2 = submit(&mut lp, &tx, r2);
        lp.admit();
        let mut guessed = [0, 0];
        while !lp.running.is_empty() {
            lp.step();
            for r in &lp.running {
                let guess = &r.input[1..];
                if guess.is_empty() {
                    continue;
                }
                guessed[r.req.tenant.0 as usize - 1] += guess.len();
                let own = [&r.req.prompt[..], &r.generated[..]].concat();
                let last2 = &own[own.len() - 2..];
                let found = (0..own.len() - 2).any(|i| own[i..i + 2] == *last2 && own[i + 2..].starts_with(guess));
                assert!(found, "tenant {}: {guess:?} is not a run of its own tokens", r.req.tenant.0);
            }
        }
        assert!(guessed[0] > 0 && guessed[1] > 0, "both guessed: {guessed:?}");
        assert_eq!(tokens(&drain(&mut rx1)), continuation, "the same output beside the other tenant");
    }

    /// Requests and their event streams.
    type Streams = Vec<(GenRequest, tmpsc::UnboundedReceiver<Event>)>;

    /// A loop with `n` requests decoding (their prompts computed in one step) and the streams.
    fn decoding(n: u64) -> (Loop, mpsc::Sender<Msg>, Streams) {
        let (mut lp, tx) = new_loop();
        let mut streams = Vec::new();
        for id in 1..=n {
            let r = req(id, id, 10, 12);
            streams.push((r.clone(), submit(&mut lp, &tx, r)));
        }
        lp.admit();
        lp.step();
        assert!(lp.running.iter().all(Running::decoding));
        (lp, tx, streams)
    }

    /// Runs the loop dry; every stream's tokens must equal its request's tokens alone.
    fn finish_alike(lp: &mut Loop, mut streams: Streams, mut seen: Vec<Vec<Event>>) {
        seen.resize_with(streams.len(), Vec::new);
        while !lp.running.is_empty() {
            lp.step();
        }
        for ((r, rx), mut events) in streams.iter_mut().zip(seen) {
            events.extend(drain(rx));
            assert!(matches!(events.last(), Some(Event::Finished { .. })), "{events:?}");
            assert_eq!(tokens(&events), alone(r.clone()), "request {} equals its output alone", r.id.0);
        }
    }

    /// Six requests decoding, then a new prompt of `len` tokens admitted and the clock set as
    /// if it had measured a decode row at 1 ms and an extra step's fixed part at `fixed`; runs
    /// `prompts_ahead`. Returns the loop, the streams (the new one last), the events each had
    /// before, and whether an extra step ran.
    fn ahead_of_six(len: usize, fixed: Duration) -> (Loop, Streams, Vec<Vec<Event>>, bool) {
        let (mut lp, tx, mut streams) = decoding(6);
        let new = req(7, 7, len, 5);
        streams.push((new.clone(), submit(&mut lp, &tx, new)));
        let seen: Vec<Vec<Event>> = streams.iter_mut().map(|(_, rx)| drain(rx)).collect();
        lp.admit();
        lp.clock = StepClock::measured(Duration::from_millis(1), fixed);
        let steps = lp.stats.steps;
        lp.prompts_ahead();
        let ran = lp.stats.steps != steps;
        (lp, streams, seen, ran)
    }

    #[test]
    fn a_short_prompt_gets_its_first_token_in_a_step_of_its_own_before_a_long_decode_step() {
        // 3 prompt tokens may run ahead of 6 decode rows.
        let (mut lp, mut streams, mut seen, ran) = ahead_of_six(3, Duration::from_micros(100));
        assert!(ran, "one extra step ran");
        for (i, (_, rx)) in streams.iter_mut().enumerate() {
            let events = drain(rx);
            let want = if i == 6 { 1 } else { 0 };
            assert_eq!(tokens(&events).len(), want, "only the new prompt's first token: {i} {events:?}");
            seen[i].extend(events);
        }
        finish_alike(&mut lp, streams, seen);
    }

    #[test]
    fn a_prompt_that_cannot_finish_within_the_budget_does_not_run_ahead() {
        let (mut lp, streams, seen, ran) = ahead_of_six(4, Duration::from_micros(100));
        assert!(!ran, "4 prompt tokens do not fit in 3: no extra step");
        assert!(lp.running.iter().any(|r| !r.decoding()), "it is prefilled with the decodes");
        finish_alike(&mut lp, streams, seen);
    }

    #[test]
    fn no_prompt_runs_ahead_of_a_decode_step_whose_fixed_part_it_would_repeat_at_too_high_a_cost() {
        // A 2 ms fixed part against a 6 ms decode step.
        let (mut lp, streams, seen, ran) = ahead_of_six(1, Duration::from_millis(2));
        assert!(!ran);
        finish_alike(&mut lp, streams, seen);
    }

    #[test]
    fn a_tenant_at_its_full_limits_shares_the_step_with_a_lone_stream_and_every_output_is_unchanged() {
        let (mut lp, tx) = new_loop();
        // Tenant 1 runs eight sequences, tenant 2 one.
        let mut streams: Streams = (1..=8)
            .map(|id| req(id, 1, 10, 12))
            .chain([req(9, 2, 10, 12)])
            .map(|r| (r.clone(), submit(&mut lp, &tx, r)))
            .collect();
        lp.admit();
        lp.step();
        assert!(lp.running.iter().all(Running::decoding));
        let mut seen: Vec<Vec<Event>> = streams.iter_mut().map(|(_, rx)| drain(rx)).collect();
        for step in 0..8 {
            // A fixed part worth 3.5 rows: 4 rows a step, the lone stream's and 3 of the eight
            // (set before each step: the tiny test model's own step times would replace it).
            lp.clock = StepClock::measured(Duration::from_millis(1), Duration::from_micros(3500));
            lp.step();
            let got: Vec<usize> = streams
                .iter_mut()
                .zip(seen.iter_mut())
                .map(|((_, rx), seen)| {
                    let events = drain(rx);
                    let n = tokens(&events).len();
                    seen.extend(events);
                    n
                })
                .collect();
            assert_eq!(got[8], 1, "step {step}: the lone stream advances every step: {got:?}");
            assert_eq!(got[..8].iter().sum::<usize>(), 3, "step {step}: three of the eight: {got:?}");
        }
        let total: Vec<usize> = seen[..8].iter().map(|e| tokens(e).len()).collect();
        assert!(total.iter().all(|&t| t == total[0]), "each of the eight advanced in turn: {total:?}");
        finish_alike(&mut lp, streams, seen);
    }

    #[test]
    fn a_prompt_whose_pages_cannot_be_sealed_fails_closed_in_its_step_and_its_batch_mate_goes_on() {
        let (alice, bob) = (req(1, 5, 40, 6), req(2, 6, 37, 6));
        let expected = alone(bob.clone());
        let (mut lp, tx) = new_loop();
        let mut alice_rx = submit(&mut lp, &tx, alice);
        let mut bob_rx = submit(&mut lp, &tx, bob);
        lp.admit();
        assert_eq!(lp.running.len(), 2);
        // The fault: alice's prompt is to be sealed under another tenant's cache scope (a
        // scheduling bug would do this). Her pages are hers and fully written, so the forward
        // pass succeeds; only the seal at the end of her prefill can catch it.
        let other = lp.pool.scope(TenantId(99), None);
        let a = lp.running.iter().position(|r| r.req.tenant == TenantId(5)).unwrap();
        lp.running[a].scope = Some(other);

        // One step prefills both prompts whole (77 tokens within the step's 512).
        lp.step();
        assert_eq!(lp.stats.steps, 1);
        let alice_events = drain(&mut alice_rx);
        assert!(
            matches!(
                alice_events.last(),
                Some(Event::Failed(RequestError::IsolationViolation { kind: ViolationKind::OwnerMismatch }))
            ),
            "{alice_events:?}"
        );
        assert!(tokens(&alice_events).is_empty(), "no token is sampled from a prompt that failed its seal");
        assert_eq!(lp.pool.pages_held_by(TenantId(5)), 0, "her pages are freed");
        assert_eq!(lp.pool.cached_pages_of(TenantId(99)), 0, "nothing entered the other tenant's cache");
        assert_eq!(lp.pool.cached_pages_of(TenantId(5)), 0);
        // Bob shared that step and got his first token from it.
        let mut bob_events = drain(&mut bob_rx);
        assert_eq!(tokens(&bob_events).len(), 1, "{bob_events:?}");
        while !lp.running.is_empty() {
            lp.step();
            bob_events.extend(drain(&mut bob_rx));
        }
        assert!(matches!(bob_events.last(), Some(Event::Finished { .. })), "{bob_events:?}");
        assert_eq!(tokens(&bob_events), expected, "bob's output equals his output alone");
        assert_eq!(lp.pool.cached_pages_of(TenantId(6)), 3, "bob's own whole prompt pages and his tail were sealed");
    }
}
