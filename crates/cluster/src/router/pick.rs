//! Choosing a worker for a route: the least loaded of a role, passing over the workers a first
//! attempt failed on, never a draining one. A pure function of the registered workers, so its
//! rule is tested here without links.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use wire::Role;

use super::worker::WorkerConn;

/// The least loaded worker of `role` (routes in flight), passing over those in `avoid` (the
/// workers a first attempt failed on) while another of the role is registered; a draining
/// worker is never picked.
pub(super) fn pick<'a>(ws: &'a [Arc<WorkerConn>], role: Role, avoid: &[u64]) -> Option<&'a Arc<WorkerConn>> {
    let of_role = || ws.iter().filter(|w| w.role == role && !w.draining.load(Ordering::SeqCst));
    let fresh = of_role().filter(|w| !avoid.contains(&w.id)).min_by_key(|w| w.inflight.load(Ordering::Relaxed));
    fresh.or_else(|| of_role().min_by_key(|w| w.inflight.load(Ordering::Relaxed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::sync::mpsc;

    fn worker(id: u64, role: Role, inflight: usize) -> Arc<WorkerConn> {
        let (tx, _) = mpsc::unbounded_channel();
        let w = WorkerConn::new(id, format!("w{id}"), role, None, 4096, tx);
        w.inflight.store(inflight, std::sync::atomic::Ordering::SeqCst);
        Arc::new(w)
    }

    #[test]
    fn a_draining_worker_is_never_picked_even_when_it_is_the_least_loaded() {
        let ws = vec![worker(1, Role::Decode, 0), worker(2, Role::Decode, 5)];
        ws[0].draining.store(true, Ordering::SeqCst);
        assert_eq!(pick(&ws, Role::Decode, &[]).map(|w| w.id), Some(2));
        assert_eq!(pick(&ws, Role::Decode, &[2]).map(|w| w.id), Some(2));
        ws[1].draining.store(true, Ordering::SeqCst);
        assert!(pick(&ws, Role::Decode, &[]).is_none());
    }

    #[test]
    fn pick_takes_the_least_loaded_worker_of_the_role_and_avoids_a_failed_one_while_another_exists() {
        let ws = vec![
            worker(1, Role::Decode, 3),
            worker(2, Role::Prefill, 0),
            worker(3, Role::Decode, 1),
            worker(4, Role::Decode, 2),
        ];
        assert_eq!(pick(&ws, Role::Decode, &[]).map(|w| w.id), Some(3));
        assert_eq!(pick(&ws, Role::Prefill, &[]).map(|w| w.id), Some(2));
        // A retry passes over the worker that failed, even though it is the least loaded.
        assert_eq!(pick(&ws, Role::Decode, &[3]).map(|w| w.id), Some(4));
        // With every worker of the role avoided, the least loaded of them is still better than none.
        assert_eq!(pick(&ws, Role::Prefill, &[2]).map(|w| w.id), Some(2));
        assert_eq!(pick(&ws, Role::Decode, &[1, 3, 4]).map(|w| w.id), Some(3));
        assert!(pick(&ws, Role::Gateway, &[]).is_none());
        assert!(pick(&[], Role::Decode, &[]).is_none());
    }
}
