//! The tenant-scoped prefix cache (invariant 8): sealed, read-only, refcounted pages keyed by
//! a hash chain over whole pages of token ids.
//!
//! Why a chain with a secret, tenant-derived root: a page's key must name everything its KV
//! depends on (every earlier token) and must never collide across tenants, whatever a client
//! sends. The root is a keyed BLAKE3 of the tenant id (and of an optional client salt, which
//! can only narrow: it is appended after the tenant), under a key drawn at random when the
//! pool is built and never leaves it. Only [`crate::KvPool::scope`] builds a [`CacheScope`],
//! from a `TenantId` the caller authenticated; a client string can never stand in for it.
//! Each entry also records its tenant, and every read of a sealed page checks the page's
//! owner against the reading table's tenant, so a key collision could not cross tenants
//! either.
//!
//! Refcounting is `Arc<SealedPage>` ([`crate::SealedPage`]; the cache is generic over the page
//! type so that it stays below the pool that owns both): the cache holds one reference, every block table reusing
//! the page another. Eviction only drops the cache's reference of pages nobody else holds
//! (least recently used, deepest first), so a page in use is never freed: it goes back to the
//! pool (scrubbed) when its last holder drops it.

use std::collections::HashMap;
use std::sync::Arc;

use crate::route_tags::{RouteTag, TagChanges, TagLog, TAGS_PER_PAGE};
use crate::{RequestId, TenantId};

/// The request id sealed pages are recorded under: no live request has it.
pub(crate) const SEALED: RequestId = RequestId(u64::MAX);

const ROOT_DOMAIN: &[u8] = b"pagewarden prefix-cache root v1";
const PAGE_CONTEXT: &str = "pagewarden 2026-11 prefix-cache page v1";
const TAIL_CONTEXT: &str = "pagewarden 2026-12 prefix-cache tail v1";

/// Key of one cached page: the hash of its tokens chained onto its predecessor's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrefixKey([u8; 32]);

/// The root of one tenant's (optionally client-narrowed) hash chain. Built only by
/// [`crate::KvPool::scope`].
#[derive(Clone, PartialEq, Eq)]
pub struct CacheScope {
    tenant: TenantId,
    root: [u8; 32],
}

impl std::fmt::Debug for CacheScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The root is derived from a secret: never printed.
        f.debug_struct("CacheScope").field("tenant", &self.tenant).finish_non_exhaustive()
    }
}

impl CacheScope {
    pub(crate) fn derive(secret: &[u8; 32], tenant: TenantId, client_salt: Option<&str>) -> CacheScope {
        let mut h = blake3::Hasher::new_keyed(secret);
        // Every field length-prefixed, so no two (tenant, salt) pairs hash the same bytes.
        for field in [ROOT_DOMAIN, &tenant.0.to_le_bytes()] {
            h.update(&(field.len() as u64).to_le_bytes());
            h.update(field);
        }
        match client_salt {
            None => h.update(&[0]),
            Some(s) => {
                h.update(&[1]);
                h.update(&(s.len() as u64).to_le_bytes());
                h.update(s.as_bytes())
            }
        };
        CacheScope { tenant, root: *h.finalize().as_bytes() }
    }

    pub fn tenant(&self) -> TenantId {
        self.tenant
    }

    /// Keys of the whole pages of `tokens` (a trailing partial page has none).
    pub fn chain(&self, tokens: &[u32], page_size: usize) -> Vec<PrefixKey> {
        page_chain(self.root, PAGE_CONTEXT, tokens, page_size).into_iter().map(PrefixKey).collect()
    }

    /// Key of the page holding a prompt's last token, as far as the prompt fills it (1 to
    /// page_size tokens), after the whole pages keyed up to `before` (`None`: the first page).
    /// Its own context, so a tail never answers for a whole page of the same tokens.
    pub fn tail(&self, before: Option<&PrefixKey>, tokens: &[u32]) -> PrefixKey {
        let mut h = blake3::Hasher::new_derive_key(TAIL_CONTEXT);
        h.update(&before.map_or(self.root, |k| k.0));
        h.update(&(tokens.len() as u64).to_le_bytes());
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        PrefixKey(*h.finalize().as_bytes())
    }
}

/// A hash chain over the whole pages of `tokens` (a trailing partial page has none): each
/// page's hash is BLAKE3 in derive-key mode under `context` of the previous hash (`root` for
/// the first page), the page's length and its token ids. The prefix cache's keys and a
/// router's route tags (under their own roots and contexts) are such chains.
pub fn page_chain(root: [u8; 32], context: &str, tokens: &[u32], page_size: usize) -> Vec<[u8; 32]> {
    let mut prev = root;
    tokens
        .chunks_exact(page_size.max(1))
        .map(|page| {
            let mut h = blake3::Hasher::new_derive_key(context);
            h.update(&prev);
            h.update(&(page.len() as u64).to_le_bytes());
            for t in page {
                h.update(&t.to_le_bytes());
            }
            prev = *h.finalize().as_bytes();
            prev
        })
        .collect()
}

struct Entry<P> {
    tenant: TenantId,
    page: Arc<P>,
    last_used: u64,
    /// Position of the page in its chain: deeper pages of a chain go first at equal age.
    depth: usize,
    /// The routers' names for this page ([`RouteTag`]), oldest first.
    tags: Vec<RouteTag>,
}

/// The cache's entries; lives in the pool behind its own mutex.
pub(crate) struct PrefixCache<P> {
    entries: HashMap<PrefixKey, Entry<P>>,
    tick: u64,
    tag_log: TagLog,
}

impl<P> Default for PrefixCache<P> {
    fn default() -> Self {
        PrefixCache { entries: HashMap::new(), tick: 0, tag_log: TagLog::default() }
    }
}

impl<P> PrefixCache<P> {
    /// The longest run of cached pages `keys` starts with, all of `tenant`'s; marks them used.
    pub(crate) fn lookup(&mut self, tenant: TenantId, keys: &[PrefixKey]) -> Vec<Arc<P>> {
        self.tick += 1;
        let mut hits = Vec::new();
        for k in keys {
            match self.entries.get_mut(k) {
                Some(e) if e.tenant == tenant => {
                    e.last_used = self.tick;
                    hits.push(Arc::clone(&e.page));
                }
                _ => break,
            }
        }
        hits
    }

    /// Whether `key` is cached (for any tenant: a caller about to copy a page for it need not).
    pub(crate) fn contains(&self, key: &PrefixKey) -> bool {
        self.entries.contains_key(key)
    }

    /// Adds `page` under `key` unless the key is already cached (another request sealed the
    /// same content first; the caller keeps its own copy until it drops it).
    pub(crate) fn insert(&mut self, tenant: TenantId, key: PrefixKey, depth: usize, page: &Arc<P>) -> bool {
        self.tick += 1;
        if self.entries.contains_key(&key) {
            return false;
        }
        self.entries
            .insert(key, Entry { tenant, page: Arc::clone(page), last_used: self.tick, depth, tags: Vec::new() });
        true
    }

    /// Names the cached page under `key` by `tag` too (nothing when the key is not cached or
    /// the tag names it already); a page named by too many tags forgets its oldest.
    pub(crate) fn tag(&mut self, key: &PrefixKey, tag: RouteTag) {
        let Some(e) = self.entries.get_mut(key) else { return };
        if e.tags.contains(&tag) {
            return;
        }
        if e.tags.len() >= TAGS_PER_PAGE {
            let old = e.tags.remove(0);
            self.tag_log.dropped(old);
        }
        e.tags.push(tag);
        self.tag_log.cached(tag);
    }

    /// Tag changes since the last call (see [`crate::route_tags`]).
    pub(crate) fn take_tag_changes(&mut self) -> TagChanges {
        let entries = &self.entries;
        self.tag_log.take(|| {
            let mut all: Vec<RouteTag> = entries.values().flat_map(|e| e.tags.iter().copied()).collect();
            all.sort_unstable();
            all
        })
    }

    /// Every tag naming a cached page now.
    pub(crate) fn tags(&self) -> Vec<RouteTag> {
        let mut all: Vec<RouteTag> = self.entries.values().flat_map(|e| e.tags.iter().copied()).collect();
        all.sort_unstable();
        all
    }

    /// Takes the entry of `key` out of the cache, logging its tags as dropped.
    fn remove(&mut self, key: &PrefixKey) -> Option<Arc<P>> {
        let e = self.entries.remove(key)?;
        for t in e.tags {
            self.tag_log.dropped(t);
        }
        Some(e.page)
    }

    /// Removes up to `n` entries nobody but the cache holds, least recently used first, and
    /// returns them so the caller drops them (freeing their pages) outside every lock.
    pub(crate) fn evict(&mut self, n: usize) -> Vec<Arc<P>> {
        let mut idle: Vec<(u64, std::cmp::Reverse<usize>, PrefixKey)> = self
            .entries
            .iter()
            .filter(|(_, e)| Arc::strong_count(&e.page) == 1)
            .map(|(k, e)| (e.last_used, std::cmp::Reverse(e.depth), *k))
            .collect();
        idle.sort_unstable_by_key(|(t, d, _)| (*t, *d));
        idle.into_iter().take(n).filter_map(|(_, _, k)| self.remove(&k)).collect()
    }

    /// Entries nobody but the cache holds (the pages a reservation may evict).
    pub(crate) fn idle(&self) -> usize {
        self.entries.values().filter(|e| Arc::strong_count(&e.page) == 1).count()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Removes every entry of the tenants `forget` picks, idle or in use (a page in use is
    /// freed when its last holder drops it), and returns them for the caller to drop.
    pub(crate) fn forget(&mut self, forget: &dyn Fn(TenantId) -> bool) -> Vec<Arc<P>> {
        let keys: Vec<PrefixKey> = self.entries.iter().filter(|(_, e)| forget(e.tenant)).map(|(k, _)| *k).collect();
        keys.iter().filter_map(|k| self.remove(k)).collect()
    }

    /// Entries of `tenant` nobody but the cache holds.
    pub(crate) fn idle_of(&self, tenant: TenantId) -> usize {
        self.entries.values().filter(|e| e.tenant == tenant && Arc::strong_count(&e.page) == 1).count()
    }

    /// Entries per tenant, idle or in use.
    pub(crate) fn count_by_tenant(&self) -> HashMap<TenantId, usize> {
        let mut out = HashMap::new();
        for e in self.entries.values() {
            *out.entry(e.tenant).or_default() += 1;
        }
        out
    }

    /// Entries of `tenant`, idle or in use.
    pub(crate) fn count_of(&self, tenant: TenantId) -> usize {
        self.entries.values().filter(|e| e.tenant == tenant).count()
    }

    /// Empties the cache; the returned pages are freed when the caller drops them.
    pub(crate) fn clear(&mut self) -> Vec<Arc<P>> {
        let keys: Vec<PrefixKey> = self.entries.keys().copied().collect();
        keys.iter().filter_map(|k| self.remove(k)).collect()
    }
}
