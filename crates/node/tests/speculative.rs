#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Speculative decoding through the HTTP API of real servers (default model): a server with
//! `[engine] speculative_draft` answers exactly what one without it answers, for greedy and
//! seeded sampling, `n`, `stop`, `response_format` and log-probs, and keeps guesses doing so.

mod common;

use common::*;
use serde_json::{json, Value};

const PASSAGE: &str = "The harbour town woke slowly. Fishermen carried nets down the stone steps, \
    gulls circled the masts, and the baker on the corner opened his shutters to let the smell of \
    bread into the street.";

fn server(draft: usize) -> Server {
    let mut c = test_config();
    c.engine.speculative_draft = draft;
    start(c)
}

fn copy_request(extra: Value) -> Value {
    let mut b = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": format!("Copy this paragraph exactly.\n\n{PASSAGE}")}],
        "max_tokens": 48,
        "temperature": 0,
        "logprobs": true,
        "top_logprobs": 2,
    });
    if let (Some(b), Value::Object(e)) = (b.as_object_mut(), extra) {
        b.extend(e);
    }
    b
}

/// What a client sees of an answer: every choice's message, log-probs and finish reason, and
/// the token counts (the id and timestamp differ between servers).
fn answer(s: &Server, body: &Value) -> Value {
    let r = post_json(&s.url("/v1/chat/completions"), Some(ALICE), body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    json!({"choices": v["choices"], "usage": v["usage"]})
}

#[test]
fn a_server_verifying_guesses_answers_exactly_as_one_without_and_keeps_guesses() {
    let (plain, spec) = (server(0), server(8));
    let schema = json!({"type": "json_schema", "json_schema": {"name": "town", "strict": true, "schema": {
        "type": "object",
        "properties": {"town": {"type": "string"}, "morning": {"type": "string"}},
        "required": ["town", "morning"],
        "additionalProperties": false,
    }}});
    let cases = [
        json!({}),
        json!({"n": 2, "temperature": 0.8, "seed": 11}),
        json!({"stop": ["gulls"]}),
        json!({"response_format": schema, "max_tokens": 80}),
    ];
    for extra in cases {
        let body = copy_request(extra.clone());
        assert_eq!(answer(&spec, &body), answer(&plain, &body), "{extra}");
    }
    let stopped = answer(&spec, &copy_request(json!({"stop": ["gulls"]})));
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop", "{stopped}");
    let text = metrics_text(&spec);
    // How many follows the measured step time; that a copy's first guess is fed and kept does not.
    let kept = metric_or_zero(&text, "pagewarden_draft_tokens_accepted_total");
    assert!(kept >= 1.0, "copying a paragraph keeps guesses: {kept}");
    assert_eq!(metric_or_zero(&metrics_text(&plain), "pagewarden_draft_tokens_total"), 0.0);
}
