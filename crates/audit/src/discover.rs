//! The first phase, for one model: its context window, batch invariance and how many tokens a
//! word of filler costs, asked of the server itself.

use serde_json::{json, Value};

use crate::client::Client;
use crate::error::AuditError;
use crate::meter::Meter;
use crate::options::AuditOptions;
use crate::rng::Rng;
use crate::workload::{self, Calibration, Endpoint};

/// `max_tokens` of a length probe: over any context window, so nothing is ever computed.
const PROBE_MAX_TOKENS: u64 = 1 << 30;

/// The first number after `pat` in `msg`, or the last one before it.
fn number_near(msg: &str, pat: &str, after: bool) -> Option<usize> {
    let i = msg.find(pat)?;
    if after {
        let rest = &msg[i + pat.len()..];
        let digits: String =
            rest.chars().skip_while(|c| !c.is_ascii_digit()).take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    } else {
        let head = msg[..i].trim_end();
        let digits: String = head.chars().rev().take_while(char::is_ascii_digit).collect();
        digits.chars().rev().collect::<String>().parse().ok()
    }
}

/// (context window, prompt tokens) from a context-length refusal, in the wordings of
/// pagewarden ("... is 8192 tokens; the request needs N (P in the prompt + M to generate)"),
/// OpenAI and vLLM ("(P in the messages, M in the completion)", "resulted in P tokens").
fn parse_lengths(msg: &str) -> (Option<usize>, Option<usize>) {
    let context = number_near(msg, "maximum context length is", true);
    let prompt = number_near(msg, " in the prompt", false)
        .or_else(|| number_near(msg, " in the messages", false))
        .or_else(|| number_near(msg, "resulted in", true));
    (context, prompt)
}

/// Sends `body` with an impossible `max_tokens`; the refusal states the lengths.
pub(crate) fn probe(client: &Client, key: &str, endpoint: &str, body: &Value) -> (Option<usize>, Option<usize>) {
    let mut b = body.clone();
    b["max_tokens"] = json!(PROBE_MAX_TOKENS);
    b["stream"] = json!(false);
    if let Some(o) = b.as_object_mut() {
        o.remove("stream_options");
    }
    match client.post(endpoint, key, &b) {
        Ok((400, text)) => {
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            parse_lengths(v["error"]["message"].as_str().unwrap_or_default())
        }
        _ => (None, None),
    }
}

/// The context window: from `/v1/models` when the server lists it, else from a probe.
pub(crate) fn discover_window(client: &Client, key: &str, model: &str, models: &Value) -> Result<usize, AuditError> {
    if let Some(n) = listed_window(models, model) {
        return Ok(n);
    }
    let body = workload::body(model, Endpoint::Chat, "Say hello.", 1, false, 0);
    match probe(client, key, Endpoint::Chat.path(), &body) {
        (Some(n), _) => Ok(n),
        _ => Err(AuditError::Target("cannot find the deployment's context window: pass --context-window N".into())),
    }
}

/// The window `/v1/models` states for `model`: the OpenAI-style fields of pagewarden, vLLM and
/// SGLang, else llama-server's `meta.n_ctx` (what a slot holds; `n_ctx_train`, the model's
/// training length, is only a last resort: llama-server serves `-c`, often far less).
fn listed_window(models: &Value, model: &str) -> Option<usize> {
    let m = models["data"].as_array()?.iter().find(|m| m["id"] == model)?;
    ["context_length", "context_window", "max_model_len", "max_context_length"]
        .iter()
        .find_map(|k| m[*k].as_u64())
        .or_else(|| m["meta"]["n_ctx"].as_u64())
        .or_else(|| m["meta"]["n_ctx_train"].as_u64())
        .map(|n| n as usize)
}

/// Tokens per filler word, from two prompts (no filler, 1,000 words) counted by the audit's own
/// tokenizer, else by the server's refusals; also the context window the server states, if it
/// does.
pub(crate) fn calibrate(client: &Client, key: &str, model: &str, meter: &Meter) -> (Calibration, Option<usize>) {
    let mut rng = Rng::new(0x5eed);
    let make = |words: &str| {
        let prompt = format!("The secret code is kavorimu-tezulani-4821. {words} Repeat the secret code exactly.");
        workload::body(model, Endpoint::Chat, &prompt, 1, false, 0)
    };
    let text = crate::prose::filler(&mut rng, 1000);
    let (window, a) = probe(client, key, Endpoint::Chat.path(), &make(""));
    let (a, b) = match (meter.count(&make("")), meter.count(&make(&text))) {
        (Some(a), Some(b)) => (Some(a), Some(b)),
        _ => (a, probe(client, key, Endpoint::Chat.path(), &make(&text)).1),
    };
    let cal = match (a, b) {
        (Some(a), Some(b)) if b > a => {
            Calibration { tokens_per_word: (b - a) as f64 / 1000.0, base_tokens: a, measured: true }
        }
        _ => Calibration::guess(),
    };
    (cal, window)
}

/// Texts the audit's own tokenizer and the target's endpoint must count alike: a short one,
/// a canary sentence, and the calibration's 1,000 words of filler.
pub(crate) fn cross_check_texts() -> Vec<String> {
    let mut rng = Rng::new(0x5eed);
    vec![
        "Hello world".to_string(),
        "The secret code is kavorimu-tezulani-4821. Repeat the secret code exactly.".to_string(),
        crate::prose::filler(&mut rng, 1000),
    ]
}

/// Whether the target's outputs are bit-identical alone and batched: as told, else as its
/// `/v1/models` entry declares (`batch_invariant`), else not assumed.
pub(crate) fn batch_invariant(opts: &AuditOptions, models: &Value, model: &str) -> bool {
    opts.batch_invariant.unwrap_or_else(|| {
        models["data"]
            .as_array()
            .and_then(|d| d.iter().find(|m| m["id"] == model))
            .and_then(|m| m["batch_invariant"].as_bool())
            .unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_from_refusals_of_several_servers() {
        let pw = "this model's maximum context length is 8192 tokens; the request needs 1073741848 \
                  (24 in the prompt + 1073741824 to generate)";
        assert_eq!(parse_lengths(pw), (Some(8192), Some(24)));
        let vllm = "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens \
                    (4000 in the messages, 1000 in the completion).";
        assert_eq!(parse_lengths(vllm), (Some(4096), Some(4000)));
        let openai = "This model's maximum context length is 128000 tokens. However, your messages resulted in \
                      130000 tokens. Please reduce the length of the messages.";
        assert_eq!(parse_lengths(openai), (Some(128000), Some(130000)));
        assert_eq!(parse_lengths("max_tokens is too large"), (None, None));
    }

    #[test]
    fn the_window_a_server_lists_is_the_one_it_serves_not_the_models_training_length() {
        let pw = json!({"data": [{"id": "m", "context_length": 1024}]});
        assert_eq!(listed_window(&pw, "m"), Some(1024));
        let vllm = json!({"data": [{"id": "m", "max_model_len": 4096}]});
        assert_eq!(listed_window(&vllm, "m"), Some(4096));
        // llama-server 0c1e570 with -c 4096 -np 4: each slot holds 1,024 of a model trained on 8,192.
        let llama = json!({"data": [{"id": "m", "meta": {"n_ctx": 1024, "n_ctx_train": 8192}}]});
        assert_eq!(listed_window(&llama, "m"), Some(1024));
        let old_llama = json!({"data": [{"id": "m", "meta": {"n_ctx_train": 8192}}]});
        assert_eq!(listed_window(&old_llama, "m"), Some(8192));
        assert_eq!(listed_window(&llama, "other"), None);
        assert_eq!(listed_window(&json!({"data": [{"id": "m"}]}), "m"), None);
    }
}
