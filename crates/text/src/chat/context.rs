//! A conversation as llama.cpp hands it to a template (common/chat.cpp,
//! `common_chat_templates_apply_jinja` and `common_chat_template_direct_apply_impl`): messages
//! rewritten for what the template supports, and the globals llama-server always sets.

use std::collections::BTreeMap;

use minijinja::value::Value;

use super::caps::TemplateCaps;
use super::clock::strftime;
use super::conversation::{Conversation, Message, Tool, ToolCall};
use super::functions::strftime_now;
use super::json::{Json, JsonMap};
use crate::TextError;

/// The messages after llama.cpp's workarounds, in its order:
/// * `developer` becomes `system`, except for templates with `<|channel|>` (GPT-OSS), which
///   know the role (`map_developer_role_to_system`);
/// * a template that does not read a system message gets the first one merged into the next
///   message, `system + "\n" + next`, or dropped when it is alone (`system_message_not_supported`).
fn adapt(messages: &[Message], caps: &TemplateCaps, knows_developer: bool) -> Vec<Message> {
    let mut out = messages.to_vec();
    if !knows_developer {
        for m in &mut out {
            if m.role == "developer" {
                m.role = "system".to_string();
            }
        }
    }
    if !caps.supports_system_role && out.first().is_some_and(|m| m.role == "system") {
        let system = out.remove(0);
        if let Some(next) = out.first_mut() {
            let merged =
                format!("{}\n{}", system.content.unwrap_or_default(), next.content.as_deref().unwrap_or_default());
            next.content = Some(merged);
        }
    }
    out
}

/// One message as `common_chat_msg::to_json_oaicompat` writes it: keys in its order, a missing
/// content as `""`, empty `name` / `tool_call_id` left out.
fn message_value(m: &Message, object_arguments: bool) -> Result<Value, TextError> {
    let mut entries = vec![
        ("role".to_string(), Value::from(m.role.as_str())),
        ("content".to_string(), Value::from(m.content.as_deref().unwrap_or_default())),
    ];
    if let Some(name) = m.name.as_deref().filter(|n| !n.is_empty()) {
        entries.push(("name".to_string(), Value::from(name)));
    }
    if let Some(id) = m.tool_call_id.as_deref().filter(|n| !n.is_empty()) {
        entries.push(("tool_call_id".to_string(), Value::from(id)));
    }
    if !m.tool_calls.is_empty() {
        let calls: Result<Vec<Value>, TextError> =
            m.tool_calls.iter().map(|c| tool_call_value(c, object_arguments)).collect();
        entries.push(("tool_calls".to_string(), Value::from(calls?)));
    }
    Ok(JsonMap::value(entries))
}

/// `{"type": "function", "function": {"name", "arguments"}, "id"}`. Arguments stay JSON text
/// unless the template reads them as an object; then they are parsed, as llama.cpp's
/// `func_args_not_string` does (and, like it, text that is not JSON is an error).
fn tool_call_value(c: &ToolCall, object_arguments: bool) -> Result<Value, TextError> {
    let arguments = if object_arguments {
        Json::parse(&c.function.arguments)
            .map_err(|source| TextError::ToolArguments { function: c.function.name.clone(), source })?
            .to_value()
    } else {
        Value::from(c.function.arguments.as_str())
    };
    let function = JsonMap::value(vec![
        ("name".to_string(), Value::from(c.function.name.as_str())),
        ("arguments".to_string(), arguments),
    ]);
    let mut entries = vec![("type".to_string(), Value::from("function")), ("function".to_string(), function)];
    if let Some(id) = c.id.as_deref().filter(|id| !id.is_empty()) {
        entries.push(("id".to_string(), Value::from(id)));
    }
    Ok(JsonMap::value(entries))
}

/// `{"type": "function", "function": {"name", "description", "parameters"}}`, the shape
/// `common_chat_tools_to_json_oaicompat` rebuilds whatever the request's key order was.
fn tool_value(t: &Tool) -> Value {
    let function = JsonMap::value(vec![
        ("name".to_string(), Value::from(t.name.as_str())),
        ("description".to_string(), Value::from(t.description.as_str())),
        ("parameters".to_string(), t.parameters.to_value()),
    ]);
    JsonMap::value(vec![("type".to_string(), Value::from("function")), ("function".to_string(), function)])
}

/// Everything the template sees. Besides the conversation, llama-server always sets
/// `date_string` ("%d %b %Y") and `datetime` ("%b %d %Y") from its clock
/// (`common_chat_extra_context`), `enable_thinking`, `preserve_reasoning = true` (its default
/// `--reasoning-preserve`) with the variables `caps_apply_preserve_reasoning` derives from it,
/// and `strftime_now`; `tools` only when there are some, `add_generation_prompt` only when true.
pub(super) fn globals(
    conv: &Conversation,
    caps: &TemplateCaps,
    knows_developer: bool,
    bos: &str,
    eos: &str,
) -> Result<Value, TextError> {
    let messages: Result<Vec<Value>, TextError> = adapt(&conv.messages, caps, knows_developer)
        .iter()
        .map(|m| message_value(m, caps.supports_object_arguments))
        .collect();
    let mut g: BTreeMap<&str, Value> = BTreeMap::new();
    g.insert("messages", Value::from(messages?));
    g.insert("bos_token", Value::from(bos));
    g.insert("eos_token", Value::from(eos));
    g.insert("enable_thinking", Value::from(conv.enable_thinking));
    if !conv.tools.is_empty() {
        g.insert("tools", Value::from(conv.tools.iter().map(tool_value).collect::<Vec<_>>()));
    }
    if conv.add_generation_prompt {
        g.insert("add_generation_prompt", Value::from(true));
    }
    g.insert("date_string", Value::from(strftime(conv.now, "%d %b %Y")));
    g.insert("datetime", Value::from(strftime(conv.now, "%b %d %Y")));
    g.insert("strftime_now", strftime_now(conv.now));
    g.insert("preserve_reasoning", Value::from(true));
    g.insert("preserve_thinking", Value::from(true));
    for off in ["clear_thinking", "truncate_history_thinking", "drop_thinking"] {
        g.insert(off, Value::from(false));
    }
    Ok(Value::from(g))
}
