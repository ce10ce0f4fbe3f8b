//! Function calling: a request's `tools` and `tool_choice`, what the model is told about them,
//! the grammar its answer is held to, and the `tool_calls` read back from that answer.
//!
//! The model is shown the functions in a system message and answers a call as one JSON object
//! `{"name": ..., "arguments": {...}}`. With `tool_choice` `required` (or a named function) the
//! answer is held to the union of the functions' schemas, so its arguments always validate;
//! with `auto` it is held to "free text, or such a call", and the model chooses.

use serde_json::{json, Map, Value};

use grammar::OutputFormat;

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

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `tools` and `tool_choice`; `None` when no function may be called (no tools, or `none`).
pub fn parse(o: &Map<String, Value>) -> Result<Option<Tools>, ApiError> {
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
        let description = f.get("description").and_then(Value::as_str).map(str::to_string);
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
    Ok(Some(Tools { functions, choice }))
}

impl Tools {
    fn offered(&self) -> impl Iterator<Item = &Function> {
        self.functions.iter().filter(|f| match &self.choice {
            Choice::Named(n) => &f.name == n,
            _ => true,
        })
    }

    /// What the model is told: the functions, and the one form a call takes.
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

    /// The schema of one call to any offered function.
    fn call_schema(&self) -> Value {
        let one: Vec<Value> = self
            .offered()
            .map(|f| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": f.name}, "arguments": f.parameters},
                    "required": ["name", "arguments"],
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

    /// The grammar of the answer: a call, or (with `auto`) free text not starting with `{`.
    pub fn output_format(&self) -> OutputFormat {
        let call = self.call_schema();
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

    /// The call in a finished answer, if the answer is one.
    pub fn call(&self, text: &str) -> Option<ToolCall> {
        let v: Value = serde_json::from_str(text.trim()).ok()?;
        let name = v.get("name")?.as_str()?;
        let args = v.get("arguments")?;
        self.offered().any(|f| f.name == name).then(|| ToolCall { name: name.to_string(), arguments: args.to_string() })
    }
}

/// An assistant message's `tool_calls` as the model wrote them, for the prompt of a later turn.
pub fn calls_as_text(calls: &Value) -> Option<String> {
    let list = calls.as_array()?;
    let texts: Option<Vec<String>> = list
        .iter()
        .map(|c| {
            let f = c.get("function")?;
            let name = f.get("name")?.as_str()?;
            // OpenAI sends arguments as a JSON text; a client may send the object.
            let args = match f.get("arguments")? {
                Value::String(s) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
                other => other.clone(),
            };
            Some(json!({"name": name, "arguments": args}).to_string())
        })
        .collect();
    texts.map(|t| t.join("\n"))
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
        parse(&o)
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
    }

    #[test]
    fn a_call_is_read_back_only_for_an_offered_function() {
        let t = tools(json!({"tools": weather(), "tool_choice": "required"})).unwrap().unwrap();
        let c = t.call(r#"{"name":"get_weather","arguments":{"city":"Paris"}}"#).unwrap();
        assert_eq!(c, ToolCall { name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() });
        assert!(t.call(r#"{"name":"rm_rf","arguments":{}}"#).is_none());
        assert!(t.call("It is sunny.").is_none());
    }
}
