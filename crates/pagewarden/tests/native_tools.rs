#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Tools through a model's own template and call syntax: a Qwen 2.5 template's model is shown
//! the functions in its `<tools>` block and answers `<tool_call>` blocks, a Llama 3.1 template's
//! model its JSON with `parameters`, a Mistral v3 template's model `[TOOL_CALLS]` (its control
//! token) and an array; all read back as OpenAI `tool_calls`, streamed or not, and an earlier
//! turn's calls and results rendered as the template renders them.
//!
//! The models are small random ones of each architecture (`model::tiny`) carrying the real
//! templates (llama.cpp's test copies, rendered as llama.cpp renders them: the text crate's
//! `templates_vs_llamacpp`). Random weights say nothing useful, so the answers are held to the
//! grammar: a call always comes, and it must come in the model's own syntax, or it would not
//! be read back.

mod common;

use std::path::Path;

use gguf::write::GgufWriter;
use gguf::{Gguf, Value as Meta};
use model::tiny::{arch_gguf, Variant};
use serde_json::Value;
use text::{ChatTemplate, Conversation, Tokenizer};

fn template(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../text/tests/data/templates").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A synthetic model of `variant` carrying `template` as its chat template.
fn model_with_template(variant: Variant, template: &str) -> Vec<u8> {
    model_with_template_and_control(variant, template, None)
}

/// As [`model_with_template`], with the vocabulary's last merged token replaced by `control`
/// as a control token (and its merge dropped), as Mistral's vocabularies hold `[TOOL_CALLS]`.
fn model_with_template_and_control(variant: Variant, template: &str, control: Option<&str>) -> Vec<u8> {
    let src = arch_gguf(&variant.spec());
    let g = Gguf::parse(&src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        let mut v = v.clone();
        if let (Some(text), Meta::Array(a)) = (control, &mut v) {
            // The last merge makes the token just before BOS and EOS.
            let last = model::tiny::ARCH_VOCAB - 3;
            match k {
                "tokenizer.ggml.tokens" => a[last] = Meta::String(text.to_string()),
                "tokenizer.ggml.token_type" => a[last] = Meta::I32(3),
                "tokenizer.ggml.merges" => drop(a.pop()),
                _ => {}
            }
        }
        w.meta(k, v);
    }
    w.meta("tokenizer.chat_template", Meta::String(template.to_string()));
    for t in g.tensors() {
        w.tensor(&t.name, &t.dims, t.ty, g.tensor_data(&src, &t.name).unwrap().1.to_vec());
    }
    w.to_bytes()
}

/// The prompt's token count for `body` as the model's template renders it natively.
fn native_prompt_tokens(file: &Path, body: &str) -> usize {
    let bytes = std::fs::read(file).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    let (tokenizer, tmpl) = (Tokenizer::from_gguf(&g).unwrap(), ChatTemplate::from_gguf(&g).unwrap());
    let conv: Conversation = serde_json::from_str(body).unwrap();
    tmpl.encode(&tokenizer, &tmpl.render_with(&conv).unwrap()).unwrap().len()
}

/// The tool, with its parameters' keys deliberately out of alphabetical order (`unit` before
/// `city`): the template must show them as the client wrote them.
const WEATHER: &str = r#"{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}, "city": {"type": "string", "enum": ["Rome", "Paris"]}}, "required": ["unit", "city"]}}}"#;

struct Served {
    server: common::Server,
    qwen: std::path::PathBuf,
    llama: std::path::PathBuf,
    mistral: std::path::PathBuf,
}

fn serve() -> Served {
    let dir = launch::scratch_dir("pw-native-tools").unwrap();
    let qwen = dir.join("qwen2.gguf");
    let llama = dir.join("llama3.gguf");
    std::fs::write(&qwen, model_with_template(Variant::Qwen2, &template("Qwen-Qwen2.5-7B-Instruct.jinja"))).unwrap();
    let llama_bytes = model_with_template(Variant::Llama3Rope, &template("meta-llama-Llama-3.1-8B-Instruct.jinja"));
    std::fs::write(&llama, llama_bytes).unwrap();
    let mistral = dir.join("mistral.gguf");
    let v3 = template("mistralai-v3-Mistral-Large-Instruct-2407.jinja");
    std::fs::write(&mistral, model_with_template_and_control(Variant::Llama, &v3, Some("[TOOL_CALLS]"))).unwrap();
    let config = dir.join("pagewarden.toml");
    let models = format!(
        "[[models]]\nname = \"qwen\"\nfile = \"{}\"\ncontext_window = 2048\npool = {{ tokens = 8192 }}\n\n\
         [[models]]\nname = \"llama3\"\nfile = \"{}\"\ncontext_window = 2048\npool = {{ tokens = 8192 }}\n\n\
         [[models]]\nname = \"mistral\"\nfile = \"{}\"\ncontext_window = 512\npool = {{ tokens = 8192 }}\n\n",
        qwen.display(),
        llama.display(),
        mistral.display()
    );
    std::fs::write(&config, format!("{models}{}", common::metrics_section(&dir))).unwrap();
    let key = launch::tenant_add(common::bin().as_ref(), &config, "tools").unwrap();
    Served { server: common::Server::start_with(dir, key), qwen, llama, mistral }
}

/// POSTs `body` as written (key order kept) to the chat endpoint.
fn post_raw(server: &common::Server, body: &str) -> (u16, String) {
    let url = format!("{}/v1/chat/completions", server.url);
    launch::post_json(&url, &server.key, body, std::time::Duration::from_secs(120)).unwrap()
}

/// The one call of a non-streamed answer, checked against the tool's schema.
fn one_call(answer: &str) -> Value {
    let v: Value = serde_json::from_str(answer).unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert!(choice["message"]["content"].is_null(), "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(["Rome", "Paris"].contains(&args["city"].as_str().unwrap()), "{args}");
    assert!(["c", "f"].contains(&args["unit"].as_str().unwrap()), "{args}");
    v
}

#[test]
fn tools_go_through_each_models_own_template_and_come_back_in_its_syntax() {
    let s = serve();

    // Qwen 2.5: a required call, one block.
    let body = format!(
        r#"{{"model": "qwen", "messages": [{{"role": "user", "content": "What is the weather in Rome?"}}], "tools": [{WEATHER}], "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 200}}"#
    );
    let (status, answer) = post_raw(&s.server, &body);
    assert_eq!(status, 200, "{answer}");
    let v = one_call(&answer);
    // The prompt is the template's own rendering of the tools (a `<tools>` block with the
    // schema as written), not a system message of the gateway's.
    assert_eq!(v["usage"]["prompt_tokens"], native_prompt_tokens(&s.qwen, &body), "{v}");

    // The same, streamed: the call arrives as one `tool_calls` delta with its index.
    let streamed = body.replace(r#""max_tokens": 200"#, r#""max_tokens": 200, "stream": true"#);
    let (status, text) = post_raw(&s.server, &streamed);
    assert_eq!(status, 200, "{text}");
    let chunks: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let calls: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
    assert_eq!(calls.len(), 1, "{text}");
    assert_eq!(calls[0][0]["index"], 0);
    assert_eq!(calls[0][0]["function"]["name"], "get_weather");
    assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"] == "tool_calls"), "{text}");

    // An earlier turn's call and its result, rendered by the template (`<tool_call>` in the
    // assistant turn, `<tool_response>` in a user turn), and `auto`'s grammar compiles.
    let history = format!(
        r#"{{"model": "qwen", "messages": [{{"role": "user", "content": "What is the weather in Rome?"}}, {{"role": "assistant", "content": null, "tool_calls": [{{"id": "call_1", "type": "function", "function": {{"name": "get_weather", "arguments": "{{\"unit\": \"c\", \"city\": \"Rome\"}}"}}}}]}}, {{"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}}], "tools": [{WEATHER}], "max_tokens": 4}}"#
    );
    let (status, answer) = post_raw(&s.server, &history);
    assert_eq!(status, 200, "{answer}");
    let v: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], native_prompt_tokens(&s.qwen, &history), "{v}");

    // Llama 3.1: a named function, answered as its JSON with `parameters`.
    let body = format!(
        r#"{{"model": "llama3", "messages": [{{"role": "system", "content": "You help with the weather."}}, {{"role": "user", "content": "Weather in Paris?"}}], "tools": [{WEATHER}], "tool_choice": {{"type": "function", "function": {{"name": "get_weather"}}}}, "max_tokens": 200}}"#
    );
    let (status, answer) = post_raw(&s.server, &body);
    assert_eq!(status, 200, "{answer}");
    let v = one_call(&answer);
    assert_eq!(v["usage"]["prompt_tokens"], native_prompt_tokens(&s.llama, &body), "{v}");

    // Mistral v3: `[TOOL_CALLS]`, a control token of its vocabulary, then the array; the call's
    // id is nine letters and digits, so it can come back in the history, which the template
    // renders (and would refuse with another id).
    let body = format!(
        r#"{{"model": "mistral", "messages": [{{"role": "user", "content": "Weather in Rome?"}}], "tools": [{WEATHER}], "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 200}}"#
    );
    let (status, answer) = post_raw(&s.server, &body);
    assert_eq!(status, 200, "{answer}");
    let v: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], native_prompt_tokens(&s.mistral, &body), "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert!(!calls.is_empty(), "{v}");
    let ids: Vec<&str> = calls.iter().map(|c| c["id"].as_str().unwrap()).collect();
    for (c, id) in calls.iter().zip(&ids) {
        assert_eq!(c["function"]["name"], "get_weather", "{v}");
        assert!(id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
    }
    assert!(ids.iter().enumerate().all(|(i, id)| !ids[..i].contains(id)), "ids repeat: {ids:?}");
    let call = &calls[0];
    let args = serde_json::to_string(call["function"]["arguments"].as_str().unwrap()).unwrap();
    let history = |id: &str| {
        format!(
            r#"{{"model": "mistral", "messages": [{{"role": "user", "content": "Weather in Rome?"}}, {{"role": "assistant", "content": null, "tool_calls": [{{"id": "{id}", "type": "function", "function": {{"name": "get_weather", "arguments": {args}}}}}]}}, {{"role": "tool", "tool_call_id": "{id}", "content": "18 C"}}], "tools": [{WEATHER}], "max_tokens": 2}}"#
        )
    };
    let (status, answer) = post_raw(&s.server, &history(ids[0]));
    assert_eq!(status, 200, "{answer}");
    let v: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], native_prompt_tokens(&s.mistral, &history(ids[0])), "{v}");
    // Another server's id (not nine letters and digits): the template's own refusal, as a 400.
    let (status, answer) = post_raw(&s.server, &history("call_1"));
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("Tool call IDs should be alphanumeric strings with length 9"), "{answer}");

    // A body naming `tools` twice would show the template one list and hold the answer to
    // another; a description that is no text cannot be printed: both are the client's 400.
    let twice = format!(
        r#"{{"model": "qwen", "messages": [{{"role": "user", "content": "Hi"}}], "tools": [], "tools": [{WEATHER}]}}"#
    );
    let described = r#"{"model": "qwen", "messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function", "function": {"name": "f", "description": {"text": "x"}}}]}"#;
    for (body, param) in [(twice.as_str(), "tools"), (described, "tools[0].function.description")] {
        let (status, answer) = post_raw(&s.server, body);
        assert_eq!(status, 400, "{answer}");
        let v: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(v["error"]["param"], param, "{v}");
    }

    // A plain chat renders exactly as before on both (the template alone).
    for (model, file) in [("qwen", &s.qwen), ("llama3", &s.llama), ("mistral", &s.mistral)] {
        let body = format!(
            r#"{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello there"}}], "max_tokens": 2}}"#
        );
        let (status, answer) = post_raw(&s.server, &body);
        assert_eq!(status, 200, "{answer}");
        let v: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(v["usage"]["prompt_tokens"], native_prompt_tokens(file, &body), "{model}: {v}");
    }
}
