#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The prefix cache through the engine, on a generated tiny model: hits only for the same
//! tenant and client salt, fewer prompt tokens computed, the same output token for token.

use engine::{Engine, EngineConfig, EngineHandle, Event, GenRequest, Usage};
use gguf::GgufFile;
use kv::{Capacity, KvDtype, KvPool, PoolConfig, RequestId, ScrubPolicy, TenantId};
use model::tiny::{tiny_gguf, TinySpec};
use model::{Llama, LoadOptions};
use sampling::{SamplingParams, StopTokens};

fn engine(pool_tokens: usize, prefix_cache: bool) -> Engine {
    let f = GgufFile::from_bytes(tiny_gguf(&TinySpec::default())).unwrap();
    let model = Llama::from_file(&f, LoadOptions { threads: 2, ..Default::default() }).unwrap();
    let layout = model.config.kv_layout(16, KvDtype::F16);
    let pool = KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(pool_tokens), scrub: ScrubPolicy::OnFree })
        .unwrap();
    Engine::start(model, pool, EngineConfig { max_batch_tokens: 32, prefix_cache, ..Default::default() })
}

fn prompt(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 7 + seed * 13) % 79 + 1).collect()
}

fn req(id: u64, tenant: u64, prompt: &[u32], salt: Option<&str>) -> GenRequest {
    GenRequest {
        id: RequestId(id),
        tenant: TenantId(tenant),
        prompt: prompt.to_vec(),
        max_tokens: 8,
        // Log-probabilities asked for: the comparisons below are bit-exact on them too.
        sampling: SamplingParams::builder().logprobs(true).build().unwrap(),
        stop_tokens: StopTokens::new([]),
        deadline: None,
        cache_salt: salt.map(str::to_string),
        constraint: None,
        route_tags: Vec::new(),
    }
}

struct Run {
    tokens: Vec<u32>,
    logprobs: Vec<Option<f32>>,
    usage: Usage,
    /// What the `PrefixCache` event said, if the cache was consulted.
    looked_up: Option<usize>,
    /// Prompt tokens the engine computed for this request.
    computed: u64,
}

fn run(h: &EngineHandle, r: GenRequest) -> Run {
    let before = h.stats().prefill_tokens;
    let mut s = h.submit(r).unwrap();
    let (mut tokens, mut logprobs, mut looked_up) = (Vec::new(), Vec::new(), None);
    while let Some(ev) = s.blocking_next() {
        match ev {
            Event::Token(t) => {
                tokens.push(t.token);
                logprobs.push(t.logprob);
            }
            Event::PrefixCache { cached_tokens } => looked_up = Some(cached_tokens),
            Event::Finished { usage, .. } => {
                // Stats are published after the step that finished the request.
                let t0 = std::time::Instant::now();
                while h.stats().running > 0 && t0.elapsed() < std::time::Duration::from_secs(5) {
                    std::thread::yield_now();
                }
                let computed = h.stats().prefill_tokens - before;
                return Run { tokens, logprobs, usage, looked_up, computed };
            }
            Event::Failed(e) => panic!("failed: {e}"),
            _ => {}
        }
    }
    panic!("no final event")
}

#[test]
fn the_same_prefix_from_the_same_tenant_is_a_hit_with_fewer_tokens_computed_and_identical_output() {
    let e = engine(4096, true);
    let h = e.handle();
    let p = prompt(70, 1);
    let first = run(&h, req(1, 1, &p, None));
    assert_eq!(first.looked_up, Some(0));
    assert_eq!(first.computed, 70);
    assert_eq!(first.usage.cached_tokens, 0);
    let again = run(&h, req(2, 1, &p, None));
    assert_eq!(again.looked_up, Some(69), "four whole pages of 16, then the tail's first five slots");
    assert_eq!(again.usage.cached_tokens, 69);
    assert_eq!(again.computed, 1, "only the last token, whose logits are needed");
    assert_eq!(again.tokens, first.tokens);
    assert_eq!(again.logprobs, first.logprobs, "bit-exact: cached KV is the KV the prompt computes");
    // A longer conversation that starts with the same prompt reuses its pages too.
    let mut longer = p.clone();
    longer.extend(prompt(30, 9));
    let turn = run(&h, req(3, 1, &longer, None));
    assert_eq!(turn.usage.cached_tokens, 64, "whole pages: the first prompt's tail page is whole here");
    let alone = run(&engine(4096, false).handle(), req(3, 1, &longer, None));
    assert_eq!(turn.tokens, alone.tokens);
    assert_eq!(turn.logprobs, alone.logprobs);
    assert_eq!(alone.looked_up, None, "a disabled cache is never consulted");
}

#[test]
fn another_tenant_misses_whatever_salt_it_sends() {
    let e = engine(4096, true);
    let h = e.handle();
    let p = prompt(70, 2);
    let a = run(&h, req(1, 1, &p, None));
    for (i, salt) in [None, Some("1"), Some("tenant-1"), Some("")].into_iter().enumerate() {
        let b = run(&h, req(10 + i as u64, 2, &p, salt));
        assert_eq!(b.usage.cached_tokens, 0, "salt {salt:?}");
        assert_eq!(b.computed, 70);
        assert_eq!(b.tokens, a.tokens, "same prompt, same model");
    }
}

#[test]
fn a_different_cache_salt_within_a_tenant_misses_and_the_same_salt_hits() {
    let e = engine(4096, true);
    let h = e.handle();
    let p = prompt(40, 3);
    run(&h, req(1, 1, &p, Some("conversation-a")));
    assert_eq!(run(&h, req(2, 1, &p, Some("conversation-b"))).usage.cached_tokens, 0);
    assert_eq!(run(&h, req(3, 1, &p, None)).usage.cached_tokens, 0, "no salt is a scope of its own");
    assert_eq!(run(&h, req(4, 1, &p, Some("conversation-a"))).usage.cached_tokens, 39);
}

#[test]
fn another_tenants_idle_cached_pages_never_make_a_request_wait() {
    // A pool of 8 pages. Tenant 1 leaves 5 pages in its cache; tenant 2 then needs all 8.
    let e = engine(128, true);
    let h = e.handle();
    run(&h, req(1, 1, &prompt(70, 4), None));
    assert_eq!(h.stats().cached_pages, 5, "four whole pages and the tail");
    let mut big = req(2, 2, &prompt(100, 5), None);
    big.max_tokens = 28;
    let r = run(&h, big);
    assert_eq!(r.usage.completion_tokens, 28);
    assert_eq!(h.stats().cached_pages, 6, "tenant 1's pages evicted; tenant 2's own prompt sealed");
    assert_eq!(h.stats().pages_used, 0, "idle cached pages are not pages in use");
}
