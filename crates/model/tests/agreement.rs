#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Teacher-forced agreement with llama.cpp on the default model, from the reference outputs
//! measured with llama.cpp on this machine class (reference/, copied from ../shared/reference).

use kv::{Capacity, KvDtype, KvPool, Owner, PoolConfig, RequestId, ScrubPolicy, TenantId};
use model::{Llama, LoadOptions, Logits, SeqStep};
use serde_json::Value;

fn reference(name: &str) -> Value {
    let path = format!("{}/../../reference/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Log-probability gap (nats) under which two candidates count as a tie.
const NEAR_TIE: f32 = 0.1;

fn log_softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let lse = x.iter().map(|&v| ((v - max) as f64).exp()).sum::<f64>().ln() as f32 + max;
    x.iter().map(|&v| v - lse).collect()
}

struct Case {
    prompt: Vec<u32>,
    output: Vec<u32>,
    /// Per output position: the reference log-prob of the reference token, and the reference's
    /// top alternatives (id, log-prob).
    ref_lp: Vec<(f32, Vec<(u32, f32)>)>,
}

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
    let layout = model.config.kv_layout(16, KvDtype::F16);
    let pool =
        KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(4096), scrub: ScrubPolicy::OnFree }).unwrap();
    let (mut agree, mut strict, mut total, mut dsum) = (0usize, 0usize, 0usize, 0f64);
    let mut worst = 0f32;
    for (ci, case) in cases().iter().enumerate() {
        let seq: Vec<u32> = case.prompt.iter().chain(&case.output).copied().collect();
        let mut kv = pool.reserve(Owner { tenant: TenantId(1), request: RequestId(ci as u64) }, seq.len()).unwrap();
        let vocab = model.config.vocab;
        let rows = model
            .forward(&mut [SeqStep { tokens: &seq, start: 0, kv: &mut kv, logits: Logits::All }])
            .unwrap()
            .remove(0);
        for (i, (&tok, (ref_lp, top))) in case.output.iter().zip(&case.ref_lp).enumerate() {
            let row = &rows[(case.prompt.len() - 1 + i) * vocab..][..vocab];
            let lp = log_softmax(row);
            let ours =
                lp.iter().enumerate().fold((0, f32::NEG_INFINITY), |a, (j, &v)| if v > a.1 { (j, v) } else { a }).0
                    as u32;
            // A near-tie counts either answer (reference README): the two candidates within
            // NEAR_TIE nats of each other in llama.cpp's distribution or in ours. llama.cpp
            // disagrees with itself at 2-3% of positions; most of our differences come from its
            // flash-attention kernel accumulating V in f16 (mimicking that gave 98.6% strict).
            let ref_gap = top.iter().find(|t| t.0 == ours).map(|t| (top[0].1 - t.1).abs());
            let our_gap = (lp[ours as usize] - lp[tok as usize]).abs();
            let near_tie = ref_gap.is_some_and(|g| g < NEAR_TIE) || our_gap < NEAR_TIE;
            if ours == tok {
                strict += 1;
            }
            if ours == tok || near_tie {
                agree += 1;
            } else {
                eprintln!(
                    "case {ci} pos {i}: reference {tok} ({ref_lp:.3}), ours {ours} ({:.3} vs {:.3})",
                    lp[ours as usize], lp[tok as usize]
                );
            }
            let d = (lp[tok as usize] - ref_lp).abs();
            worst = worst.max(d);
            dsum += d as f64;
            total += 1;
        }
    }
    let rate = agree as f64 / total as f64;
    let mean = dsum / total as f64;
    eprintln!(
        "top-1 agreement {agree}/{total} = {rate:.4} (strict {strict}/{total}); mean |delta logprob| {mean:.4}; worst {worst:.4}"
    );
    assert!(rate >= 0.97, "top-1 agreement {rate}");
    assert!(mean <= 0.05, "mean |delta logprob| {mean}");
    assert_eq!(pool.used_pages(), 0);
}
