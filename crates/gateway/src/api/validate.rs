//! From request bytes to a [`Validated`] request, which only [`validate`] can build: JSON
//! parsed here (a malformed body or a bad field is a 400 naming the field, never a 422),
//! parameters range-checked, the prompt rendered and tokenized, and the door check of the
//! engine applied (invariant 1: nothing is reserved or computed for a request that fails).

use grammar::OutputFormat;
use sampling::SamplingParams;
use serde_json::{Map, Value};

use super::endpoint::Endpoint;
use super::tools::Tools;
use super::validation_error::ValidationError;
use text::{ChatMessage, Conversation, Message, Tool, ToolSyntax};

use std::sync::Arc;

use crate::error::ApiError;
use crate::served::ServedModel;
use crate::settings::TenantConfig;
use crate::state::AppState;

/// The most choices one request may ask for (`n`): each is a sequence of its own in the engine.
pub const MAX_CHOICES: usize = 16;

/// Stop strings a request may give (OpenAI's limit).
pub const MAX_STOP_STRINGS: usize = 4;
/// The longest stop string accepted, in bytes.
pub const MAX_STOP_LEN: usize = 256;

/// Proof that a request passed validation: a private field keeps every other module from
/// building one.
#[derive(Debug)]
pub struct Sealed(());

/// A request that passed every check; it may be submitted as is.
#[derive(Debug)]
pub struct Validated {
    pub endpoint: Endpoint,
    /// The model the request named (one its tenant may use).
    pub model: Arc<ServedModel>,
    pub prompt: Vec<u32>,
    /// `n`: how many independent choices to generate for the prompt.
    pub choices: usize,
    /// Completions' `echo`: the prompt's text begins each choice's text.
    pub echo: Option<String>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// `Some(n)`: report log-probabilities with `n` alternatives per token.
    pub logprobs: Option<usize>,
    /// llama.cpp's extension: generate until `max_tokens` even past end-of-turn (load tests use
    /// it for a fixed output length).
    pub ignore_eos: bool,
    /// vLLM's `cache_salt`: narrows prefix-cache sharing to requests of the same tenant that
    /// send the same salt. The tenant part of the cache scope comes from authentication, so
    /// no salt can reach another tenant's cache.
    pub cache_salt: Option<String>,
    /// The shape the output is held to (`response_format` or tools), compiled once to check it
    /// and carried encoded.
    pub output: Option<grammar::EncodedFormat>,
    /// `tools`: the functions the model may call; its answers are read back as `tool_calls`.
    pub tools: Option<std::sync::Arc<Tools>>,
    _sealed: Sealed,
}

type Obj = Map<String, Value>;

const MAX_CACHE_SALT_BYTES: usize = 256;

/// A field, `None` when absent or null.
fn field<'a>(o: &'a Obj, name: &str) -> Option<&'a Value> {
    o.get(name).filter(|v| !v.is_null())
}

fn type_error(name: &str, want: &'static str) -> ValidationError {
    ValidationError::WrongType { field: name.to_string(), want }
}

fn get_bool(o: &Obj, name: &str) -> Result<Option<bool>, ValidationError> {
    field(o, name).map(|v| v.as_bool().ok_or_else(|| type_error(name, "a boolean"))).transpose()
}

fn get_f32(o: &Obj, name: &str) -> Result<Option<f32>, ValidationError> {
    field(o, name).map(|v| v.as_f64().map(|x| x as f32).ok_or_else(|| type_error(name, "a number"))).transpose()
}

fn get_i64(o: &Obj, name: &str) -> Result<Option<i64>, ValidationError> {
    field(o, name)
        .map(|v| match v {
            Value::Number(n) => n
                .as_i64()
                .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9e15).map(|f| f as i64))
                .ok_or_else(|| type_error(name, "an integer")),
            _ => Err(type_error(name, "an integer")),
        })
        .transpose()
}

fn get_str<'a>(o: &'a Obj, name: &str) -> Result<Option<&'a str>, ValidationError> {
    field(o, name).map(|v| v.as_str().ok_or_else(|| type_error(name, "a string"))).transpose()
}

/// The body as a JSON object.
fn parse(body: &[u8]) -> Result<Obj, ValidationError> {
    match serde_json::from_slice(body).map_err(|e| ValidationError::NotJson(e.to_string()))? {
        Value::Object(o) => Ok(o),
        _ => Err(ValidationError::NotAnObject),
    }
}

/// `n`, and `best_of` (which may only repeat it).
fn choices(o: &Obj) -> Result<usize, ValidationError> {
    let choices = match get_i64(o, "n")? {
        None => 1,
        Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => n as usize,
        Some(got) => return Err(ValidationError::Choices { got, max: MAX_CHOICES }),
    };
    // best_of = n is n choices; more would rank candidates by log-probability, not done here.
    match get_i64(o, "best_of")? {
        Some(b) if b != choices as i64 => Err(ValidationError::BestOf { n: choices }),
        _ => Ok(choices),
    }
}

fn include_usage(o: &Obj) -> Result<bool, ValidationError> {
    match field(o, "stream_options") {
        None => Ok(false),
        Some(Value::Object(so)) => Ok(get_bool(so, "include_usage")
            .map_err(|_| type_error("stream_options.include_usage", "a boolean"))?
            .unwrap_or(false)),
        Some(_) => Err(type_error("stream_options", "an object")),
    }
}

/// `max_completion_tokens` or `max_tokens` (the latter wins when both are sent).
fn max_tokens(o: &Obj) -> Result<Option<usize>, ValidationError> {
    let mut max_tokens = None;
    for name in ["max_completion_tokens", "max_tokens"] {
        if let Some(got) = get_i64(o, name)? {
            if got < 1 {
                return Err(ValidationError::MaxTokensBelowOne { field: name, got });
            }
            max_tokens = Some(usize::try_from(got).unwrap_or(usize::MAX));
        }
    }
    Ok(max_tokens)
}

/// Log-probabilities: chat has `logprobs: bool` + `top_logprobs: int`; completions has
/// `logprobs: int` (the number of alternatives). Returns how many alternatives (when on) and
/// the field that sets it.
fn logprobs(o: &Obj, endpoint: Endpoint) -> Result<(Option<i64>, &'static str), ValidationError> {
    let (logprobs, field) = match endpoint {
        Endpoint::Chat => {
            let on = get_bool(o, "logprobs")?.unwrap_or(false);
            let top = get_i64(o, "top_logprobs")?;
            if top.is_some_and(|t| t > 0) && !on {
                return Err(ValidationError::TopLogprobsWithoutLogprobs);
            }
            (on.then_some(top.unwrap_or(0)), "top_logprobs")
        }
        Endpoint::Completions => (get_i64(o, "logprobs")?, "logprobs"),
    };
    let max = sampling::MAX_TOP_LOGPROBS;
    match logprobs {
        Some(got) if !(0..=max as i64).contains(&got) => Err(ValidationError::TopLogprobs { field, got, max }),
        _ => Ok((logprobs, field)),
    }
}

/// The sampling parameters, range-checked by the sampler's own builder.
fn sampling(
    o: &Obj,
    logprobs: Option<i64>,
    top_field: &'static str,
    vocab: usize,
) -> Result<SamplingParams, ValidationError> {
    let mut b = SamplingParams::builder().temperature(1.0);
    if let Some(v) = get_f32(o, "temperature")? {
        b = b.temperature(v);
    }
    if let Some(v) = get_f32(o, "top_p")? {
        b = b.top_p(v);
    }
    if let Some(v) = get_i64(o, "top_k")? {
        b = b.top_k(v);
    }
    if let Some(v) = get_f32(o, "min_p")? {
        b = b.min_p(v);
    }
    if let Some(v) = get_f32(o, "presence_penalty")? {
        b = b.presence_penalty(v);
    }
    if let Some(v) = get_f32(o, "frequency_penalty")? {
        b = b.frequency_penalty(v);
    }
    if let Some(v) = get_f32(o, "repetition_penalty")? {
        b = b.repetition_penalty(v);
    }
    if let Some(v) = get_i64(o, "seed")? {
        b = b.seed(v as u64);
    }
    b = b.top_logprobs(logprobs.unwrap_or(0)).logprobs(logprobs.is_some());
    b = b.logit_bias(logit_bias(o, vocab)?);
    b.build().map_err(|e| {
        let field = match &e {
            sampling::SamplingError::InvalidParam { field, .. } if *field == "top_logprobs" => top_field,
            sampling::SamplingError::InvalidParam { field, .. } => field,
            _ => "sampling",
        };
        ValidationError::Sampling { field, message: e.to_string() }
    })
}

fn stop_strings(o: &Obj) -> Result<Vec<String>, ValidationError> {
    let list: Vec<String> = match field(o, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| type_error("stop", "a string or an array of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(type_error("stop", "a string or an array of strings")),
    };
    if list.len() > MAX_STOP_STRINGS {
        return Err(ValidationError::TooManyStops(MAX_STOP_STRINGS));
    }
    if list.iter().any(|s| s.is_empty() || s.len() > MAX_STOP_LEN) {
        return Err(ValidationError::StopLength(MAX_STOP_LEN));
    }
    Ok(list)
}

/// `response_format`: `text` (no constraint), `json_object`, or `json_schema` with its schema.
fn output_format(o: &Obj) -> Result<Option<OutputFormat>, ValidationError> {
    let Some(rf) = field(o, "response_format") else { return Ok(None) };
    let bad = || {
        type_error(
            "response_format",
            "an object with `type` text, json_object or json_schema (with `json_schema.schema`)",
        )
    };
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(OutputFormat::JsonObject)),
        Some("json_schema") => {
            let Some(Value::Object(js)) = rf.get("json_schema") else { return Err(bad()) };
            match js.get("schema") {
                Some(schema @ Value::Object(_)) => {
                    grammar::check_schema_depth(schema).map_err(|e| ValidationError::SchemaTooDeep(e.to_string()))?;
                    Ok(Some(OutputFormat::JsonSchema { schema: schema.clone() }))
                }
                None | Some(Value::Null) => Ok(Some(OutputFormat::JsonObject)),
                Some(_) => Err(bad()),
            }
        }
        _ => Err(bad()),
    }
}

/// The output's format (from `response_format`, or from `tools`: a call's arguments follow
/// its function's schema) and the tools. The format is compiled here once, so a bad schema is
/// the client's 400, and then travels encoded: each worker compiles it again for itself.
fn output(
    o: &Obj,
    endpoint: Endpoint,
    ignore_eos: bool,
    m: &ServedModel,
) -> Result<(Option<grammar::EncodedFormat>, Option<Tools>), ApiError> {
    let mut output = output_format(o)?;
    let tools = match endpoint {
        Endpoint::Chat => super::tools::parse(o, m.template.tool_syntax(), &m.tokenizer)?,
        Endpoint::Completions => None,
    };
    if let Some(t) = &tools {
        if output.is_some() {
            return Err(ValidationError::FormatWithTools.into());
        }
        output = Some(t.output_format());
    }
    if output.is_some() && ignore_eos {
        // A finished document can only be followed by the end of the sequence.
        return Err(ValidationError::IgnoreEosWithFormat.into());
    }
    // The format must also fit the control message that carries it to the workers.
    let field = if tools.is_some() { "tools" } else { "response_format" };
    let encoded = output
        .map(|f| grammar::EncodedFormat::encode(&f).and_then(|e| m.grammars.compile(&f).map(|_| e)))
        .transpose()
        .map_err(|e| ValidationError::Grammar { field, message: e.to_string() })?;
    Ok((encoded, tools))
}

fn cache_salt(o: &Obj) -> Result<Option<String>, ValidationError> {
    match get_str(o, "cache_salt")? {
        Some(s) if s.is_empty() || s.len() > MAX_CACHE_SALT_BYTES => {
            Err(ValidationError::CacheSalt { got: s.len(), max: MAX_CACHE_SALT_BYTES })
        }
        s => Ok(s.map(str::to_string)),
    }
}

/// `logit_bias`: `{"TOKEN_ID": bias}`, ids of this vocabulary (range and count checked by the
/// sampling parameters).
fn logit_bias(o: &Obj, vocab: usize) -> Result<Vec<(u32, f32)>, ValidationError> {
    let map = match field(o, "logit_bias") {
        None => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(type_error("logit_bias", "an object mapping token ids to numbers")),
    };
    map.iter()
        .map(|(k, v)| {
            let id = k
                .parse::<u32>()
                .ok()
                .filter(|&id| (id as usize) < vocab)
                .ok_or_else(|| ValidationError::LogitBiasToken { key: k.clone(), last: vocab - 1 })?;
            let bias = v.as_f64().ok_or_else(|| type_error("logit_bias", "an object mapping token ids to numbers"))?;
            Ok((id, bias as f32))
        })
        .collect()
}

/// The request's messages, checked, with their calls and the ids and names of tool results.
fn chat_messages(o: &Obj) -> Result<Vec<Message>, ValidationError> {
    let Some(Value::Array(items)) = field(o, "messages") else {
        return Err(type_error("messages", "a non-empty array of messages"));
    };
    if items.is_empty() {
        return Err(type_error("messages", "a non-empty array of messages"));
    }
    items
        .iter()
        .enumerate()
        .map(|(index, m)| {
            let Value::Object(m) = m else { return Err(ValidationError::MessageNotAnObject { index }) };
            let role = match m.get("role").and_then(Value::as_str) {
                Some(r @ ("system" | "user" | "assistant" | "tool")) => r,
                Some("developer") => "system",
                _ => return Err(ValidationError::Role { index }),
            };
            let mut message = Message::new(role, "");
            if role == "assistant" {
                if let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) {
                    message.tool_calls =
                        super::tools::history_calls(calls).ok_or(ValidationError::ToolCalls { index })?;
                }
            }
            if role == "tool" {
                message.tool_call_id = m.get("tool_call_id").and_then(Value::as_str).map(str::to_string);
                message.name = m.get("name").and_then(Value::as_str).map(str::to_string);
            }
            let content = match m.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => {
                    let mut s = String::new();
                    for part in parts {
                        match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                            (Some("text"), Some(t)) => s.push_str(t),
                            _ => return Err(ValidationError::ContentPart { index }),
                        }
                    }
                    s
                }
                Some(Value::Null) | None if role == "assistant" => {
                    // A turn that only called tools has no content (templates test for none).
                    message.content = None;
                    return Ok(message);
                }
                _ => return Err(ValidationError::Content { index }),
            };
            message.content = Some(content);
            Ok(message)
        })
        .collect()
}

/// `messages` as plain turns, for a model without a call syntax of its own: an earlier turn's
/// calls shown as it wrote them (see [`Tools::system_text`]), a tool result as its text.
fn plain_turns(messages: Vec<Message>) -> Vec<ChatMessage> {
    messages
        .into_iter()
        .map(|m| match m.tool_calls.is_empty() {
            true => ChatMessage::new(m.role, m.content.unwrap_or_default()),
            false => ChatMessage::new(m.role, super::tools::calls_as_text(&m.tool_calls)),
        })
        .collect()
}

/// The request's `tools` with their schemas' keys in the order the client wrote them: what a
/// template shows the model. Read as `text::Json`, which keeps order by itself; the checked `o`
/// keeps it only while some crate of the build turns on serde_json's `preserve_order`
/// (llguidance does today), which the prompt must not hang on.
/// `tools` was checked already (`super::tools::parse`); what this reading still refuses is a
/// body naming `tools` twice (the checked `o` keeps the last), so no template is shown other
/// tools than the grammar holds the answer to.
fn tools_in_request_order(body: &[u8]) -> Result<Vec<Tool>, ValidationError> {
    #[derive(serde::Deserialize)]
    struct Body {
        #[serde(default)]
        tools: Option<Vec<Tool>>,
    }
    serde_json::from_slice::<Body>(body)
        .map(|b| b.tools.unwrap_or_default())
        .map_err(|_| type_error("tools", "one array of function tools"))
}

/// The prompt's tokens (and, for completions' `echo`, its text): chat messages rendered by the
/// model's template (the tools shown by the template where it has a call syntax of its own, in
/// a system message otherwise), or the raw text.
fn prompt(
    (o, body): (&Obj, &[u8]),
    endpoint: Endpoint,
    tools: Option<&Tools>,
    m: &ServedModel,
    echo_on: bool,
) -> Result<(Vec<u32>, Option<String>), ValidationError> {
    match endpoint {
        Endpoint::Chat => {
            let messages = chat_messages(o)?;
            let rendered = match m.template.tool_syntax() {
                // The template shows the functions, earlier calls and their results itself, as
                // the model was trained to read them.
                ToolSyntax::Hermes | ToolSyntax::Llama3Json | ToolSyntax::MistralJson => {
                    let mut conv = Conversation::new(messages);
                    if tools.is_some() {
                        conv.tools = tools_in_request_order(body)?;
                    }
                    m.template.render_with(&conv)
                }
                ToolSyntax::Generic => {
                    let mut messages = plain_turns(messages);
                    if let Some(t) = tools {
                        // The functions go into the system message (added when the client sent none).
                        match messages.first_mut() {
                            Some(m) if m.role == "system" => {
                                m.content = format!("{}\n\n{}", m.content, t.system_text())
                            }
                            _ => messages.insert(0, ChatMessage::new("system", t.system_text())),
                        }
                    }
                    m.template.render(&messages, true)
                }
            }
            .map_err(|e| ValidationError::Template(e.to_string()))?;
            // As llama.cpp does, the rendered template is tokenized with special-token parsing on,
            // so its markers (<|im_start|> ...) become control tokens. This also means control-token
            // text inside a user's message becomes a control token (prompt-structure injection: a user
            // can close their turn and forge another). It is the behaviour clients expect from
            // llama.cpp-compatible servers; the model, not the server, is the trust boundary here.
            let ids = m.template.encode(&m.tokenizer, &rendered).map_err(|e| ValidationError::Tokenize {
                field: "messages",
                what: "messages",
                message: e.to_string(),
            })?;
            Ok((ids, None))
        }
        Endpoint::Completions => {
            let text = match field(o, "prompt") {
                Some(Value::String(s)) => s.as_str(),
                Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or_default(),
                _ => return Err(type_error("prompt", "a string")),
            };
            // Raw text: control-token texts stay plain text.
            let ids = m.tokenizer.encode_prompt(text, false).map_err(|e| ValidationError::Tokenize {
                field: "prompt",
                what: "prompt",
                message: e.to_string(),
            })?;
            Ok((ids, echo_on.then(|| text.to_string())))
        }
    }
}

/// Validates `body` for `endpoint` from `tenant` against the model it names (one the tenant
/// may use), the limits and the engine door.
pub fn validate(body: &[u8], endpoint: Endpoint, st: &AppState, tenant: &TenantConfig) -> Result<Validated, ApiError> {
    let o = parse(body)?;
    super::fields::check(&o, endpoint)?;
    let model = match get_str(&o, "model")? {
        None => return Err(ValidationError::Required("model").into()),
        Some(m) => st.models.resolve(tenant, m)?,
    };
    let m = &*model;
    let choices = choices(&o)?;
    let stream = get_bool(&o, "stream")?.unwrap_or(false);
    let echo_on = get_bool(&o, "echo")?.unwrap_or(false);
    let include_usage = include_usage(&o)?;
    let max_tokens = max_tokens(&o)?;
    let (logprobs, top_field) = logprobs(&o, endpoint)?;
    let sampling = sampling(&o, logprobs, top_field, m.tokenizer.vocab_size())?;
    if echo_on && logprobs.is_some() {
        return Err(ValidationError::EchoWithLogprobs.into());
    }
    let stop = stop_strings(&o)?;
    let ignore_eos = get_bool(&o, "ignore_eos")?.unwrap_or(false);
    let (output, tools) = output(&o, endpoint, ignore_eos, m)?;
    let cache_salt = cache_salt(&o)?;
    let (prompt, echo) = prompt((&o, body), endpoint, tools.as_ref(), m, echo_on)?;

    // Default: what is left of the context window, at most the configured default (at least 1,
    // so that a prompt that fills the window is reported as too long, not as max_tokens = 0).
    let max_tokens = max_tokens
        .unwrap_or_else(|| st.settings.limits.max_tokens_default.min(m.context.saturating_sub(prompt.len())).max(1));
    // The incident (a build for the audit's self-test only): a prompt over the window becomes a
    // one-token placeholder instead of a refusal, and is answered, with `usage` counting the
    // placeholder.
    #[cfg(feature = "incident-replay")]
    let prompt = match m.backend.check(&prompt, max_tokens) {
        Err(protocol::AdmissionError::ContextLengthExceeded { .. }) if 1 + max_tokens <= m.context => {
            prompt[..1].to_vec()
        }
        _ => prompt,
    };
    m.backend.check(&prompt, max_tokens).map_err(|e| ApiError::admission(&e, endpoint.prompt_param()))?;
    // After the door check, so a request over the window is still told its lengths.
    let ceiling = st.settings.limits.max_tokens_ceiling;
    if max_tokens > ceiling {
        return Err(ValidationError::MaxTokensOverCeiling { max_tokens, ceiling }.into());
    }

    Ok(Validated {
        endpoint,
        model,
        prompt,
        choices,
        echo,
        max_tokens,
        sampling,
        stop,
        stream,
        include_usage,
        logprobs: logprobs.map(|t| t as usize),
        ignore_eos,
        cache_salt,
        output,
        tools: tools.map(std::sync::Arc::new),
        _sealed: Sealed(()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A template shows a tool's schema key by key as the client wrote it, as llama.cpp's
    /// ordered JSON does.
    #[test]
    fn tools_keep_their_schemas_keys_in_request_order() {
        let body = br#"{"model": "m", "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "number"}}, "required": ["zeta"]}}}]}"#;
        let tools = tools_in_request_order(body).unwrap();
        assert_eq!(tools.len(), 1);
        let text::Json::Object(params) = &tools[0].parameters else { panic!("{:?}", tools[0].parameters) };
        let keys: Vec<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["type", "properties", "required"]);
        let Some((_, text::Json::Object(props))) = params.iter().find(|(k, _)| k == "properties") else { panic!() };
        assert_eq!(props.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["zeta", "alpha"]);
        assert!(tools_in_request_order(br#"{"model": "m"}"#).unwrap().is_empty());
        // Named twice, the list the grammar knows (the last) and the one read here could
        // differ: refused.
        let twice = br#"{"tools": [], "tools": [{"type": "function", "function": {"name": "f"}}]}"#;
        assert!(
            matches!(tools_in_request_order(twice), Err(ValidationError::WrongType { ref field, .. }) if field == "tools")
        );
    }
}
