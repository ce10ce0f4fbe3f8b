//! Software prefetch of a context's pages ahead of the decode path that reads them.

use kv::{KvSlice, LayerView};

/// Starts loading `s` into the cache. A context's pages are scattered through the pool, so
/// the hardware prefetcher, which follows one address stream, starts over at every page: a
/// decode step at a long context waited on memory latency far more than on bandwidth.
#[inline(always)]
pub(super) fn prefetch(s: KvSlice<'_>) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let (p, bytes) = match s {
            KvSlice::F16(x) => (x.as_ptr() as *const i8, std::mem::size_of_val(x)),
            KvSlice::F32(x) => (x.as_ptr() as *const i8, std::mem::size_of_val(x)),
        };
        let mut off = 0;
        while off < bytes {
            // SAFETY: a prefetch is a hint that never faults, and the address lies within `s`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(off)) };
            off += 64;
        }
        if bytes > 0 {
            // SAFETY: as above (the last byte, whose line a misaligned start leaves out).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(bytes - 1)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = s;
}

/// Prefetches head `kvh`'s K of positions `[from, to)` (whole pages).
#[inline(always)]
pub(super) fn prefetch_keys(view: &LayerView<'_>, from: usize, to: usize, kvh: usize, hd: usize) {
    for ch in view.chunks_from(from) {
        if ch.start >= to {
            break;
        }
        match ch.k_block(kvh * hd, hd) {
            Some(block) => prefetch(block),
            None => (0..hd).for_each(|d| prefetch(ch.k_run(kvh * hd + d))),
        }
    }
}

/// Prefetches head `kvh`'s V rows of positions `[from, to)`.
#[inline(always)]
pub(super) fn prefetch_values(view: &LayerView<'_>, from: usize, to: usize, row_len: usize, kvh: usize, hd: usize) {
    for ch in view.chunks_from(from) {
        if ch.start >= to {
            break;
        }
        for s in from.saturating_sub(ch.start)..ch.len.min(to - ch.start) {
            prefetch(ch.v.sub(s * row_len + kvh * hd, hd));
        }
    }
}
