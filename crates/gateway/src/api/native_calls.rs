//! The call syntaxes of models whose templates have one ([`ToolSyntax`]): the grammar an answer
//! is held to and the calls read back from a finished answer. Read back strictly: an answer is
//! calls only if it is nothing but calls, each a JSON object, as the grammar makes it.

use grammar::OutputFormat;
use serde_json::Value;
use text::ToolSyntax;

/// Hermes' block markers (Qwen 2.5 and 3 print them in their templates, as text).
const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
/// Llama 3.1's marker before a call of a built-in tool; a custom call may carry it too.
const PYTHON_TAG: &str = "<|python_tag|>";

/// The key a call's arguments go under: Llama 3's templates ask for `parameters`.
pub(super) fn arguments_key(syntax: ToolSyntax) -> &'static str {
    match syntax {
        ToolSyntax::Llama3Json => "parameters",
        ToolSyntax::Hermes | ToolSyntax::Generic => "arguments",
    }
}

/// The grammar of a Hermes answer: `<tool_call>\n{call}\n</tool_call>` blocks (one, or one or
/// more on lines of their own with `parallel`), each call valid against `call`; with `auto`,
/// free text instead, any that does not begin as a block.
pub(super) fn hermes_format(call: Value, parallel: bool, auto: bool) -> OutputFormat {
    let schema = grammar::compact(call);
    let calls = if parallel { "block (\"\\n\" block)*" } else { "block" };
    let mut grammar = format!(
        "start: {}\ncalls: {calls}\nblock: \"{OPEN}\\n\" call \"\\n{CLOSE}\"\ncall: %json {schema}\n",
        if auto { "calls | TEXT" } else { "calls" }
    );
    if auto {
        grammar.push_str(&format!("TEXT: /{}/\n", not_starting_with(OPEN)));
    }
    OutputFormat::Lark { grammar }
}

/// A regex (no look-ahead: the grammar engine's lexer is a DFA) of the non-empty texts that do
/// not begin with `marker`: a first difference at some character of it, then anything; or a
/// proper prefix of it and nothing more.
fn not_starting_with(marker: &str) -> String {
    let chars: Vec<char> = marker.chars().collect();
    let esc = |c: char| match c {
        '\\' | '/' | '[' | ']' | '^' | '-' | '(' | ')' | '.' | '*' | '+' | '?' | '{' | '}' | '|' | '$' => {
            format!("\\{c}")
        }
        c => c.to_string(),
    };
    let mut alts: Vec<String> = (0..chars.len())
        .map(|i| format!("{}[^{}][\\s\\S]*", chars[..i].iter().map(|&c| esc(c)).collect::<String>(), esc(chars[i])))
        .collect();
    alts.extend((1..chars.len()).map(|i| chars[..i].iter().map(|&c| esc(c)).collect::<String>()));
    format!("(?:{})", alts.join("|"))
}

/// The calls of a Hermes answer: one or more blocks and nothing else but blank space between
/// them; `None` if anything else is there or a block's content is not a JSON object.
pub(super) fn hermes_blocks(text: &str) -> Option<Vec<Value>> {
    let mut rest = text.trim();
    let mut calls = Vec::new();
    while !rest.is_empty() {
        let inner = rest.strip_prefix(OPEN)?;
        let end = inner.find(CLOSE)?;
        let call: Value = serde_json::from_str(inner[..end].trim()).ok()?;
        if !call.is_object() {
            return None;
        }
        calls.push(call);
        rest = inner[end + CLOSE.len()..].trim_start();
    }
    Some(calls)
}

/// The call of a Llama 3 answer: one JSON object, after the built-in tools' marker if present.
pub(super) fn llama3_object(text: &str) -> Option<Value> {
    let text = text.trim();
    let v: Value = serde_json::from_str(text.strip_prefix(PYTHON_TAG).unwrap_or(text).trim()).ok()?;
    v.is_object().then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hermes_answers_are_calls_only_when_nothing_but_blocks() {
        let one = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        assert_eq!(hermes_blocks(one).unwrap().len(), 1);
        let two = format!("{one}\n{one}\n");
        assert_eq!(hermes_blocks(&two).unwrap().len(), 2);
        for not in [
            "It is sunny.",
            "Sure: <tool_call>\n{\"name\": \"f\"}\n</tool_call>",
            "<tool_call>\n{\"name\": \"f\"}\n",
            "<tool_call>\n[1, 2]\n</tool_call>",
            &format!("{one} and more"),
        ] {
            assert!(hermes_blocks(not).is_none(), "{not}");
        }
    }

    #[test]
    fn a_llama3_answer_is_one_object_after_an_optional_python_tag() {
        assert!(llama3_object("{\"name\": \"f\", \"parameters\": {}}").is_some());
        assert!(llama3_object("<|python_tag|>{\"name\": \"f\", \"parameters\": {}}").is_some());
        assert!(llama3_object("The answer is {\"name\": \"f\"}").is_none());
        assert!(llama3_object("[{\"name\": \"f\"}]").is_none());
    }

    /// Model output is shaped by a tenant's prompt: every text made of up to five pieces of the
    /// syntaxes (markers cut anywhere, braces, quotes, multi-byte characters) reads back without
    /// a panic, and whatever is read back is objects only.
    #[test]
    fn any_arrangement_of_marker_pieces_reads_back_without_panicking() {
        let pieces = [
            "<tool_call>",
            "</tool_call>",
            "<tool_",
            "call>",
            "\n",
            " ",
            "{",
            "}",
            "{\"name\": \"f\"}",
            "\"",
            "[1]",
            "é",
            "<|python_tag|>",
        ];
        let mut texts = vec![String::new()];
        for _ in 0..5 {
            let mut next = Vec::with_capacity(texts.len() * pieces.len());
            for t in &texts {
                for p in pieces {
                    let text = format!("{t}{p}");
                    for calls in hermes_blocks(&text).into_iter().chain(llama3_object(&text).map(|v| vec![v])) {
                        assert!(calls.iter().all(Value::is_object), "{text:?}");
                    }
                    next.push(text);
                }
            }
            texts = next;
        }
        assert_eq!(texts.len(), pieces.len().pow(5));
    }
}
