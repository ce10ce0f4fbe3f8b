//! Counting what the audit sends: every prompt's length in tokens, measured by the audit, never
//! taken from the answer it judges.
//!
//! The incident's server answered an over-long prompt with 200 and a `usage` that said the
//! prompt was one token long; an audit that believes the server's own count excuses exactly
//! that. So the audit counts each prompt itself, with (in order of preference):
//! 1. the model's tokenizer and chat template read from a GGUF file the audit holds
//!    (`--tokenizer`, or the packaged model when the target serves it under its name, or when
//!    the target's own tokenizer endpoint tokenizes a fingerprint text exactly as that file
//!    does): the audit's own count, which no answer of the target can change;
//! 2. the target's tokenizer endpoint (`POST /tokenize` as vLLM serves it, or llama-server's
//!    `/tokenize` and `/apply-template`), when the audit holds no file;
//! 3. nothing: sizes are then estimates, and a reported `prompt_tokens` is only checked against
//!    a bound from the prompt's bytes ([`min_tokens_for_bytes`]).
//!
//! When the audit holds the file and the target also has an endpoint, the two are compared on
//! the same texts ([`Meter::cross_check`]): a target whose endpoint counts otherwise than the
//! model it serves is lying about lengths, which is a finding of its own.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{json, Value};

use super::client::Client;
use crate::error::AuditError;

/// The most bytes of prompt text one token of a packaged model's vocabulary stands for in the
/// audit's prompts (prose and pseudo-words; the longest pieces are whole words with their
/// space). A server reporting fewer tokens than bytes / this did not run the prompt it got.
pub const MAX_BYTES_PER_TOKEN: usize = 16;

/// The fewest tokens a prompt of `bytes` bytes can take ([`MAX_BYTES_PER_TOKEN`]).
pub fn min_tokens_for_bytes(bytes: usize) -> usize {
    bytes / MAX_BYTES_PER_TOKEN
}

/// Where the audit's prompt lengths come from (`prompt_lengths` in report.json).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum MeterSource {
    /// vLLM's `POST /tokenize` (`{"model", "messages" | "prompt"}` → `{"count"}`).
    VllmTokenize,
    /// llama-server's `POST /apply-template` and `POST /tokenize` (`{"content"}` → `{"tokens"}`).
    LlamaCppTokenize,
    /// The tokenizer and chat template of a GGUF file.
    ModelFile { path: PathBuf },
    /// No way to count: estimates from the calibration only.
    Estimate,
}

impl MeterSource {
    pub fn describe(&self) -> String {
        match self {
            MeterSource::VllmTokenize => "the target's /tokenize endpoint (vLLM style)".into(),
            MeterSource::LlamaCppTokenize => "the target's /apply-template and /tokenize endpoints (llama.cpp)".into(),
            MeterSource::ModelFile { path } => format!("the tokenizer of {}", path.display()),
            MeterSource::Estimate => "estimates (no tokenizer: pass --tokenizer MODEL.gguf)".into(),
        }
    }
}

/// The target's tokenizer endpoint, in one of the two dialects the audit speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Vllm,
    LlamaCpp,
}

/// The model's own tokenizer and template, for counting locally.
struct Local {
    tokenizer: text::Tokenizer,
    template: text::ChatTemplate,
    /// The model's training context (`{arch}.context_length`), when the file states it.
    context_length: Option<usize>,
}

/// Counts prompt tokens of request bodies.
pub struct Meter<'a> {
    source: MeterSource,
    client: &'a Client,
    key: String,
    model: String,
    local: Option<Local>,
    endpoint: Option<Endpoint>,
}

/// Loads the tokenizer and chat template of a GGUF file.
fn local_from(path: &Path) -> Result<Local, AuditError> {
    let f = gguf::GgufFile::open(path).map_err(|source| AuditError::ModelFile { path: path.to_path_buf(), source })?;
    let tokenizer = text::Tokenizer::from_gguf(&f)
        .map_err(|source| AuditError::Tokenizer { what: "reading the tokenizer", source })?;
    let template = text::ChatTemplate::from_gguf(&f)
        .map_err(|source| AuditError::Tokenizer { what: "reading the chat template", source })?;
    let context_length = f
        .str("general.architecture")
        .ok()
        .and_then(|arch| f.get(&format!("{arch}.context_length")))
        .and_then(|v| v.as_u64())
        .map(|n| n as usize);
    Ok(Local { tokenizer, template, context_length })
}

/// The packaged model's file when the target serves one by its name, its file name or the
/// file's stem (pagewarden's id for a single model).
fn packaged_model_for(model: &str) -> Option<PathBuf> {
    let known = fetch::KNOWN.iter().copied().find(|k| {
        let stem = k.file_name.split('.').next().unwrap_or_default();
        model == k.name || model == k.file_name || model == stem
    })?;
    fetch::ensure_model(known).ok()
}

/// A text whose tokens differ between tokenizers: what identifies the model behind an alias.
const FINGERPRINT: &str = "Kavorimu-tezulani 4821: the quick brown fox, naïve café, 東京 — ŝ!?";

impl<'a> Meter<'a> {
    /// Picks the best source the target and the options allow: a given `--tokenizer` file wins
    /// (the operator said so), then the packaged model's file (by the served name, or by the
    /// endpoint's fingerprint behind an alias), then the target's endpoint alone.
    pub fn discover(
        client: &'a Client,
        key: &str,
        model: &str,
        tokenizer: Option<&Path>,
    ) -> Result<Meter<'a>, AuditError> {
        let mut m = Meter {
            source: MeterSource::Estimate,
            client,
            key: key.to_string(),
            model: model.to_string(),
            local: None,
            endpoint: None,
        };
        m.endpoint = m.find_endpoint();
        if let Some(path) = tokenizer {
            m.local = Some(local_from(path)?);
            m.source = MeterSource::ModelFile { path: path.to_path_buf() };
            return Ok(m);
        }
        let by_name = packaged_model_for(model);
        let named = by_name.is_some();
        let candidates: Vec<PathBuf> = match by_name {
            Some(p) => vec![p],
            // Behind an alias: a packaged model already on disk whose tokenizer the endpoint
            // matches on the fingerprint (nothing is fetched for a guess).
            None if m.endpoint.is_some() => fetch::KNOWN
                .iter()
                .filter(|k| fetch::cache_dir().join(k.file_name).exists())
                .filter_map(|k| fetch::ensure_model(k).ok())
                .collect(),
            None => Vec::new(),
        };
        for path in candidates {
            let Ok(local) = local_from(&path) else { continue };
            let matches = named || {
                let ours = local.tokenizer.encode(FINGERPRINT, false).ok();
                ours.is_some() && m.endpoint_tokens(FINGERPRINT).as_ref() == ours.as_ref()
            };
            if matches {
                m.local = Some(local);
                m.source = MeterSource::ModelFile { path };
                return Ok(m);
            }
        }
        m.source = match m.endpoint {
            Some(Endpoint::Vllm) => MeterSource::VllmTokenize,
            Some(Endpoint::LlamaCpp) => MeterSource::LlamaCppTokenize,
            None => MeterSource::Estimate,
        };
        Ok(m)
    }

    fn find_endpoint(&self) -> Option<Endpoint> {
        let probe = json!({"model": self.model, "prompt": "Hello world"});
        if let Ok((200, text)) = self.client.post("/tokenize", &self.key, &probe) {
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if v["count"].as_u64().is_some_and(|n| n > 0) {
                return Some(Endpoint::Vllm);
            }
        }
        if let Ok((200, text)) = self.client.post("/tokenize", &self.key, &json!({"content": "Hello world"})) {
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if v["tokens"].as_array().is_some_and(|t| !t.is_empty()) {
                return Some(Endpoint::LlamaCpp);
            }
        }
        None
    }

    pub fn source(&self) -> &MeterSource {
        &self.source
    }

    /// Whether counts are exact (a tokenizer), not estimates.
    pub fn exact(&self) -> bool {
        self.source != MeterSource::Estimate
    }

    /// The model file's training context, when the audit holds the file.
    pub fn file_context_length(&self) -> Option<usize> {
        self.local.as_ref().and_then(|l| l.context_length)
    }

    /// The prompt of `body` in tokens, counted as the target counts it; None when the audit
    /// has no tokenizer or the endpoint did not answer.
    pub fn count(&self, body: &Value) -> Option<usize> {
        match (&self.source, self.tokens(body)) {
            (_, Some(t)) => Some(t.len()),
            (MeterSource::VllmTokenize, None) => {
                let v = self.post("/tokenize", &self.vllm_body(body)?)?;
                v["count"].as_u64().map(|n| n as usize)
            }
            _ => None,
        }
    }

    /// The token ids of `body`'s prompt, when the source gives ids (the file always does; the
    /// endpoints when they list them).
    pub fn tokens(&self, body: &Value) -> Option<Vec<u32>> {
        let messages = body.get("messages");
        let prompt = body.get("prompt").and_then(Value::as_str);
        match &self.source {
            MeterSource::Estimate => None,
            MeterSource::ModelFile { .. } => {
                let l = self.local.as_ref()?;
                match (messages, prompt) {
                    (Some(ms), _) => {
                        let msgs: Vec<text::ChatMessage> = ms
                            .as_array()?
                            .iter()
                            .map(|m| {
                                text::ChatMessage::new(
                                    m["role"].as_str().unwrap_or_default(),
                                    m["content"].as_str().unwrap_or_default(),
                                )
                            })
                            .collect();
                        let rendered = l.template.render(&msgs, true).ok()?;
                        // As the server does: the rendered template with control-token parsing.
                        l.template.encode(&l.tokenizer, &rendered).ok()
                    }
                    (None, Some(p)) => l.tokenizer.encode_prompt(p, false).ok(),
                    _ => None,
                }
            }
            MeterSource::VllmTokenize => {
                let v = self.post("/tokenize", &self.vllm_body(body)?)?;
                ids(&v["tokens"])
            }
            MeterSource::LlamaCppTokenize => {
                let content = match (messages, prompt) {
                    (Some(ms), _) => {
                        let v = self.post("/apply-template", &json!({"messages": ms}))?;
                        v["prompt"].as_str()?.to_string()
                    }
                    (None, Some(p)) => p.to_string(),
                    _ => return None,
                };
                let v = self.post("/tokenize", &json!({"content": content, "add_special": true}))?;
                ids(&v["tokens"])
            }
        }
    }

    fn vllm_body(&self, body: &Value) -> Option<Value> {
        let mut b = json!({"model": self.model});
        match (body.get("messages"), body.get("prompt").and_then(Value::as_str)) {
            (Some(ms), _) => {
                b["messages"] = ms.clone();
                b["add_generation_prompt"] = json!(true);
            }
            (None, Some(p)) => b["prompt"] = json!(p),
            _ => return None,
        }
        Some(b)
    }

    /// The target endpoint's tokens of plain `text` (no special tokens added).
    fn endpoint_tokens(&self, text: &str) -> Option<Vec<u32>> {
        match self.endpoint? {
            Endpoint::Vllm => {
                let b = json!({"model": self.model, "prompt": text, "add_special_tokens": false});
                ids(&self.post("/tokenize", &b)?["tokens"])
            }
            Endpoint::LlamaCpp => {
                let b = json!({"content": text, "add_special": false});
                ids(&self.post("/tokenize", &b)?["tokens"])
            }
        }
    }

    /// The audit's own count and the target endpoint's of each text, where they differ: the
    /// target counts otherwise than the model file the audit holds for the model it serves.
    /// Empty when the audit holds no file or the target has no endpoint.
    pub fn cross_check(&self, texts: &[&str]) -> Vec<(usize, usize)> {
        let (Some(l), Some(_)) = (&self.local, self.endpoint) else { return Vec::new() };
        texts
            .iter()
            .filter_map(|t| {
                let ours = l.tokenizer.encode(t, false).ok()?.len();
                let theirs = self.endpoint_tokens(t).map_or(0, |v| v.len());
                (ours != theirs).then_some((ours, theirs))
            })
            .collect()
    }

    fn post(&self, path: &str, body: &Value) -> Option<Value> {
        match self.client.post(path, &self.key, body) {
            Ok((200, text)) => serde_json::from_str(&text).ok(),
            _ => None,
        }
    }
}

/// Token ids from a `tokens` array of numbers (or of `{"id": n}` pieces).
fn ids(v: &Value) -> Option<Vec<u32>> {
    v.as_array()?.iter().map(|t| t.as_u64().or_else(|| t["id"].as_u64()).map(|n| n as u32)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_model_file_counts_chat_and_completions_as_the_server_tokenizes_them() {
        let path = fetch::ensure_default_model().expect("default model");
        let client = Client::new("http://127.0.0.1:9", Duration::from_secs(1));
        let m = Meter::discover(&client, "k", "x", Some(&path)).unwrap();
        assert!(m.exact());
        let l = local_from(&path).unwrap();
        let text = "The secret code is kavorimu-tezulani-4821. Repeat the secret code exactly.";
        let chat = json!({"model": "x", "messages": [{"role": "user", "content": text}]});
        let rendered = l.template.render(&[text::ChatMessage::new("user", text)], true).unwrap();
        assert_eq!(m.count(&chat), Some(l.template.encode(&l.tokenizer, &rendered).unwrap().len()));
        // The template adds its turn markers: a chat prompt is longer than its text alone.
        let raw = json!({"model": "x", "prompt": text});
        let n = m.count(&raw).unwrap();
        assert_eq!(n, l.tokenizer.encode_prompt(text, false).unwrap().len());
        assert!(m.count(&chat).unwrap() > n + 4);
        assert_eq!(m.count(&json!({"model": "x"})), None);
    }

    #[test]
    fn without_a_tokenizer_or_endpoint_counts_are_estimates() {
        // Nothing listens on port 9: no endpoint; "other-model" is not the default model.
        let client = Client::new("http://127.0.0.1:9", Duration::from_secs(1));
        let m = Meter::discover(&client, "k", "other-model", None).unwrap();
        assert_eq!(m.source(), &MeterSource::Estimate);
        assert!(!m.exact());
        assert_eq!(m.count(&json!({"prompt": "hello"})), None);
    }
}
