//! The one contiguous allocation that holds every page, accessed through raw pointers.
//!
//! The arena itself knows nothing about ownership. Its `unsafe` methods state the contract
//! the caller must uphold (no other access to the same range at the same time); the pool
//! upholds it through lease uniqueness: a page is touched only by the single live lease that
//! holds it (`&mut BlockTable` to write, `&BlockTable` to read), or by the pool while the page
//! is on the free list or being handed out / taken back. Bounds are always checked here.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::marker::PhantomData;
use std::ptr::NonNull;

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::{KvError, KvSlice};

mod sealed {
    /// Element types for which the all-zero bit pattern is a valid value (+0.0).
    pub trait ZeroIsValid: Copy {}
    impl ZeroIsValid for half::f16 {}
    impl ZeroIsValid for f32 {}
}

/// An owned, zero-initialised buffer of `len` elements (like `Box<[T]>`, but never turned
/// into a reference as a whole, so disjoint ranges can be used independently).
pub(crate) struct RawBuf<T: sealed::ZeroIsValid> {
    ptr: NonNull<T>,
    len: usize,
    _owns: PhantomData<T>,
}

// SAFETY: RawBuf owns its elements like a Box<[T]>; T (f16/f32) is Send + Sync. Shared use
// across threads goes only through the unsafe range methods below, whose callers guarantee
// that no two threads access the same range concurrently with a writer.
unsafe impl<T: sealed::ZeroIsValid + Send> Send for RawBuf<T> {}
// SAFETY: see the Send impl above.
unsafe impl<T: sealed::ZeroIsValid + Sync> Sync for RawBuf<T> {}

impl<T: sealed::ZeroIsValid> RawBuf<T> {
    fn zeroed(len: usize) -> Result<Self, KvError> {
        let bytes = len.saturating_mul(std::mem::size_of::<T>());
        let layout = Layout::array::<T>(len).map_err(|_| KvError::AllocationFailed { bytes })?;
        if layout.size() == 0 {
            return Err(KvError::InvalidConfig { field: "capacity", detail: "pool would be empty".into() });
        }
        // SAFETY: the layout has a non-zero size (checked just above).
        let raw = unsafe { alloc_zeroed(layout) }.cast::<T>();
        let ptr = NonNull::new(raw).ok_or(KvError::AllocationFailed { bytes })?;
        Ok(Self { ptr, len, _owns: PhantomData })
    }

    /// Pointer to element `off`, after checking that `[off, off + n)` lies inside the buffer.
    fn range_ptr(&self, off: usize, n: usize) -> *mut T {
        let end = off.checked_add(n);
        assert!(end.is_some_and(|e| e <= self.len), "arena range {off}+{n} outside {} elements", self.len);
        // SAFETY: off <= len (asserted), so the result stays within (or one past) the allocation.
        unsafe { self.ptr.as_ptr().add(off) }
    }

    /// # Safety
    /// While the returned slice lives, nobody may write `[off, off + n)`.
    unsafe fn slice(&self, off: usize, n: usize) -> &[T] {
        // SAFETY: in bounds (checked by range_ptr), initialised (zeroed at allocation, and only
        // ever overwritten with valid T), and free of writers while the slice lives per the caller's contract.
        unsafe { std::slice::from_raw_parts(self.range_ptr(off, n), n) }
    }

    /// # Safety
    /// No other access of `[off, off + n)` may happen while the returned slice is alive.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice_mut(&self, off: usize, n: usize) -> &mut [T] {
        // SAFETY: in bounds and initialised as in `slice`; exclusive per the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.range_ptr(off, n), n) }
    }
}

impl<T: sealed::ZeroIsValid> Drop for RawBuf<T> {
    fn drop(&mut self) {
        if let Ok(layout) = Layout::array::<T>(self.len) {
            // SAFETY: ptr was returned by alloc_zeroed with exactly this layout.
            unsafe { dealloc(self.ptr.as_ptr().cast(), layout) }
        }
    }
}

/// Page storage in the pool's element type.
pub(crate) enum Arena {
    F16(RawBuf<f16>),
    F32(RawBuf<f32>),
}

impl Arena {
    pub(crate) fn zeroed(dtype: crate::KvDtype, len: usize) -> Result<Self, KvError> {
        Ok(match dtype {
            crate::KvDtype::F16 => Arena::F16(RawBuf::zeroed(len)?),
            crate::KvDtype::F32 => Arena::F32(RawBuf::zeroed(len)?),
        })
    }

    /// Zeroes `[off, off + n)`.
    ///
    /// # Safety
    /// The caller has exclusive access to the range (a page on its way to or from the free list).
    pub(crate) unsafe fn zero(&self, off: usize, n: usize) {
        // SAFETY: exclusive per the caller's contract; zero bits are a valid f16 / f32.
        unsafe {
            match self {
                Arena::F16(b) => std::ptr::write_bytes(b.range_ptr(off, n), 0, n),
                Arena::F32(b) => std::ptr::write_bytes(b.range_ptr(off, n), 0, n),
            }
        }
    }

    /// Copies the `n` elements at `src` to `dst`, unconverted (the same element type).
    ///
    /// # Safety
    /// The ranges do not overlap; the caller has exclusive access to the destination and
    /// nobody writes the source during the call.
    pub(crate) unsafe fn copy(&self, src: usize, dst: usize, n: usize) {
        // SAFETY: in bounds (range_ptr), disjoint and unshared per the caller's contract.
        unsafe {
            match self {
                Arena::F16(b) => std::ptr::copy_nonoverlapping(b.range_ptr(src, n), b.range_ptr(dst, n), n),
                Arena::F32(b) => std::ptr::copy_nonoverlapping(b.range_ptr(src, n), b.range_ptr(dst, n), n),
            }
        }
    }

    /// Stores `src` (converted to the arena's type) at `[off, off + src.len())`.
    ///
    /// # Safety
    /// The caller has exclusive access to the range.
    pub(crate) unsafe fn store(&self, off: usize, src: &[f32]) {
        // SAFETY: exclusive per the caller's contract.
        unsafe {
            match self {
                Arena::F16(b) => b.slice_mut(off, src.len()).convert_from_f32_slice(src),
                Arena::F32(b) => b.slice_mut(off, src.len()).copy_from_slice(src),
            }
        }
    }

    /// Stores `src[i]` (converted) at `off + i * stride`.
    ///
    /// # Safety
    /// The caller has exclusive access to every element written.
    pub(crate) unsafe fn store_strided(&self, off: usize, stride: usize, src: &[f32]) {
        if src.is_empty() {
            return;
        }
        let span = (src.len() - 1) * stride + 1;
        // SAFETY: exclusive per the caller's contract; bounds checked by `slice_mut`.
        unsafe {
            match self {
                Arena::F16(b) => {
                    let dst = b.slice_mut(off, span);
                    for (i, &x) in src.iter().enumerate() {
                        dst[i * stride] = f16::from_f32(x);
                    }
                }
                Arena::F32(b) => {
                    let dst = b.slice_mut(off, span);
                    for (i, &x) in src.iter().enumerate() {
                        dst[i * stride] = x;
                    }
                }
            }
        }
    }

    /// Loads `dst[i]` from `off + i * stride` as f32.
    ///
    /// # Safety
    /// Nobody writes those elements during the call.
    pub(crate) unsafe fn load_strided(&self, off: usize, stride: usize, dst: &mut [f32]) {
        if dst.is_empty() {
            return;
        }
        let span = (dst.len() - 1) * stride + 1;
        // SAFETY: no concurrent writer per the caller's contract; bounds checked by `slice`.
        unsafe {
            match self {
                Arena::F16(b) => {
                    let src = b.slice(off, span);
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = src[i * stride].to_f32();
                    }
                }
                Arena::F32(b) => {
                    let src = b.slice(off, span);
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = src[i * stride];
                    }
                }
            }
        }
    }

    /// Loads `[off, off + dst.len())` into `dst` as f32.
    ///
    /// # Safety
    /// Nobody writes the range during the call.
    pub(crate) unsafe fn load(&self, off: usize, dst: &mut [f32]) {
        // SAFETY: no concurrent writer per the caller's contract.
        unsafe {
            match self {
                Arena::F16(b) => b.slice(off, dst.len()).convert_to_f32_slice(dst),
                Arena::F32(b) => dst.copy_from_slice(b.slice(off, dst.len())),
            }
        }
    }

    /// Appends the `n` elements at `off + i * stride` to `out` as little-endian bytes of the
    /// arena's type (the wire payload encoding).
    ///
    /// # Safety
    /// Nobody writes those elements during the call.
    pub(crate) unsafe fn load_bytes_strided(&self, off: usize, stride: usize, n: usize, out: &mut Vec<u8>) {
        if n == 0 {
            return;
        }
        let span = (n - 1) * stride + 1;
        // SAFETY: no concurrent writer per the caller's contract; bounds checked by `slice`.
        unsafe {
            match self {
                Arena::F16(b) => {
                    let src = b.slice(off, span);
                    out.extend(src.iter().step_by(stride).flat_map(|x| x.to_bits().to_le_bytes()));
                }
                Arena::F32(b) => {
                    let src = b.slice(off, span);
                    out.extend(src.iter().step_by(stride).flat_map(|x| x.to_bits().to_le_bytes()));
                }
            }
        }
    }

    /// Stores little-endian elements of the arena's type from `src` at `off + i * stride`.
    /// `src.len()` must be a multiple of the element size (the caller checked the length).
    ///
    /// # Safety
    /// The caller has exclusive access to every element written.
    pub(crate) unsafe fn store_bytes_strided(&self, off: usize, stride: usize, src: &[u8]) {
        // SAFETY: exclusive per the caller's contract; bounds checked by `slice_mut`.
        unsafe {
            match self {
                Arena::F16(b) => {
                    let n = src.len() / 2;
                    if n == 0 {
                        return;
                    }
                    let dst = b.slice_mut(off, (n - 1) * stride + 1);
                    for (i, c) in src.chunks_exact(2).enumerate() {
                        dst[i * stride] = f16::from_bits(u16::from_le_bytes([c[0], c[1]]));
                    }
                }
                Arena::F32(b) => {
                    let n = src.len() / 4;
                    if n == 0 {
                        return;
                    }
                    let dst = b.slice_mut(off, (n - 1) * stride + 1);
                    for (i, c) in src.chunks_exact(4).enumerate() {
                        dst[i * stride] = f32::from_bits(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                    }
                }
            }
        }
    }

    /// Borrows `[off, off + n)` for `'a`.
    ///
    /// # Safety
    /// Nobody writes the range during `'a`.
    pub(crate) unsafe fn view<'a>(&'a self, off: usize, n: usize) -> KvSlice<'a> {
        // SAFETY: no writer during 'a per the caller's contract.
        unsafe {
            match self {
                Arena::F16(b) => KvSlice::F16(b.slice(off, n)),
                Arena::F32(b) => KvSlice::F32(b.slice(off, n)),
            }
        }
    }

    /// Whether every bit of `[off, off + n)` is zero.
    ///
    /// # Safety
    /// Nobody writes the range during the call.
    pub(crate) unsafe fn is_zero(&self, off: usize, n: usize) -> bool {
        // SAFETY: no concurrent writer per the caller's contract.
        unsafe {
            match self {
                Arena::F16(b) => b.slice(off, n).iter().all(|x| x.to_bits() == 0),
                Arena::F32(b) => b.slice(off, n).iter().all(|x| x.to_bits() == 0),
            }
        }
    }
}
