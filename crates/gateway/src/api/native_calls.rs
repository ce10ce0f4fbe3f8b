//! The call syntaxes of models whose templates have one ([`ToolSyntax`]): the grammar an answer
//! is held to and the calls read back from a finished answer. Read back strictly: calls are
//! read only where the grammar puts them, each a JSON object, as the grammar makes it.
//!
//! The marked syntaxes (Hermes' `<tool_call>` blocks, Mistral's `[TOOL_CALLS]` array) let an
//! `auto` answer say something first: free text whose lines do not begin with the marker, then
//! the calls from the start of a line to the end. The text becomes the message's `content`.
//! Lines keep the grammar exact: the engine's lexer is greedy and cannot take back a run of
//! text once it sees a marker in it, so the text is made of lexemes that end at each newline,
//! after which a marker may begin.

use grammar::OutputFormat;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use text::{Tokenizer, ToolSyntax};

/// Hermes' block markers (Qwen 2.5 and 3 print them in their templates, as text).
const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
/// Mistral's call marker (a control token in the v3 and tekken vocabularies).
const MISTRAL: &str = "[TOOL_CALLS]";
/// Llama 3.1's marker before a call of a built-in tool; a custom call may carry it too.
const PYTHON_TAG: &str = "<|python_tag|>";

/// The key a call's arguments go under: Llama 3's templates ask for `parameters`.
pub(super) fn arguments_key(syntax: ToolSyntax) -> &'static str {
    match syntax {
        ToolSyntax::Llama3Json => "parameters",
        ToolSyntax::Hermes | ToolSyntax::MistralJson | ToolSyntax::Generic => "arguments",
    }
}

/// A syntax's marker as this model writes it: the one control token whose text it is, where
/// the vocabulary has one (the model was trained on that token, and no text spells it), else
/// the text itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Marker {
    text: &'static str,
    token: Option<u32>,
}

impl Marker {
    fn in_vocab(text: &'static str, tokenizer: &Tokenizer) -> Marker {
        let token = match tokenizer.encode(text, true).as_deref() {
            Ok(&[id]) if tokenizer.is_special(id) => Some(id),
            _ => None,
        };
        Marker { text, token }
    }

    /// The marker in a Lark rule: the token by id, or the text (the markers hold no `"` or `\`).
    fn atom(&self) -> String {
        match self.token {
            Some(id) => format!("<[{id}]>"),
            None => format!("\"{}\"", self.text),
        }
    }
}

/// The id of call `k` of an answer in `syntax`, from `base` (unique to the response's choice):
/// `base`, `base_1`, ..., except for Mistral's models, whose templates refuse (raise on) a call
/// id that is not nine letters and digits when the client sends the call back in a later
/// turn's history: theirs are nine letters and digits from a hash of `base` and `k`.
pub(super) fn call_id(syntax: ToolSyntax, base: &str, k: usize) -> String {
    const ALPHABET: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    match (syntax, k) {
        (ToolSyntax::MistralJson, _) => {
            let digest = Sha256::digest(format!("{base}/{k}").as_bytes());
            let mut n = u64::from_le_bytes(digest[..8].try_into().unwrap_or_default());
            (0..9)
                .map(|_| {
                    let c = ALPHABET[(n % 62) as usize];
                    n /= 62;
                    char::from(c)
                })
                .collect()
        }
        (_, 0) => base.to_string(),
        (_, _) => format!("{base}_{k}"),
    }
}

/// The markers of a marked syntax (Hermes, Mistral), resolved against the model's vocabulary;
/// Llama 3's JSON and the generic JSON have none (the whole answer is one object).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Markers {
    Hermes { open: Marker, close: Marker },
    Mistral(Marker),
}

impl Markers {
    pub(super) fn of(syntax: ToolSyntax, tokenizer: &Tokenizer) -> Option<Markers> {
        match syntax {
            ToolSyntax::Hermes => Some(Markers::Hermes {
                open: Marker::in_vocab(OPEN, tokenizer),
                close: Marker::in_vocab(CLOSE, tokenizer),
            }),
            ToolSyntax::MistralJson => Some(Markers::Mistral(Marker::in_vocab(MISTRAL, tokenizer))),
            ToolSyntax::Llama3Json | ToolSyntax::Generic => None,
        }
    }

    /// The text an answer's calls begin with.
    fn leading(&self) -> &'static str {
        match self {
            Markers::Hermes { open, .. } => open.text,
            Markers::Mistral(m) => m.text,
        }
    }

    /// The grammar of an answer in this syntax: its calls (one, or with `parallel` one or
    /// more), each valid against `call`; with `auto`, free text instead, or free text and then
    /// calls from the start of a line.
    pub(super) fn format(&self, mut call: Value, parallel: bool, auto: bool) -> OutputFormat {
        if let Markers::Mistral(_) = self {
            // Mistral's models write each call's id after its arguments, as their templates
            // show earlier calls; the grammar lets them (the response's ids are the server's).
            with_mistral_id(&mut call);
        }
        let schema = grammar::compact(call);
        let calls = match self {
            Markers::Hermes { open, close } => {
                let calls = if parallel { "block (\"\\n\" block)*" } else { "block" };
                format!("calls: {calls}\nblock: {} \"\\n\" call \"\\n\" {}\n", open.atom(), close.atom())
            }
            // v3 templates print `[TOOL_CALLS] [`, Nemo's `[TOOL_CALLS][`: either is the model's.
            Markers::Mistral(m) => {
                let more = if parallel { " (\", \" call)*" } else { "" };
                format!("calls: {} \" \"? \"[\" call{more} \"]\"\n", m.atom())
            }
        };
        let start = match auto {
            true => {
                let marker = self.leading();
                format!(
                    "start: LINE* calls | LINE* LAST | LINE+\nLINE: /{}/\nLAST: /{}/\n",
                    line_not_starting_with(marker, true),
                    line_not_starting_with(marker, false)
                )
            }
            false => "start: calls\n".to_string(),
        };
        OutputFormat::Lark { grammar: format!("{start}{calls}call: %json {schema}\n") }
    }

    /// The calls of a finished answer: any text before them (lines not beginning with the
    /// marker) and the calls, as the grammar allows; `None` if there are none or anything else
    /// is there.
    pub(super) fn read(&self, text: &str) -> Option<(Option<String>, Vec<Value>)> {
        let at = line_start_of(text, self.leading())?;
        let (before, rest) = text.split_at(at);
        let calls = match self {
            Markers::Hermes { .. } => hermes_blocks(rest)?,
            Markers::Mistral(_) => mistral_array(rest)?,
        };
        let before = before.trim_end();
        Some(((!before.trim_start().is_empty()).then(|| before.to_string()), calls))
    }
}

/// Adds Mistral's optional `id` (nine letters and digits, as the templates print it) after the
/// arguments of each alternative of a call's schema.
fn with_mistral_id(call: &mut Value) {
    let id = json!({"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"});
    match call.get_mut("anyOf").and_then(Value::as_array_mut) {
        Some(alternatives) => alternatives.iter_mut().for_each(|a| a["properties"]["id"] = id.clone()),
        None => call["properties"]["id"] = id,
    }
}

/// Where the first line of `text` that begins with `marker` begins.
fn line_start_of(text: &str, marker: &str) -> Option<usize> {
    if text.starts_with(marker) {
        return Some(0);
    }
    text.match_indices('\n').map(|(i, _)| i + 1).find(|&i| text[i..].starts_with(marker))
}

/// A regex (no look-ahead: the grammar engine's lexer is a DFA) of one line that does not
/// begin with `marker`: with `newline`, the line and its `\n`; without, a non-empty last line.
/// A first difference at some character of the marker then the rest of the line, or a
/// proper prefix of the marker and no more.
fn line_not_starting_with(marker: &str, newline: bool) -> String {
    let chars: Vec<char> = marker.chars().collect();
    let esc = |c: char| match c {
        '\\' | '/' | '[' | ']' | '^' | '-' | '(' | ')' | '.' | '*' | '+' | '?' | '{' | '}' | '|' | '$' => {
            format!("\\{c}")
        }
        c => c.to_string(),
    };
    let prefix = |i: usize| chars[..i].iter().map(|&c| esc(c)).collect::<String>();
    let end = if newline { "\\n" } else { "" };
    let mut alts: Vec<String> =
        (0..chars.len()).map(|i| format!("{}[^{}\\n][^\\n]*{end}", prefix(i), esc(chars[i]))).collect();
    // The empty prefix is a line of its own only with its newline (the last line is not empty).
    let first = if newline { 0 } else { 1 };
    alts.extend((first..chars.len()).map(|i| format!("{}{end}", prefix(i))));
    format!("(?:{})", alts.join("|"))
}

/// The calls of Hermes blocks: one or more blocks and nothing else but blank space between
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

/// The calls of a Mistral answer: the marker, then one JSON array of objects and nothing else.
fn mistral_array(text: &str) -> Option<Vec<Value>> {
    let list: Value = serde_json::from_str(text.trim().strip_prefix(MISTRAL)?).ok()?;
    let calls = list.as_array()?.clone();
    (!calls.is_empty() && calls.iter().all(Value::is_object)).then_some(calls)
}

/// The call of a Llama 3 answer: one JSON object, after the built-in tools' marker if present.
pub(super) fn llama3_object(text: &str) -> Option<Value> {
    let text = text.trim();
    let v: Value = serde_json::from_str(text.strip_prefix(PYTHON_TAG).unwrap_or(text).trim()).ok()?;
    v.is_object().then_some(v)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use gguf::write::GgufWriter;
    use gguf::Value as Meta;
    use serde_json::json;

    /// A byte-level vocabulary: the 256 bytes, BOS and EOS, and `controls` as control tokens.
    pub(in crate::api) fn vocab(controls: &[&str]) -> Tokenizer {
        let chars = text::bytes_to_chars();
        let mut tokens: Vec<String> = chars.iter().map(char::to_string).collect();
        tokens.push("ab".into());
        tokens.extend(["<|bos|>", "<|eos|>"].iter().chain(controls).map(|s| s.to_string()));
        let types = (0..tokens.len()).map(|i| Meta::I32(if i > 256 { 3 } else { 1 })).collect();
        let n = tokens.len();
        let mut w = GgufWriter::new();
        w.meta("general.architecture", Meta::String("llama".into()))
            .meta("tokenizer.ggml.model", Meta::String("gpt2".into()))
            .meta("tokenizer.ggml.pre", Meta::String("default".into()))
            .meta("tokenizer.ggml.tokens", Meta::Array(tokens.into_iter().map(Meta::String).collect()))
            .meta("tokenizer.ggml.token_type", Meta::Array(types))
            .meta("tokenizer.ggml.merges", Meta::Array(vec![Meta::String("a b".into())]))
            .meta("tokenizer.ggml.bos_token_id", Meta::U32(257))
            .meta("tokenizer.ggml.eos_token_id", Meta::U32(258));
        let bytes = w.to_bytes();
        let tok = Tokenizer::from_gguf(&gguf::Gguf::parse(&bytes).unwrap()).unwrap();
        assert_eq!(tok.vocab_size(), n);
        tok
    }

    fn call() -> Value {
        json!({"type": "object", "properties": {"name": {"const": "f"},
            "arguments": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}},
            "required": ["name", "arguments"]})
    }

    /// Whether the grammar of `markers` takes `tokens` to a complete answer, each token allowed
    /// by the mask before it; `Err(k)` names the first token refused.
    fn walk(tok: &Tokenizer, format: &OutputFormat, tokens: &[u32]) -> Result<bool, usize> {
        let mut c = grammar::Grammars::new(tok).unwrap().compile(format).unwrap();
        for (k, &t) in tokens.iter().enumerate() {
            let mut logits = vec![0.0f32; tok.vocab_size()];
            c.mask(&mut logits).unwrap();
            if !logits[t as usize].is_finite() {
                return Err(k);
            }
            c.accept(t).unwrap();
        }
        Ok(c.is_complete())
    }

    fn ids(tok: &Tokenizer, text: &str) -> Vec<u32> {
        tok.encode(text, false).unwrap()
    }

    /// A call as the grammar writes JSON: compact (see `grammar::compact`).
    const CALL: &str = r#"{"name":"f","arguments":{"a":1}}"#;

    #[test]
    fn a_marker_is_the_vocabularys_control_token_where_it_has_one() {
        let with = vocab(&["[TOOL_CALLS]"]);
        let Some(Markers::Mistral(m)) = Markers::of(ToolSyntax::MistralJson, &with) else { panic!() };
        assert_eq!(m.token, Some(259));
        assert_eq!(m.atom(), "<[259]>");
        let Some(Markers::Mistral(m)) = Markers::of(ToolSyntax::MistralJson, &vocab(&[])) else { panic!() };
        assert_eq!(m.token, None);
        assert_eq!(m.atom(), "\"[TOOL_CALLS]\"");
    }

    #[test]
    fn a_mistral_call_is_its_control_token_then_an_array_and_no_text_can_spell_the_token() {
        let tok = vocab(&["[TOOL_CALLS]"]);
        let markers = Markers::of(ToolSyntax::MistralJson, &tok).unwrap();
        let required = markers.format(call(), true, false);
        let mut answer = vec![259];
        answer.extend(ids(&tok, &format!("[{CALL}, {CALL}]")));
        assert_eq!(walk(&tok, &required, &answer), Ok(true));
        // v3's space after the marker is the model's choice too.
        let mut spaced = vec![259];
        spaced.extend(ids(&tok, &format!(" [{CALL}]")));
        assert_eq!(walk(&tok, &required, &spaced), Ok(true));
        // The marker's text in plain bytes is not the marker.
        assert_eq!(walk(&tok, &required, &ids(&tok, &format!("[TOOL_CALLS][{CALL}]"))), Err(0));
        // Without `parallel`, one call and the array closes.
        let single = markers.format(call(), false, false);
        assert!(walk(&tok, &single, &answer).is_err());

        // With `auto`: text, or text and then calls from the start of a line.
        let auto = markers.format(call(), true, true);
        assert_eq!(walk(&tok, &auto, &ids(&tok, "It is sunny.\nReally.")), Ok(true));
        let mut after_text = ids(&tok, "Let me look.\n");
        after_text.extend(&answer);
        assert_eq!(walk(&tok, &auto, &after_text), Ok(true));
        // A line that begins with the marker's plain text is refused where it becomes the marker.
        let plain = ids(&tok, "Hi\n[TOOL_CALLS]");
        assert_eq!(walk(&tok, &auto, &plain), Err(plain.len() - 1));
        // Mid-line the token cannot come: calls begin a line.
        let mut mid = ids(&tok, "Let me look. ");
        mid.push(259);
        assert_eq!(walk(&tok, &auto, &mid), Err(mid.len() - 1));

        let text = tok.decode(&after_text).unwrap();
        let (content, calls) = markers.read(&text).unwrap();
        assert_eq!(content.as_deref(), Some("Let me look."));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["arguments"]["a"], 1);
    }

    #[test]
    fn a_hermes_answer_may_say_something_first_and_its_calls_still_hold_to_the_schema() {
        let tok = vocab(&[]);
        let markers = Markers::of(ToolSyntax::Hermes, &tok).unwrap();
        let auto = markers.format(call(), true, true);
        let block = format!("<tool_call>\n{CALL}\n</tool_call>");
        for ok in [
            block.clone(),
            format!("{block}\n{block}"),
            format!("I will look it up.\n\n{block}"),
            "It is sunny.".to_string(),
            "Two lines\nof text\n".to_string(),
            // A marker inside a line is text.
            "See <tool_call> in the docs.".to_string(),
        ] {
            assert_eq!(walk(&tok, &auto, &ids(&tok, &ok)), Ok(true), "{ok:?}");
        }
        // Once a line begins as a call, it is held to the schema.
        let bad = ids(&tok, "Let me see.\n<tool_call>\n{\"name\": \"g\"");
        assert!(walk(&tok, &auto, &bad).is_err());
        // Nothing follows the calls.
        assert!(walk(&tok, &auto, &ids(&tok, &format!("{block}\nDone."))).is_err());

        let (content, calls) = markers.read(&format!("I will look it up.\n\n{block}")).unwrap();
        assert_eq!(content.as_deref(), Some("I will look it up."));
        assert_eq!(calls, vec![serde_json::from_str::<Value>(CALL).unwrap()]);
        assert_eq!(markers.read(&block).unwrap().0, None);
        assert!(markers.read("See <tool_call> in the docs.").is_none());
        assert!(markers.read("It is sunny.").is_none());
    }

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
    fn a_mistral_answer_is_one_array_of_objects_after_the_marker() {
        assert_eq!(mistral_array("[TOOL_CALLS] [{\"name\": \"f\"}]").unwrap().len(), 1);
        for not in [
            "[{\"name\": \"f\"}]",
            "[TOOL_CALLS][]",
            "[TOOL_CALLS][1]",
            "[TOOL_CALLS]{\"name\": \"f\"}",
            "[TOOL_CALLS][{}] x",
        ] {
            assert!(mistral_array(not).is_none(), "{not}");
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
    /// syntaxes (markers cut anywhere, braces, quotes, newlines, multi-byte characters) reads
    /// back without a panic, and whatever is read back is objects only.
    #[test]
    fn any_arrangement_of_marker_pieces_reads_back_without_panicking() {
        let pieces = [
            "<tool_call>",
            "</tool_call>",
            "<tool_",
            "call>",
            "[TOOL_CALLS]",
            "\n",
            " ",
            "{",
            "}",
            "[{\"name\": \"f\"}]",
            "\"",
            "é",
            "<|python_tag|>",
        ];
        let marked = [
            Markers::of(ToolSyntax::Hermes, &vocab(&[])).unwrap(),
            Markers::of(ToolSyntax::MistralJson, &vocab(&["[TOOL_CALLS]"])).unwrap(),
        ];
        let mut texts = vec![String::new()];
        for _ in 0..5 {
            let mut next = Vec::with_capacity(texts.len() * pieces.len());
            for t in &texts {
                for p in pieces {
                    let text = format!("{t}{p}");
                    let read = marked.iter().filter_map(|m| m.read(&text).map(|(_, calls)| calls));
                    for calls in read.chain(llama3_object(&text).map(|v| vec![v])) {
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
