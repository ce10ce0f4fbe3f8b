//! `pagewarden generate`: a prompt (raw, or chat messages through the model's template) in,
//! text streamed to the terminal. The request runs through the engine, the same step loop,
//! door rule and sampling as a served request, on a pool sized for it.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use engine::{Engine, EngineConfig, Event, FinishReason, GenRequest, TokenEvent};
use sampling::{SamplingParams, StopTokens};
use serde::Serialize;
use text::{ChatMessage, ChatTemplate, StreamDecoder};
use types::{RequestId, TenantId};

use crate::runtime;
use crate::{ModelArgs, ToolError};

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
    /// Speculative decoding: verify up to this many tokens guessed from the prompt and output
    /// with each decode step (0 = off, at most 16). The output is the same either way; only speed changes.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=16))]
    pub speculative_draft: u8,
}

#[derive(Serialize)]
struct Output {
    prompt_tokens: usize,
    text: String,
    tokens: Vec<u32>,
    finish_reason: FinishReason,
    logprobs: Vec<TokenLogprob>,
    /// From submission to the first token: the prompt's prefill and the first sampling.
    prefill_ms: f64,
    /// From the first token to the end: one decode step per further token.
    decode_ms: f64,
    /// Tokens after the first per second of decoding.
    decode_tokens_per_s: f64,
    /// Guessed tokens verified and kept (speculative decoding).
    draft_tokens: u64,
    draft_tokens_accepted: u64,
}

/// One request's tokens and timings.
struct Generation {
    tokens: Vec<TokenEvent>,
    finish: FinishReason,
    prefill: Duration,
    decode: Duration,
}

#[derive(Serialize)]
struct TokenLogprob {
    token: u32,
    /// Always present: `--json` asks the sampler for it.
    logprob: Option<f32>,
    top: Vec<(u32, f32)>,
}

/// What the prompt is made from.
enum Input<'a> {
    Chat(Vec<ChatMessage>),
    Raw(&'a str),
}

fn messages(a: &GenerateArgs) -> Result<Option<Vec<ChatMessage>>, ToolError> {
    if let Some(path) = &a.messages {
        let raw = std::fs::read_to_string(path).map_err(ToolError::file("reading", path))?;
        let msgs: Vec<ChatMessage> =
            serde_json::from_str(&raw).map_err(ToolError::json("messages must be [{\"role\", \"content\"}, ...]"))?;
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

pub fn run(a: &GenerateArgs) -> Result<(), ToolError> {
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
        .logprobs(a.json)
        .build()?;
    let input = match (messages(a)?, &a.prompt) {
        (Some(msgs), _) => Input::Chat(msgs),
        (None, Some(p)) => Input::Raw(p),
        (None, None) => return Err(ToolError::Usage("give a prompt, or --messages FILE".into())),
    };
    let file = runtime::open(&a.m)?;
    // The tokenizer is built and the prompt encoded while the weights load: on its own it
    // kept one core busy and the other idle for a third of a 1B model's start.
    let (model, encoded) = runtime::load_model_beside(&file, a.m.threads, || {
        let tok = runtime::tokenizer(&file)?;
        let prompt = match &input {
            Input::Chat(msgs) => {
                let template = ChatTemplate::from_gguf(&file)?;
                template.encode(&tok, &template.render(msgs, true)?)?
            }
            Input::Raw(p) => tok.encode_prompt(p, a.parse_special)?,
        };
        Ok::<_, ToolError>((tok, prompt))
    });
    let (tok, prompt) = encoded?;
    let model = model?;
    drop(file);
    let context = model.config.context;
    // The door rule, before a pool is built: a request that cannot be served whole is refused.
    if let Err(e) = engine::door_check(&prompt, a.max_tokens, context, usize::MAX, model.config.vocab) {
        return Err(ToolError::refused(e));
    }
    let pool = runtime::pool_for(&model, prompt.len() + a.max_tokens)?;
    let cfg =
        EngineConfig { prefix_cache: false, speculative_draft: a.speculative_draft.into(), ..EngineConfig::default() };
    let engine = Engine::start(model, pool, cfg);
    let request = GenRequest {
        id: RequestId(1),
        tenant: TenantId(1),
        prompt: prompt.clone(),
        max_tokens: a.max_tokens,
        sampling: params,
        stop_tokens: StopTokens::new(tok.stop_tokens()),
        deadline: None,
        cache_salt: None,
        constraint: None,
        route_tags: Vec::new(),
    };
    let mut dec = StreamDecoder::new();
    let mut out = std::io::stdout().lock();
    let stream = !a.json;
    let g = run_request(&engine, request, |t| {
        let piece = dec.push(&tok, t.token)?;
        if stream {
            out.write_all(piece.as_bytes()).and_then(|()| out.flush()).map_err(ToolError::Stdout)?;
        }
        Ok(())
    })?;
    // Read once the loop has stopped: it publishes its counters after each step and at exit.
    let handle = engine.handle().clone();
    drop(engine);
    let stats = handle.stats();
    if stream {
        out.write_all(dec.finish().as_bytes()).and_then(|()| out.write_all(b"\n")).map_err(ToolError::Stdout)?;
        return Ok(());
    }
    let ids: Vec<u32> = g.tokens.iter().map(|t| t.token).collect();
    let decode_s = g.decode.as_secs_f64();
    let o = Output {
        prompt_tokens: prompt.len(),
        text: tok.decode(&ids)?,
        finish_reason: g.finish,
        logprobs: g
            .tokens
            .iter()
            .map(|s| TokenLogprob {
                token: s.token,
                logprob: s.logprob,
                top: s.top.iter().map(|t| (t.token, t.logprob)).collect(),
            })
            .collect(),
        decode_tokens_per_s: if decode_s > 0.0 { ids.len().saturating_sub(1) as f64 / decode_s } else { 0.0 },
        tokens: ids,
        draft_tokens: stats.draft_tokens,
        draft_tokens_accepted: stats.draft_tokens_accepted,
        prefill_ms: g.prefill.as_secs_f64() * 1e3,
        decode_ms: decode_s * 1e3,
    };
    let json = serde_json::to_string(&o).map_err(ToolError::json("serialising the output"))?;
    writeln!(out, "{json}").map_err(ToolError::Stdout)?;
    Ok(())
}

/// Submits `request` and follows its events to the end, calling `on_token` for each token.
fn run_request(
    engine: &Engine,
    request: GenRequest,
    mut on_token: impl FnMut(&TokenEvent) -> Result<(), ToolError>,
) -> Result<Generation, ToolError> {
    let t0 = Instant::now();
    let mut stream = engine.handle().submit(request).map_err(ToolError::refused)?;
    let mut tokens = Vec::new();
    let mut first: Option<Instant> = None;
    loop {
        match stream.blocking_next() {
            Some(Event::Token(t)) => {
                first.get_or_insert_with(Instant::now);
                on_token(&t)?;
                tokens.push(t);
            }
            Some(Event::Finished { reason, .. }) => {
                let first = first.unwrap_or_else(Instant::now);
                return Ok(Generation { tokens, finish: reason, prefill: first - t0, decode: first.elapsed() });
            }
            Some(Event::Failed(e)) => return Err(ToolError::Generation(e)),
            Some(_) => {}
            None => return Err(ToolError::EngineStopped),
        }
    }
}
