//! Which request fields each endpoint knows, and the values of OpenAI's fields this server
//! cannot honour. No field is silently ignored: each one is implemented, accepted because it
//! cannot change an answer here (`user`: an end-user label; `metadata`: labels for stored
//! completions, and nothing is stored), or refused with a 400 that names it, so a client asking
//! for something it will not get learns so before spending tokens.

use serde_json::{Map, Value};

use super::endpoint::Endpoint;
use crate::error::ApiError;

/// Fields both endpoints take.
const COMMON: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "seed",
    "user",
    // Extensions of vLLM and llama.cpp.
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "cache_salt",
];

const CHAT: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "store",
    "metadata",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "verbosity",
    "web_search_options",
];

const COMPLETIONS: &[&str] = &["prompt", "echo", "suffix", "best_of"];

fn unsupported(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::unsupported_param(param, message)
}

fn present<'a>(o: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    o.get(name).filter(|v| !v.is_null())
}

/// Refuses a field this endpoint does not know, and a known field whose value asks for what this
/// server does not do. The values it lets through are checked by the validator.
pub fn check(o: &Map<String, Value>, endpoint: Endpoint) -> Result<(), ApiError> {
    let own = match endpoint {
        Endpoint::Chat => CHAT,
        Endpoint::Completions => COMPLETIONS,
    };
    let path = match endpoint {
        Endpoint::Chat => "/v1/chat/completions",
        Endpoint::Completions => "/v1/completions",
    };
    // Sorted, so the error names the same field whatever order the client's JSON had.
    let mut keys: Vec<&String> = o.keys().collect();
    keys.sort();
    if let Some(k) = keys.into_iter().find(|k| !COMMON.contains(&k.as_str()) && !own.contains(&k.as_str())) {
        return Err(ApiError::unknown_param(k, path));
    }

    for name in
        ["functions", "function_call", "audio", "prediction", "reasoning_effort", "verbosity", "web_search_options"]
    {
        if present(o, name).is_some() {
            return Err(unsupported(name, format!("`{name}` is not supported by this server")));
        }
    }
    if present(o, "parallel_tool_calls").is_some_and(|v| !v.is_boolean()) {
        return Err(ApiError::invalid_param("parallel_tool_calls", "`parallel_tool_calls` must be a boolean"));
    }
    match present(o, "store") {
        None | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => {
            return Err(unsupported("store", "`store: true` is not supported: this server stores no completions"))
        }
        Some(_) => return Err(ApiError::invalid_param("store", "`store` must be a boolean")),
    }
    match present(o, "service_tier") {
        None => {}
        Some(Value::String(s)) if s == "auto" || s == "default" => {}
        Some(_) => return Err(unsupported("service_tier", "`service_tier` can only be `auto` or `default` here")),
    }
    match present(o, "modalities") {
        None => {}
        Some(Value::Array(a)) if a.iter().all(|m| m == "text") => {}
        Some(_) => return Err(unsupported("modalities", "only the `text` modality is supported")),
    }
    if present(o, "metadata").is_some_and(|v| !v.is_object()) {
        return Err(ApiError::invalid_param("metadata", "`metadata` must be an object"));
    }
    for name in ["user", "safety_identifier", "prompt_cache_key"] {
        if present(o, name).is_some_and(|v| !v.is_string()) {
            return Err(ApiError::invalid_param(name, format!("`{name}` must be a string")));
        }
    }
    if present(o, "suffix").is_some() {
        return Err(unsupported("suffix", "`suffix` (fill in the middle) is not supported by this server"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(v: Value, endpoint: Endpoint) -> Option<(String, Option<&'static str>)> {
        let Value::Object(o) = v else { panic!("not an object") };
        check(&o, endpoint).err().map(|e| (e.param.unwrap_or_default(), e.code))
    }

    #[test]
    fn an_unknown_field_is_a_400_naming_it() {
        let r = refused(json!({"model": "m", "messages": [], "temprature": 0.5}), Endpoint::Chat);
        assert_eq!(r, Some(("temprature".into(), Some("unknown_parameter"))));
        // A chat-only field on the completions endpoint is unknown there.
        let r = refused(json!({"model": "m", "prompt": "x", "messages": []}), Endpoint::Completions);
        assert_eq!(r, Some(("messages".into(), Some("unknown_parameter"))));
    }

    #[test]
    fn fields_asking_for_what_the_server_does_not_do_are_refused_by_name() {
        for (field, value) in [
            ("store", json!(true)),
            ("audio", json!({})),
            ("modalities", json!(["text", "audio"])),
            ("service_tier", json!("flex")),
        ] {
            let r = refused(json!({"model": "m", "messages": [], field: value}), Endpoint::Chat);
            assert_eq!(r, Some((field.into(), Some("unsupported_parameter"))), "{field}");
        }
        let r = refused(json!({"model": "m", "prompt": "x", "suffix": "y"}), Endpoint::Completions);
        assert_eq!(r, Some(("suffix".into(), Some("unsupported_parameter"))));
    }

    #[test]
    fn fields_that_cannot_change_an_answer_here_are_accepted() {
        let ok = json!({
            "model": "m", "messages": [], "user": "u-1", "metadata": {"k": "v"}, "store": false,
            "response_format": {"type": "text"}, "tools": [], "tool_choice": "none",
            "service_tier": "auto", "modalities": ["text"], "n": 2, "logit_bias": {"5": 1},
        });
        assert_eq!(refused(ok, Endpoint::Chat), None);
    }
}
