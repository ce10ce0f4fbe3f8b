//! What a template supports, found the way llama.cpp finds it (common/jinja/caps.cpp,
//! `caps_get`): render fixed probe conversations and watch which input values the template
//! read. llama.cpp then adapts every conversation to those answers (context.rs), so the same
//! answers are needed for the same prompt: a template that never reads a system message gets it
//! merged into the first user turn; one that reads `arguments.arg` from an object gets tool
//! arguments as objects, otherwise as JSON text.

use std::time::SystemTime;

use minijinja::value::Value;
use minijinja::Template;

use super::functions::strftime_now;
use super::json::{Json, JsonMap};

/// The answers of llama.cpp's capability probes that change how a conversation is rendered
/// (llama-server reports them as `chat_template_caps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateCaps {
    /// The template reads a leading system message's content (Gemma 2 does not: it raises).
    pub supports_system_role: bool,
    /// The template reads the tools' names.
    pub supports_tools: bool,
    /// The template reads an assistant message's `tool_calls`.
    pub supports_tool_calls: bool,
    /// The template reads tool-call arguments as an object (`arguments.arg`, `arguments|tojson`,
    /// `arguments.items()`); otherwise they stay JSON text.
    pub supports_object_arguments: bool,
}

/// llama.cpp's probe tool, verbatim (including its odd top-level "name").
const PROBE_TOOLS: &str = r#"[{"name": "tool", "type": "function", "function": {"name": "tool1", "description": "Tool description", "parameters": {"type": "object", "properties": {"arg": {"type": "string", "description": "Arg description"}}, "required": ["arg"]}}}]"#;

/// llama.cpp's single-call probe conversation, with `arguments` spliced in.
fn tool_call_probe(arguments: &str) -> String {
    format!(
        r#"[{{"role": "user", "content": "User message"}},
            {{"role": "assistant", "content": "", "tool_calls": [{{"id": "call00001", "type": "function", "function": {{"name": "tool1", "arguments": {arguments}}}}}]}},
            {{"role": "tool", "content": "Tool response", "tool_call_id": "call00001"}},
            {{"role": "assistant", "content": "The tool response was 'tool response'"}},
            {{"role": "user", "content": "User message"}}]"#
    )
}

/// The map behind `v`, without marking anything read.
fn map(v: &Value) -> Option<&JsonMap> {
    v.downcast_object_ref::<JsonMap>()
}

fn item(v: &Value, i: usize) -> Option<Value> {
    // Lists are plain sequences; indexing them marks nothing.
    v.get_item_by_index(i).ok()
}

/// Whether `path` (map keys after a list index) was read in `root[index]`.
fn read_at(root: &Value, index: usize, path: &[&str]) -> bool {
    let Some(mut cur) = item(root, index) else { return false };
    let Some((last, inner)) = path.split_last() else { return false };
    for key in inner {
        let Some(next) = map(&cur).and_then(|m| m.peek(key)) else { return false };
        cur = next;
    }
    map(&cur).is_some_and(|m| m.was_read(last))
}

struct Probe {
    messages: Value,
    tools: Value,
    ok: bool,
}

fn probe(tmpl: &Template, messages: &str, tools: Option<&str>) -> Probe {
    let parse = |s: &str| Json::parse(s).map(|j| j.to_value()).unwrap_or_default();
    let messages = parse(messages);
    let tools = tools.map_or_else(|| Value::from(Vec::<Value>::new()), parse);
    let ctx = minijinja::context! {
        messages => messages.clone(),
        tools => tools.clone(),
        bos_token => "",
        eos_token => "",
        add_generation_prompt => true,
        strftime_now => strftime_now(SystemTime::now()),
    };
    // A probe that fails teaches what it fails on (llama.cpp ignores the error the same way).
    let ok = tmpl.render(ctx).is_ok();
    Probe { messages, tools, ok }
}

/// Runs llama.cpp's probes on `tmpl`, in its order and with its rules.
pub(super) fn detect(tmpl: &Template) -> TemplateCaps {
    let mut caps = TemplateCaps {
        supports_system_role: true,
        supports_tools: true,
        supports_tool_calls: true,
        supports_object_arguments: false,
    };

    let p = probe(
        tmpl,
        r#"[{"role": "system", "content": "System message"}, {"role": "user", "content": "User message"}]"#,
        None,
    );
    caps.supports_system_role = read_at(&p.messages, 0, &["content"]);

    let p = probe(tmpl, &tool_call_probe(r#"{"arg": "value"}"#), Some(PROBE_TOOLS));
    if p.ok {
        if !read_at(&p.tools, 0, &["function", "name"]) {
            caps.supports_tools = false;
        }
        if !read_at(&p.messages, 1, &["tool_calls"]) {
            caps.supports_tool_calls = false;
        } else {
            let args = item(&p.messages, 1)
                .and_then(|m| map(&m)?.peek("tool_calls"))
                .and_then(|calls| item(&calls, 0))
                .and_then(|c| map(&c)?.peek("function"))
                .and_then(|f| map(&f)?.peek("arguments"));
            caps.supports_object_arguments = args.as_ref().and_then(map).is_some_and(|a| a.was_read("arg"));
        }
    }

    if !caps.supports_object_arguments {
        let p = probe(tmpl, &tool_call_probe(r#""{\"arg\": \"value\"}""#), Some(PROBE_TOOLS));
        if !p.ok {
            caps.supports_tool_calls = false;
            caps.supports_tools = false;
        } else {
            if !read_at(&p.tools, 0, &["function", "name"]) {
                caps.supports_tools = false;
            }
            if !read_at(&p.messages, 1, &["tool_calls"]) {
                caps.supports_tool_calls = false;
            }
        }
    }
    caps
}
