//! A small fork-join pool for the forward pass.
//!
//! A decode step runs a few hundred short parallel sections (tens of microseconds each), so
//! waking sleeping threads for each would cost more than the work. Workers here spin for a
//! while after each section before parking, and the calling thread takes tasks too.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(300);

struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    n_tasks: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    panicked: AtomicBool,
}

struct Shared {
    epoch: AtomicU64,
    /// The job being run, or null. Workers register in `active` before loading it, and the
    /// caller nulls it and waits for `active == 0` before its stack frame (and the job) ends.
    job: AtomicPtr<Job<'static>>,
    active: AtomicUsize,
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

pub struct ComputePool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl ComputePool {
    /// `threads` total including the caller; 0 = available parallelism.
    pub fn new(threads: usize) -> std::io::Result<ComputePool> {
        let n = if threads == 0 { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) } else { threads };
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            active: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(n - 1);
        for i in 1..n {
            let s = shared.clone();
            workers.push(std::thread::Builder::new().name(format!("pw-compute-{i}")).spawn(move || worker(&s))?);
        }
        Ok(ComputePool { shared, workers })
    }

    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(0..n_tasks)` across the pool and returns when every call has returned.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if n_tasks == 1 || self.workers.is_empty() {
            (0..n_tasks).for_each(f);
            return;
        }
        let job =
            Job { f, n_tasks, next: AtomicUsize::new(0), done: AtomicUsize::new(0), panicked: AtomicBool::new(false) };
        let s = &*self.shared;
        // SAFETY: the pointer is only dereferenced by workers registered in `active`, and this
        // function does not return until it has nulled the pointer and seen `active == 0`.
        let ptr = &job as *const Job<'_> as *mut Job<'static>;
        s.job.store(ptr, SeqCst);
        s.epoch.fetch_add(1, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        work_on(&job);
        while job.done.load(SeqCst) < n_tasks {
            std::hint::spin_loop();
        }
        s.job.store(std::ptr::null_mut(), SeqCst);
        while s.active.load(SeqCst) > 0 {
            std::hint::spin_loop();
        }
        if job.panicked.load(SeqCst) {
            panic!("a compute task panicked");
        }
    }

    /// Splits `data` into chunks of `chunk` elements and runs `f(chunk_index, chunk)` for each.
    pub fn for_each_chunk_mut<T: Send>(&self, data: &mut [T], chunk: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
        let chunk = chunk.max(1);
        let n = data.len().div_ceil(chunk);
        let len = data.len();
        let base = SendPtr(data.as_mut_ptr());
        self.run(n, &|i| {
            let start = i * chunk;
            let end = (start + chunk).min(len);
            let base = &base;
            // SAFETY: task i gets elements [i*chunk, min((i+1)*chunk, len)), disjoint from every
            // other task's, inside `data`, which is mutably borrowed for the whole `run`.
            let part = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), end - start) };
            f(i, part)
        });
    }
}

struct SendPtr<T>(*mut T);
// SAFETY: used only to hand disjoint sub-slices of a `&mut [T]` (T: Send) to pool tasks.
unsafe impl<T: Send> Sync for SendPtr<T> {}

fn work_on(job: &Job<'_>) {
    loop {
        let i = job.next.fetch_add(1, SeqCst);
        if i >= job.n_tasks {
            return;
        }
        // A panicking task still counts as done, so the caller never waits forever; the caller
        // re-raises it.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (job.f)(i))).is_err() {
            job.panicked.store(true, SeqCst);
        }
        job.done.fetch_add(1, SeqCst);
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let started = Instant::now();
        let mut spins = 0u32;
        while s.epoch.load(SeqCst) == seen {
            if s.shutdown.load(SeqCst) {
                return;
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && started.elapsed() > SPIN {
                let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, SeqCst);
                while s.epoch.load(SeqCst) == seen && !s.shutdown.load(SeqCst) {
                    g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, SeqCst);
                drop(g);
            }
        }
        seen = s.epoch.load(SeqCst);
        s.active.fetch_add(1, SeqCst);
        let p = s.job.load(SeqCst);
        if !p.is_null() {
            // SAFETY: registered in `active` before loading a non-null job: see `run`.
            work_on(unsafe { &*p });
        }
        s.active.fetch_sub(1, SeqCst);
    }
}

impl Drop for ComputePool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_exactly_once_across_many_sections() {
        let pool = ComputePool::new(3).unwrap();
        for n in [0usize, 1, 2, 7, 64, 1000] {
            for _ in 0..50 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(n, &|i| {
                    hits[i].fetch_add(1, SeqCst);
                });
                assert!(hits.iter().all(|h| h.load(SeqCst) == 1));
            }
        }
    }

    /// Runs `n_tasks` tasks that each wait until `n_tasks` distinct threads are inside the
    /// section (or `deadline` passes), then apply `then` to their index. The rendezvous makes
    /// every thread of the pool (the caller and each worker) take exactly one task, so a pool
    /// that lost a worker cannot pass it by letting the caller do all the work.
    fn rendezvous(pool: &ComputePool, deadline: Duration, then: &(dyn Fn(usize) + Sync)) -> Vec<bool> {
        let n = pool.threads();
        let arrived = AtomicUsize::new(0);
        let met: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
        pool.run(n, &|i| {
            arrived.fetch_add(1, SeqCst);
            let start = Instant::now();
            while arrived.load(SeqCst) < n && start.elapsed() < deadline {
                std::thread::yield_now();
            }
            met[i].store(arrived.load(SeqCst) >= n, SeqCst);
            then(i)
        });
        met.iter().map(|m| m.load(SeqCst)).collect()
    }

    #[test]
    fn a_panicking_task_ends_the_wait_with_its_panic_and_the_pool_keeps_every_worker() {
        // The pool runs on its own thread and reports each stage through a channel: if a
        // panicking task left the caller waiting, `recv_timeout` fails this test instead of
        // hanging the suite.
        const LIMIT: Duration = Duration::from_secs(60);
        let (tx, rx) = std::sync::mpsc::channel::<(&'static str, bool)>();
        std::thread::spawn(move || {
            let pool = ComputePool::new(3).unwrap();
            // Every thread of the pool (the caller and both workers) panics in its task.
            let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                rendezvous(&pool, Duration::from_secs(20), &|i| panic!("task {i} fails on purpose"))
            }));
            let _ = tx.send(("the panicking section returned with a panic", first.is_err()));
            // A section where only one task of many panics, on whichever thread takes it.
            let ran = AtomicUsize::new(0);
            let second = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.run(200, &|i| {
                    ran.fetch_add(1, SeqCst);
                    assert_ne!(i, 137, "task 137 fails on purpose");
                })
            }));
            let _ = tx.send(("one panicking task of 200 surfaces as a panic", second.is_err()));
            let _ = tx.send(("every task of that section still ran", ran.load(SeqCst) == 200));
            // Afterwards the pool still has all three threads and runs every task once.
            let met = rendezvous(&pool, Duration::from_secs(20), &|_| {});
            let _ = tx.send(("all three threads of the pool take part afterwards", met.iter().all(|m| *m)));
            let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
            pool.run(hits.len(), &|i| {
                hits[i].fetch_add(1, SeqCst);
            });
            let _ = tx.send(("a later section runs every task exactly once", hits.iter().all(|h| h.load(SeqCst) == 1)));
        });
        for expected in [
            "the panicking section returned with a panic",
            "one panicking task of 200 surfaces as a panic",
            "every task of that section still ran",
            "all three threads of the pool take part afterwards",
            "a later section runs every task exactly once",
        ] {
            match rx.recv_timeout(LIMIT) {
                Ok((stage, ok)) => {
                    assert_eq!(stage, expected);
                    assert!(ok, "{stage}: not so");
                }
                Err(e) => panic!("the pool's caller is still waiting ({e}) at: {expected}"),
            }
        }
    }

    #[test]
    fn chunks_are_disjoint_and_cover_the_slice() {
        let pool = ComputePool::new(2).unwrap();
        let mut v = vec![0usize; 1003];
        pool.for_each_chunk_mut(&mut v, 10, &|i, c| c.iter_mut().for_each(|x| *x += i + 1));
        for (j, x) in v.iter().enumerate() {
            assert_eq!(*x, j / 10 + 1);
        }
    }

    #[test]
    fn parked_workers_wake_for_new_work() {
        let pool = ComputePool::new(2).unwrap();
        std::thread::sleep(SPIN * 4);
        let count = AtomicUsize::new(0);
        pool.run(100, &|_| {
            count.fetch_add(1, SeqCst);
        });
        assert_eq!(count.load(SeqCst), 100);
    }
}
