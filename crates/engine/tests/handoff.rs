#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The two halves of a disaggregated request on the tiny model: a prefill engine hands its
//! prompt's KV over, a decode engine reserves, receives it (copied row by row as a transfer
//! would) and decodes. Greedy output must equal the single-engine run.

use engine::{Engine, EngineConfig, EngineHandle, Event, GenRequest, TokenEvent};
use gguf::GgufFile;
use kv::{BlockTable, Capacity, KvDtype, KvPool, PoolConfig, RequestId, ScrubPolicy, TenantId};
use model::tiny::{tiny_gguf, TinySpec};
use model::{Llama, LoadOptions};
use protocol::RequestError;
use sampling::{SamplingParams, StopTokens};

fn engine(pool_tokens: usize) -> Engine {
    let f = GgufFile::from_bytes(tiny_gguf(&TinySpec::default())).unwrap();
    let model = Llama::from_file(&f, LoadOptions { threads: 1, ..Default::default() }).unwrap();
    let layout = model.config.kv_layout(16, KvDtype::F16);
    let pool = KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(pool_tokens), scrub: ScrubPolicy::OnFree })
        .unwrap();
    Engine::start(model, pool, EngineConfig::default())
}

/// An engine holding prompts of prefill requests in a pool of their own, as `serve` does.
fn engine_with_prefill_pool(pool_tokens: usize, prefill_tokens: usize, cfg: EngineConfig) -> Engine {
    let f = GgufFile::from_bytes(tiny_gguf(&TinySpec::default())).unwrap();
    let model = Llama::from_file(&f, LoadOptions { threads: 1, ..Default::default() }).unwrap();
    let layout = model.config.kv_layout(16, KvDtype::F16);
    let pool = |tokens| {
        KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(tokens), scrub: ScrubPolicy::OnFree }).unwrap()
    };
    Engine::start_with_prefill_pool(model, pool(pool_tokens), pool(prefill_tokens), cfg)
}

fn req(id: u64, prompt_len: usize, max_tokens: usize) -> GenRequest {
    GenRequest {
        id: RequestId(id),
        tenant: TenantId(5),
        prompt: (0..prompt_len).map(|i| ((i * 11 + 3) % 80) as u32).collect(),
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop_tokens: StopTokens::new([]),
        deadline: None,
        cache_salt: None,
        constraint: None,
        route_tags: Vec::new(),
    }
}

fn tokens_of(mut s: engine::RequestStream) -> Result<Vec<u32>, RequestError> {
    let mut out = Vec::new();
    loop {
        match s.blocking_next().expect("final event") {
            Event::Token(t) => out.push(t.token),
            Event::Finished { usage, .. } => {
                assert_eq!(usage.completion_tokens, out.len() + 1, "usage counts the handed-over first token");
                return Ok(out);
            }
            Event::Failed(e) => return Err(e),
            Event::Started | Event::PrefixCache { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn prefill(h: &EngineHandle, r: GenRequest) -> (TokenEvent, BlockTable) {
    let mut s = h.prefill(r).unwrap();
    loop {
        match s.blocking_next().expect("event") {
            Event::Started | Event::PrefixCache { .. } => {}
            Event::Prefilled { first, kv } => return (first, kv),
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn reserve(h: &EngineHandle, r: GenRequest) -> BlockTable {
    match h.reserve(r).unwrap().blocking_next().expect("event") {
        Event::Reserved(kv) => kv,
        other => panic!("unexpected {other:?}"),
    }
}

fn copy(src: &BlockTable, dst: &mut BlockTable, n: usize, layers: usize) {
    let mut buf = Vec::new();
    for layer in 0..layers {
        buf.clear();
        src.export_rows(layer, 0, n, &mut buf).unwrap();
        dst.import_rows(layer, 0, n, &buf).unwrap();
    }
}

#[test]
fn prefill_handoff_then_resume_equals_one_engine_doing_both() {
    let (p, d) = (engine(1024), engine(1024));
    let (ph, dh) = (p.handle(), d.handle());
    for (id, len) in [(1u64, 1usize), (2, 17), (3, 40)] {
        let r = req(id, len, 9);
        let mut alone = Vec::new();
        let mut s = ph.submit(r.clone()).unwrap();
        while let Some(ev) = s.blocking_next() {
            if let Event::Token(t) = ev {
                alone.push(t.token);
            }
        }
        let (first, kv) = prefill(&ph, r.clone());
        let mut dst = reserve(&dh, r.clone());
        assert_eq!(dst.capacity(), (len + 9).div_ceil(16) * 16, "the whole sequence is reserved");
        // The prompts are prefixes of each other: what decode verified before, it holds.
        let held = dst.shared_pages() * 16;
        copy_after(&kv, &mut dst, held, len, 2);
        drop(kv);
        assert_eq!(
            ph.pool().used_pages(),
            ph.pool().idle_cached_pages(),
            "the prefill side frees its pages once the KV is sent (its prompt pages stay cached, idle)"
        );
        let rest = tokens_of(dh.resume(r, dst, first.token).unwrap()).unwrap();
        let mut got = vec![first.token];
        got.extend(rest);
        assert_eq!(got, alone, "prompt of {len}");
        assert_eq!(dh.pool().used_pages(), dh.pool().idle_cached_pages(), "only the verified prompt pages stay, idle");
    }
}

/// Copies rows `from..n` of every layer, as a transfer after `from` held tokens would.
fn copy_after(src: &BlockTable, dst: &mut BlockTable, from: usize, n: usize, layers: usize) {
    let mut buf = Vec::new();
    for layer in 0..layers {
        buf.clear();
        src.export_rows(layer, from, n - from, &mut buf).unwrap();
        dst.import_rows(layer, from, n - from, &buf).unwrap();
    }
}

#[test]
fn a_decode_reservation_holds_the_tenants_verified_prompt_pages_and_needs_only_the_rest() {
    let (p, d) = (engine(1024), engine(1024));
    let (ph, dh) = (p.handle(), d.handle());
    let handoff = |r: GenRequest| {
        let (first, kv) = prefill(&ph, r.clone());
        let mut dst = reserve(&dh, r.clone());
        let held = dst.shared_pages() * 16;
        copy_after(&kv, &mut dst, held, r.prompt.len(), 2);
        drop(kv);
        let mut got = vec![first.token];
        got.extend(tokens_of(dh.resume(r, dst, first.token).unwrap()).unwrap());
        (held, got)
    };
    let turn1 = req(1, 40, 6);
    assert_eq!(handoff(turn1.clone()).0, 0, "nothing is held before the first turn");
    // The next turn starts with the whole first prompt: its two whole pages are held.
    let mut turn2 = req(2, 0, 6);
    turn2.prompt = turn1.prompt.iter().copied().chain((0..10).map(|i| (i * 7 + 5) % 80)).collect();
    let mut alone = Vec::new();
    let mut s = ph.submit(GenRequest { id: RequestId(9), ..turn2.clone() }).unwrap();
    while let Some(ev) = s.blocking_next() {
        if let Event::Token(t) = ev {
            alone.push(t.token);
        }
    }
    let (held, got) = handoff(turn2.clone());
    assert_eq!(held, 32);
    assert_eq!(got, alone, "the held pages are the same KV the transfer would have carried");
    // Another tenant sending the same prompt holds nothing of it; a held page is read-only.
    let other = GenRequest { id: RequestId(3), tenant: TenantId(6), ..turn2.clone() };
    assert_eq!(reserve(&dh, other).shared_pages(), 0);
    let mut again = reserve(&dh, GenRequest { id: RequestId(4), ..turn2.clone() });
    assert_eq!(again.shared_pages(), 3, "turn 2's own verified pages are held now");
    assert!(again.import_rows(0, 0, 1, &[0; 64]).is_err(), "a held page cannot be written");
}

#[test]
fn resume_refuses_pages_with_an_unwritten_prompt_slot_and_frees_them() {
    let (p, d) = (engine(1024), engine(1024));
    let r = req(7, 20, 4);
    let (first, kv) = prefill(&p.handle(), r.clone());
    let mut dst = reserve(&d.handle(), r.clone());
    // The incident: only the first token's KV arrives for a 20-token prompt.
    let mut buf = Vec::new();
    for layer in 0..2 {
        buf.clear();
        kv.export_rows(layer, 0, 1, &mut buf).unwrap();
        dst.import_rows(layer, 0, 1, &buf).unwrap();
    }
    let e = tokens_of(d.handle().resume(r, dst, first.token).unwrap()).unwrap_err();
    assert_eq!(e, RequestError::IsolationViolation { kind: engine::ViolationKind::UnwrittenRead });
    assert_eq!(d.handle().pool().used_pages(), 0);
}

#[test]
fn resume_refuses_another_requests_reservation() {
    let d = engine(1024);
    let dh = d.handle();
    let other = reserve(&dh, req(8, 10, 4));
    let e = tokens_of(dh.resume(req(9, 10, 4), other, 1).unwrap()).unwrap_err();
    assert_eq!(e, RequestError::IsolationViolation { kind: engine::ViolationKind::OwnerMismatch });
    assert_eq!(dh.pool().used_pages(), 0);
}

#[test]
fn a_reservation_nobody_collects_is_freed() {
    let d = engine(1024);
    let dh = d.handle();
    let s = dh.reserve(req(10, 10, 4)).unwrap();
    drop(s);
    let t0 = std::time::Instant::now();
    while dh.pool().used_pages() != 0 {
        assert!(t0.elapsed().as_secs() < 10);
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn seeded_sampling_across_the_handoff_continues_the_single_engine_stream() {
    let (p, d) = (engine(1024), engine(1024));
    let (ph, dh) = (p.handle(), d.handle());
    let mut r = req(11, 30, 12);
    r.sampling = SamplingParams::builder().temperature(1.5).seed(7).build().unwrap();
    let mut alone = Vec::new();
    let mut s = ph.submit(r.clone()).unwrap();
    while let Some(ev) = s.blocking_next() {
        if let Event::Token(t) = ev {
            alone.push(t.token);
        }
    }
    let (first, kv) = prefill(&ph, r.clone());
    let mut dst = reserve(&dh, r.clone());
    copy(&kv, &mut dst, 30, 2);
    let mut got = vec![first.token];
    got.extend(tokens_of(dh.resume(r, dst, first.token).unwrap()).unwrap());
    assert_eq!(got, alone);
}

#[test]
fn a_reservation_waiting_for_pages_does_not_hold_up_the_same_tenants_prefills() {
    let cfg = EngineConfig { queue_timeout: std::time::Duration::from_secs(20), ..Default::default() };
    let e = engine_with_prefill_pool(64, 64, cfg);
    let h = e.handle();
    let held = reserve(&h, req(1, 30, 10));
    // Needs pages the first reservation holds: it waits at the head of this tenant's queue.
    let mut waiting = h.reserve(req(2, 30, 10)).unwrap();
    let t0 = std::time::Instant::now();
    let (_first, kv) = prefill(&h, req(3, 20, 10));
    assert!(t0.elapsed() < std::time::Duration::from_secs(5), "the prefill waited behind the reservation");
    drop((kv, held));
    assert!(matches!(waiting.blocking_next(), Some(Event::Reserved(_))));
}

/// Resumes `r` from a copy of its own prefill, as a decode worker would.
fn handed_over(ph: &EngineHandle, dh: &EngineHandle, r: &GenRequest) -> (BlockTable, u32) {
    let (first, kv) = prefill(ph, r.clone());
    let mut dst = reserve(dh, r.clone());
    copy(&kv, &mut dst, r.prompt.len(), 2);
    (dst, first.token)
}

fn alone(h: &EngineHandle, r: &GenRequest) -> Vec<u32> {
    let mut out = Vec::new();
    let mut s = h.submit(r.clone()).unwrap();
    while let Some(ev) = s.blocking_next() {
        if let Event::Token(t) = ev {
            out.push(t.token);
        }
    }
    out
}

#[test]
fn a_first_token_outside_the_vocabulary_is_refused_before_it_joins_a_step() {
    let (p, d) = (engine(1024), engine(1024));
    let (ph, dh) = (p.handle(), d.handle());
    let r = req(1, 20, 8);
    let (kv, _) = handed_over(&ph, &dh, &r);
    let vocab = TinySpec::default().vocab as u32;
    let e = tokens_of(dh.resume(r, kv, vocab).unwrap()).unwrap_err();
    assert_eq!(e, RequestError::IsolationViolation { kind: engine::ViolationKind::BadFirstToken });
    assert_eq!(dh.pool().used_pages(), 0, "its pages are freed");
}

#[test]
fn a_sequence_failing_mid_step_fails_alone_and_its_batch_mates_output_is_unchanged() {
    let (p, d) = (engine(1024), engine(1024));
    let (ph, dh) = (p.handle(), d.handle());
    // Bob decodes for hundreds of steps, so the rogue, resumed right after him, joins a step
    // he is in (checked below by counting steps, not assumed).
    let bob = req(1, 20, 480);
    let mut rogue = req(2, 16, 24);
    rogue.tenant = TenantId(6);
    let expected = alone(&ph, &bob);
    let (bob_kv, bob_first) = handed_over(&ph, &dh, &bob);
    let (rogue_kv, rogue_first) = handed_over(&ph, &dh, &rogue);
    // The rogue's second page (positions 16..32, past its prompt, so the resume check passes)
    // goes stale: it fails at its first decode write, in the middle of a step with bob.
    rogue_kv.debug_make_page_stale(1);
    let steps_before = dh.stats().steps;
    let bob_stream = dh.resume(bob.clone(), bob_kv, bob_first).unwrap();
    let mut rogue_stream = dh.resume(rogue, rogue_kv, rogue_first).unwrap();
    let mut rogue_tokens = 0;
    let e = loop {
        match rogue_stream.blocking_next().expect("the rogue's stream ends with an event") {
            Event::Token(_) => rogue_tokens += 1,
            Event::Failed(e) => break e,
            Event::Started => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(e, RequestError::IsolationViolation { kind: engine::ViolationKind::GenerationMismatch });
    assert_eq!(rogue_tokens, 0, "no token comes out of the step that failed");
    // Its pages are freed before its failure is sent.
    assert_eq!(dh.pool().pages_held_by(TenantId(6)), 0);
    let mut got = vec![bob_first];
    got.extend(tokens_of(bob_stream).unwrap());
    assert_eq!(got, expected, "bob's output equals his output alone");
    // Bob's 479 decode steps are all the steps there were: the rogue's failing step was one of
    // his (a rogue alone in a step would add one), so the batched pass failed and was rerun.
    let t0 = std::time::Instant::now();
    while dh.stats().running != 0 {
        assert!(t0.elapsed().as_secs() < 10);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(dh.stats().steps - steps_before, bob.max_tokens as u64 - 1, "the rogue failed in a step with bob");
    assert_eq!(dh.pool().used_pages(), dh.pool().idle_cached_pages(), "only verified prompt pages stay, idle");
}

#[test]
fn revoking_a_tenant_ends_its_requests_and_drops_its_cached_prefixes() {
    use std::collections::HashSet;
    let e = engine(1024);
    let h = e.handle();
    let (alice, bob) = (TenantId(5), TenantId(6));
    let a = req(1, 40, 400);
    let mut b = req(2, 40, 4);
    b.tenant = bob;
    let _ = alone(&h, &b);
    let _ = alone(&h, &req(3, 40, 4));
    // Two whole pages of 16 and the tail of each 40-token prompt.
    assert_eq!(h.pool().cached_pages_of(alice), 3);
    assert_eq!(h.pool().cached_pages_of(bob), 3);
    let running = h.submit(a).unwrap();
    h.apply_tenants(engine::TenantPolicy {
        live: Some(HashSet::from([alice, bob])),
        revoke: engine::Revoke::These(vec![alice]),
        max_share: 1.0,
    });
    let err = tokens_of_any(running);
    assert_eq!(err, Some(RequestError::TenantRevoked));
    assert_eq!(h.pool().cached_pages_of(alice), 0);
    assert_eq!(h.pool().cached_pages_of(bob), 3, "bob keeps his");
    // A tenant outside the table is refused from now on.
    h.apply_tenants(engine::TenantPolicy {
        live: Some(HashSet::from([bob])),
        revoke: engine::Revoke::These(vec![]),
        max_share: 1.0,
    });
    assert_eq!(tokens_of_any(h.submit(req(4, 10, 4)).unwrap()), Some(RequestError::TenantRevoked));
    assert_eq!(h.pool().used_pages(), h.pool().idle_cached_pages());
}

#[test]
fn dropping_only_a_tenants_cached_prefixes_lets_its_running_requests_finish() {
    use std::collections::HashSet;
    let e = engine(1024);
    let h = e.handle();
    let (alice, bob) = (TenantId(5), TenantId(6));
    let _ = alone(&h, &GenRequest { tenant: bob, ..req(2, 40, 4) });
    let _ = alone(&h, &req(3, 40, 4));
    assert_eq!(h.pool().cached_pages_of(alice), 3);
    // Another scope of alice's (a salt), so it neither hits nor refills the entries dropped.
    let running = h.submit(GenRequest { cache_salt: Some("other".into()), ..req(1, 40, 200) }).unwrap();
    h.apply_tenants(engine::TenantPolicy {
        live: Some(HashSet::from([alice, bob])),
        revoke: engine::Revoke::Caches(vec![alice]),
        max_share: 1.0,
    });
    let mut again = h.submit(req(4, 40, 4)).unwrap();
    let cached = loop {
        match again.blocking_next().expect("an event") {
            Event::PrefixCache { cached_tokens } => break cached_tokens,
            Event::Started => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(cached, 0, "alice's cached prefix went with the table");
    for mut s in [running, again] {
        let last = std::iter::from_fn(|| s.blocking_next()).last();
        assert!(matches!(last, Some(Event::Finished { .. })), "her requests finish: {last:?}");
    }
    assert_eq!(h.pool().cached_pages_of(bob), 3, "bob keeps his");
}

/// The error a stream ends with, if any.
fn tokens_of_any(mut s: engine::RequestStream) -> Option<RequestError> {
    while let Some(ev) = s.blocking_next() {
        match ev {
            Event::Failed(e) => return Some(e),
            Event::Finished { .. } => return None,
            _ => {}
        }
    }
    None
}

/// A reservation computes nothing: while nothing is queued it holds its pages as soon as
/// `reserve` returns, even with the loop in the middle of other requests' steps.
#[test]
fn a_reservation_holds_its_pages_when_reserve_returns_if_nothing_waits() {
    let d = engine(2048);
    let dh = d.handle();
    // Keeps the loop stepping for hundreds of steps.
    let mut busy = dh.submit(req(1, 20, 480)).unwrap();
    while !matches!(busy.blocking_next(), Some(Event::Token(_))) {}
    let before = dh.pool().used_pages();
    // Another tenant: the busy request's prompt pages, cached, are not held for it.
    let mut s = dh.reserve(GenRequest { tenant: TenantId(6), ..req(2, 30, 10) }).unwrap();
    assert_eq!(dh.pool().used_pages(), before + 40usize.div_ceil(16), "the pages are held on return");
    assert!(matches!(s.blocking_next(), Some(Event::Reserved(_))));
    drop(busy);
}

/// Taking pages at once never overtakes a request that waits for them: with one queued, a
/// later reservation that would fit queues behind it.
#[test]
fn a_reservation_that_fits_queues_behind_one_waiting_for_pages() {
    let d = engine(64);
    let dh = d.handle();
    let held = reserve(&dh, req(1, 30, 10));
    let mut waiting = dh.reserve(req(2, 30, 10)).unwrap();
    let used = dh.pool().used_pages();
    let mut small = dh.reserve(req(3, 4, 4)).unwrap();
    assert_eq!(dh.pool().used_pages(), used, "the small reservation took no page past the waiting one");
    drop(held);
    assert!(matches!(waiting.blocking_next(), Some(Event::Reserved(_))));
    assert!(matches!(small.blocking_next(), Some(Event::Reserved(_))));
}

/// A prefill waiting for pages of its own pool (as `serve` keeps prompts apart from decode
/// reservations) would take none of the main pool's, so it does not make reservations queue:
/// one still holds its pages when `reserve` returns, and the prefill goes on once it fits.
#[test]
fn a_prefill_waiting_in_its_own_pool_does_not_hold_back_reservations() {
    let d = engine_with_prefill_pool(2048, 32, EngineConfig::default());
    let dh = d.handle();
    let (_, held) = prefill(&dh, req(1, 30, 10));
    let mut waiting = dh.prefill(req(2, 31, 10)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while dh.stats().queued == 0 {
        assert!(std::time::Instant::now() < deadline, "the second prefill never queued");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // The loop idles (nothing runs), so whatever it admits it admits at once: what shows the
    // reservation did not go through it is that it holds its pages while the prefill waits.
    let before = dh.pool().used_pages();
    let mut s = dh.reserve(req(3, 30, 10)).unwrap();
    assert_eq!(dh.pool().used_pages(), before + 40usize.div_ceil(16), "the pages are held on return");
    assert!(matches!(s.blocking_next(), Some(Event::Reserved(_))));
    assert_eq!(dh.stats().queued, 1, "the prefill still waits");
    drop(held);
    loop {
        match waiting.blocking_next().expect("event") {
            Event::Started | Event::PrefixCache { .. } => {}
            Event::Prefilled { .. } => break,
            other => panic!("unexpected {other:?}"),
        }
    }
}
