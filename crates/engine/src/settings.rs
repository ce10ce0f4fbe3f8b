//! What an engine is configured with, what it reports, and what a tenant table tells it.

use std::collections::HashSet;
use std::time::Duration;

use kv::{KvPool, TenantId};
use protocol::{PageKind, PageRun};

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Tokens per forward step: one per decoding sequence, the rest for prefill chunks. Bounds
    /// the latency a long prompt adds to everyone else's next token.
    pub max_batch_tokens: usize,
    /// Sequences running (prefilling or decoding) at once.
    pub max_running: usize,
    /// Requests waiting for pages, across all tenants.
    pub max_queued: usize,
    /// How long a request may wait for pages before it is refused.
    pub queue_timeout: Duration,
    /// Reuse whole prompt pages a request of the same tenant (and client salt) computed
    /// before: the tenant-scoped prefix cache of the pool the prompt is prefilled in.
    pub prefix_cache: bool,
    /// The compiler of output formats for this model's vocabulary: workers build the
    /// constraint of each request they receive with it (`None`: they refuse such requests).
    pub grammars: Option<grammar::Grammars>,
    /// Speculative decoding: up to this many tokens guessed from a sequence's own tokens are
    /// verified in its decode row ([`crate::draft`]); 0: none. Output is unchanged either way.
    pub speculative_draft: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_batch_tokens: 512,
            max_running: 64,
            max_queued: 256,
            queue_timeout: Duration::from_secs(30),
            prefix_cache: true,
            grammars: None,
            speculative_draft: 0,
        }
    }
}

/// Run-length codes a pool's page map, appending to `out`.
pub(crate) fn page_runs(map: &[kv::PageUse], out: &mut Vec<PageRun>) {
    for u in map {
        let (kind, tenant) = match *u {
            kv::PageUse::Free => (PageKind::Free, 0),
            kv::PageUse::Request(t) => (PageKind::Request, t.0),
            kv::PageUse::Sealed(t) => (PageKind::Sealed, t.0),
        };
        match out.last_mut() {
            Some(r) if r.kind == kind && r.tenant == tenant => r.pages += 1,
            _ => out.push(PageRun { kind, tenant, pages: 1 }),
        }
    }
}

/// What the gateway's tenant table tells an engine (sent at registration and on every change).
#[derive(Debug, Clone, PartialEq)]
pub struct TenantPolicy {
    /// Tenants that may run here; `None` until a table arrives (any tenant may).
    pub live: Option<HashSet<TenantId>>,
    /// What the table ends now: requests and cached prefixes of removed or re-keyed tenants,
    /// or only cached prefixes (see [`Revoke`]). Requests of tenants outside `live` end too.
    pub revoke: Revoke,
    /// The most of the main pool one tenant may hold (0 < share <= 1). Applied only while the
    /// table has more than one tenant, so a lone tenant can use the whole pool.
    pub max_share: f64,
}

/// Which tenants' state a [`TenantPolicy`] ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Revoke {
    /// Their running and queued requests end and their cached prefixes go.
    These(Vec<TenantId>),
    /// Only their cached prefixes go; their requests run on. A worker serving several
    /// gateways ends a request only when the gateway that sent it re-keys the tenant, which
    /// the engine cannot tell apart (see `cluster::tenancy`).
    Caches(Vec<TenantId>),
    /// Every cached prefix (the worker cannot tell which tenants they belong to any more).
    AllCaches,
}

impl TenantPolicy {
    /// Whether `tenant` may run here.
    pub(crate) fn is_live(&self, tenant: TenantId) -> bool {
        self.live.as_ref().is_none_or(|l| l.contains(&tenant))
    }

    /// Whether `tenant` may take `tokens` more slots of the main pool: always when it holds
    /// nothing (one request of the context window must always be able to run), else only
    /// within its share while more than one tenant can send requests.
    pub(crate) fn within_share(&self, pool: &KvPool, tenant: TenantId, tokens: usize) -> bool {
        let multi = self.live.as_ref().is_some_and(|l| l.len() > 1);
        if !multi || self.max_share >= 1.0 {
            return true;
        }
        let held = pool.pages_held_by(tenant);
        if held == 0 {
            return true;
        }
        let cap = (self.max_share * pool.total_pages() as f64).ceil() as usize;
        held + pool.layout().pages_for(tokens) <= cap
    }
}

impl Default for TenantPolicy {
    fn default() -> Self {
        TenantPolicy { live: None, revoke: Revoke::These(Vec::new()), max_share: 1.0 }
    }
}
