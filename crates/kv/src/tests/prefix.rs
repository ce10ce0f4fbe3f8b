//! The prefix cache: hits only within a tenant (and client salt), read-only shared pages,
//! eviction that never frees a page in use.

use proptest::prelude::*;

use super::{owner, pool, read};
use crate::*;

/// KV that depends only on the tenant and the tokens up to and including `pos`: what a model
/// would compute. A hit that serves another tenant's or another prefix's page shows up as a
/// mismatch.
fn kv_row(tenant: u64, prompt: &[u32], layer: usize, pos: usize, is_v: bool) -> Vec<f32> {
    let h = prompt[..=pos]
        .iter()
        .fold(tenant * 1_000_003 + layer as u64, |h, &t| h.wrapping_mul(31).wrapping_add(t as u64));
    (0..8).map(|i| ((h.wrapping_add(i) % 1000) as f32) + 1.0 + if is_v { 0.5 } else { 0.0 }).collect()
}

/// Writes positions `[from, prompt.len())` as a prefill would.
fn prefill(t: &mut BlockTable, prompt: &[u32], from: usize) {
    let tenant = t.owner().tenant.0;
    for layer in 0..3 {
        for pos in from..prompt.len() {
            let (k, v) = (kv_row(tenant, prompt, layer, pos, false), kv_row(tenant, prompt, layer, pos, true));
            t.write(layer, pos, &k, &v).expect("write");
        }
    }
}

fn check_reads(t: &BlockTable, prompt: &[u32]) {
    let tenant = t.owner().tenant.0;
    for layer in 0..3 {
        for pos in 0..prompt.len() {
            let (k, v) = read(t, layer, pos).expect("read");
            assert_eq!(k, kv_row(tenant, prompt, layer, pos, false), "layer {layer} pos {pos}");
            assert_eq!(v, kv_row(tenant, prompt, layer, pos, true), "layer {layer} pos {pos}");
        }
    }
}

/// Runs one request: reserve with the cache, prefill the rest, check, seal. Returns the table
/// and how many positions hit.
fn run(p: &KvPool, t: u64, r: u64, salt: Option<&str>, prompt: &[u32]) -> (BlockTable, usize) {
    let scope = p.scope(TenantId(t), salt);
    let (mut table, cached) = p.reserve_cached(owner(t, r), prompt.len() + 4, &scope, prompt).expect("reserve");
    prefill(&mut table, prompt, cached);
    check_reads(&table, prompt);
    table.seal_prefix(&scope, prompt, &[]).expect("seal");
    (table, cached)
}

const PROMPT: [u32; 11] = [5, 9, 2, 7, 1, 1, 8, 3, 4, 6, 2];

#[test]
fn the_same_prompt_from_the_same_tenant_hits_all_but_its_last_token() {
    let p = pool(32);
    let (first, cached) = run(&p, 1, 1, None, &PROMPT);
    assert_eq!(cached, 0);
    drop(first);
    assert_eq!(p.cached_pages(), 3, "two whole pages of 4 in an 11-token prompt, and its tail");
    let (_, cached) = run(&p, 1, 2, None, &PROMPT);
    assert_eq!(cached, 10, "the whole pages, then the tail's first two slots");
    // An 8-token prompt: its last token must be computed, so only one page can hit, and no
    // prompt ended on its second page before.
    let (_, cached) = run(&p, 1, 3, None, &PROMPT[..8]);
    assert_eq!(cached, 4);
    // Now one did (a page-aligned prompt's tail is its last whole page).
    let (_, cached) = run(&p, 1, 4, None, &PROMPT[..8]);
    assert_eq!(cached, 7);
    // A different second page: the chain stops at the first page.
    let mut other = PROMPT;
    other[5] = 99;
    let (_, cached) = run(&p, 1, 5, None, &other);
    assert_eq!(cached, 4);
}

#[test]
fn a_tail_hits_only_the_same_tokens_after_the_same_whole_pages() {
    let p = pool(64);
    drop(run(&p, 1, 1, None, &PROMPT));
    // The last token differs: the tail's key names every token of the page, so only the
    // whole pages hit.
    let mut last = PROMPT;
    last[10] = 99;
    assert_eq!(run(&p, 1, 2, None, &last).1, 8);
    // Longer, starting with the prompt: the page the tail was cut from is whole here, and no
    // whole page has those tokens.
    let longer: Vec<u32> = PROMPT.iter().copied().chain([1, 2]).collect();
    assert_eq!(run(&p, 1, 3, None, &longer).1, 8);
    // Shorter: its tail (two tokens) is another key than the prompt's (three).
    assert_eq!(run(&p, 1, 4, None, &PROMPT[..10]).1, 8);
    // The same tokens on the tail's page after different whole pages.
    let mut early = PROMPT;
    early[0] = 99;
    assert_eq!(run(&p, 1, 5, None, &early).1, 0);
}

#[test]
fn a_tail_hit_writes_the_tables_own_page_and_leaves_the_cached_copy_as_it_was() {
    let p = pool(32);
    drop(run(&p, 1, 1, None, &PROMPT));
    let (mut t, cached) = run(&p, 1, 2, None, &PROMPT);
    assert_eq!((cached, t.shared_pages()), (10, 2), "the tail's page is a copy of the table's own");
    // Decode writes after the prompt on that page.
    let row = vec![7.0; 8];
    t.write(0, 11, &row, &row).expect("own page");
    drop(t);
    // The copy kept in the cache still holds the prompt's KV (run checks every position).
    assert_eq!(run(&p, 1, 3, None, &PROMPT).1, 10);
}

#[test]
fn another_tenant_misses_whatever_client_salt_it_sends() {
    let p = pool(64);
    drop(run(&p, 1, 1, None, &PROMPT));
    for (r, salt) in [None, Some(""), Some("1"), Some("tenant-1"), Some("\u{0}\u{0}")].into_iter().enumerate() {
        let (_, cached) = run(&p, 2, r as u64 + 10, salt, &PROMPT);
        assert_eq!(cached, 0, "salt {salt:?}");
        p.clear_prefix_cache();
        drop(run(&p, 1, 1, None, &PROMPT));
    }
}

#[test]
fn a_different_client_salt_within_a_tenant_misses_and_the_same_one_hits() {
    let p = pool(64);
    drop(run(&p, 1, 1, Some("alice"), &PROMPT));
    assert_eq!(run(&p, 1, 2, None, &PROMPT).1, 0, "no salt is not salt alice");
    assert_eq!(run(&p, 1, 3, Some("bob"), &PROMPT).1, 0);
    assert_eq!(run(&p, 1, 4, Some("alice"), &PROMPT).1, 10);
}

#[test]
fn a_tenants_scope_cannot_reserve_for_another_tenant() {
    let p = pool(16);
    drop(run(&p, 1, 1, None, &PROMPT));
    let scope = p.scope(TenantId(1), None);
    let e = p.reserve_cached(owner(2, 5), 16, &scope, &PROMPT).expect_err("scope of tenant 1");
    assert!(matches!(e, KvError::WrongOwner { .. }), "{e}");
    let (mut t2, _) = p.reserve_cached(owner(2, 6), 16, &p.scope(TenantId(2), None), &PROMPT).expect("reserve");
    prefill(&mut t2, &PROMPT, 0);
    assert!(matches!(t2.seal_prefix(&scope, &PROMPT, &[]), Err(KvError::WrongOwner { .. })));
}

#[test]
fn shared_pages_are_read_only_and_readable_by_every_holder() {
    let p = pool(32);
    let (a, _) = run(&p, 1, 1, None, &PROMPT);
    let (mut b, cached) = run(&p, 1, 2, None, &PROMPT);
    assert_eq!(cached, 10);
    assert_eq!(b.shared_pages(), 2);
    let row = vec![0.0; 8];
    assert!(matches!(b.write(0, 3, &row, &row), Err(KvError::ReadOnly { .. })));
    assert!(matches!(b.write_range(1, 6, &row, &row), Err(KvError::ReadOnly { .. })));
    // Past the shared pages, the table's own.
    b.write(0, 11, &row, &row).expect("own page");
    check_reads(&a, &PROMPT);
    check_reads(&b, &PROMPT);
}

#[test]
fn eviction_never_frees_a_page_in_use() {
    // 6 pages: the sealed prefix (2) held by a live request, its own two, and the copy of
    // its tail that only the cache holds.
    let p = pool(6);
    let (holder, _) = run(&p, 1, 1, None, &PROMPT);
    assert_eq!(p.cached_pages(), 3);
    assert_eq!(p.idle_cached_pages(), 1);
    let free = p.free_pages();
    let e = p.reserve(owner(2, 9), (free + 2) * 4).expect_err("two of the cached pages are in use");
    assert!(matches!(e, KvError::Exhausted { .. }), "{e}");
    assert_eq!(p.cached_pages(), 2, "only the idle tail went");
    check_reads(&holder, &PROMPT);
    drop(holder);
    // Now idle: another tenant's reservation may evict them (it never sees their content).
    let t = p.reserve(owner(2, 9), (p.free_pages() + 1) * 4).expect("evicts idle cached pages");
    assert_eq!(p.cached_pages(), 1);
    assert!(t.debug_pages_zeroed(), "evicted pages are scrubbed before reuse");
}

#[test]
fn eviction_takes_the_least_recently_used_prefix_first() {
    let p = pool(8);
    let other: Vec<u32> = PROMPT.iter().map(|t| t + 100).collect();
    drop(run(&p, 1, 1, None, &PROMPT));
    drop(run(&p, 1, 2, None, &other));
    // Touch PROMPT: `other` is now the least recently used.
    drop(run(&p, 1, 3, None, &PROMPT));
    assert_eq!(p.cached_pages(), 6);
    let t = p.reserve(owner(1, 4), (p.free_pages() + 2) * 4).expect("evicts two pages");
    drop(t);
    assert_eq!(run(&p, 1, 5, None, &other).1, 0, "evicted");
    assert_eq!(run(&p, 1, 6, None, &PROMPT).1, 10, "kept");
}

#[test]
fn a_page_leaves_the_cache_but_lives_until_its_last_holder_drops_it() {
    let p = pool(8);
    let (holder, _) = run(&p, 1, 1, None, &PROMPT);
    // The tail's copy is the cache's alone: it goes with the cache.
    let used = p.used_pages() - p.idle_cached_pages();
    p.clear_prefix_cache();
    assert_eq!(p.cached_pages(), 0);
    assert_eq!(p.used_pages(), used, "still held");
    check_reads(&holder, &PROMPT);
    drop(holder);
    assert_eq!(p.used_pages(), 0);
    assert!(p.debug_free_pages_zeroed());
}

#[test]
fn forgetting_a_tenant_drops_only_its_entries_and_its_next_request_misses() {
    let p = pool(64);
    let (alice_holder, _) = run(&p, 1, 1, None, &PROMPT);
    let (bob, _) = run(&p, 2, 2, None, &PROMPT);
    drop(bob);
    assert_eq!((p.cached_pages_of(TenantId(1)), p.cached_pages_of(TenantId(2))), (3, 3));
    // Alice's request still holds her pages: they leave the cache now, the pool at its drop.
    assert_eq!(p.pages_held_by(TenantId(2)), 0, "bob's idle cached pages are not held");
    assert_eq!(p.forget_tenants(&|t| t == TenantId(1)), 3);
    assert_eq!((p.cached_pages_of(TenantId(1)), p.cached_pages_of(TenantId(2))), (0, 3));
    check_reads(&alice_holder, &PROMPT);
    drop(alice_holder);
    assert_eq!(p.pages_used_by(TenantId(1)), 0);
    let (_, cached) = run(&p, 1, 3, None, &PROMPT);
    assert_eq!(cached, 0, "a forgotten tenant's prefix is computed again");
    let (_, cached) = run(&p, 2, 4, None, &PROMPT);
    assert_eq!(cached, 10, "another tenant keeps its cache");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random requests of two tenants over a small alphabet (so prefixes repeat), some kept
    /// alive, some dropped, in a small pool: every read matches what the request's own tenant
    /// and tokens would compute, hits never exceed the shared prefix, and when everything is
    /// dropped and the cache cleared every page is free and zero.
    #[test]
    fn hits_always_hold_the_tenants_own_kv_for_the_exact_prefix(
        ops in proptest::collection::vec((0u64..2, proptest::collection::vec(0u32..3, 1..14), any::<bool>(), 0usize..3), 1..40)
    ) {
        let p = pool(24);
        let mut live: Vec<BlockTable> = Vec::new();
        for (r, (tenant, prompt, keep, salt)) in ops.into_iter().enumerate() {
            let salt = ["a", "b"].get(salt).copied();
            let scope = p.scope(TenantId(tenant), salt);
            match p.reserve_cached(owner(tenant, r as u64), prompt.len() + 2, &scope, &prompt) {
                Ok((mut t, cached)) => {
                    prop_assert!(cached < prompt.len().max(1));
                    // Whole pages, or every token but the last (a tail).
                    prop_assert!(cached % 4 == 0 || cached + 1 == prompt.len(), "{} of {}", cached, prompt.len());
                    prefill(&mut t, &prompt, cached);
                    check_reads(&t, &prompt);
                    t.seal_prefix(&scope, &prompt, &[]).expect("seal");
                    check_reads(&t, &prompt);
                    if keep { live.push(t) }
                }
                Err(KvError::Exhausted { .. }) => live.clear(),
                Err(e) => prop_assert!(false, "unexpected {}", e),
            }
            prop_assert!(p.cached_pages() <= p.used_pages());
        }
        drop(live);
        p.clear_prefix_cache();
        prop_assert_eq!(p.used_pages(), 0);
        prop_assert!(p.debug_free_pages_zeroed());
    }
}

fn tags(from: u8, n: usize) -> Vec<RouteTag> {
    (0..n).map(|i| RouteTag([from + i as u8; 16])).collect()
}

#[test]
fn route_tags_are_reported_cached_when_their_pages_are_sealed_or_hit_and_dropped_when_the_pages_go() {
    let p = pool(32);
    let scope = p.scope(TenantId(1), None);
    let (mut t, _) = p.reserve_cached(owner(1, 1), PROMPT.len() + 4, &scope, &PROMPT).unwrap();
    prefill(&mut t, &PROMPT, 0);
    // Two whole pages: a third tag names nothing and is not reported.
    t.seal_prefix(&scope, &PROMPT, &tags(1, 3)).unwrap();
    let c = p.take_tag_changes();
    assert_eq!((c.reset, c.cached, c.dropped), (false, tags(1, 2), vec![]));
    assert!(p.take_tag_changes().is_empty());
    drop(t);

    // Another router's names for the same pages, on a request that hits them.
    let (mut t, cached) = p.reserve_cached(owner(1, 2), PROMPT.len() + 4, &scope, &PROMPT).unwrap();
    assert!(cached >= 8);
    prefill(&mut t, &PROMPT, cached);
    t.seal_prefix(&scope, &PROMPT, &tags(10, 2)).unwrap();
    assert_eq!(p.take_tag_changes().cached, tags(10, 2));
    assert_eq!(p.route_tags(), [tags(1, 2), tags(10, 2)].concat());
    drop(t);

    // Eviction (a reservation that needs every page) drops the pages' tags.
    let everything = p.reserve(owner(2, 3), 32 * 4).expect("evicts the idle cached pages");
    let c = p.take_tag_changes();
    assert_eq!((c.cached, c.dropped), (vec![], [tags(1, 2), tags(10, 2)].concat()));
    assert!(p.route_tags().is_empty());
    drop(everything);

    // A forgotten tenant's tags are dropped too.
    run(&p, 1, 4, None, &PROMPT);
    let (mut t, _) = p.reserve_cached(owner(1, 5), PROMPT.len() + 4, &scope, &PROMPT).unwrap();
    prefill(&mut t, &PROMPT, 8);
    t.seal_prefix(&scope, &PROMPT, &tags(20, 2)).unwrap();
    drop(t);
    assert_eq!(p.take_tag_changes().cached, tags(20, 2));
    p.forget_tenants(&|t| t == TenantId(1));
    assert_eq!(p.take_tag_changes().dropped, tags(20, 2));
}
