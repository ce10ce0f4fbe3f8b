//! Capped exponential backoff with jitter, so that nodes cut off from etcd together do not
//! all come back in the same instant when it returns.

use std::hash::BuildHasher as _;
use std::time::Duration;

pub(crate) struct Backoff {
    first: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(first: Duration, cap: Duration) -> Self {
        let first = first.min(cap);
        Backoff { first, cap, next: first }
    }

    /// After a success: the next failure waits the shortest time again.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }

    /// The wait before the next try: between half and all of the current step, which then
    /// doubles up to the cap.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(self.cap);
        // std's per-instance random hasher keys are entropy enough for jitter; no RNG crate.
        let r = std::collections::hash_map::RandomState::new().hash_one(0u8);
        let fraction = 0.5 + (r % 1024) as f64 / 2048.0;
        step.mul_f64(fraction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_reset() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let steps: Vec<Duration> = (0..5).map(|_| b.next_delay()).collect();
        for (d, step) in steps.iter().zip([100, 200, 350, 350, 350]) {
            let step = Duration::from_millis(step);
            assert!(*d >= step / 2 && *d <= step, "{d:?} vs {step:?}");
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
