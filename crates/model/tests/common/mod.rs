//! Teacher-forced agreement with llama.cpp: the reference's greedy tokens are fed back as input
//! and, at every position, our top-1 token and log-probabilities are compared with llama.cpp's.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use kv::{Capacity, KvDtype, KvPool, Owner, PoolConfig, RequestId, ScrubPolicy, TenantId};
use model::{Llama, Logits, SeqStep};
use serde_json::Value;

/// Log-probability gap (nats) under which two candidates count as a tie.
pub const NEAR_TIE: f32 = 0.1;

pub fn reference(name: &str) -> Value {
    let path = format!("{}/../../reference/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))).unwrap()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

pub fn log_softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let lse = x.iter().map(|&v| ((v - max) as f64).exp()).sum::<f64>().ln() as f32 + max;
    x.iter().map(|&v| v - lse).collect()
}

pub struct Case {
    pub prompt: Vec<u32>,
    pub output: Vec<u32>,
    /// Per output position: the reference log-prob of the reference token, and the reference's
    /// top alternatives (id, log-prob).
    pub ref_lp: Vec<(f32, Vec<(u32, f32)>)>,
}

pub struct Agreement {
    /// Positions where our top-1 is the reference token or a near-tie with it.
    pub agree: usize,
    /// Positions where our top-1 is the reference token.
    pub strict: usize,
    pub total: usize,
    pub mean_delta: f64,
    pub worst_delta: f32,
}

impl Agreement {
    pub fn rate(&self) -> f64 {
        self.agree as f64 / self.total as f64
    }
}

pub fn teacher_forced(model: &Llama, cases: &[Case]) -> Agreement {
    let layout = model.config.kv_layout(16, KvDtype::F16);
    let pool =
        KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(4096), scrub: ScrubPolicy::OnFree }).unwrap();
    let (mut agree, mut strict, mut total, mut dsum) = (0usize, 0usize, 0usize, 0f64);
    let mut worst = 0f32;
    for (ci, case) in cases.iter().enumerate() {
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
            // NEAR_TIE nats of each other in llama.cpp's distribution or in ours.
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
    assert_eq!(pool.used_pages(), 0);
    let a = Agreement { agree, strict, total, mean_delta: dsum / total as f64, worst_delta: worst };
    eprintln!(
        "top-1 agreement {}/{} = {:.4} (strict {}/{}); mean |delta logprob| {:.4}; worst {:.4}",
        a.agree,
        a.total,
        a.rate(),
        a.strict,
        a.total,
        a.mean_delta,
        a.worst_delta
    );
    a
}
