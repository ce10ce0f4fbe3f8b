//! Per-tenant limits: concurrent requests, queued requests and tokens per minute.
//!
//! Checked after parsing and the door check, before submitting to the engine. A request holds a
//! [`Permit`] for its whole life (released on drop); its queue slot is released when the engine
//! starts it ([`Permit::started`]). The token bucket charges prompt + max_tokens at admission
//! and refunds the unused completion tokens at the end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use kv::TenantId;

use crate::config::TenantConfig;
use crate::error::ApiError;

#[derive(Debug)]
struct TenantState {
    max_concurrent: usize,
    max_queued: usize,
    tokens_per_minute: u64,
    running: usize,
    queued: usize,
    /// Token bucket: up to `tokens_per_minute`, refilled continuously.
    tokens: f64,
    refilled: Instant,
}

impl TenantState {
    fn refill(&mut self, now: Instant) {
        let cap = self.tokens_per_minute as f64;
        let secs = now.duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + secs * cap / 60.0).min(cap);
        self.refilled = now;
    }
}

/// All tenants' counters, shared by the handlers.
#[derive(Debug, Clone, Default)]
pub struct Limiter {
    inner: Arc<Mutex<HashMap<TenantId, TenantState>>>,
}

impl Limiter {
    pub fn new<'a>(tenants: impl IntoIterator<Item = (TenantId, &'a TenantConfig)>) -> Limiter {
        let now = Instant::now();
        let map = tenants
            .into_iter()
            .map(|(id, t)| {
                (
                    id,
                    TenantState {
                        max_concurrent: t.max_concurrent,
                        max_queued: t.max_queued,
                        tokens_per_minute: t.tokens_per_minute,
                        running: 0,
                        queued: 0,
                        tokens: t.tokens_per_minute as f64,
                        refilled: now,
                    },
                )
            })
            .collect();
        Limiter { inner: Arc::new(Mutex::new(map)) }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<TenantId, TenantState>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits one request that will use up to `tokens` (prompt + max_tokens), or says which
    /// limit it hit (429 with Retry-After).
    pub fn acquire(&self, tenant: TenantId, tokens: usize) -> Result<Permit, ApiError> {
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
        let mut charged = 0.0;
        if s.tokens_per_minute > 0 {
            let cap = s.tokens_per_minute as f64;
            let need = tokens as f64;
            if need > cap {
                return Err(ApiError::rate_limited(
                    "tenant_tokens_per_minute",
                    format!(
                        "the request needs {tokens} tokens (prompt + max_tokens), more than this key's limit of {} \
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
            charged = need;
        }
        s.running += 1;
        s.queued += 1;
        Ok(Permit { limiter: self.clone(), tenant, queued: true, charged })
    }
}

/// One admitted request's share of its tenant's limits; released on drop.
#[derive(Debug)]
pub struct Permit {
    limiter: Limiter,
    tenant: TenantId,
    queued: bool,
    charged: f64,
}

impl Permit {
    /// The engine started the request: it no longer counts as queued.
    pub fn started(&mut self) {
        if std::mem::take(&mut self.queued) {
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

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(s) = self.limiter.lock().get_mut(&self.tenant) {
            s.running = s.running.saturating_sub(1);
            if self.queued {
                s.queued = s.queued.saturating_sub(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(max_concurrent: usize, max_queued: usize, tpm: u64) -> TenantConfig {
        TenantConfig { id: TenantId(1), name: "t".into(), key_sha256: [0; 32], max_concurrent, max_queued, tokens_per_minute: tpm }
    }

    #[test]
    fn concurrency_limit_is_released_on_drop() {
        let c = cfg(1, 5, 0);
        let l = Limiter::new([(TenantId(1), &c)]);
        let p = l.acquire(TenantId(1), 10).unwrap();
        let e = l.acquire(TenantId(1), 10).unwrap_err();
        assert_eq!(e.status.as_u16(), 429);
        assert_eq!(e.retry_after, Some(1));
        drop(p);
        assert!(l.acquire(TenantId(1), 10).is_ok());
    }

    #[test]
    fn queue_limit_counts_only_unstarted_requests() {
        let c = cfg(5, 1, 0);
        let l = Limiter::new([(TenantId(1), &c)]);
        let mut p = l.acquire(TenantId(1), 1).unwrap();
        assert_eq!(l.acquire(TenantId(1), 1).unwrap_err().reason, "tenant_queue");
        p.started();
        let _q = l.acquire(TenantId(1), 1).unwrap();
    }

    #[test]
    fn token_bucket_charges_and_refunds() {
        let c = cfg(10, 10, 100);
        let l = Limiter::new([(TenantId(1), &c)]);
        let mut p = l.acquire(TenantId(1), 80).unwrap();
        let e = l.acquire(TenantId(1), 30).unwrap_err();
        assert_eq!(e.reason, "tenant_tokens_per_minute");
        assert!(e.retry_after.unwrap_or(0) >= 1);
        p.refund(50);
        assert!(l.acquire(TenantId(1), 30).is_ok());
        assert!(l.acquire(TenantId(1), 101).is_err());
    }
}
