//! Widening the pool's f16 elements to f32 for the gathering paths, as wide as the CPU allows:
//! one type per instruction set, chosen by the feature-enabled attention entry points so the
//! intrinsics compile with those features.

use kv::KvSlice;

/// f16 to f32 for runs of elements, as wide as the CPU allows. Inlined into the
/// feature-enabled attention entry points, so the intrinsics compile with those features.
pub(super) trait Widen {
    /// Whether AVX-512 (with AVX2, FMA and F16C) was detected: the decode row then reads an f16
    /// pool's pages directly (the `direct` module).
    const AVX512: bool = false;
    fn run(src: &[half::f16], dst: &mut [f32]);
}

pub(super) struct Portable;

impl Widen for Portable {
    #[inline(always)]
    fn run(src: &[half::f16], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) struct F16c;

#[cfg(target_arch = "x86_64")]
impl Widen for F16c {
    #[inline(always)]
    fn run(src: &[half::f16], dst: &mut [f32]) {
        use std::arch::x86_64::{_mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: only reached from `attend_avx2` / `attend_avx512`, which run after
            // detecting f16c; `i + 8 <= n` keeps both accesses in bounds.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i) as *const _);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        Portable::run(&src[i..n], &mut dst[i..n]);
    }
}

/// Sixteen at a time, one 512-bit store each (the gather's stores are most of its cost).
#[cfg(target_arch = "x86_64")]
pub(super) struct F16c512;

#[cfg(target_arch = "x86_64")]
impl Widen for F16c512 {
    const AVX512: bool = true;
    #[inline(always)]
    fn run(src: &[half::f16], dst: &mut [f32]) {
        use std::arch::x86_64::{_mm256_loadu_si256, _mm512_cvtph_ps, _mm512_storeu_ps};
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: only reached from `attend_avx512`, which runs after detecting avx512f;
            // `i + 16 <= n` keeps both accesses in bounds.
            unsafe {
                let h = _mm256_loadu_si256(src.as_ptr().add(i) as *const _);
                _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
            }
            i += 16;
        }
        F16c::run(&src[i..n], &mut dst[i..n]);
    }
}

/// Copies a run of the pool's elements into f32.
#[inline(always)]
pub(super) fn widen<W: Widen>(src: KvSlice<'_>, dst: &mut [f32]) {
    match src {
        KvSlice::F16(x) => W::run(x, dst),
        KvSlice::F32(x) => dst.copy_from_slice(x),
    }
}
