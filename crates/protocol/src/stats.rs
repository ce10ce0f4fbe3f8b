//! What a pool holds and what its engine computed, as a worker reports it and the gateway
//! sums it (the metrics and the operator's page map).

use serde::{Deserialize, Serialize};
use types::TenantId;

/// One engine's pool and step counters (a snapshot), or their sum over engines.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PoolStats {
    pub queued: usize,
    pub running: usize,
    pub pages_total: usize,
    pub pages_used: usize,
    pub pages_by_tenant: Vec<(TenantId, usize)>,
    pub steps: u64,
    /// Prompt tokens computed (cache hits excluded).
    pub prefill_tokens: u64,
    pub decode_tokens: u64,
    /// Speculative decoding: guessed tokens verified in decode rows, and those kept (each kept
    /// one is also a decoded token).
    pub draft_tokens: u64,
    pub draft_tokens_accepted: u64,
    /// Prompt tokens served from the prefix cache instead of computed.
    pub cached_tokens: u64,
    /// Pages held by the prefix caches (main and prefill pool).
    pub cached_pages: usize,
    /// The same, per tenant.
    pub cached_pages_by_tenant: Vec<(TenantId, usize)>,
}

impl PoolStats {
    /// Adds `other`'s figures (another engine's) to these.
    pub fn absorb(&mut self, other: &PoolStats) {
        // Saturating: a worker's figures are its own word, and a lying one must not make the
        // gateway's sum panic or wrap.
        self.queued = self.queued.saturating_add(other.queued);
        self.running = self.running.saturating_add(other.running);
        self.pages_total = self.pages_total.saturating_add(other.pages_total);
        self.pages_used = self.pages_used.saturating_add(other.pages_used);
        self.steps = self.steps.saturating_add(other.steps);
        self.prefill_tokens = self.prefill_tokens.saturating_add(other.prefill_tokens);
        self.decode_tokens = self.decode_tokens.saturating_add(other.decode_tokens);
        self.draft_tokens = self.draft_tokens.saturating_add(other.draft_tokens);
        self.draft_tokens_accepted = self.draft_tokens_accepted.saturating_add(other.draft_tokens_accepted);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.cached_pages = self.cached_pages.saturating_add(other.cached_pages);
        for (dst, src) in [
            (&mut self.pages_by_tenant, &other.pages_by_tenant),
            (&mut self.cached_pages_by_tenant, &other.cached_pages_by_tenant),
        ] {
            for &(t, n) in src {
                match dst.iter_mut().find(|(u, _)| *u == t) {
                    Some((_, m)) => *m = m.saturating_add(n),
                    None => dst.push((t, n)),
                }
            }
            dst.sort_by_key(|(t, _)| t.0);
        }
    }
}

/// What a page is used for, as the operator's map shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PageKind {
    Free,
    /// Leased to a running request of `tenant`.
    Request,
    /// A sealed prefix page in `tenant`'s cache.
    Sealed,
}

/// Consecutive pages with the same holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageRun {
    pub kind: PageKind,
    /// The holder's tenant id (0 for free pages).
    pub tenant: u64,
    pub pages: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sum_over_engines_adds_every_field_the_cache_ones_included() {
        let a = PoolStats {
            cached_tokens: 40,
            cached_pages: 3,
            cached_pages_by_tenant: vec![(TenantId(1), 2), (TenantId(2), 1)],
            pages_by_tenant: vec![(TenantId(1), 5)],
            prefill_tokens: 7,
            queued: 1,
            running: 2,
            pages_total: 10,
            pages_used: 5,
            steps: 3,
            decode_tokens: 4,
            draft_tokens: 9,
            draft_tokens_accepted: 6,
        };
        let b = PoolStats {
            cached_tokens: 2,
            cached_pages: 1,
            draft_tokens: 1,
            cached_pages_by_tenant: vec![(TenantId(2), 1)],
            pages_total: 6,
            ..Default::default()
        };
        let mut sum = PoolStats::default();
        sum.absorb(&a);
        sum.absorb(&b);
        assert_eq!((sum.cached_tokens, sum.cached_pages, sum.prefill_tokens), (42, 4, 7));
        assert_eq!((sum.draft_tokens, sum.draft_tokens_accepted), (10, 6));
        assert_eq!((sum.queued, sum.running, sum.pages_total, sum.pages_used), (1, 2, 16, 5));
        assert_eq!((sum.steps, sum.decode_tokens), (3, 4));
        assert_eq!(sum.cached_pages_by_tenant, vec![(TenantId(1), 2), (TenantId(2), 2)]);
        assert_eq!(sum.pages_by_tenant, vec![(TenantId(1), 5)]);
        // A lying worker's huge figures saturate the sum; they neither panic nor wrap.
        let liar = PoolStats {
            decode_tokens: u64::MAX,
            draft_tokens: u64::MAX,
            pages_by_tenant: vec![(TenantId(1), usize::MAX)],
            ..Default::default()
        };
        sum.absorb(&liar);
        assert_eq!((sum.decode_tokens, sum.draft_tokens), (u64::MAX, u64::MAX));
        assert_eq!(sum.pages_by_tenant[0], (TenantId(1), usize::MAX));
    }
}
