//! Response shapes of the OpenAI API (chat completions, completions, models, their chunks).

use ::types::FinishReason;
use serde_json::{json, Value};
use text::Tokenizer;

use super::endpoint::Endpoint;

/// The log-probabilities of one generated token.
#[derive(Debug, Clone)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<sampling::TopLogprob>,
}

/// One finished choice of a complete response.
#[derive(Debug, Clone)]
pub struct Choice {
    pub text: String,
    pub reason: &'static str,
    pub logprobs: Option<Value>,
    /// The `tool_calls` array when the answer is calls; then `text` is what the model said
    /// before them (content `null` when it said nothing).
    pub tool_calls: Option<Value>,
}

/// Token counts as OpenAI reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the tenant's prefix cache.
    pub cached_tokens: usize,
}

impl Usage {
    pub fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": self.cached_tokens },
        })
    }
}

pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// What identifies one response: its id, creation time and model.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
}

impl ResponseMeta {
    pub fn new(endpoint: Endpoint, serial: u64, model: &str) -> Self {
        let created =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        ResponseMeta { id: format!("{prefix}-{serial:x}{nanos:08x}"), created, model: model.to_string(), endpoint }
    }

    /// A complete (non-streaming) response with one entry per choice, in index order.
    pub fn full(&self, choices: &[Choice], usage: Usage) -> Value {
        let choices: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(index, c)| {
                let lp = c.logprobs.clone().unwrap_or(Value::Null);
                match self.endpoint {
                    Endpoint::Chat => {
                        let message = match &c.tool_calls {
                            Some(calls) => {
                                let content = (!c.text.is_empty()).then_some(c.text.as_str());
                                json!({"role": "assistant", "content": content, "tool_calls": calls})
                            }
                            None => json!({"role": "assistant", "content": c.text}),
                        };
                        json!({"index": index, "message": message, "logprobs": lp, "finish_reason": c.reason})
                    }
                    Endpoint::Completions => {
                        json!({"index": index, "text": c.text, "logprobs": lp, "finish_reason": c.reason})
                    }
                }
            })
            .collect();
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage.json(),
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    /// One streaming chunk carrying `text` for choice `index` (chat: the choice's first chunk
    /// also carries the role).
    pub fn chunk(
        &self,
        index: usize,
        text: &str,
        first: bool,
        reason: Option<&str>,
        logprobs: Option<Value>,
        include_usage: bool,
    ) -> Value {
        let lp = logprobs.unwrap_or(Value::Null);
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let delta = match (first, reason.is_some() && text.is_empty()) {
                    (true, _) => json!({"role": "assistant", "content": text}),
                    (false, true) => json!({}),
                    (false, false) => json!({"content": text}),
                };
                json!({"index": index, "delta": delta, "logprobs": lp, "finish_reason": reason})
            }
            Endpoint::Completions => json!({"index": index, "text": text, "logprobs": lp, "finish_reason": reason}),
        };
        let mut v = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// A chat chunk carrying a choice's whole `tool_calls` delta (calls are sent once complete).
    pub fn tool_calls_chunk(&self, index: usize, first: bool, calls: Value, include_usage: bool) -> Value {
        let mut delta = json!({"content": null, "tool_calls": calls});
        if first {
            delta["role"] = json!("assistant");
        }
        let mut v = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [{"index": index, "delta": delta, "logprobs": null, "finish_reason": null}],
        });
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// The id of choice `index`'s call: unique per response, quoted back by the `tool` message.
    pub fn call_id(&self, index: usize) -> String {
        let tail = self.id.split_once('-').map_or(self.id.as_str(), |(_, t)| t);
        format!("call_{tail}_{index}")
    }

    /// The usage chunk of `stream_options.include_usage`: no choices.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage.json(),
        })
    }
}

fn token_text(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_bytes(id).unwrap_or_default().to_vec();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Log-probabilities in the endpoint's format (chat: `{content: [...]}`; completions:
/// `{tokens, token_logprobs, top_logprobs, text_offset}`), `text_offset` counted from `offset`.
pub fn logprobs_json(endpoint: Endpoint, tok: &Tokenizer, lps: &[TokenLogprob], mut offset: usize) -> Value {
    match endpoint {
        Endpoint::Chat => {
            let content: Vec<Value> = lps
                .iter()
                .map(|lp| {
                    let (text, bytes) = token_text(tok, lp.token);
                    let top: Vec<Value> = lp
                        .top
                        .iter()
                        .map(|t| {
                            let (text, bytes) = token_text(tok, t.token);
                            json!({"token": text, "logprob": t.logprob, "bytes": bytes})
                        })
                        .collect();
                    json!({"token": text, "logprob": lp.logprob, "bytes": bytes, "top_logprobs": top})
                })
                .collect();
            json!({ "content": content })
        }
        Endpoint::Completions => {
            let mut tokens = Vec::new();
            let mut token_logprobs = Vec::new();
            let mut top = Vec::new();
            let mut offsets = Vec::new();
            for lp in lps {
                let (text, _) = token_text(tok, lp.token);
                offsets.push(offset);
                offset += text.len();
                tokens.push(text);
                token_logprobs.push(lp.logprob);
                let map: serde_json::Map<String, Value> =
                    lp.top.iter().map(|t| (token_text(tok, t.token).0, json!(t.logprob))).collect();
                top.push(Value::Object(map));
            }
            json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
        }
    }
}

/// `GET /v1/models`. Besides OpenAI's fields: the context window (`context_length`, as
/// llama-server and OpenRouter name it) and `batch_invariant`: a request's tokens and log-probs
/// do not depend on what else is in its batch, so an auditor may hold every answer under load
/// to be bit-identical to the same request run alone.
/// `/v1/models`: `(name, context window)` of each model the caller may use.
pub fn models(models: &[(&str, usize)], created: u64) -> Value {
    let data: Vec<Value> = models
        .iter()
        .map(|(id, context)| {
            json!({
                "id": id,
                "object": "model",
                "created": created,
                "owned_by": "pagewarden",
                "context_length": context,
                "batch_invariant": true,
            })
        })
        .collect();
    json!({ "object": "list", "data": data })
}
