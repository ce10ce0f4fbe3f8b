#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Teacher-forced agreement with llama.cpp on the default model, from the reference outputs
//! measured with llama.cpp on this machine class (reference/, copied from ../shared/reference).

mod common;

use common::{ids, reference, teacher_forced, Case};
use model::{Llama, LoadOptions};

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let chat = reference("chat_greedy.json");
    let raw = reference("raw_greedy.json");
    let both = chat["cases"].as_array().unwrap().iter().map(|c| (c, &c["completion_from_prompt_ids"]));
    let both = both.chain(raw["cases"].as_array().unwrap().iter().map(|c| (c, &c["completion"])));
    for (c, comp) in both {
        let probs = comp["probs"].as_array().unwrap();
        out.push(Case {
            prompt: ids(&c["prompt_token_ids"]),
            output: ids(&comp["tokens"]),
            ref_lp: probs
                .iter()
                .map(|p| {
                    let top = p["top"].as_array().unwrap();
                    let top =
                        top.iter().map(|t| (t["id"].as_u64().unwrap() as u32, t["logprob"].as_f64().unwrap() as f32));
                    (p["logprob"].as_f64().unwrap() as f32, top.collect())
                })
                .collect(),
        });
    }
    out
}

#[test]
fn teacher_forced_logprobs_agree_with_llamacpp() {
    let path = fetch::ensure_default_model().unwrap();
    let model = Llama::load(&path, LoadOptions::default()).unwrap();
    let a = teacher_forced(&model, &cases());
    assert!(a.rate() >= 0.97, "top-1 agreement {}", a.rate());
    assert!(a.mean_delta <= 0.05, "mean |delta logprob| {}", a.mean_delta);
}
