//! `pagewarden generate`: a prompt (raw, or chat messages through the model's template) in,
//! text streamed to the terminal.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use sampling::{Sampler, SamplingParams, StopTokens};
use serde::Serialize;
use text::{ChatMessage, ChatTemplate, StreamDecoder};

use crate::runtime;
use crate::session::{self, Finish};
use crate::ModelArgs;

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub m: ModelArgs,
    /// The prompt. With --chat it is the user message; otherwise it is fed to the model as is.
    pub prompt: Option<String>,
    /// Send the prompt as a user message through the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// System message (implies --chat).
    #[arg(long)]
    pub system: Option<String>,
    /// A JSON file with chat messages ([{"role": "user", "content": "..."}]); implies --chat.
    #[arg(long)]
    pub messages: Option<PathBuf>,
    /// Parse special-token text in a raw prompt (e.g. <|im_start|>) into special tokens.
    #[arg(long)]
    pub parse_special: bool,
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: i64,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Report the log-probability of each token and this many alternatives (with --json).
    #[arg(long, default_value_t = 0)]
    pub top_logprobs: i64,
    /// Print one JSON object at the end (text, token ids, log-probs, timings) instead of streaming.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Output {
    prompt_tokens: usize,
    text: String,
    tokens: Vec<u32>,
    finish_reason: Finish,
    logprobs: Vec<TokenLogprob>,
    prefill_ms: f64,
    decode_ms: f64,
    decode_tokens_per_s: f64,
}

#[derive(Serialize)]
struct TokenLogprob {
    token: u32,
    logprob: f32,
    top: Vec<(u32, f32)>,
}

fn messages(a: &GenerateArgs) -> Result<Option<Vec<ChatMessage>>> {
    if let Some(path) = &a.messages {
        let raw = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let msgs: Vec<ChatMessage> =
            serde_json::from_str(&raw).context("messages must be [{\"role\", \"content\"}, ...]")?;
        return Ok(Some(msgs));
    }
    if !(a.chat || a.system.is_some()) {
        return Ok(None);
    }
    let mut msgs = Vec::new();
    if let Some(s) = &a.system {
        msgs.push(ChatMessage::new("system", s.clone()));
    }
    msgs.push(ChatMessage::new("user", a.prompt.clone().unwrap_or_default()));
    Ok(Some(msgs))
}

pub fn run(a: &GenerateArgs) -> Result<()> {
    let params = SamplingParams::builder()
        .temperature(a.temperature)
        .top_k(a.top_k)
        .top_p(a.top_p)
        .min_p(a.min_p)
        .seed(a.seed)
        .repetition_penalty(a.repeat_penalty)
        .frequency_penalty(a.frequency_penalty)
        .presence_penalty(a.presence_penalty)
        .top_logprobs(a.top_logprobs)
        .build()?;
    let file = runtime::open(&a.m)?;
    let tok = runtime::tokenizer(&file)?;
    let prompt = match messages(a)? {
        Some(msgs) => {
            let text = ChatTemplate::from_gguf(&file)?.render(&msgs, true)?;
            tok.encode(&text, true)?
        }
        None => match &a.prompt {
            Some(p) => tok.encode(p, a.parse_special)?,
            None => bail!("give a prompt, or --messages FILE"),
        },
    };
    let model = runtime::load_model(&file, a.m.threads)?;
    drop(file);
    let pool = runtime::pool_for(&model, prompt.len() + a.max_tokens)?;
    let mut sampler = Sampler::new(params);
    let stops = StopTokens::new(tok.stop_tokens());
    let mut dec = StreamDecoder::new();
    let mut out = std::io::stdout().lock();
    let stream = !a.json;
    let g = session::generate(&model, &pool, &prompt, a.max_tokens, &mut sampler, &stops, |id, _| {
        let piece = dec.push(&tok, id)?;
        if stream {
            out.write_all(piece.as_bytes())?;
            out.flush()?;
        }
        Ok(())
    })?;
    if stream {
        out.write_all(dec.finish().as_bytes())?;
        out.write_all(b"\n")?;
        return Ok(());
    }
    let decode_s = g.decode.as_secs_f64();
    let o = Output {
        prompt_tokens: prompt.len(),
        text: tok.decode(&g.tokens)?,
        finish_reason: g.finish,
        logprobs: g
            .sampled
            .iter()
            .map(|s| TokenLogprob {
                token: s.token,
                logprob: s.logprob,
                top: s.top.iter().map(|t| (t.token, t.logprob)).collect(),
            })
            .collect(),
        decode_tokens_per_s: if decode_s > 0.0 { g.tokens.len() as f64 / decode_s } else { 0.0 },
        tokens: g.tokens,
        prefill_ms: g.prefill.as_secs_f64() * 1e3,
        decode_ms: decode_s * 1e3,
    };
    writeln!(out, "{}", serde_json::to_string(&o)?)?;
    Ok(())
}
