#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Gemma 3 270M (Q4_K_M: Q8_0, Q5_0, Q4_K and Q6_K tensors) against llama.cpp's greedy outputs
//! on the same file (reference/gemma3, measured with llama.cpp 0c1e570 on this machine class).

mod common;

use common::{ids, reference, teacher_forced, Case};
use model::config::Arch;
use model::{Llama, LoadOptions};

fn cases() -> Vec<Case> {
    let r = reference("gemma3/gemma3_reference.json");
    r["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: ids(&c["prompt_token_ids"]),
            output: ids(&c["tokens"]),
            ref_lp: c["probs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    let top = p["top_logprobs"].as_array().unwrap();
                    let top =
                        top.iter().map(|t| (t["id"].as_u64().unwrap() as u32, t["logprob"].as_f64().unwrap() as f32));
                    (p["logprob"].as_f64().unwrap() as f32, top.collect())
                })
                .collect(),
        })
        .collect()
}

#[test]
fn gemma3_greedy_tokens_and_logprobs_agree_with_llamacpp() {
    let path = fetch::ensure_model(&fetch::GEMMA3_270M).unwrap();
    let model = Llama::load(&path, LoadOptions::default()).unwrap();
    let c = &model.config;
    assert_eq!((c.arch, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim), (Arch::Gemma3, 18, 4, 1, 256));
    // Five local layers (window 512, rotary base 10k) then one global (base 1M).
    assert_eq!(c.layer_attention(0).window, Some(512));
    assert_eq!(c.layer_attention(5).window, None);
    assert_eq!(c.layer_attention(5).rope_base, 1_000_000.0);
    let a = teacher_forced(&model, &cases());
    assert!(a.rate() >= 0.97, "top-1 agreement {}", a.rate());
    assert!(a.mean_delta <= 0.05, "mean |delta logprob| {}", a.mean_delta);
}
