//! Function calling: a request's `tools` and `tool_choice`, what the model is told about them,
//! the grammar its answer is held to, and the `tool_calls` read back from that answer.
//!
//! A model whose template has a call syntax of its own ([`ToolSyntax`]: Hermes blocks for Qwen
//! 2.5/3 and Hermes, Llama 3's JSON, Mistral's `[TOOL_CALLS]` array) is shown the functions by
//! its template and answers in that syntax ([`native`](super::native_calls)). Any other model is
//! shown them in a system message and answers a call as one JSON object
//! `{"name": ..., "arguments": {...}}`. With `tool_choice` `required` (or a named function) the
//! answer is held to calls of the offered functions, so their arguments always validate; with
//! `auto` it is held to "free text, or calls" (in the marked syntaxes, also "free text, then
//! calls from the start of a line"), and the model chooses.

use serde_json::{json, Map, Value};

use grammar::OutputFormat;
use text::{Tokenizer, ToolSyntax};

use super::native_calls::{self, Markers};
use crate::error::ApiError;

/// The most functions one request may offer.
pub const MAX_TOOLS: usize = 64;

#[derive(Debug, Clone)]
struct Function {
    name: String,
    description: Option<String>,
    parameters: Value,
}

#[derive(Debug, Clone, PartialEq)]
enum Choice {
    Auto,
    Required,
    Named(String),
}

/// The functions a request offers and how the model may use them.
#[derive(Debug, Clone)]
pub struct Tools {
    functions: Vec<Function>,
    choice: Choice,
    /// How the model writes a call (its template's syntax), and the syntax's markers in the
    /// model's vocabulary where it has markers.
    syntax: ToolSyntax,
    markers: Option<Markers>,
    /// `parallel_tool_calls` (default true): whether one answer may hold several calls, where
    /// the syntax has a way to write several.
    parallel: bool,
}

/// One call read from a model's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON text, as OpenAI sends them.
    pub arguments: String,
}

impl ToolCall {
    /// The `tool_calls` entry; `id` identifies the call in the `tool` message that answers it.
    pub fn json(&self, id: &str, index: Option<usize>) -> Value {
        let mut v = json!({
            "id": id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        });
        if let Some(i) = index {
            v["index"] = json!(i);
        }
        v
    }
}

/// A finished answer read as calls: what the model said before them, if anything, and the
/// calls (at least one).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolAnswer {
    pub content: Option<String>,
    pub calls: Vec<ToolCall>,
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `tools` and `tool_choice` for a model writing calls in `syntax` with the vocabulary of
/// `tokenizer`; `None` when no function may be called (no tools, or `none`).
pub fn parse(o: &Map<String, Value>, syntax: ToolSyntax, tokenizer: &Tokenizer) -> Result<Option<Tools>, ApiError> {
    let list = match o.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return Err(ApiError::invalid_param("tools", "`tools` must be an array of functions")),
    };
    if list.len() > MAX_TOOLS {
        return Err(ApiError::invalid_param("tools", format!("at most {MAX_TOOLS} tools are allowed")));
    }
    let mut functions = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = |f: &str| format!("tools[{i}].{f}");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::invalid_param(&at("type"), "only tools of type `function` are supported"));
        }
        let Some(Value::Object(f)) = t.get("function") else {
            return Err(ApiError::invalid_param(&at("function"), "a function object is required"));
        };
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        if !valid_name(name) {
            return Err(ApiError::invalid_param(
                &at("function.name"),
                "a function name is 1 to 64 letters, digits, `_` or `-`",
            ));
        }
        if functions.iter().any(|g: &Function| g.name == name) {
            return Err(ApiError::invalid_param(&at("function.name"), format!("`{name}` is offered twice")));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => {
                grammar::check_schema_depth(p)
                    .map_err(|e| ApiError::invalid_param(&at("function.parameters"), e.to_string()))?;
                p.clone()
            }
            Some(_) => return Err(ApiError::invalid_param(&at("function.parameters"), "must be a JSON schema object")),
        };
        let description = match f.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d.clone()),
            Some(_) => return Err(ApiError::invalid_param(&at("function.description"), "must be a string")),
        };
        functions.push(Function { name: name.to_string(), description, parameters });
    }
    let choice = match o.get("tool_choice") {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) if s == "none" => return Ok(None),
        Some(Value::String(s)) if s == "auto" => Choice::Auto,
        Some(Value::String(s)) if s == "required" => Choice::Required,
        Some(Value::Object(c)) => {
            let name = c.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            match (c.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(n)) if functions.iter().any(|f| f.name == n) => Choice::Named(n.to_string()),
                (Some("function"), Some(n)) => {
                    return Err(ApiError::invalid_param("tool_choice", format!("`{n}` is not one of the tools")))
                }
                _ => {
                    return Err(ApiError::invalid_param(
                        "tool_choice",
                        "`tool_choice` must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    ))
                }
            }
        }
        Some(_) => return Err(ApiError::invalid_param("tool_choice", "`tool_choice` must be a string or an object")),
    };
    if functions.is_empty() {
        return match choice {
            Choice::Auto => Ok(None),
            _ => Err(ApiError::invalid_param("tool_choice", "`tool_choice` needs `tools`")),
        };
    }
    let parallel = o.get("parallel_tool_calls").and_then(Value::as_bool).unwrap_or(true);
    let markers = Markers::of(syntax, tokenizer);
    Ok(Some(Tools { functions, choice, syntax, markers, parallel }))
}

impl Tools {
    fn offered(&self) -> impl Iterator<Item = &Function> {
        self.functions.iter().filter(|f| match &self.choice {
            Choice::Named(n) => &f.name == n,
            _ => true,
        })
    }

    /// What a model without a call syntax of its own is told: the functions, and the one form a
    /// call takes.
    pub fn system_text(&self) -> String {
        let listing: Vec<Value> = self
            .offered()
            .map(|f| json!({"name": f.name, "description": f.description, "parameters": f.parameters}))
            .collect();
        let rule = match self.choice {
            Choice::Auto => "If one of them helps, answer with only a JSON object",
            _ => "Answer with only a JSON object",
        };
        format!(
            "You can call these functions:\n{}\n{rule} {{\"name\": <function name>, \"arguments\": <arguments object>}}.",
            Value::Array(listing)
        )
    }

    /// The schema of one call to any offered function, its arguments under `args` (the key the
    /// syntax uses).
    fn call_schema(&self, args: &str) -> Value {
        let one: Vec<Value> = self
            .offered()
            .map(|f| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": f.name}, args: f.parameters},
                    "required": ["name", args],
                    "additionalProperties": false,
                })
            })
            .collect();
        if one.len() == 1 {
            one.into_iter().next().unwrap_or_default()
        } else {
            json!({"anyOf": one})
        }
    }

    /// The grammar of the answer: calls in the model's syntax, or (with `auto`) free text that
    /// does not begin as one (in a marked syntax, text that may end in calls).
    pub fn output_format(&self) -> OutputFormat {
        let args = native_calls::arguments_key(self.syntax);
        let call = self.call_schema(args);
        if let Some(markers) = &self.markers {
            return markers.format(call, self.parallel, self.choice == Choice::Auto);
        }
        match self.choice {
            Choice::Auto => {
                let schema = grammar::compact(call);
                OutputFormat::Lark {
                    grammar: format!("start: call | TEXT\ncall: %json {schema}\nTEXT: /[^{{][\\s\\S]*/\n"),
                }
            }
            _ => OutputFormat::JsonSchema { schema: call },
        }
    }

    /// The calls in a finished answer, if it has any where the grammar puts them (the whole
    /// answer, or in a marked syntax after some lines of text), every one of an offered function.
    pub fn calls(&self, text: &str) -> Option<ToolAnswer> {
        let (content, objects) = match (&self.markers, self.syntax) {
            (Some(markers), _) => markers.read(text)?,
            (None, ToolSyntax::Llama3Json) => (None, vec![native_calls::llama3_object(text)?]),
            (None, _) => (None, vec![serde_json::from_str(text.trim()).ok()?]),
        };
        if objects.is_empty() || (objects.len() > 1 && !self.parallel) {
            return None;
        }
        let args = native_calls::arguments_key(self.syntax);
        let calls = objects
            .iter()
            .map(|v| {
                let name = v.get("name")?.as_str()?;
                let arguments = v.get(args)?;
                self.offered()
                    .any(|f| f.name == name)
                    .then(|| ToolCall { name: name.to_string(), arguments: arguments.to_string() })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(ToolAnswer { content, calls })
    }

    /// An answer's calls as a `tool_calls` array, their ids made from `base` (unique to the
    /// response's choice) as the syntax needs them ([`native_calls::call_id`]); with `stream`,
    /// each carries its `index` (a chunk's delta needs it).
    pub fn calls_json(&self, calls: &[ToolCall], base: &str, stream: bool) -> Value {
        let list = calls
            .iter()
            .enumerate()
            .map(|(k, c)| c.json(&native_calls::call_id(self.syntax, base, k), stream.then_some(k)));
        Value::Array(list.collect())
    }
}

/// An assistant message's `tool_calls`, checked: each a function with a name and arguments
/// (OpenAI sends arguments as a JSON text; a client may send the object, kept as its text).
pub fn history_calls(calls: &Value) -> Option<Vec<text::ToolCall>> {
    calls
        .as_array()?
        .iter()
        .map(|c| {
            let f = c.get("function")?;
            let name = f.get("name")?.as_str()?.to_string();
            let arguments = match f.get("arguments")? {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let id = c.get("id").and_then(Value::as_str).map(str::to_string);
            Some(text::ToolCall { id, function: text::FunctionCall { name, arguments } })
        })
        .collect()
}

/// An earlier turn's calls as a model without a call syntax of its own wrote them (see
/// [`Tools::system_text`]), for the prompt of a later turn.
pub fn calls_as_text(calls: &[text::ToolCall]) -> String {
    let texts: Vec<String> = calls
        .iter()
        .map(|c| {
            let args = serde_json::from_str(&c.function.arguments)
                .unwrap_or_else(|_| Value::String(c.function.arguments.clone()));
            json!({"name": c.function.name, "arguments": args}).to_string()
        })
        .collect();
    texts.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
    }

    fn tools(v: Value) -> Result<Option<Tools>, ApiError> {
        let Value::Object(o) = v else { panic!() };
        parse(&o, ToolSyntax::Generic, &super::native_calls::tests::vocab(&[]))
    }

    #[test]
    fn choices_none_auto_required_and_named() {
        assert!(tools(json!({"tools": weather(), "tool_choice": "none"})).unwrap().is_none());
        assert!(tools(json!({})).unwrap().is_none());
        let t = tools(json!({"tools": weather()})).unwrap().unwrap();
        assert!(matches!(t.output_format(), OutputFormat::Lark { .. }));
        let t = tools(json!({"tools": weather(), "tool_choice": "required"})).unwrap().unwrap();
        assert!(matches!(t.output_format(), OutputFormat::JsonSchema { .. }));
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        assert!(tools(json!({"tools": weather(), "tool_choice": named})).unwrap().is_some());
        let other = json!({"type": "function", "function": {"name": "nope"}});
        assert_eq!(tools(json!({"tools": weather(), "tool_choice": other})).unwrap_err().param.unwrap(), "tool_choice");
    }

    #[test]
    fn bad_tools_are_400_naming_the_place() {
        let e = tools(json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]})).unwrap_err();
        assert_eq!(e.param.unwrap(), "tools[0].function.name");
        let e = tools(json!({"tools": [{"type": "retrieval"}]})).unwrap_err();
        assert_eq!(e.param.unwrap(), "tools[0].type");
        let e = tools(json!({"tool_choice": "required"})).unwrap_err();
        assert_eq!(e.param.unwrap(), "tool_choice");
        // A template prints the description: anything but text is refused, not dropped.
        let e =
            tools(json!({"tools": [{"type": "function", "function": {"name": "f", "description": 5}}]})).unwrap_err();
        assert_eq!(e.param.unwrap(), "tools[0].function.description");
    }

    #[test]
    fn a_call_is_read_back_only_for_an_offered_function() {
        let t = tools(json!({"tools": weather(), "tool_choice": "required"})).unwrap().unwrap();
        let c = t.calls(r#"{"name":"get_weather","arguments":{"city":"Paris"}}"#).unwrap();
        assert_eq!(c.calls, [ToolCall { name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() }]);
        assert_eq!(c.content, None);
        assert!(t.calls(r#"{"name":"rm_rf","arguments":{}}"#).is_none());
        assert!(t.calls("It is sunny.").is_none());
    }
}
