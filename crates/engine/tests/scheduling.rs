#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The engine on a generated tiny model: real forward passes, real pool, real threads.

use std::time::{Duration, Instant};

use engine::{Engine, EngineConfig, EngineHandle, Event, FinishReason, GenRequest};
use gguf::GgufFile;
use kv::{Capacity, KvDtype, KvPool, PoolConfig, RequestId, ScrubPolicy, TenantId};
use model::tiny::{tiny_gguf, TinySpec};
use model::{Llama, LoadOptions};
use protocol::{AdmissionError, RequestError};
use sampling::{SamplingParams, StopTokens};

fn engine(pool_tokens: usize, cfg: EngineConfig) -> Engine {
    let f = GgufFile::from_bytes(tiny_gguf(&TinySpec::default())).unwrap();
    let model = Llama::from_file(&f, LoadOptions { threads: 2, ..Default::default() }).unwrap();
    let layout = model.config.kv_layout(16, KvDtype::F16);
    let pool = KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(pool_tokens), scrub: ScrubPolicy::OnFree })
        .unwrap();
    Engine::start(model, pool, cfg)
}

fn req(id: u64, tenant: u64, prompt_len: usize, max_tokens: usize) -> GenRequest {
    GenRequest {
        id: RequestId(id),
        tenant: TenantId(tenant),
        prompt: (0..prompt_len).map(|i| ((i * 7 + id as usize * 3) % 80) as u32).collect(),
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop_tokens: StopTokens::new([]),
        deadline: None,
        cache_salt: None,
        constraint: None,
        route_tags: Vec::new(),
    }
}

/// Tokens of a request, or the failure that ended it.
fn collect(h: &EngineHandle, r: GenRequest) -> Result<Vec<u32>, RequestError> {
    let mut s = h.submit(r).unwrap();
    let mut out = Vec::new();
    while let Some(ev) = s.blocking_next() {
        match ev {
            Event::Token(t) => out.push(t.token),
            Event::Finished { reason, usage } => {
                assert_eq!(usage.completion_tokens, out.len());
                if reason == FinishReason::Length {
                    return Ok(out);
                }
                return Ok(out);
            }
            Event::Failed(e) => return Err(e),
            Event::Started | Event::PrefixCache { .. } => {}
            Event::Reserved(_) | Event::Prefilled { .. } => panic!("a full request never hands over pages"),
        }
    }
    panic!("stream ended without a final event")
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn sixteen_concurrent_requests_get_the_tokens_each_gets_alone() {
    let e = engine(8192, EngineConfig { max_batch_tokens: 64, ..Default::default() });
    let h = e.handle();
    let reqs: Vec<GenRequest> = (0..16).map(|i| req(i, i % 3, 5 + (i as usize * 13) % 90, 12)).collect();
    let alone: Vec<Vec<u32>> = reqs.iter().map(|r| collect(&h, r.clone()).unwrap()).collect();
    let together: Vec<Vec<u32>> = std::thread::scope(|s| {
        let hs: Vec<_> = reqs
            .iter()
            .map(|r| {
                let h = h.clone();
                let r = r.clone();
                s.spawn(move || collect(&h, r).unwrap())
            })
            .collect();
        hs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    assert_eq!(alone, together);
    assert!(alone.iter().all(|t| t.len() == 12));
    wait_until("pages to return", || h.stats().pages_used == 0);
}

#[test]
fn request_over_the_context_window_is_refused_before_anything_happens() {
    let e = engine(8192, EngineConfig::default());
    let h = e.handle();
    let before = h.stats();
    let err = h.submit(req(1, 1, 500, 100)).err().unwrap();
    assert!(
        matches!(
            err,
            AdmissionError::ContextLengthExceeded { prompt: 500, max_tokens: 100, needed: 600, context: 512 }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("512"));
    assert!(matches!(h.submit(req(2, 1, 0, 4)).err(), Some(AdmissionError::EmptyPrompt)));
    assert!(matches!(h.submit(req(3, 1, 4, 0)).err(), Some(AdmissionError::ZeroMaxTokens)));
    let mut bad = req(4, 1, 4, 4);
    bad.prompt[2] = 10_000;
    assert!(matches!(h.submit(bad).err(), Some(AdmissionError::InvalidToken { id: 10_000, .. })));
    std::thread::sleep(Duration::from_millis(50));
    let after = h.stats();
    assert_eq!(
        (after.steps, after.prefill_tokens, after.pages_used, after.queued),
        (before.steps, before.prefill_tokens, 0, 0)
    );
}

#[test]
fn request_larger_than_the_pool_is_refused_at_the_door() {
    let e = engine(256, EngineConfig::default());
    let err = e.handle().submit(req(1, 1, 200, 100)).err().unwrap();
    assert!(matches!(err, AdmissionError::ExceedsPool { needed: 300, capacity: 256 }), "{err}");
}

#[test]
fn dropping_the_stream_frees_the_pages() {
    let e = engine(8192, EngineConfig::default());
    let h = e.handle();
    let mut s = h.submit(req(1, 1, 40, 400)).unwrap();
    let mut tokens = 0;
    while tokens < 3 {
        if let Some(Event::Token(_)) = s.blocking_next() {
            tokens += 1;
        }
    }
    assert!(h.stats().pages_used > 0);
    drop(s);
    wait_until("cancelled request's pages to be freed", || h.stats().pages_used == 0 && h.stats().running == 0);
}

/// Holds every free page of the engine's pool, as if other requests were running.
fn fill_pool(h: &EngineHandle) -> kv::BlockTable {
    let pool = h.pool();
    let owner = kv::Owner { tenant: TenantId(999), request: RequestId(999) };
    pool.reserve(owner, pool.free_pages() * pool.layout().page_size).unwrap()
}

#[test]
fn full_pool_queues_then_refuses_without_serving_part() {
    let cfg = EngineConfig { queue_timeout: Duration::from_millis(200), ..Default::default() };
    let e = engine(1024, cfg);
    let h = e.handle();
    let blocker = fill_pool(&h);
    // Waits (no Started, no token), then is refused: never a partial reservation.
    let mut s = h.submit(req(1, 1, 100, 156)).unwrap();
    assert!(matches!(s.blocking_next(), Some(Event::Failed(RequestError::QueueTimeout))));
    assert_eq!(h.pool().used_pages(), blocker.pages());
    // Once pages are free, the same request is served whole.
    let waiting = h.submit(req(2, 1, 100, 156)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(h.stats().queued, 1);
    drop(blocker);
    let mut waiting = waiting;
    let mut n = 0;
    while let Some(ev) = waiting.blocking_next() {
        match ev {
            Event::Token(_) => n += 1,
            Event::Finished { reason, .. } => {
                assert_eq!(reason, FinishReason::Length);
                break;
            }
            Event::Started | Event::PrefixCache { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(n, 156);
    wait_until("pages to return", || h.stats().pages_used == 0);
}

#[test]
fn a_flooding_tenant_cannot_starve_another() {
    // Two sequences at a time. With the pool held, tenant 1 queues twelve requests and then
    // tenant 2 queues one; when the pool frees, admission goes round-robin across tenants.
    let cfg = EngineConfig { max_running: 2, ..Default::default() };
    let e = engine(8192, cfg);
    let h = e.handle();
    let blocker = fill_pool(&h);
    let order = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        // Long flood requests, a short victim: a round of the flood lasts hundreds of steps, far
        // more than any thread-scheduling jitter in observing completions.
        let mut streams: Vec<(u64, _)> = (0..12).map(|i| (1, h.submit(req(100 + i, 1, 20, 400)).unwrap())).collect();
        streams.push((2, h.submit(req(1, 2, 20, 5)).unwrap()));
        let order = &order;
        let joins: Vec<_> = streams
            .into_iter()
            .map(|(tenant, mut s)| {
                sc.spawn(move || {
                    while let Some(ev) = s.blocking_next() {
                        match ev {
                            Event::Finished { .. } => {
                                order.lock().unwrap().push(tenant);
                                return;
                            }
                            Event::Failed(e) => panic!("{e}"),
                            Event::Started | Event::PrefixCache { .. } | Event::Token(_) => {}
                            other => panic!("unexpected {other:?}"),
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(h.stats().queued, 13);
        drop(blocker);
        joins.into_iter().for_each(|j| j.join().unwrap());
    });
    // Round-robin admits tenant 2 in the first round, beside one of the flood, so it finishes
    // first; a FIFO would admit it after the whole flood and finish it last.
    let order = order.into_inner().unwrap();
    let victim_at = order.iter().position(|&t| t == 2).unwrap();
    assert!(victim_at <= 1, "tenant 2 finished as number {victim_at} of {order:?}");
    wait_until("pages to return", || h.stats().pages_used == 0);
}

#[test]
fn a_passed_deadline_fails_the_request_and_frees_its_pages() {
    let e = engine(8192, EngineConfig::default());
    let h = e.handle();
    // 470 tokens take far longer than 10 ms even on the tiny model.
    let mut r = req(1, 1, 40, 470);
    r.deadline = Some(Instant::now() + Duration::from_millis(10));
    assert_eq!(collect(&h, r), Err(RequestError::DeadlineExceeded));
    wait_until("pages to return", || h.stats().pages_used == 0);
}

#[test]
fn stop_token_ends_generation_without_emitting_it() {
    let e = engine(8192, EngineConfig::default());
    let h = e.handle();
    let free = collect(&h, req(1, 1, 10, 8)).unwrap();
    let stop = free[3];
    let mut r = req(1, 1, 10, 8);
    r.stop_tokens = StopTokens::new([stop]);
    let mut s = h.submit(r).unwrap();
    let mut got = Vec::new();
    let reason = loop {
        match s.blocking_next().unwrap() {
            Event::Token(t) => got.push(t.token),
            Event::Finished { reason, .. } => break reason,
            Event::Started | Event::PrefixCache { .. } => {}
            Event::Failed(e) => panic!("{e}"),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(reason, FinishReason::Stop);
    let cut = free.iter().position(|&t| t == stop).unwrap();
    assert_eq!(got, free[..cut]);
}

#[test]
fn shutting_down_fails_what_is_left_and_refuses_new_work() {
    let e = engine(8192, EngineConfig::default());
    let h = e.handle();
    let mut s = h.submit(req(1, 1, 10, 400)).unwrap();
    assert!(matches!(s.blocking_next(), Some(Event::Started)));
    drop(e);
    let last = std::iter::from_fn(|| s.blocking_next()).last();
    assert!(matches!(last, Some(Event::Failed(RequestError::ShuttingDown))), "{last:?}");
    assert!(matches!(h.submit(req(2, 1, 10, 4)).err(), Some(AdmissionError::ShuttingDown)));
    // What is left is the prompt's tail in the prefix cache, which no request holds.
    assert_eq!(h.pool().used_pages(), h.pool().idle_cached_pages());
}
