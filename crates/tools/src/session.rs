//! One request's generation on a private KV reservation: prefill the prompt, then sample and
//! decode until a stop token or the token budget. The whole sequence is reserved up front, all
//! or nothing, so generation can never run out of pages halfway.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use kv::{KvPool, Owner, RequestId, TenantId};
use model::{Llama, Logits, SeqStep};
use sampling::{Sampled, Sampler, StopTokens};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Finish {
    Stop,
    Length,
}

pub struct Generation {
    pub tokens: Vec<u32>,
    pub sampled: Vec<Sampled>,
    pub finish: Finish,
    pub prefill: Duration,
    pub decode: Duration,
}

/// Prompt chunk size for prefill: bounds the activation memory of one step.
const PREFILL_CHUNK: usize = 512;

pub fn generate(
    model: &Llama,
    pool: &KvPool,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    stops: &StopTokens,
    mut on_token: impl FnMut(u32, &Sampled) -> Result<()>,
) -> Result<Generation> {
    let ctx = model.config.context;
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    if prompt.len() + max_tokens > ctx {
        bail!(
            "prompt of {} tokens plus {} new tokens exceeds the context window of {} tokens",
            prompt.len(),
            max_tokens,
            ctx
        );
    }
    let owner = Owner { tenant: TenantId(0), request: RequestId(0) };
    let mut kv = pool.reserve(owner, prompt.len() + max_tokens)?;
    let t0 = Instant::now();
    let mut logits = Vec::new();
    for start in (0..prompt.len()).step_by(PREFILL_CHUNK) {
        let chunk = &prompt[start..(start + PREFILL_CHUNK).min(prompt.len())];
        let last = start + chunk.len() == prompt.len();
        let want = if last { Logits::Last } else { Logits::None };
        logits = model.forward(&mut [SeqStep { tokens: chunk, start, kv: &mut kv, logits: want }])?.remove(0);
    }
    let prefill = t0.elapsed();
    let t1 = Instant::now();
    let (mut tokens, mut sampled) = (Vec::new(), Vec::new());
    let mut finish = Finish::Length;
    while tokens.len() < max_tokens {
        let s = sampler.sample(&logits, &tokens)?;
        let tok = s.token;
        if stops.contains(tok) {
            finish = Finish::Stop;
            break;
        }
        on_token(tok, &s)?;
        tokens.push(tok);
        sampled.push(s);
        if tokens.len() == max_tokens {
            break;
        }
        let pos = prompt.len() + tokens.len() - 1;
        let step = [tok];
        logits =
            model.forward(&mut [SeqStep { tokens: &step, start: pos, kv: &mut kv, logits: Logits::Last }])?.remove(0);
    }
    Ok(Generation { tokens, sampled, finish, prefill, decode: t1.elapsed() })
}
