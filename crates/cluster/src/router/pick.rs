//! Choosing a worker for a route: the least loaded of a role, or for prefill the one with the
//! least work once its cache of the request's own tenant is counted, passing over the workers a
//! first attempt failed on, never a draining one. Pure functions of the registered workers, so
//! their rules are tested here without links.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use kv::RouteTag;
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

/// The prefill worker with the least work for this prompt, and the prompt tokens it will
/// compute. A worker's work is the prompt tokens it would compute (those after the leading run
/// of `tags`, the request's own tenant-scoped page names, that it reported cached) plus the
/// prompt tokens its routes in flight still compute: a cached prefix draws its tenant's turns
/// until the queue there costs more than computing the prefix elsewhere. Ties go to the worker
/// with fewer routes in flight, then to the one sent fewer routes since it registered (ties
/// spread), then to the first registered; never to how much a worker holds, which would let
/// other tenants' cached pages move a request. Workers in `avoid` are passed over while another
/// is registered; a draining one is never picked.
pub(super) fn pick_prefill<'a>(
    ws: &'a [Arc<WorkerConn>],
    avoid: &[u64],
    tags: &[RouteTag],
    page_size: usize,
    prompt_len: usize,
) -> Option<(&'a Arc<WorkerConn>, usize)> {
    let of_role = || ws.iter().filter(|w| w.role == Role::Prefill && !w.draining.load(Ordering::SeqCst));
    let cost = |w: &'a Arc<WorkerConn>| {
        let matched = w.cached().matched(tags);
        let computes = prompt_len.saturating_sub(matched * page_size);
        let queued = w.queued_tokens.load(Ordering::Relaxed);
        (w, computes, (computes.saturating_add(queued), load_ties(w)))
    };
    let best = |it: &mut dyn Iterator<Item = &'a Arc<WorkerConn>>| it.map(cost).min_by_key(|(_, _, c)| *c);
    let fresh = best(&mut of_role().filter(|w| !avoid.contains(&w.id)));
    fresh.or_else(|| best(&mut of_role())).map(|(w, computes, _)| (w, computes))
}

/// How many tokens of KV reserved on a decode worker one prompt token's KV crossing to it
/// weighs: a token sent costs its prefill worker, the link and the decode worker (encrypt,
/// frame, decrypt, copy, verify) once, while a token reserved costs its worker a share of every
/// decode step and of its pool while it lasts. At 4 a conversation stays on the decode worker
/// holding its history until that worker holds about four such conversations more than another,
/// which rides out the bursts of a gateway sending every conversation's turn at once.
const SEND_WEIGHT: usize = 4;

/// The decode worker for a prompt of `prompt_len` tokens whose shareable pages are named
/// `tags`: the one with the least `SEND_WEIGHT x tokens it would be sent + KV tokens its routes
/// in flight reserve`. A worker holding the longest run of `tags` reserves those pages from its
/// cache and is sent only the rest, so a conversation stays where its history is while the load
/// there stays within a few conversations of the least; a worker holding nothing of it is only
/// picked for its lighter load (one that joins takes load at once). Ties go to fewer routes in
/// flight, then to fewer routes since it registered, then to the first registered. Workers in
/// `avoid` are passed over while another is registered; a draining one is never picked.
pub(super) fn pick_decode<'a>(
    ws: &'a [Arc<WorkerConn>],
    avoid: &[u64],
    tags: &[RouteTag],
    page_size: usize,
    prompt_len: usize,
) -> Option<&'a Arc<WorkerConn>> {
    let of_role = || ws.iter().filter(|w| w.role == Role::Decode && !w.draining.load(Ordering::SeqCst));
    let cost = |w: &'a Arc<WorkerConn>| {
        let sent = prompt_len.saturating_sub(w.cached().matched(tags) * page_size);
        let reserved = w.reserved_tokens.load(Ordering::Relaxed);
        (w, (sent.saturating_mul(SEND_WEIGHT).saturating_add(reserved), load_ties(w)))
    };
    let best = |it: &mut dyn Iterator<Item = &'a Arc<WorkerConn>>| it.map(cost).min_by_key(|(_, c)| *c);
    best(&mut of_role().filter(|w| !avoid.contains(&w.id))).or_else(|| best(&mut of_role())).map(|(w, _)| w)
}

/// How ties on cost are broken: fewer routes in flight, then fewer routes since the worker
/// registered. Load only: nothing a worker caches for any tenant.
fn load_ties(w: &WorkerConn) -> (usize, u64) {
    (w.inflight.load(Ordering::Relaxed), w.routed.load(Ordering::Relaxed))
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

    #[test]
    fn prefill_goes_where_the_tenants_prefix_is_until_the_queue_there_costs_more_than_computing_it() {
        use super::super::cache_map::TagKey;
        let key = TagKey::random();
        let prompt: Vec<u32> = (0..100).collect();
        let a = key.tags(types::TenantId(1), None, None, &prompt, 16);
        assert_eq!(a.len(), 6);
        let ws = vec![worker(1, Role::Prefill, 0), worker(2, Role::Prefill, 0), worker(3, Role::Decode, 0)];
        // Worker 2 holds the first 5 pages of tenant 1's prompt.
        ws[1].cached().apply(false, &a[..5], &[]);
        let picked = |tags: &[RouteTag], avoid: &[u64]| pick_prefill(&ws, avoid, tags, 16, 100).map(|(w, n)| (w.id, n));
        assert_eq!(picked(&a, &[]), Some((2, 20)), "80 of 100 tokens cached there");
        // Another tenant's request for the very same tokens has its own tags: worker 2's cache
        // of tenant 1 does not draw it, nor does a third tenant's on worker 1 push it away (a
        // tie on work, then on load: the first registered).
        let b = key.tags(types::TenantId(2), None, None, &prompt, 16);
        assert_eq!(picked(&b, &[]), Some((1, 100)));
        ws[0].cached().apply(false, &key.tags(types::TenantId(3), None, None, &[9; 200], 16), &[]);
        assert_eq!(picked(&b, &[]), Some((1, 100)), "other tenants' cached pages never move a request");
        ws[0].routed.store(3, Ordering::Relaxed);
        assert_eq!(picked(&b, &[]), Some((2, 100)), "ties go to the worker sent fewer routes");
        ws[0].routed.store(0, Ordering::Relaxed);
        ws[0].cached().apply(true, &[], &[]);
        // Queued work on worker 2 below what the hit saves keeps the tenant there...
        ws[1].queued_tokens.store(79, Ordering::Relaxed);
        assert_eq!(picked(&a, &[]), Some((2, 20)));
        // ...and more than it saves sends it elsewhere.
        ws[1].queued_tokens.store(81, Ordering::Relaxed);
        assert_eq!(picked(&a, &[]), Some((1, 100)));
        ws[1].queued_tokens.store(0, Ordering::Relaxed);
        // A failed first attempt passes over the worker, a draining one is never picked.
        assert_eq!(picked(&a, &[2]), Some((1, 100)));
        ws[0].draining.store(true, Ordering::SeqCst);
        assert_eq!(picked(&a, &[2]), Some((2, 20)));
        ws[1].draining.store(true, Ordering::SeqCst);
        assert_eq!(picked(&a, &[]), None);
    }

    #[test]
    fn decode_goes_to_the_worker_holding_the_tenants_prefix_until_its_reserved_kv_outweighs_sending_it() {
        use super::super::cache_map::TagKey;
        let key = TagKey::random();
        let prompt: Vec<u32> = (0..100).collect();
        let a = key.tags(types::TenantId(1), None, None, &prompt, 16);
        let ws = vec![worker(1, Role::Decode, 0), worker(2, Role::Decode, 1), worker(3, Role::Prefill, 0)];
        let picked = |tags: &[RouteTag], avoid: &[u64]| pick_decode(&ws, avoid, tags, 16, 100).map(|w| w.id);
        // Nothing held anywhere: the least reserved KV, then the fewest routes in flight.
        ws[1].reserved_tokens.store(50, Ordering::Relaxed);
        assert_eq!(picked(&a, &[]), Some(1));
        // Worker 2 holds 4 of the 6 shareable pages (64 tokens): it is sent 36, worker 1 100.
        ws[1].cached().apply(false, &a[..4], &[]);
        // 4 x 36 + 50 = 194 < 4 x 100 = 400: the holder wins though it is busier.
        assert_eq!(picked(&a, &[]), Some(2));
        // Another tenant's identical prompt matches nothing there: the less loaded.
        assert_eq!(picked(&key.tags(types::TenantId(2), None, None, &prompt, 16), &[]), Some(1));
        // 4 x 36 + 256 = 400 ties with 400: the tie goes to fewer routes in flight.
        ws[1].reserved_tokens.store(256, Ordering::Relaxed);
        assert_eq!(picked(&a, &[]), Some(1));
        ws[0].reserved_tokens.store(1, Ordering::Relaxed);
        assert_eq!(picked(&a, &[]), Some(2), "past the tie, the holder again");
        // A long stream reserved on the holder outweighs what it saves: a worker that just
        // joined (nothing held, nothing reserved) takes the request.
        ws[1].reserved_tokens.store(1_100, Ordering::Relaxed);
        ws[0].reserved_tokens.store(0, Ordering::Relaxed);
        assert_eq!(picked(&a, &[]), Some(1));
        ws[1].reserved_tokens.store(0, Ordering::Relaxed);
        assert_eq!(picked(&a, &[2]), Some(1), "a failed worker is passed over");
        ws[0].draining.store(true, Ordering::SeqCst);
        assert_eq!(picked(&a, &[2]), Some(2), "a draining one never picked");
    }
}
