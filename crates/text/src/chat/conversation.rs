//! What a chat template renders: a conversation in the OpenAI chat shape (messages that may
//! carry tool calls or answer one, the tools on offer), plus the settings llama.cpp passes
//! beside it. Deserializes from an OpenAI-style request body, as llama-server reads one.

use std::time::SystemTime;

use serde::Deserialize;

use super::json::Json;

/// One message: `content` may be absent (`null`) on an assistant turn that only calls tools.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<String>,
    /// The tool whose result a `tool` message carries (some templates print it).
    #[serde(default)]
    pub name: Option<String>,
    /// The call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub tool_calls: Vec<ToolCall>,
}

impl Message {
    /// A plain text message.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: Some(content.into()),
            name: None,
            tool_call_id: None,
            tool_calls: Vec::new(),
        }
    }
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<ToolCall>, D::Error> {
    Ok(Option::<Vec<ToolCall>>::deserialize(d)?.unwrap_or_default())
}

/// A function call the assistant made (OpenAI: `{"id", "type": "function", "function"}`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ToolCall {
    #[serde(default)]
    pub id: Option<String>,
    pub function: FunctionCall,
}

/// The function called and its arguments, a JSON text as the OpenAI API carries them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// A function the model may call (OpenAI: `{"type": "function", "function": {...}}`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "ToolWire")]
pub struct Tool {
    pub name: String,
    /// Empty when the request gave none (llama.cpp passes `""` then).
    pub description: String,
    /// The JSON Schema of the arguments, keys in request order; `{}` when the request gave none.
    pub parameters: Json,
}

#[derive(Deserialize)]
struct ToolWire {
    function: FunctionWire,
}

#[derive(Deserialize)]
struct FunctionWire {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Json>,
}

impl From<ToolWire> for Tool {
    fn from(w: ToolWire) -> Tool {
        let f = w.function;
        Tool {
            name: f.name,
            description: f.description.unwrap_or_default(),
            parameters: f.parameters.unwrap_or_else(Json::empty_object),
        }
    }
}

/// Everything a render takes. Defaults are llama-server's: a generation prompt, thinking
/// enabled (it passes `enable_thinking = true` to templates that read it), the current time.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Conversation {
    pub messages: Vec<Message>,
    #[serde(default, deserialize_with = "null_as_no_tools")]
    pub tools: Vec<Tool>,
    #[serde(default = "yes")]
    pub add_generation_prompt: bool,
    #[serde(default = "yes")]
    pub enable_thinking: bool,
    /// The instant `strftime_now`, `date_string` and `datetime` show (formatted in UTC).
    /// Tests pin it; a request body cannot set it.
    #[serde(skip, default = "SystemTime::now")]
    pub now: SystemTime,
}

fn yes() -> bool {
    true
}

fn null_as_no_tools<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Tool>, D::Error> {
    Ok(Option::<Vec<Tool>>::deserialize(d)?.unwrap_or_default())
}

impl Conversation {
    /// `messages` with llama-server's defaults and no tools.
    pub fn new(messages: Vec<Message>) -> Self {
        Conversation {
            messages,
            tools: Vec::new(),
            add_generation_prompt: true,
            enable_thinking: true,
            now: SystemTime::now(),
        }
    }
}
