//! The KV cache pool of pagewarden: the only place where attention keys and values live.
//!
//! Why it exists: in a multi-tenant server, KV pages are recycled between requests of
//! different tenants, and a page read before it is written (or after it changed hands) leaks
//! another user's prompt. This crate makes those reads impossible rather than unlikely.
//!
//! What it enforces (invariants 3, 4 and 7 of `docs/invariants.md`):
//!
//! * **One owner per page.** Pages are handed out as [`PageLease`]s grouped in a
//!   [`BlockTable`]; neither is `Clone`, and dropping them frees the pages. Each allocation
//!   bumps the page's generation; the table keeps `(page, generation)` and every write, view
//!   and read checks generation and owner against the pool's page metadata.
//!   Reservation is all or nothing ([`KvError::Exhausted`], never a partial lease).
//! * **Written before read.** The pool keeps a bit per (page, layer, slot), reset on every
//!   allocation. [`BlockTable::layer`] and [`BlockTable::read`] refuse (with
//!   [`KvError::Unwritten`]) any slot not written in the current lease: an error, never zeros
//!   and never stale data.
//! * **Scrub.** Freed pages are zeroed, at free ([`ScrubPolicy::OnFree`], default) or at
//!   reservation ([`ScrubPolicy::OnAlloc`]); no reservation ever sees a previous owner's bytes.
//!
//! * **Tenant-scoped prefix cache** (invariant 8, [`prefix`]). Whole prompt pages can be
//!   sealed into the cache of the tenant that computed them: read-only, refcounted, keyed by a
//!   hash chain whose root is derived from the tenant with a secret of the pool. Only tables
//!   of the same tenant can read a sealed page (checked on every access, like any lease);
//!   none can write it. Idle cached pages are evicted (LRU) when a reservation needs them.
//!
//! Storage is one contiguous arena (page `p` at `p * page_elems`; inside a page, per layer,
//! a K block `[page_size][row_len]` then a V block). Reads and writes take no lock: their
//! soundness rests on lease uniqueness (`&mut BlockTable` is the only writer of its pages,
//! `&BlockTable` the only reader; sealed pages have no writer at all, so
//! any number of tables may read them at once). The free list and per-tenant accounting sit behind a
//! mutex taken only to reserve and free.

mod arena;
mod error;
mod layout;
mod pages;
mod pool;
pub mod prefix;
mod route_tags;
mod slice;
mod table;
mod view;

pub use error::KvError;
pub use layout::{Capacity, KvDtype, KvLayout, PoolConfig, ScrubPolicy};
pub use pages::{PageLease, PageUse, SealedPage};
pub use pool::KvPool;
pub use prefix::{CacheScope, PrefixKey};
pub use route_tags::{RouteTag, TagChanges};
pub use slice::KvSlice;
pub use table::BlockTable;
pub use types::{Owner, RequestId, TenantId};
pub use view::{KvChunk, LayerView};

/// A page and the generation it was leased at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageRef {
    pub page: u32,
    pub generation: u64,
}

#[cfg(test)]
mod tests;
