//! The progress bar on stderr, and the hook it reports to.

use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::options::AuditHooks;
use crate::sync::lock;

/// The progress bar: `\r[#####     ] 120/200` on stderr.
pub(crate) struct Progress {
    pub(crate) on: bool,
    pub(crate) total: AtomicUsize,
    pub(crate) done: AtomicUsize,
    pub(crate) last: Mutex<Option<Instant>>,
}

impl Progress {
    pub(crate) fn tick<H: AuditHooks + ?Sized>(&self, hooks: &H) {
        let done = self.done.fetch_add(1, Ordering::SeqCst) + 1;
        let total = self.total.load(Ordering::SeqCst);
        hooks.on_progress(done, total);
        if !self.on {
            return;
        }
        let mut last = lock(&self.last);
        // At most ten redraws a second, but always the last one.
        if done < total && last.is_some_and(|t| t.elapsed() < Duration::from_millis(100)) {
            return;
        }
        *last = Some(Instant::now());
        let width = 30;
        let filled = (done * width).checked_div(total).unwrap_or(width).min(width);
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r[{}{}] {done}/{total}", "#".repeat(filled), " ".repeat(width - filled));
        let _ = err.flush();
    }

    pub(crate) fn finish(&self) {
        if self.on {
            eprintln!();
        }
    }
}
