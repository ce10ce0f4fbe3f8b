//! Typed errors of the KV pool. Every message names the numbers involved.

use crate::Owner;

/// Everything that can go wrong when configuring, reserving, writing or reading KV pages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// The pool has fewer free pages than the reservation needs; nothing was reserved.
    #[error("KV pool exhausted: {requested_pages} pages requested, {free_pages} free")]
    Exhausted { requested_pages: usize, free_pages: usize },

    /// The request could never fit in this pool, even when it is empty.
    #[error("{requested_tokens} tokens can never fit in a KV pool of {capacity_tokens} tokens")]
    ExceedsPool { requested_tokens: usize, capacity_tokens: usize },

    /// The pool configuration (layout or capacity) is unusable.
    #[error("invalid KV pool configuration: {field}: {detail}")]
    InvalidConfig { field: &'static str, detail: String },

    /// The arena could not be allocated.
    #[error("could not allocate {bytes} bytes for the KV pool")]
    AllocationFailed { bytes: usize },

    /// A layer or position index is out of range; valid indices are `< limit`.
    #[error("{what} {index} is out of range (must be < {limit})")]
    OutOfRange { what: &'static str, index: usize, limit: usize },

    /// A span of positions runs past the block table's capacity.
    #[error("{len} positions requested but the block table holds only {capacity}")]
    BeyondCapacity { len: usize, capacity: usize },

    /// The slot was not written at this layer in the page's current generation.
    #[error("KV slot at layer {layer}, position {pos} was never written in this lease")]
    Unwritten { layer: usize, pos: usize },

    /// The page was reallocated since this block table leased it.
    #[error("page {page} is at generation {found}, block table expects {expected}")]
    StaleGeneration { page: u32, expected: u64, found: u64 },

    /// The page's recorded owner is not the block table's owner.
    #[error("page {page} belongs to {found:?}, not {expected:?}")]
    WrongOwner { page: u32, expected: Owner, found: Owner },

    /// A write reached a sealed prefix-cache page, which is read-only.
    #[error("page {page} is a sealed prefix-cache page and read-only")]
    ReadOnly { page: u32 },

    /// An input or output buffer has the wrong number of elements.
    #[error("{what} has {got} elements, expected {expected}")]
    LengthMismatch { what: &'static str, expected: usize, got: usize },
}
