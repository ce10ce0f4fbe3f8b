//! Weight storage, moved once loaded into one region the kernel may back with huge pages.
//!
//! Decode streams every weight once per step: 86 MiB in 4 KiB pages is 22,000 pages, far
//! more than the TLB holds, so each page of weights costs a page walk. Measured on the
//! 2-vCPU EPYC this project targets, backing them with 2 MiB pages (THP forced on for the
//! whole system) raised batch-1 decode 20 % at one thread and 8 % at two. Most matrices are
//! under 2 MiB, so huge pages only help when all of them share one region; the system's
//! default (`madvise`) gives huge pages only to memory that asks, so the region asks.
//!
//! It asks once the weights are written, not before: faulting fresh huge pages in is slow
//! and erratic in a VM whose balloon hands freed memory back to its host (the 2-vCPU VMs
//! this project is measured on: touching 800 MB took 0.33 s in 4 KiB pages every time, but
//! 0.16 s in huge pages just after another process freed some and 2.5-2.7 s a few seconds
//! later), and it was most of a model's load time. So the loader writes small pages, and a background thread
//! of the lowest priority collapses them into huge ones (`MADV_COLLAPSE`) while the model
//! already serves: a few percent of decode speed for the first seconds, instead of a
//! load time that varied from under to over twice llama.cpp's.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// Huge page size on x86-64 and the alignment of the region.
const HUGE: usize = 2 << 20;
/// Each buffer starts on a cache line.
const ALIGN: usize = 64;

/// A weight array: its own `Vec` while the model is built, a range of the shared region once
/// [`pack`] moved it there. Either way it owns its elements alone.
pub enum WeightBuf<T> {
    Owned(Vec<T>),
    Packed { ptr: *mut T, len: usize, _region: Arc<Region> },
}

// SAFETY: a packed buffer is the only one to reach its range of the region (see `pack`), so
// it is as sendable and shareable as the Vec it replaced.
unsafe impl<T: Send> Send for WeightBuf<T> {}
// SAFETY: as above; `&WeightBuf` gives only `&[T]`.
unsafe impl<T: Sync> Sync for WeightBuf<T> {}

impl<T> From<Vec<T>> for WeightBuf<T> {
    fn from(v: Vec<T>) -> Self {
        WeightBuf::Owned(v)
    }
}

impl<T> Deref for WeightBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            WeightBuf::Owned(v) => v,
            // SAFETY: `ptr` points at `len` initialized elements inside the live region.
            WeightBuf::Packed { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }
}

impl<T> DerefMut for WeightBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            WeightBuf::Owned(v) => v,
            // SAFETY: as in `deref`, and no other buffer reaches this range.
            WeightBuf::Packed { ptr, len, .. } => unsafe { std::slice::from_raw_parts_mut(*ptr, *len) },
        }
    }
}

/// Bytes [`pack`] needs for a buffer of `len` elements of `T`.
fn footprint<T>(len: usize) -> usize {
    (len * size_of::<T>()).next_multiple_of(ALIGN)
}

/// One mapping, 2 MiB aligned, written in small pages and collapsed into huge ones once
/// [`Packer::finish`] hands it out.
pub struct Region {
    base: *mut u8,
    /// Bytes from `base` still mapped ([`Packer::finish`] unmaps the part never used).
    len: AtomicUsize,
    /// The slack before `base` cut off by alignment, left mapped: (start, bytes).
    head: (*mut u8, usize),
    /// Set once the background collapse has tried every huge page of the region.
    settled: (Mutex<bool>, Condvar),
    /// Huge pages the collapse made.
    collapsed: AtomicUsize,
}

/// How long after loading the collapse starts. It copies every weight once and holds the
/// process's memory map lock while it swaps each page, so compute threads that map memory
/// meanwhile wait on it: profiled beside the first tokens after load, it took 15% of the CPU
/// and the engine's threads spun on that lock. It pays back only over tens of seconds of
/// decoding (a few percent of each step), so the first seconds, and processes that live no
/// longer (`generate`), are better off without it.
const COLLAPSE_AFTER: Duration = Duration::from_secs(2);

/// `MADV_COLLAPSE` (Linux 6.1), which the `libc` crate exports for glibc targets only.
#[cfg(target_os = "linux")]
const MADV_COLLAPSE: libc::c_int = 25;

// SAFETY: the region is plain memory; who may touch which part is decided by `WeightBuf`.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// Reserves `len` bytes (rounded up to huge pages) of address space: untouched pages cost
    /// no memory (`MAP_NORESERVE`), so a loader can reserve a bound on what it will pack.
    #[cfg(target_os = "linux")]
    fn map(len: usize) -> Option<Region> {
        let len = len.checked_next_multiple_of(HUGE)?;
        let total = len.checked_add(HUGE)?;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let p = p as *mut u8;
        let head = p.align_offset(HUGE);
        let base = p.wrapping_add(head);
        // The tail past `base + len` is never used.
        // SAFETY: `base + len .. p + total` lies inside the mapping just made.
        unsafe { libc::munmap(base.wrapping_add(len) as *mut libc::c_void, total - head - len) };
        // Small pages while it is written, even where the system gives huge pages unasked
        // (`always`): see the module doc. Only a hint.
        // SAFETY: `base..base + len` lies inside the mapping just made.
        unsafe { libc::madvise(base as *mut libc::c_void, len, libc::MADV_NOHUGEPAGE) };
        Some(Region {
            base,
            len: AtomicUsize::new(len),
            head: (p, head),
            settled: (Mutex::new(false), Condvar::new()),
            collapsed: AtomicUsize::new(0),
        })
    }

    /// Asks for huge pages now that the region is written, and starts a thread of the lowest
    /// priority that collapses it into them one huge page at a time. The thread holds the
    /// region only while it collapses one page, so dropping the model stops it.
    fn collapse_in_background(region: &Arc<Region>) {
        #[cfg(target_os = "linux")]
        {
            let len = region.len.load(Ordering::Acquire);
            // From here khugepaged may collapse it too (the only way on kernels before 6.1).
            // SAFETY: `base..base + len` is mapped (`trim` kept it).
            unsafe { libc::madvise(region.base as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
            let weak = Arc::downgrade(region);
            let spawned = std::thread::Builder::new().name("weight-huge-pages".into()).spawn(move || {
                // Behind every inference thread: the model serves meanwhile. Failing leaves
                // it at the default priority, still correct.
                // SAFETY: plain system calls about the calling thread.
                unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
                std::thread::sleep(COLLAPSE_AFTER);
                let mut at = 0;
                while let Some(r) = weak.upgrade() {
                    if at >= len || !r.collapse_one(at) {
                        r.settle();
                        break;
                    }
                    at += HUGE;
                }
            });
            if spawned.is_err() {
                region.settle();
            }
        }
        #[cfg(not(target_os = "linux"))]
        region.settle();
    }

    /// Collapses the huge page at byte `at` of the region; false when the kernel has no
    /// `MADV_COLLAPSE` (so none of the others can be either).
    #[cfg(target_os = "linux")]
    fn collapse_one(&self, at: usize) -> bool {
        // The kernel copies the small pages into a huge one and swaps the mapping under its
        // own locks, so readers on other threads see the same bytes throughout.
        // SAFETY: `base + at .. base + at + HUGE` lies inside the mapped `len` (a multiple of
        // HUGE); the call changes which pages back it, never its contents.
        let rc = unsafe { libc::madvise(self.base.wrapping_add(at) as *mut libc::c_void, HUGE, MADV_COLLAPSE) };
        if rc == 0 {
            self.collapsed.fetch_add(1, Ordering::AcqRel);
            return true;
        }
        // Anything else (no huge page free just now) leaves this page small and goes on.
        std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
    }

    fn settle(&self) {
        *self.settled.0.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.settled.1.notify_all();
    }

    /// Waits up to `timeout` for the background collapse to finish; whether it did.
    pub fn wait_settled(&self, timeout: Duration) -> bool {
        let (done, cv) = &self.settled;
        let done = done.lock().unwrap_or_else(PoisonError::into_inner);
        let (done, _) = cv.wait_timeout_while(done, timeout, |d| !*d).unwrap_or_else(PoisonError::into_inner);
        *done
    }

    /// Bytes the background collapse has moved into huge pages so far.
    pub fn collapsed_bytes(&self) -> usize {
        self.collapsed.load(Ordering::Acquire) * HUGE
    }

    /// Unmaps the region past its first `used` bytes (rounded up to a huge page).
    fn trim(&self, used: usize) {
        let keep = used.next_multiple_of(HUGE);
        let len = self.len.load(Ordering::Acquire);
        if keep < len {
            #[cfg(target_os = "linux")]
            // SAFETY: `base + keep .. base + len` is mapped and no buffer lies in it (every
            // buffer ends by `used`).
            unsafe {
                libc::munmap(self.base.wrapping_add(keep) as *mut libc::c_void, len - keep)
            };
            self.len.store(keep, Ordering::Release);
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn map(_len: usize) -> Option<Region> {
        None
    }

    /// Bytes of this region the kernel backs with huge pages, from `/proc/self/smaps`
    /// (None where that cannot be read).
    pub fn huge_bytes(&self) -> Option<usize> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let (lo, hi) = (self.base as usize, self.base as usize + self.len.load(Ordering::Acquire));
        let mut inside = false;
        let mut total = 0;
        for line in smaps.lines() {
            if let Some((a, b)) = mapping_range(line) {
                inside = a < hi && b > lo;
            } else if let Some(kb) = line.strip_prefix("AnonHugePages:").filter(|_| inside) {
                total += kb.trim().trim_end_matches("kB").trim().parse::<usize>().ok()? * 1024;
            }
        }
        Some(total)
    }
}

/// The address range of an smaps mapping header (`start-end perms ...`); None for other lines.
pub(crate) fn mapping_range(line: &str) -> Option<(usize, usize)> {
    let (a, b) = line.split_once(' ')?.0.split_once('-')?;
    Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?))
}

impl Drop for Region {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        // SAFETY: what is left of the mapping made in `map`; every buffer into it holds the
        // Arc, so none is left.
        unsafe {
            libc::munmap(self.head.0 as *mut libc::c_void, self.head.1 + *self.len.get_mut());
        }
    }
}

/// Something holding weight buffers that [`pack`] can move.
pub trait Packable {
    /// Calls `f` on each of its buffers (the same ones, in the same order, each time).
    fn each_buf(&mut self, f: &mut dyn FnMut(BufMut<'_>));
}

/// One buffer handed to a [`Packable::each_buf`] visitor.
pub enum BufMut<'a> {
    U8(&'a mut WeightBuf<u8>),
    U16(&'a mut WeightBuf<u16>),
    U64(&'a mut WeightBuf<u64>),
    F32(&'a mut WeightBuf<f32>),
}

/// Moves every owned buffer of `items` into one new region; returns it (None, leaving every
/// buffer where it was, when the system gave no mapping).
pub fn pack(items: &mut [&mut dyn Packable]) -> Option<Arc<Region>> {
    let mut bytes = 0;
    for it in items.iter_mut() {
        it.each_buf(&mut |b| bytes += b.owned_footprint());
    }
    if bytes == 0 {
        return None;
    }
    let packer = Packer::reserve(bytes);
    for it in items.iter_mut() {
        packer.pack(*it);
    }
    packer.finish()
}

/// Hands out ranges of one region to buffers as they are made ([`Alloc::In`]) or moved in
/// ([`Packer::pack`]), from any thread: a loader that builds each matrix in place holds the
/// model once, not a copy beside it.
pub struct Packer {
    region: Option<Arc<Region>>,
    /// Bytes of the region handed out.
    at: AtomicUsize,
}

impl Packer {
    /// A region of `bound` bytes of address space (see [`Region::map`]; a buffer that would
    /// pass the bound is made, or stays, on the heap).
    pub fn reserve(bound: usize) -> Packer {
        Packer { region: Region::map(bound.max(1)).map(Arc::new), at: AtomicUsize::new(0) }
    }

    /// The byte offset of a fresh range of `bytes`, if the region has room.
    fn claim(&self, bytes: usize) -> Option<(&Arc<Region>, usize)> {
        let region = self.region.as_ref()?;
        let cap = region.len.load(Ordering::Acquire);
        let at = self
            .at
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |at| at.checked_add(bytes).filter(|&end| end <= cap))
            .ok()?;
        Some((region, at))
    }

    /// Moves every owned buffer of `item` that still fits into the region.
    pub fn pack(&self, item: &mut dyn Packable) {
        item.each_buf(&mut |b| b.move_into(self));
    }

    /// The region with the part never used unmapped (None when nothing was packed).
    pub fn finish(self) -> Option<Arc<Region>> {
        let region = self.region?;
        let used = self.at.into_inner();
        if used == 0 {
            return None;
        }
        region.trim(used);
        Region::collapse_in_background(&region);
        Some(region)
    }
}

/// Element types whose all-zero bytes are a value (what a fresh region range holds).
///
/// # Safety
/// Every bit pattern of zeros must be a valid `Self`, and `ZERO` that value.
pub unsafe trait Zeroable: Copy + 'static {
    const ZERO: Self;
}
// SAFETY: integers and floats of all-zero bits are 0 and 0.0.
unsafe impl Zeroable for u8 {
    const ZERO: Self = 0;
}
// SAFETY: as above.
unsafe impl Zeroable for u16 {
    const ZERO: Self = 0;
}
// SAFETY: as above.
unsafe impl Zeroable for u64 {
    const ZERO: Self = 0;
}
// SAFETY: as above.
unsafe impl Zeroable for f32 {
    const ZERO: Self = 0.0;
}

/// Where a new weight buffer is made.
#[derive(Clone, Copy)]
pub enum Alloc<'a> {
    Heap,
    /// In the packer's region where it has room, else on the heap.
    In(&'a Packer),
}

impl Alloc<'_> {
    /// `len` zeros.
    pub fn zeroed<T: Zeroable>(self, len: usize) -> WeightBuf<T> {
        if let Alloc::In(packer) = self {
            if let Some((region, at)) = packer.claim(footprint::<T>(len)) {
                // The range `at..at + footprint` is this buffer's alone (claimed atomically,
                // never handed out again) and, in a fresh anonymous mapping never written
                // before, all zeros: `len` valid `T`s (`Zeroable`), aligned as in `move_into`.
                let ptr = region.base.wrapping_add(at) as *mut T;
                return WeightBuf::Packed { ptr, len, _region: region.clone() };
            }
        }
        WeightBuf::Owned(vec![T::ZERO; len])
    }
}

impl BufMut<'_> {
    /// Bytes [`pack`] needs for it: none once it is packed.
    fn owned_footprint(&self) -> usize {
        match self {
            BufMut::U8(b) => owned_footprint(b),
            BufMut::U16(b) => owned_footprint(b),
            BufMut::U64(b) => owned_footprint(b),
            BufMut::F32(b) => owned_footprint(b),
        }
    }

    fn move_into(self, packer: &Packer) {
        match self {
            BufMut::U8(b) => move_into(b, packer),
            BufMut::U16(b) => move_into(b, packer),
            BufMut::U64(b) => move_into(b, packer),
            BufMut::F32(b) => move_into(b, packer),
        }
    }
}

fn owned_footprint<T>(b: &WeightBuf<T>) -> usize {
    match b {
        WeightBuf::Owned(v) => footprint::<T>(v.len()),
        WeightBuf::Packed { .. } => 0,
    }
}

/// Copies an owned buffer into a range the packer hands out and points it there, if it fits.
fn move_into<T: Copy>(b: &mut WeightBuf<T>, packer: &Packer) {
    let WeightBuf::Owned(v) = b else { return };
    let len = v.len();
    let Some((region, at)) = packer.claim(footprint::<T>(len)) else { return };
    let ptr = region.base.wrapping_add(at) as *mut T;
    // SAFETY: `ptr` is aligned (the region is 2 MiB aligned, offsets are multiples of 64 and
    // `T` needs at most 8) and `len` elements fit in the range just claimed, inside the
    // mapping and given to no other buffer; the source is a distinct allocation.
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), ptr, len) };
    *b = WeightBuf::Packed { ptr, len, _region: region.clone() };
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Two {
        a: WeightBuf<u8>,
        b: WeightBuf<f32>,
        c: WeightBuf<u64>,
    }

    impl Packable for Two {
        fn each_buf(&mut self, f: &mut dyn FnMut(BufMut<'_>)) {
            f(BufMut::U8(&mut self.a));
            f(BufMut::F32(&mut self.b));
            f(BufMut::U64(&mut self.c));
        }
    }

    #[test]
    fn packed_buffers_keep_their_contents_and_stay_writable() {
        let a: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
        let b: Vec<f32> = (0..1001).map(|i| i as f32 * 0.5).collect();
        let c: Vec<u64> = (0..33).map(|i| i * 0x0101_0101).collect();
        let mut x = Two { a: a.clone().into(), b: b.clone().into(), c: c.clone().into() };
        let mut y = Two { a: vec![9u8; 5].into(), b: Vec::new().into(), c: vec![1].into() };
        let Some(region) = pack(&mut [&mut x, &mut y]) else { return };
        assert!(matches!(x.a, WeightBuf::Packed { .. }) && matches!(y.c, WeightBuf::Packed { .. }));
        assert_eq!((&x.a[..], &x.b[..], &x.c[..]), (&a[..], &b[..], &c[..]));
        assert_eq!((&y.a[..], y.b.len(), &y.c[..]), (&[9u8; 5][..], 0, &[1u64][..]));
        assert_eq!(x.b.as_ptr() as usize % ALIGN, 0);
        x.a[0] = 200;
        assert_eq!((x.a[0], x.a[1], y.a[0]), (200, 7, 9), "a write lands in its own buffer only");
        // Packing again moves nothing: every buffer is already in a region.
        assert!(pack(&mut [&mut x, &mut y]).is_none());
        drop(region);
        assert_eq!(x.b[1000], 500.0, "the buffers keep the region alive");
    }

    #[test]
    fn a_packer_moves_what_fits_its_bound_keeps_the_rest_owned_and_gives_back_the_unused_part() {
        let big = |n: usize, v: u8| Two { a: vec![v; n].into(), b: Vec::new().into(), c: Vec::new().into() };
        let packer = Packer::reserve(3 * HUGE);
        if packer.region.is_none() {
            return;
        }
        let (mut x, mut y, mut z) = (big(HUGE, 1), big(2 * HUGE + 1, 2), big(100, 3));
        packer.pack(&mut x);
        packer.pack(&mut y);
        packer.pack(&mut z);
        assert!(matches!(x.a, WeightBuf::Packed { .. }) && matches!(z.a, WeightBuf::Packed { .. }));
        assert!(matches!(y.a, WeightBuf::Owned(_)), "past the bound, a buffer stays where it was");
        let region = packer.finish().expect("something was packed");
        assert_eq!(region.len.load(Ordering::Acquire), 2 * HUGE, "only the huge pages in use stay mapped");
        assert_eq!((x.a[HUGE - 1], y.a[2 * HUGE], z.a[99]), (1, 2, 3));
        assert!(Packer::reserve(HUGE).finish().is_none(), "nothing packed, nothing kept");
    }

    #[test]
    fn a_finished_region_moves_to_huge_pages_in_the_background_and_keeps_every_byte() {
        let packer = Packer::reserve(3 * HUGE);
        if packer.region.is_none() {
            return;
        }
        let mut bufs: Vec<WeightBuf<u64>> = (0..3).map(|_| Alloc::In(&packer).zeroed(HUGE / 8 - 8)).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            b.iter_mut().enumerate().for_each(|(j, x)| *x = (i as u64) << 40 | j as u64);
        }
        let region = packer.finish().expect("written");
        assert!(region.wait_settled(Duration::from_secs(60)), "the collapse ends");
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.iter().enumerate().all(|(j, &x)| x == (i as u64) << 40 | j as u64), "buffer {i} unchanged");
        }
        // Where the kernel collapsed pages (6.1 and later, huge pages not `never`), smaps
        // shows them, so `huge_bytes` and bench's report agree with the thread's count.
        if let Some(huge) = region.huge_bytes() {
            assert!(
                huge >= region.collapsed_bytes(),
                "{huge} bytes in huge pages, {} collapsed",
                region.collapsed_bytes()
            );
        }
        assert!(region.collapsed_bytes() <= 3 * HUGE);
    }

    #[test]
    fn buffers_made_in_a_region_from_several_threads_are_zero_disjoint_and_fall_back_to_the_heap() {
        let packer = Packer::reserve(HUGE);
        if packer.region.is_none() {
            return;
        }
        let made: Vec<(WeightBuf<u16>, WeightBuf<f32>)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (Alloc::In(&packer).zeroed::<u16>(1000), Alloc::In(&packer).zeroed::<f32>(3000))))
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let mut made = made;
        for (i, (a, b)) in made.iter_mut().enumerate() {
            assert!(matches!(a, WeightBuf::Packed { .. }) && matches!(b, WeightBuf::Packed { .. }));
            assert!(a.iter().all(|&x| x == 0) && b.iter().all(|&x| x == 0.0));
            a.fill(i as u16 + 1);
            b.fill(i as f32 + 1.0);
        }
        for (i, (a, b)) in made.iter().enumerate() {
            assert!(a.iter().all(|&x| x == i as u16 + 1) && b.iter().all(|&x| x == i as f32 + 1.0), "no overlap");
        }
        let big: WeightBuf<u8> = Alloc::In(&packer).zeroed(HUGE);
        assert!(matches!(big, WeightBuf::Owned(_)), "past the bound: on the heap");
        assert!(packer.finish().is_some());
    }
}
