//! The route of one request: the attempt on a decode and a prefill worker (reserve, prefill,
//! KV transfer, verification), the first-token gate that holds the first token until decode
//! verified the KV, the one retry on other workers of a failure before the first token, and
//! cancellation on every node when the route ends any other way than finished.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use protocol::{Event, EventSender, RequestError, RouteRequest, TokenEvent, Usage, ViolationKind};
use tokio::sync::{mpsc, watch};
use wire::{Role, Ticket};

use super::cache_map::TagKey;
use super::config::{RouterConfig, RoutingPolicy};
use super::registry::Registry;
use super::revocations::Revocations;
use super::worker::{RouteMsg, WorkerConn};
use crate::proto::{Spec, ToGateway, ToWorker};

/// What the route of a request reads of its router.
pub(super) struct Routing<'a> {
    pub(super) cfg: &'a RouterConfig,
    pub(super) registry: &'a Registry,
    pub(super) next_route: &'a AtomicU64,
    pub(super) revocations: &'a watch::Sender<Revocations>,
    pub(super) tag_key: &'a TagKey,
}

impl Routing<'_> {
    pub(super) async fn orchestrate(self, req: RouteRequest, ev: EventSender, mark: u64) {
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

    async fn attempt(&self, req: &RouteRequest, ev: &EventSender, avoid: &mut Vec<u64>, mark: u64) -> Outcome {
        let mut revocations = self.revocations.subscribe();
        if revocations.borrow_and_update().revoked_since(req.tenant, mark) {
            return Outcome::Fail(RequestError::TenantRevoked);
        }
        let page_size = self.cfg.identity.pairing.page_size as usize;
        let epoch = self.registry.epoch_of(req.tenant);
        let tags = self.tag_key.tags(req.tenant, epoch, req.cache_salt.as_deref(), &req.prompt, page_size);
        let decode = match self.cfg.routing {
            RoutingPolicy::CacheAware => self.registry.pick_decode(avoid, &tags, page_size, req.prompt.len()),
            RoutingPolicy::LeastLoaded => self.registry.pick(Role::Decode, avoid),
        };
        let Some(decode) = decode else {
            return Outcome::Fail(RequestError::Unavailable("no decode worker is registered".into()));
        };
        let picked = match self.cfg.routing {
            RoutingPolicy::CacheAware => self.registry.pick_prefill(avoid, &tags, page_size, req.prompt.len()),
            RoutingPolicy::LeastLoaded => self.registry.pick(Role::Prefill, avoid).map(|w| (w, req.prompt.len())),
        };
        let Some((prefill, computes)) = picked else {
            return Outcome::Fail(RequestError::Unavailable("no prefill worker is registered".into()));
        };
        let route = self.next_route.fetch_add(1, Ordering::Relaxed);
        let cache_tags = tags.iter().map(|t| t.0).collect();
        let spec = Spec { route, request: req.clone(), cache_tags };
        tracing::debug!(route, decode = %decode.name, prefill = %prefill.name, computes, "route");
        let (tx, mut rx) = mpsc::unbounded_channel();
        prefill.queued_tokens.fetch_add(computes, Ordering::Relaxed);
        let reserved = req.prompt.len().saturating_add(req.max_tokens);
        decode.reserved_tokens.fetch_add(reserved, Ordering::Relaxed);
        let guard = RouteGuard {
            route,
            workers: [decode.clone(), prefill.clone()],
            queued: computes,
            reserved,
            prefill_released: false,
            done: false,
        };
        for w in &guard.workers {
            w.inflight.fetch_add(1, Ordering::Relaxed);
            w.routed.fetch_add(1, Ordering::Relaxed);
            w.routes().insert(route, tx.clone());
        }
        drop(tx);
        let mut guard = guard;
        let _ = decode.tx.send(ToWorker::Reserve(spec.clone()));
        let deadline = req.deadline_or_default();
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
                    None => return Outcome::Fail(RequestError::Internal("route channel closed".into())),
                },
                _ = ev.closed() => return Outcome::Done,
                Ok(()) = revocations.changed() => {
                    if revocations.borrow_and_update().revoked_since(req.tenant, mark) {
                        return Outcome::Fail(RequestError::TenantRevoked);
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(deadline.into()) => return Outcome::Fail(RequestError::DeadlineExceeded),
                _ = verify_sleep => {
                    let e = RequestError::Unavailable("the decode worker did not verify the KV in time".into());
                    return if gate.released { Outcome::Fail(e) } else { Outcome::Retry(e) };
                }
            };
            let worker = if from == Role::Decode { &decode } else { &prefill };
            let msg = match msg {
                RouteMsg::Lost => {
                    avoid.push(worker.id);
                    let e = RequestError::Unavailable(format!("{} worker {} was lost", from.name(), worker.name));
                    return if gate.released { Outcome::Fail(e) } else { Outcome::Retry(e) };
                }
                RouteMsg::Msg(m) => m,
            };
            match (from, msg) {
                (Role::Decode, ToGateway::Reserved { ticket, .. }) => {
                    let t: Ticket = ticket.into();
                    let whole_pages = t.held < t.tokens && (t.held as usize).is_multiple_of(page_size.max(1));
                    if t.request != req.id
                        || t.tenant != req.tenant
                        || t.tokens as usize != req.prompt.len()
                        || !whole_pages
                    {
                        return Outcome::Fail(RequestError::IsolationViolation { kind: ViolationKind::WrongTicket });
                    }
                    let _ = ev.send(Event::Started);
                    let decode_addr = decode.kv_addr.clone().unwrap_or_default();
                    let _ = prefill.tx.send(ToWorker::Prefill { spec: spec.clone(), ticket, decode_addr });
                }
                (Role::Prefill, ToGateway::First { token, cached_tokens, .. }) => {
                    guard.prefill_computed();
                    if cached_tokens.is_some() {
                        prefill.cached().expect(&tags);
                    }
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
                        verify_by = Some(tokio::time::Instant::now() + self.cfg.transfer_timeout);
                    }
                }
                (Role::Decode, ToGateway::Verified { first, .. }) => {
                    decode.cached().expect(&tags);
                    verify_by = None;
                    gate.verified = Some(first);
                }
                (Role::Decode, m @ (ToGateway::Token { .. } | ToGateway::Finished { .. })) => gate.pending.push_back(m),
                (_, ToGateway::Failed { failure, .. }) => {
                    // A worker that could not reach its peer, or is draining, before the
                    // first token: another pair may serve it.
                    if matches!(failure, RequestError::Unavailable(_) | RequestError::ShuttingDown) && !gate.released {
                        // A prefill worker that could not reach its decode worker names the
                        // decode worker as the one to pass over (after a rotation it may hold
                        // only the old secret); a draining worker names itself.
                        let unreachable = matches!(failure, RequestError::Unavailable(_)) && from == Role::Prefill;
                        avoid.push(if unreachable { decode.id } else { worker.id });
                        return Outcome::Retry(failure);
                    }
                    return Outcome::Fail(failure);
                }
                (role, other) => {
                    let what = format!("{} sent an unexpected {:?}", role.name(), std::mem::discriminant(&other));
                    return Outcome::Fail(RequestError::Internal(what));
                }
            }
            match gate.release(req, ev, self.cfg.vocab) {
                Err(kind) => return Outcome::Fail(RequestError::IsolationViolation { kind }),
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

enum Outcome {
    Done,
    /// Failed before the first token was released: may be retried once.
    Retry(RequestError),
    Fail(RequestError),
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
    fn release(&mut self, req: &RouteRequest, ev: &EventSender, vocab: usize) -> Result<bool, ViolationKind> {
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
    /// Prompt tokens counted in the prefill worker's `queued_tokens` until it computed them.
    queued: usize,
    /// KV tokens counted in the decode worker's `reserved_tokens` while the route lasts.
    reserved: usize,
    prefill_released: bool,
    done: bool,
}

impl RouteGuard {
    /// The prefill worker computed the prompt: its tokens no longer count as queued there.
    fn prefill_computed(&mut self) {
        let n = std::mem::take(&mut self.queued);
        self.workers[1].queued_tokens.fetch_sub(n, Ordering::Relaxed);
    }

    /// Takes the prefill worker off the route once its transfer is verified: its loss no
    /// longer reaches the route, and it is no longer counted as carrying it.
    fn release_prefill(&mut self) {
        if std::mem::replace(&mut self.prefill_released, true) {
            return;
        }
        self.prefill_computed();
        let w = &self.workers[1];
        w.routes().remove(&self.route);
        w.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        self.prefill_computed();
        self.workers[0].reserved_tokens.fetch_sub(self.reserved, Ordering::Relaxed);
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
    use protocol::{EventStream, FinishReason, RequestId, TenantId};

    const VOCAB: usize = 100;

    fn request(stop: &[u32]) -> RouteRequest {
        RouteRequest {
            id: RequestId(7),
            tenant: TenantId(2),
            prompt: vec![1, 2, 3],
            max_tokens: 8,
            sampling: sampling::SamplingParams::default(),
            stop_tokens: sampling::StopTokens::new(stop.iter().copied()),
            deadline: None,
            cache_salt: None,
            output: None,
        }
    }

    fn tok(t: u32) -> TokenEvent {
        TokenEvent { token: t, logprob: Some(-0.5), top: vec![] }
    }

    fn token_msg(t: u32) -> ToGateway {
        ToGateway::Token { route: 1, token: TokenEvent { token: t, logprob: Some(-0.5), top: vec![] } }
    }

    /// What the gate sent, once the sender is gone.
    fn sent(tx: EventSender, mut rs: EventStream) -> Vec<String> {
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
        let (tx, rs) = EventStream::channel(req.id);
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
            let (tx, rs) = EventStream::channel(req.id);
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
        let (tx, rs) = EventStream::channel(req.id);
        let mut gate = FirstTokenGate { first: Some(tok(1)), verified: Some(1), ..Default::default() };
        gate.pending.extend([token_msg(2), token_msg(VOCAB as u32 + 7), token_msg(3)]);
        assert_eq!(gate.release(&req, &tx, VOCAB), Err(ViolationKind::BadToken));
        assert_eq!(sent(tx, rs), ["token 1", "token 2"]);
    }

    #[test]
    fn a_first_token_that_is_a_stop_token_ends_the_text_without_being_sent() {
        let req = request(&[0]);
        let (tx, rs) = EventStream::channel(req.id);
        let mut gate = FirstTokenGate { first: Some(tok(0)), verified: Some(0), ..Default::default() };
        gate.pending.push_back(ToGateway::Finished { route: 1, reason: FinishReason::Stop, usage: (3, 1) });
        assert_eq!(gate.release(&req, &tx, VOCAB), Ok(true));
        assert_eq!(sent(tx, rs), ["finished Stop 3 1 0"]);
    }
}
