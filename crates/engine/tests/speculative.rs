#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Speculative decoding on a generated tiny model (real forward passes, pool and threads):
//! drafts change how many tokens a step yields, never which tokens or their log-probs.

use std::time::Duration;

use engine::{Engine, EngineConfig, Event, GenRequest, TokenEvent};
use gguf::GgufFile;
use kv::{Capacity, KvDtype, KvPool, PoolConfig, RequestId, ScrubPolicy, TenantId};
use model::tiny::{tiny_gguf, TinySpec};
use model::{Llama, LoadOptions};
use protocol::PoolStats;
use sampling::{SamplingParams, StopTokens};

fn engine(draft: usize) -> Engine {
    let f = GgufFile::from_bytes(tiny_gguf(&TinySpec::default())).unwrap();
    let model = Llama::from_file(&f, LoadOptions { threads: 2, ..Default::default() }).unwrap();
    let layout = model.config.kv_layout(16, KvDtype::F16);
    let pool =
        KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(4096), scrub: ScrubPolicy::OnFree }).unwrap();
    Engine::start(model, pool, EngineConfig { speculative_draft: draft, ..Default::default() })
}

/// A prompt that repeats a phrase, as text to summarise or edit does.
fn repetitive(id: u64) -> Vec<u32> {
    let phrase: Vec<u32> = (0..7).map(|i| ((i * 11 + id * 5) % 80) as u32).collect();
    phrase.iter().cycle().take(40).copied().collect()
}

fn request(id: u64, tenant: u64, prompt: Vec<u32>, max_tokens: usize, sampling: SamplingParams) -> GenRequest {
    GenRequest {
        id: RequestId(id),
        tenant: TenantId(tenant),
        prompt,
        max_tokens,
        sampling,
        stop_tokens: StopTokens::new([]),
        deadline: None,
        cache_salt: None,
        constraint: None,
        route_tags: Vec::new(),
    }
}

/// Each request's token events, the requests run at once.
fn run(e: &Engine, reqs: Vec<GenRequest>) -> Vec<Vec<TokenEvent>> {
    let streams: Vec<_> = reqs.into_iter().map(|r| e.handle().submit(r).unwrap()).collect();
    streams
        .into_iter()
        .map(|mut s| {
            let mut out = Vec::new();
            while let Some(ev) = s.blocking_next() {
                match ev {
                    Event::Token(t) => out.push(t),
                    Event::Finished { usage, .. } => {
                        assert_eq!(usage.completion_tokens, out.len());
                        return out;
                    }
                    Event::Failed(err) => panic!("request failed: {err}"),
                    _ => {}
                }
            }
            panic!("stream ended without a final event")
        })
        .collect()
}

/// The engine's counters once its loop has published the last step (it publishes after each).
fn settled(e: &Engine) -> PoolStats {
    let mut last = e.handle().stats();
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(20));
        let now = e.handle().stats();
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

fn logprobs() -> SamplingParams {
    SamplingParams::builder().top_logprobs(3).build().unwrap()
}

#[test]
fn greedy_tokens_and_logprobs_are_the_same_bits_with_drafts_and_drafts_are_kept() {
    let reqs = |sampling: fn() -> SamplingParams| {
        (1..=3).map(|id| request(id, id, repetitive(id), 48, sampling())).collect::<Vec<_>>()
    };
    let plain = engine(0);
    let want = run(&plain, reqs(logprobs));
    assert_eq!(settled(&plain).draft_tokens, 0, "no drafts when turned off");
    for draft in [1, 4, 16] {
        let spec = engine(draft);
        let got = run(&spec, reqs(logprobs));
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.len(), w.len());
            for (a, b) in g.iter().zip(w) {
                assert_eq!(a.token, b.token, "draft {draft}");
                assert_eq!(a.logprob.map(f32::to_bits), b.logprob.map(f32::to_bits), "draft {draft}");
                let top = |t: &TokenEvent| t.top.iter().map(|x| (x.token, x.logprob.to_bits())).collect::<Vec<_>>();
                assert_eq!(top(a), top(b), "draft {draft}");
            }
        }
        let s = settled(&spec);
        assert!(s.draft_tokens > 0 && s.draft_tokens_accepted > 0, "draft {draft}: {s:?}");
        assert!(s.draft_tokens_accepted <= s.draft_tokens);
        // Fewer steps than tokens: kept drafts came out of steps that yielded several tokens.
        let tokens: usize = got.iter().map(Vec::len).sum();
        assert_eq!(s.decode_tokens as usize + 3, tokens, "every token after the first is a decoded one: {s:?}");
    }
}

#[test]
fn seeded_sampling_draws_the_same_tokens_with_drafts() {
    let sampled = |seed: u64| SamplingParams::builder().temperature(0.8).top_k(20).seed(seed).build().unwrap();
    let reqs = || (1..=2).map(|id| request(id, id, repetitive(id), 40, sampled(id * 7))).collect::<Vec<_>>();
    let want = run(&engine(0), reqs());
    let spec = engine(6);
    let got = run(&spec, reqs());
    let ids =
        |v: &Vec<Vec<TokenEvent>>| v.iter().map(|s| s.iter().map(|t| t.token).collect::<Vec<_>>()).collect::<Vec<_>>();
    assert_eq!(ids(&got), ids(&want));
    assert!(settled(&spec).draft_tokens > 0);
}

#[test]
fn drafts_never_run_past_max_tokens() {
    let spec = engine(16);
    for max in [1, 2, 3, 9] {
        let got = run(&spec, vec![request(max as u64, 1, repetitive(3), max, SamplingParams::greedy())]);
        assert_eq!(got[0].len(), max);
    }
}
