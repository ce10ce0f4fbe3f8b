//! Counting what the audit sends: every prompt's length in tokens, measured by the audit, never
//! taken from the answer it judges.
//!
//! The incident's server answered an over-long prompt with 200 and a `usage` that said the
//! prompt was one token long; an audit that believes the server's own count excuses exactly
//! that. So the audit counts each prompt itself, with (in order of preference):
//! 1. the target's tokenizer endpoint, when it has one (`POST /tokenize` as vLLM serves it, or
//!    llama-server's `/tokenize` and `/apply-template`): the target's own tokenizer and template,
//!    asked about the prompt alone, apart from the request it judges;
//! 2. the model's tokenizer and chat template read from a GGUF file (`--tokenizer`, or the
//!    packaged model of that name when the target serves one), rendered and tokenized as
//!    pagewarden and llama.cpp do;
//! 3. nothing: sizes are then estimates, and only gross under-counts are judged.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::{json, Value};

use super::client::Client;

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

/// The model's own tokenizer and template, for counting locally.
struct Local {
    tokenizer: text::Tokenizer,
    template: text::ChatTemplate,
}

/// Counts prompt tokens of request bodies.
pub struct Meter<'a> {
    source: MeterSource,
    client: &'a Client,
    key: String,
    model: String,
    local: Option<Local>,
}

/// Loads the tokenizer and chat template of a GGUF file.
fn local_from(path: &Path) -> Result<Local> {
    let f = gguf::GgufFile::open(path).with_context(|| format!("opening {}", path.display()))?;
    let tokenizer = text::Tokenizer::from_gguf(&f).context("reading the tokenizer")?;
    let template = text::ChatTemplate::from_gguf(&f).context("reading the chat template")?;
    Ok(Local { tokenizer, template })
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

impl<'a> Meter<'a> {
    /// Picks the best source the target and the options allow: a given `--tokenizer` file wins
    /// (the operator said so), then the target's endpoint, then the packaged model's file.
    pub fn discover(client: &'a Client, key: &str, model: &str, tokenizer: Option<&Path>) -> Result<Meter<'a>> {
        let mut m = Meter {
            source: MeterSource::Estimate,
            client,
            key: key.to_string(),
            model: model.to_string(),
            local: None,
        };
        if let Some(path) = tokenizer {
            m.local = Some(local_from(path)?);
            m.source = MeterSource::ModelFile { path: path.to_path_buf() };
            return Ok(m);
        }
        let probe = json!({"model": model, "prompt": "Hello world"});
        if let Ok((200, text)) = client.post("/tokenize", key, &probe) {
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if v["count"].as_u64().is_some_and(|n| n > 0) {
                m.source = MeterSource::VllmTokenize;
                return Ok(m);
            }
        }
        if let Ok((200, text)) = client.post("/tokenize", key, &json!({"content": "Hello world"})) {
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if v["tokens"].as_array().is_some_and(|t| !t.is_empty()) {
                m.source = MeterSource::LlamaCppTokenize;
                return Ok(m);
            }
        }
        if let Some(path) = packaged_model_for(model) {
            if let Ok(local) = local_from(&path) {
                m.local = Some(local);
                m.source = MeterSource::ModelFile { path };
            }
        }
        Ok(m)
    }

    pub fn source(&self) -> &MeterSource {
        &self.source
    }

    /// Whether counts are exact (a tokenizer), not estimates.
    pub fn exact(&self) -> bool {
        self.source != MeterSource::Estimate
    }

    /// The prompt of `body` in tokens, counted as the target counts it; None when the audit
    /// has no tokenizer or the endpoint did not answer.
    pub fn count(&self, body: &Value) -> Option<usize> {
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
                        Some(l.tokenizer.encode_prompt(&rendered, true).ok()?.len())
                    }
                    (None, Some(p)) => Some(l.tokenizer.encode_prompt(p, false).ok()?.len()),
                    _ => None,
                }
            }
            MeterSource::VllmTokenize => {
                let mut b = json!({"model": self.model});
                match (messages, prompt) {
                    (Some(ms), _) => {
                        b["messages"] = ms.clone();
                        b["add_generation_prompt"] = json!(true);
                    }
                    (None, Some(p)) => b["prompt"] = json!(p),
                    _ => return None,
                }
                let v = self.post("/tokenize", &b)?;
                v["count"].as_u64().map(|n| n as usize)
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
                v["tokens"].as_array().map(Vec::len)
            }
        }
    }

    fn post(&self, path: &str, body: &Value) -> Option<Value> {
        match self.client.post(path, &self.key, body) {
            Ok((200, text)) => serde_json::from_str(&text).ok(),
            _ => None,
        }
    }
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
        assert_eq!(m.count(&chat), Some(l.tokenizer.encode_prompt(&rendered, true).unwrap().len()));
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
