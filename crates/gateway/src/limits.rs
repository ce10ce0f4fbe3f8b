//! Per-tenant limits: concurrent requests, queued requests and tokens per minute.
//!
//! A request takes its concurrency and queue slots ([`Limiter::acquire`]) right after
//! authentication, before its body is read or tokenized: reading, rendering and tokenizing a
//! prompt cost the server as much as queueing it, so a tenant limited to N requests gets at most
//! N of those at once. The token bucket is charged ([`Permit::charge`]) once validation knows
//! prompt + max_tokens, and the unused completion tokens are refunded at the end. A request
//! holds its [`Permit`] for its whole life (released on drop); its queue slot is released when
//! the engine starts it ([`Permit::started`]).
//!
//! With several gateways (membership through etcd) each enforces its share of every limit:
//! the configured value divided by the number of live gateways, rounded up
//! ([`Limiter::set_gateways`]), so a tenant spread over them by a load balancer gets about
//! its configured limits in all.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use types::TenantId;

use crate::error::ApiError;
use crate::settings::TenantConfig;

#[derive(Debug)]
struct TenantState {
    /// As configured: (max_concurrent, max_queued, tokens_per_minute).
    configured: (usize, usize, u64),
    /// This gateway's share of them (all of them with one gateway).
    max_concurrent: usize,
    max_queued: usize,
    tokens_per_minute: u64,
    running: usize,
    queued: usize,
    /// Token bucket: up to `tokens_per_minute`, refilled continuously.
    tokens: f64,
    refilled: Instant,
}

/// One gateway's part of a limit `v` among `n`: rounded up, at least 1; 0 (no limit) stays 0.
fn share(v: u64, n: usize) -> u64 {
    if v == 0 {
        return 0;
    }
    v.div_ceil(n.max(1) as u64).max(1)
}

impl TenantState {
    fn new(t: &TenantConfig, now: Instant, gateways: usize) -> TenantState {
        let mut s = TenantState {
            configured: (t.max_concurrent, t.max_queued, t.tokens_per_minute),
            max_concurrent: 0,
            max_queued: 0,
            tokens_per_minute: 0,
            running: 0,
            queued: 0,
            tokens: 0.0,
            refilled: now,
        };
        s.apply_share(gateways);
        s.tokens = s.tokens_per_minute as f64;
        s
    }

    /// This gateway's share of the configured limits among `gateways`; the bucket keeps what
    /// it holds, capped by the new share.
    fn apply_share(&mut self, gateways: usize) {
        let (c, q, t) = self.configured;
        self.max_concurrent = share(c as u64, gateways) as usize;
        self.max_queued = share(q as u64, gateways) as usize;
        self.tokens_per_minute = share(t, gateways);
        self.tokens = self.tokens.min(self.tokens_per_minute as f64);
    }

    fn refill(&mut self, now: Instant) {
        let cap = self.tokens_per_minute as f64;
        let secs = now.duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + secs * cap / 60.0).min(cap);
        self.refilled = now;
    }
}

/// All tenants' counters, shared by the handlers.
#[derive(Debug, Clone)]
pub struct Limiter {
    inner: Arc<Mutex<HashMap<TenantId, TenantState>>>,
    /// Live gateways sharing the limits (1 without membership).
    gateways: Arc<AtomicUsize>,
}

impl Default for Limiter {
    fn default() -> Self {
        Limiter::new([])
    }
}

impl Limiter {
    pub fn new<'a>(tenants: impl IntoIterator<Item = (TenantId, &'a TenantConfig)>) -> Limiter {
        let now = Instant::now();
        let map = tenants.into_iter().map(|(id, t)| (id, TenantState::new(t, now, 1))).collect();
        Limiter { inner: Arc::new(Mutex::new(map)), gateways: Arc::new(AtomicUsize::new(1)) }
    }

    /// `n` gateways (at least 1) share every tenant's limits from now on.
    pub fn set_gateways(&self, n: usize) {
        let n = n.max(1);
        let mut map = self.lock();
        if self.gateways.swap(n, Ordering::SeqCst) != n {
            let now = Instant::now();
            for s in map.values_mut() {
                s.refill(now);
                s.apply_share(n);
            }
        }
    }

    /// The live gateways sharing the limits now.
    pub fn gateways(&self) -> usize {
        self.gateways.load(Ordering::SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<TenantId, TenantState>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a new tenant table (a config reload): new tenants are added, existing ones take
    /// the new limits but keep their running and queued counts and their token bucket (a
    /// reload must not hand anyone a fresh minute of tokens), and tenants no longer present are
    /// removed; their permits still out find no entry when they drop.
    pub fn reconfigure<'a>(&self, tenants: impl IntoIterator<Item = (TenantId, &'a TenantConfig)>) {
        let now = Instant::now();
        let mut map = self.lock();
        let gateways = self.gateways.load(Ordering::SeqCst);
        let mut next = HashMap::new();
        for (id, t) in tenants {
            let s = match map.remove(&id) {
                Some(mut s) => {
                    s.refill(now);
                    s.configured = (t.max_concurrent, t.max_queued, t.tokens_per_minute);
                    // A lowered limit caps what is left in the bucket.
                    s.apply_share(gateways);
                    s
                }
                None => TenantState::new(t, now, gateways),
            };
            next.insert(id, s);
        }
        *map = next;
    }

    /// Admits one request of `tenant` to its concurrency and queue slots, or says which limit
    /// it hit (429 with Retry-After). Called before the body is read.
    /// `tenant`'s requests running and waiting now.
    pub fn load(&self, tenant: TenantId) -> (usize, usize) {
        self.lock().get(&tenant).map_or((0, 0), |s| (s.running, s.queued))
    }

    pub fn acquire(&self, tenant: TenantId) -> Result<Permit, ApiError> {
        let mut map = self.lock();
        let Some(s) = map.get_mut(&tenant) else {
            return Err(ApiError::internal("tenant has no limits"));
        };
        if s.running >= s.max_concurrent {
            return Err(ApiError::rate_limited(
                "tenant_concurrency",
                format!("too many concurrent requests for this key (limit {})", s.max_concurrent),
                1,
            ));
        }
        if s.queued >= s.max_queued {
            return Err(ApiError::rate_limited(
                "tenant_queue",
                format!("too many queued requests for this key (limit {})", s.max_queued),
                1,
            ));
        }
        s.running += 1;
        s.queued += 1;
        Ok(Permit { limiter: self.clone(), tenant, slots: 1, queued: 1, charged: 0.0 })
    }
}

/// One admitted request's share of its tenant's limits; released on drop.
#[derive(Debug)]
pub struct Permit {
    limiter: Limiter,
    tenant: TenantId,
    /// Concurrency slots held: one per sequence the request runs (its `n` choices).
    slots: usize,
    /// Of those, the sequences the engine has not started yet.
    queued: usize,
    charged: f64,
}

impl Permit {
    /// Takes a slot for each of a request's `n` sequences (one is held already): the `n`
    /// choices of one request run as `n` sequences, so they count as `n` requests against the
    /// tenant's concurrency and queue limits. `n` beyond the limit itself can never run: a 400
    /// naming `n`; beyond the slots free now: a 429 naming `n`, as for `n` requests.
    pub fn widen(&mut self, n: usize) -> Result<(), ApiError> {
        let more = n.saturating_sub(self.slots);
        if more == 0 {
            return Ok(());
        }
        let mut map = self.limiter.lock();
        let Some(s) = map.get_mut(&self.tenant) else { return Ok(()) };
        if n > s.max_concurrent || n > s.max_queued {
            let limit = s.max_concurrent.min(s.max_queued);
            return Err(ApiError::invalid_param(
                "n",
                format!(
                    "n = {n} runs {n} sequences, more than this key may run at once on this gateway ({limit}); \
                     lower n"
                ),
            ));
        }
        if s.running + more > s.max_concurrent {
            return Err(ApiError::rate_limited(
                "tenant_concurrency",
                format!(
                    "n = {n} needs {n} of this key's {} concurrent sequences; {} are free",
                    s.max_concurrent,
                    s.max_concurrent.saturating_sub(s.running) + self.slots
                ),
                1,
            ));
        }
        if s.queued + more > s.max_queued {
            return Err(ApiError::rate_limited(
                "tenant_queue",
                format!(
                    "n = {n} needs {n} of this key's {} queued places; {} are free",
                    s.max_queued,
                    s.max_queued.saturating_sub(s.queued) + self.queued
                ),
                1,
            ));
        }
        s.running += more;
        s.queued += more;
        self.slots += more;
        self.queued += more;
        Ok(())
    }

    /// Charges the request's `tokens` (prompt + max_tokens) to the tenant's per-minute bucket,
    /// or says why not (429 with Retry-After). Called once validation knows the count.
    pub fn charge(&mut self, tokens: usize) -> Result<(), ApiError> {
        let mut map = self.limiter.lock();
        // The tenant was removed by a reload after this request was admitted: it no longer has
        // a bucket to charge, and its key no longer authenticates new requests.
        let Some(s) = map.get_mut(&self.tenant) else { return Ok(()) };
        if s.tokens_per_minute == 0 {
            return Ok(());
        }
        let cap = s.tokens_per_minute as f64;
        let need = tokens as f64;
        if need > cap {
            return Err(ApiError::rate_limited(
                "tenant_tokens_per_minute",
                format!(
                    "the request needs {tokens} tokens ((prompt + max_tokens) x n), more than this key's limit of {} \
                     tokens per minute; lower max_tokens",
                    s.tokens_per_minute
                ),
                60,
            ));
        }
        s.refill(Instant::now());
        if s.tokens < need {
            let wait = ((need - s.tokens) * 60.0 / cap).ceil() as u64;
            return Err(ApiError::rate_limited(
                "tenant_tokens_per_minute",
                format!("this key's limit of {} tokens per minute is used up", s.tokens_per_minute),
                wait,
            ));
        }
        s.tokens -= need;
        self.charged += need;
        Ok(())
    }

    /// The engine started one of the request's sequences: it no longer counts as queued.
    pub fn started(&mut self) {
        if self.queued > 0 {
            self.queued -= 1;
            if let Some(s) = self.limiter.lock().get_mut(&self.tenant) {
                s.queued = s.queued.saturating_sub(1);
            }
        }
    }

    /// Returns the tokens that were charged but not generated.
    pub fn refund(&mut self, unused: usize) {
        let give = (unused as f64).min(self.charged);
        if give <= 0.0 {
            return;
        }
        self.charged -= give;
        if let Some(s) = self.limiter.lock().get_mut(&self.tenant) {
            s.tokens = (s.tokens + give).min(s.tokens_per_minute as f64);
        }
    }
}

/// The permit the choices of one request share (`n` > 1): a concurrency slot per choice
/// ([`Permit::widen`]) and one charge; each choice refunds what it did not generate.
#[derive(Debug, Clone)]
pub struct SharedPermit(Arc<Mutex<Permit>>);

impl SharedPermit {
    pub fn new(p: Permit) -> Self {
        SharedPermit(Arc::new(Mutex::new(p)))
    }

    fn permit(&self) -> MutexGuard<'_, Permit> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn started(&self) {
        self.permit().started();
    }

    pub fn refund(&self, unused: usize) {
        self.permit().refund(unused);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(s) = self.limiter.lock().get_mut(&self.tenant) {
            s.running = s.running.saturating_sub(self.slots);
            s.queued = s.queued.saturating_sub(self.queued);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(max_concurrent: usize, max_queued: usize, tpm: u64) -> TenantConfig {
        TenantConfig {
            id: TenantId(1),
            name: "t".into(),
            key_sha256: [0; 32],
            max_concurrent,
            max_queued,
            tokens_per_minute: tpm,
            max_body_bytes: None,
            models: None,
        }
    }

    fn running(l: &Limiter, t: u64) -> Option<(usize, usize)> {
        l.lock().get(&TenantId(t)).map(|s| (s.running, s.queued))
    }

    #[test]
    fn with_several_gateways_each_enforces_its_rounded_up_share_and_one_gateway_all() {
        let t = TenantId(1);
        let l = Limiter::new([(t, &cfg(5, 6, 600))]);
        l.set_gateways(3);
        let permits: Vec<Permit> = (0..2).map(|_| l.acquire(t).expect("within 5 / 3 -> 2")).collect();
        let e = l.acquire(t).expect_err("a third is over this gateway's share");
        assert!(e.message.contains("limit 2"), "{}", e.message);
        drop(permits);
        let mut p = l.acquire(t).unwrap();
        assert!(p.charge(201).is_err(), "600 tokens a minute over 3 gateways: 200 here");
        p.charge(200).unwrap();
        drop(p);
        l.set_gateways(1);
        let permits: Vec<Permit> = (0..3).map(|_| l.acquire(t).expect("all 5 with one gateway")).collect();
        assert_eq!(permits.len(), 3);
        // Zero gateways is taken as one; an unlimited bucket stays unlimited.
        let u = Limiter::new([(t, &cfg(1, 1, 0))]);
        u.set_gateways(0);
        let mut p = u.acquire(t).unwrap();
        p.charge(1_000_000).unwrap();
    }

    #[test]
    fn concurrency_limit_is_released_on_drop() {
        let c = cfg(1, 5, 0);
        let l = Limiter::new([(TenantId(1), &c)]);
        let p = l.acquire(TenantId(1)).unwrap();
        let e = l.acquire(TenantId(1)).unwrap_err();
        assert_eq!(e.status.as_u16(), 429);
        assert_eq!(e.reason, "tenant_concurrency");
        assert_eq!(e.retry_after, Some(1));
        drop(p);
        assert!(l.acquire(TenantId(1)).is_ok());
    }

    #[test]
    fn queue_limit_counts_only_unstarted_requests() {
        let c = cfg(5, 1, 0);
        let l = Limiter::new([(TenantId(1), &c)]);
        let mut p = l.acquire(TenantId(1)).unwrap();
        assert_eq!(l.acquire(TenantId(1)).unwrap_err().reason, "tenant_queue");
        p.started();
        let _q = l.acquire(TenantId(1)).unwrap();
    }

    #[test]
    fn n_choices_take_n_slots_and_give_them_back_one_start_and_one_drop_at_a_time() {
        let c = cfg(8, 8, 0);
        let l = Limiter::new([(TenantId(1), &c)]);
        let mut p = l.acquire(TenantId(1)).unwrap();
        p.widen(6).unwrap();
        assert_eq!(running(&l, 1), Some((6, 6)));
        // Six of eight slots are taken: a request of n = 3 is over by one, and says so.
        let mut q = l.acquire(TenantId(1)).unwrap();
        let e = q.widen(3).unwrap_err();
        assert_eq!((e.status.as_u16(), e.reason), (429, "tenant_concurrency"));
        assert!(e.message.contains("n = 3"), "{}", e.message);
        drop(q);
        assert_eq!(running(&l, 1), Some((6, 6)), "a refused widening holds nothing");
        p.started();
        p.started();
        assert_eq!(running(&l, 1), Some((6, 4)));
        drop(p);
        assert_eq!(running(&l, 1), Some((0, 0)));
    }

    #[test]
    fn n_above_the_limit_itself_is_a_400_naming_n() {
        let c = cfg(4, 8, 0);
        let l = Limiter::new([(TenantId(1), &c)]);
        let mut p = l.acquire(TenantId(1)).unwrap();
        let e = p.widen(5).unwrap_err();
        assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some("n")));
        p.widen(4).unwrap();
        assert_eq!(running(&l, 1), Some((4, 4)));
    }

    #[test]
    fn an_unknown_tenant_has_no_limits() {
        let l = Limiter::new([]);
        assert_eq!(l.acquire(TenantId(9)).unwrap_err().status.as_u16(), 500);
    }

    #[test]
    fn token_bucket_charges_and_refunds() {
        let c = cfg(10, 10, 100);
        let l = Limiter::new([(TenantId(1), &c)]);
        let mut p = l.acquire(TenantId(1)).unwrap();
        p.charge(80).unwrap();
        let mut q = l.acquire(TenantId(1)).unwrap();
        let e = q.charge(30).unwrap_err();
        assert_eq!(e.reason, "tenant_tokens_per_minute");
        assert!(e.retry_after.unwrap_or(0) >= 1);
        p.refund(50);
        assert!(q.charge(30).is_ok());
        let e = l.acquire(TenantId(1)).unwrap().charge(101).unwrap_err();
        assert!(e.message.contains("lower max_tokens"), "{}", e.message);
        // Refunds never exceed what was charged.
        q.refund(1000);
        p.refund(1000);
        assert!(l.lock()[&TenantId(1)].tokens <= 100.0);
    }

    #[test]
    fn a_refused_charge_releases_the_slots_when_the_permit_drops() {
        let c = cfg(1, 1, 10);
        let l = Limiter::new([(TenantId(1), &c)]);
        let mut p = l.acquire(TenantId(1)).unwrap();
        assert!(p.charge(11).is_err());
        drop(p);
        assert_eq!(running(&l, 1), Some((0, 0)));
        assert!(l.acquire(TenantId(1)).is_ok());
    }

    #[test]
    fn unlimited_tokens_charge_nothing() {
        let c = cfg(1, 1, 0);
        let l = Limiter::new([(TenantId(1), &c)]);
        assert!(l.acquire(TenantId(1)).unwrap().charge(usize::MAX / 2).is_ok());
    }

    #[test]
    fn reconfigure_adds_updates_and_removes_tenants_keeping_counts_and_buckets() {
        let (a, b) = (cfg(1, 5, 100), cfg(3, 5, 0));
        let l = Limiter::new([(TenantId(1), &a), (TenantId(2), &b)]);
        let mut p1 = l.acquire(TenantId(1)).unwrap();
        p1.charge(90).unwrap();
        let p2 = l.acquire(TenantId(2)).unwrap();

        // Tenant 1 gets a higher concurrency and a larger bucket, 2 goes, 3 arrives.
        let (a2, c) = (cfg(2, 5, 200), cfg(1, 1, 0));
        l.reconfigure([(TenantId(1), &a2), (TenantId(3), &c)]);
        assert_eq!(running(&l, 1), Some((1, 1)), "running and queued counts survive");
        let t = l.lock()[&TenantId(1)].tokens;
        assert!((10.0..20.0).contains(&t), "the bucket is kept, not refilled: {t}");
        let _second = l.acquire(TenantId(1)).unwrap();
        assert_eq!(l.acquire(TenantId(1)).unwrap_err().reason, "tenant_concurrency");
        assert!(running(&l, 2).is_none());
        assert_eq!(l.acquire(TenantId(2)).unwrap_err().status.as_u16(), 500);
        drop(p2); // finds no entry: nothing happens
        assert!(l.acquire(TenantId(3)).is_ok());

        // A lowered limit applies to the next request and caps the bucket.
        let a3 = cfg(1, 5, 5);
        l.reconfigure([(TenantId(1), &a3)]);
        assert!(l.lock()[&TenantId(1)].tokens <= 5.0);
        assert_eq!(l.acquire(TenantId(1)).unwrap_err().reason, "tenant_concurrency");
        drop(p1);
        drop(_second);
        assert_eq!(running(&l, 1), Some((0, 0)));
    }
}
