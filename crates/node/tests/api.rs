#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The HTTP API against one real server (default model) shared by the tests of this file.

mod common;

use std::sync::OnceLock;

use common::*;
use serde_json::{json, Value};

fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| start(test_config()))
}

fn chat_url() -> String {
    server().url("/v1/chat/completions")
}

fn completions_url() -> String {
    server().url("/v1/completions")
}

fn hello(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 8,
        "temperature": 0,
    });
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
    body
}

#[test]
fn chat_completion_has_openai_shape_and_usage() {
    let r = post_json(&chat_url(), Some(ALICE), &hello(json!({})));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert!(v["id"].as_str().is_some_and(|s| s.starts_with("chatcmpl-")), "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    assert!(v["created"].as_u64().is_some());
    let c = &v["choices"][0];
    assert_eq!(c["index"], 0);
    assert_eq!(c["message"]["role"], "assistant");
    assert!(!c["message"]["content"].as_str().unwrap_or_default().is_empty(), "{v}");
    assert!(c["finish_reason"] == "stop" || c["finish_reason"] == "length");
    assert!(c.get("logprobs").is_some());
    let u = &v["usage"];
    let (p, n) = (u["prompt_tokens"].as_u64().unwrap(), u["completion_tokens"].as_u64().unwrap());
    assert!(p > 5 && (1..=8).contains(&n), "{u}");
    assert_eq!(u["total_tokens"].as_u64(), Some(p + n));
}

#[test]
fn greedy_chat_is_deterministic_and_logprobs_are_reported() {
    let body = hello(json!({"logprobs": true, "top_logprobs": 2}));
    let a = post_json(&chat_url(), Some(ALICE), &body).json();
    let b = post_json(&chat_url(), Some(BOB), &body).json();
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
    let content = a["choices"][0]["logprobs"]["content"].as_array().expect("logprobs.content").clone();
    assert_eq!(content.len() as u64, a["usage"]["completion_tokens"].as_u64().unwrap());
    assert!(content[0]["logprob"].as_f64().unwrap() <= 0.0);
    assert_eq!(content[0]["top_logprobs"].as_array().map(Vec::len), Some(2));
}

#[test]
fn streaming_chat_ends_with_done_and_carries_role_content_finish_and_usage() {
    let r =
        post_json(&chat_url(), Some(ALICE), &hello(json!({"stream": true, "stream_options": {"include_usage": true}})));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.header("content-type").is_some_and(|c| c.starts_with("text/event-stream")));
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{}", r.body);
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
    assert!(!text.is_empty());
    let finals: Vec<&Value> = chunks.iter().filter(|c| !c["choices"][0]["finish_reason"].is_null()).collect();
    assert_eq!(finals.len(), 1, "{}", r.body);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert!(usage["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
    // Streaming and not give the same text for the same greedy request.
    let full = post_json(&chat_url(), Some(ALICE), &hello(json!({}))).json();
    assert_eq!(full["choices"][0]["message"]["content"].as_str(), Some(text.as_str()));
}

#[test]
fn streaming_without_include_usage_has_no_usage_chunk() {
    let r = post_json(&chat_url(), Some(BOB), &hello(json!({"stream": true, "max_tokens": 3})));
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        assert!(c.get("usage").is_none(), "{e}");
        assert_eq!(c["choices"].as_array().map(Vec::len), Some(1));
    }
}

#[test]
fn completions_endpoint_returns_text_completion() {
    let body =
        json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 5, "temperature": 0, "logprobs": 1});
    let r = post_json(&completions_url(), Some(ALICE), &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert!(v["id"].as_str().is_some_and(|s| s.starts_with("cmpl-")));
    assert_eq!(v["object"], "text_completion");
    assert!(v["choices"][0]["text"].as_str().is_some());
    assert_eq!(v["choices"][0]["logprobs"]["tokens"].as_array().map(Vec::len), Some(5));
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    let s = post_json(
        &completions_url(),
        Some(ALICE),
        &json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 5, "temperature": 0, "stream": true}),
    );
    let events = s.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    assert_eq!(Some(text.as_str()), v["choices"][0]["text"].as_str());
}

#[test]
fn models_lists_the_served_model_its_window_and_its_batch_invariance() {
    let r = get(&server().url("/v1/models"), Some(ALICE));
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["batch_invariant"], true);
    // The window the server enforces: one token under it is accepted, at it refused.
    let window = v["data"][0]["context_length"].as_u64().expect("context_length") as usize;
    let r = post_json(&chat_url(), Some(ALICE), &hello(json!({"max_tokens": window})));
    assert_eq!(r.status, 400);
    assert_eq!(r.error()["code"], "context_length_exceeded");
    let m = r.error()["message"].as_str().unwrap_or_default().to_string();
    assert!(m.contains(&format!("maximum context length is {window} tokens")), "{m}");
}

#[test]
fn wrong_key_and_missing_key_are_401_in_the_envelope() {
    let wrong = post_json(&chat_url(), Some("not-a-key"), &hello(json!({})));
    assert_eq!(wrong.status, 401);
    assert_eq!(wrong.error()["code"], "invalid_api_key");
    let missing = post_json(&chat_url(), None, &hello(json!({})));
    assert_eq!(missing.status, 401);
    missing.error();
    assert_eq!(get(&server().url("/v1/models"), None).status, 401);
}

#[test]
fn unknown_model_is_404() {
    let r = post_json(&chat_url(), Some(ALICE), &hello(json!({"model": "gpt-5"})));
    assert_eq!(r.status, 404, "{}", r.body);
    let e = r.error();
    assert_eq!(e["param"], "model");
    assert_eq!(e["code"], "model_not_found");
}

#[test]
fn wrong_method_is_405_and_unknown_route_404_in_the_envelope() {
    let r = get(&chat_url(), Some(ALICE));
    assert_eq!(r.status, 405, "{}", r.body);
    assert_eq!(r.error()["type"], "invalid_request_error");
    let r = get(&server().url("/v1/nothing-here"), Some(ALICE));
    assert_eq!(r.status, 404);
    r.error();
}

#[test]
fn malformed_json_is_400_not_422() {
    let r = post(&chat_url(), Some(ALICE), "{\"model\": ");
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.error()["type"], "invalid_request_error");
    let r = post(&chat_url(), Some(ALICE), "[1, 2]");
    assert_eq!(r.status, 400);
}

#[test]
fn bad_field_is_400_naming_the_param() {
    let r = post_json(&chat_url(), Some(ALICE), &hello(json!({"temperature": 9})));
    assert_eq!(r.status, 400, "{}", r.body);
    let e = r.error();
    assert_eq!(e["param"], "temperature");
    assert!(e["message"].as_str().unwrap().contains("[0, 2]"));
    let r = post_json(&chat_url(), Some(ALICE), &hello(json!({"max_tokens": "many"})));
    assert_eq!((r.status, r.error()["param"].clone()), (400, json!("max_tokens")));
    // Within the 1024-token window, over the configured ceiling of 950.
    let r = post_json(&chat_url(), Some(ALICE), &hello(json!({"max_tokens": 980})));
    assert_eq!((r.status, r.error()["param"].clone()), (400, json!("max_tokens")), "{}", r.body);
    assert!(r.error()["message"].as_str().unwrap().contains("950"), "{}", r.body);
    let r = post_json(&chat_url(), Some(ALICE), &hello(json!({"stop": ["a", "b", "c", "d", "e"]})));
    assert_eq!((r.status, r.error()["param"].clone()), (400, json!("stop")));
    let r =
        post_json(&chat_url(), Some(ALICE), &json!({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}));
    assert_eq!((r.status, r.error()["param"].clone()), (400, json!("messages[0].role")));
}

#[test]
fn n_returns_that_many_choices_with_usage_summed_and_out_of_range_n_is_400() {
    let body = hello(json!({"n": 3, "max_tokens": 4, "ignore_eos": true, "temperature": 1.0, "seed": 5}));
    let r = post_json(&chat_url(), Some(ALICE), &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{v}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["finish_reason"], "length");
        assert!(c["message"]["content"].is_string());
    }
    // The prompt counts once; every choice's tokens count.
    let single = post_json(&chat_url(), Some(ALICE), &hello(json!({"max_tokens": 4, "ignore_eos": true}))).json();
    assert_eq!(v["usage"]["prompt_tokens"], single["usage"]["prompt_tokens"]);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    // Seeded: the same request gives the same choices.
    assert_eq!(post_json(&chat_url(), Some(ALICE), &body).json()["choices"], v["choices"]);
    for n in [0, 17] {
        let r = post_json(&chat_url(), Some(ALICE), &hello(json!({"n": n})));
        assert_eq!((r.status, r.error()["param"].clone()), (400, json!("n")), "{}", r.body);
    }
}

#[test]
fn streaming_n_choices_carry_their_index_and_end_with_one_done() {
    let body = hello(json!({"n": 2, "max_tokens": 3, "ignore_eos": true, "stream": true,
        "stream_options": {"include_usage": true}}));
    let r = post_json(&chat_url(), Some(ALICE), &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let events = r.events();
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> =
        events.iter().filter(|e| *e != "[DONE]").map(|e| serde_json::from_str(e).unwrap()).collect();
    for i in 0..2 {
        let mine: Vec<&Value> =
            chunks.iter().flat_map(|c| c["choices"].as_array().unwrap()).filter(|c| c["index"] == i).collect();
        assert_eq!(mine.first().unwrap()["delta"]["role"], "assistant", "choice {i}");
        assert_eq!(mine.iter().filter(|c| c["finish_reason"] == "length").count(), 1, "choice {i}");
    }
    let usage = chunks.iter().find(|c| c["usage"].is_object()).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 6);
}

#[test]
fn logit_bias_forces_or_bans_tokens_and_bad_entries_are_400() {
    let path = node::model_path(&test_config()).unwrap();
    let file = gguf::GgufFile::open(&path).unwrap();
    let tok = text::Tokenizer::from_gguf(&file).unwrap();
    // Forcing: +100 on one token makes greedy decoding repeat it.
    let id = tok.encode(" banana", false).unwrap()[0];
    let body = json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0,
        "ignore_eos": true, "logit_bias": {id.to_string(): 100}});
    let r = post_json(&completions_url(), Some(ALICE), &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], tok.decode(&[id, id, id]).unwrap());
    // Banning: -100 on the greedy first token makes another come first.
    let plain = json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 1, "temperature": 0});
    let first = post_json(&completions_url(), Some(ALICE), &plain).json()["choices"][0]["text"].clone();
    let first_id = tok.encode(first.as_str().unwrap(), false).unwrap()[0];
    let mut banned = plain.clone();
    banned["logit_bias"] = json!({first_id.to_string(): -100});
    let r = post_json(&completions_url(), Some(ALICE), &banned);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_ne!(r.json()["choices"][0]["text"], first);
    for bad in [json!({"abc": 1}), json!({"99999999": 1}), json!({"5": 101}), json!({"5": "x"}), json!([1])] {
        let r = post_json(&chat_url(), Some(ALICE), &hello(json!({"logit_bias": bad})));
        assert_eq!((r.status, r.error()["param"].clone()), (400, json!("logit_bias")), "{}", r.body);
    }
}

#[test]
fn unknown_or_unsupported_fields_are_400_naming_them_and_no_effect_fields_are_accepted() {
    let r = post_json(&chat_url(), Some(ALICE), &hello(json!({"some_future_field": {"x": 1}})));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.error()["param"], "some_future_field");
    assert_eq!(r.error()["code"], "unknown_parameter");
    let r = post_json(&chat_url(), Some(ALICE), &hello(json!({"audio": {"voice": "alloy"}})));
    assert_eq!((r.status, r.error()["param"].clone()), (400, json!("audio")), "{}", r.body);
    assert_eq!(r.error()["code"], "unsupported_parameter");
    // A schema that does not compile is refused before anything runs.
    let schema = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}});
    let r = post_json(&chat_url(), Some(ALICE), &hello(json!({"response_format": schema})));
    assert_eq!((r.status, r.error()["param"].clone()), (400, json!("response_format")), "{}", r.body);
    let r = post_json(
        &completions_url(),
        Some(ALICE),
        &json!({"model": MODEL, "prompt": "x", "max_tokens": 1, "best_of": 3}),
    );
    assert_eq!((r.status, r.error()["param"].clone()), (400, json!("best_of")), "{}", r.body);
    let r = post_json(
        &chat_url(),
        Some(ALICE),
        &hello(json!({"user": "u1", "metadata": {"k": "v"}, "store": false, "max_tokens": 2})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn completions_echo_puts_the_prompt_before_the_text() {
    let body = json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0});
    let plain = post_json(&completions_url(), Some(ALICE), &body).json()["choices"][0]["text"].clone();
    let mut echoed = body.clone();
    echoed["echo"] = json!(true);
    let r = post_json(&completions_url(), Some(ALICE), &echoed);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], format!("The capital of France is{}", plain.as_str().unwrap()));
    echoed["logprobs"] = json!(1);
    let r = post_json(&completions_url(), Some(ALICE), &echoed);
    assert_eq!((r.status, r.error()["param"].clone()), (400, json!("echo")), "{}", r.body);
}

#[test]
fn body_too_large_is_413() {
    let big = "x".repeat(70_000);
    let r =
        post_json(&chat_url(), Some(ALICE), &json!({"model": MODEL, "messages": [{"role": "user", "content": big}]}));
    assert_eq!(r.status, 413, "{}", r.body);
    r.error();
}

#[test]
fn prompt_over_the_context_window_is_400_context_length_exceeded() {
    let long = "hello ".repeat(1100);
    let r = post_json(&completions_url(), Some(BOB), &json!({"model": MODEL, "prompt": long, "max_tokens": 4}));
    assert_eq!(r.status, 400, "{}", r.body);
    let e = r.error();
    assert_eq!(e["code"], "context_length_exceeded");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("1024"), "{msg}");
}

#[test]
fn stop_string_cuts_output_and_is_not_emitted() {
    // Greedy continuation of a count: find a stop string that really occurs in the output.
    let base = json!({"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 12, "temperature": 0});
    let free = post_json(&completions_url(), Some(ALICE), &base).json();
    let text = free["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(text.contains(" 9"), "expected the count to continue: {text:?}");
    let expected = &text[..text.find(" 9").unwrap()];

    let mut with_stop = base.clone();
    with_stop["stop"] = json!([" 9", "never-happens"]);
    let v = post_json(&completions_url(), Some(ALICE), &with_stop).json();
    assert_eq!(v["choices"][0]["text"].as_str(), Some(expected), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    with_stop["stream"] = json!(true);
    let r = post_json(&completions_url(), Some(ALICE), &with_stop);
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect::<Vec<_>>().concat();
    assert_eq!(streamed, expected);
    assert!(!streamed.contains(" 9"));
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "stop");
}

#[test]
fn health_ready_and_metrics_are_served() {
    assert_eq!(get(&server().url("/health"), None).status, 200);
    assert_eq!(get(&server().url("/ready"), None).status, 200);
    let m = get(&server().url("/metrics"), Some(METRICS_TOKEN));
    assert_eq!(m.status, 200);
    for name in [
        "pagewarden_requests_total",
        "pagewarden_time_to_first_token_seconds",
        "pagewarden_inter_token_latency_seconds",
        "pagewarden_queue_depth",
        "pagewarden_running_sequences",
        "pagewarden_kv_pages_total",
        "pagewarden_kv_pages_used",
        "pagewarden_rejections_total",
        "pagewarden_isolation_violations_total",
        "pagewarden_engine_steps_total",
        "pagewarden_prefill_tokens_total",
        "pagewarden_decode_tokens_total",
    ] {
        // OpenMetrics names a counter's family without the `_total` its samples carry.
        let counter = name.strip_suffix("_total").map(|f| format!("# TYPE {f} counter"));
        let declared = m.body.contains(&format!("# TYPE {name} ")) || counter.is_some_and(|c| m.body.contains(&c));
        assert!(declared, "{name} missing");
    }
    assert_eq!(metric(&m.body, "pagewarden_kv_pages_total"), 128.0);
}
