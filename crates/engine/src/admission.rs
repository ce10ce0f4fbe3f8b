//! The one rule for taking a queued request's pages, applied by the loop's admission and by a
//! handle's immediate reservation (`EngineHandle::reserve`, which need not wait for the step in
//! progress): the tenant is live, a request that will decode here stays within the tenant's
//! share of the main pool, and the pool holds the whole sequence (a prefill, only its prompt,
//! in the prefill pool). The cache scope comes from the request's authenticated tenant; the
//! client's salt can only narrow it. A reservation (pages for a transfer) starts with the
//! whole pages of its tenant's cache the prompt starts with, and the sender is told to send
//! only the rest.

use kv::{BlockTable, CacheScope, KvError, KvPool, Owner};

use crate::inbox::Kind;
use crate::settings::TenantPolicy;
use crate::GenRequest;

/// A request's pages, taken.
pub(crate) struct Reservation {
    pub(crate) kv: BlockTable,
    /// Leading prompt tokens the prefix cache served.
    pub(crate) cached: usize,
    /// Where its prompt's whole pages are sealed once computed; None: no caching.
    pub(crate) scope: Option<CacheScope>,
}

/// Why a request's pages were not taken.
pub(crate) enum Refusal {
    /// Its tenant is no longer served: the request ends.
    Revoked,
    /// The tenant is at its share of the pool, or the pool has no room now: it waits.
    Wait,
    /// Not a matter of room: the request fails, the others go on.
    Failed(KvError),
}

/// The pools a request draws on: the main pool (decoding sequences) and the prefill pool
/// (prompts that leave with their KV; the same pool where a process plays both roles).
pub(crate) struct Pools<'a> {
    pub(crate) main: &'a KvPool,
    pub(crate) prefill: &'a KvPool,
    pub(crate) prefix_cache: bool,
}

/// Takes `req`'s pages by the rule above, under the tenant table `policy` (held by the caller,
/// so a new table takes effect before or after, never during).
pub(crate) fn reserve(
    pools: &Pools<'_>,
    policy: &TenantPolicy,
    req: &GenRequest,
    kind: Kind,
) -> Result<Reservation, Refusal> {
    if !policy.is_live(req.tenant) {
        return Err(Refusal::Revoked);
    }
    let (pool, tokens) = match kind {
        Kind::Prefill => (pools.prefill, req.prompt.len()),
        Kind::Full | Kind::Reserve => (pools.main, req.prompt.len() + req.max_tokens),
    };
    if kind != Kind::Prefill && !policy.within_share(pools.main, req.tenant, tokens) {
        return Err(Refusal::Wait);
    }
    let owner = Owner { tenant: req.tenant, request: req.id };
    let scope = pools.prefix_cache.then(|| pool.scope(req.tenant, req.cache_salt.as_deref()));
    let reserved = match (&scope, kind) {
        (Some(scope), Kind::Reserve) => pool.reserve_held(owner, tokens, scope, &req.prompt),
        (Some(scope), _) => pool.reserve_cached(owner, tokens, scope, &req.prompt),
        (None, _) => pool.reserve(owner, tokens).map(|kv| (kv, 0)),
    };
    match reserved {
        Ok((kv, cached)) => Ok(Reservation { kv, cached, scope }),
        Err(KvError::Exhausted { .. }) => Err(Refusal::Wait),
        Err(e) => Err(Refusal::Failed(e)),
    }
}
