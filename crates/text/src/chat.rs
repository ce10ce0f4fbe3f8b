//! Chat prompts rendered from the model's own Jinja template (`tokenizer.chat_template`), with
//! the settings HF transformers and llama.cpp use, so that the prompt the model sees is the one
//! it was trained on.

use minijinja::value::{Value, ValueKind};
use minijinja::{context, Environment, Error, ErrorKind, State, UndefinedBehavior};
use serde::{Deserialize, Serialize};

use crate::TextError;

const NAME: &str = "chat";

/// The template llama.cpp uses for a model without `tokenizer.chat_template`
/// (`CHATML_TEMPLATE_SRC` in llama.cpp's common/chat.cpp): ChatML, no system prompt added.
pub(crate) const CHATML_FALLBACK: &str = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\n' -}}\n{%- endif -%}";

/// One turn of a conversation, as in the OpenAI chat API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// A compiled chat template plus the BOS/EOS texts it may reference.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

/// The message `raise_exception` was called with, carried through minijinja as an error source.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, "raise_exception called").with_source(Raised(msg)))
}

fn to_json(v: Value) -> Result<Value, Error> {
    serde_json::to_string(&v)
        .map(Value::from_safe_string)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))
}

fn str_arg(args: &[Value], i: usize) -> Option<&str> {
    args.get(i).and_then(|v| v.as_str())
}

/// The Python `str`/`dict` methods chat templates written for HF transformers commonly call.
fn python_method(state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    let unknown = || Err(Error::from(ErrorKind::UnknownMethod));
    match value.kind() {
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            let chars: Option<Vec<char>> = str_arg(args, 0).map(|c| c.chars().collect());
            let strip_set = |c: char| match &chars {
                Some(set) => set.contains(&c),
                None => c.is_whitespace(),
            };
            Ok(match method {
                "strip" => Value::from(s.trim_matches(strip_set)),
                "lstrip" => Value::from(s.trim_start_matches(strip_set)),
                "rstrip" => Value::from(s.trim_end_matches(strip_set)),
                "startswith" => Value::from(str_arg(args, 0).is_some_and(|p| s.starts_with(p))),
                "endswith" => Value::from(str_arg(args, 0).is_some_and(|p| s.ends_with(p))),
                "upper" => Value::from(s.to_uppercase()),
                "lower" => Value::from(s.to_lowercase()),
                "title" | "capitalize" | "replace" | "split" => state.apply_filter(
                    method,
                    &std::iter::once(value.clone()).chain(args.iter().cloned()).collect::<Vec<_>>(),
                )?,
                "join" => state.apply_filter("join", &[args.first().cloned().unwrap_or_default(), value.clone()])?,
                _ => return unknown(),
            })
        }
        ValueKind::Map => match method {
            "items" => state.apply_filter("items", std::slice::from_ref(value)),
            "keys" => Ok(Value::from(value.try_iter()?.collect::<Vec<_>>())),
            "values" => {
                let vals: Result<Vec<Value>, Error> = value.try_iter()?.map(|k| value.get_item(&k)).collect();
                Ok(Value::from(vals?))
            }
            "get" => {
                let key = args.first().cloned().unwrap_or_default();
                let v = value.get_item(&key)?;
                Ok(if v.is_undefined() { args.get(1).cloned().unwrap_or(Value::from(())) } else { v })
            }
            _ => unknown(),
        },
        _ => unknown(),
    }
}

fn map_render_error(e: Error) -> TextError {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = src {
        if let Some(r) = s.downcast_ref::<Raised>() {
            return TextError::TemplateRaised(r.0.clone());
        }
        src = s.source();
    }
    TextError::TemplateRender(e)
}

impl ChatTemplate {
    /// The template in `tokenizer.chat_template`, with BOS/EOS texts from the vocabulary. A model
    /// without the key gets llama.cpp's fallback, [`CHATML_FALLBACK`] (Gemma 3's GGUF has none).
    pub fn from_gguf(g: &gguf::Gguf) -> Result<ChatTemplate, TextError> {
        let src = match g.get("tokenizer.chat_template") {
            None => CHATML_FALLBACK,
            Some(v) => v.as_str().ok_or(TextError::MissingChatTemplate)?,
        };
        let token_text = |key: &str| -> String {
            let Some(id) = g.get(key).and_then(|v| v.as_u64()) else {
                return String::new();
            };
            g.get("tokenizer.ggml.tokens")
                .and_then(|v| v.as_array())
                .and_then(|a| usize::try_from(id).ok().and_then(|i| a.get(i)))
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let bos = token_text("tokenizer.ggml.bos_token_id");
        let eos = token_text("tokenizer.ggml.eos_token_id");
        Self::from_source(src, &bos, &eos)
    }

    /// Compiles `src` with Jinja settings matching HF transformers / llama.cpp: `trim_blocks`,
    /// `lstrip_blocks`, no trailing newline kept, lenient undefined values (as Jinja2's default
    /// `Undefined`), and `raise_exception`, `tojson` and common Python string methods available.
    pub fn from_source(src: &str, bos: &str, eos: &str) -> Result<ChatTemplate, TextError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", to_json);
        env.set_unknown_method_callback(python_method);
        env.add_template_owned(NAME, src.to_string()).map_err(TextError::TemplateSyntax)?;
        Ok(ChatTemplate { env, bos: bos.to_string(), eos: eos.to_string() })
    }

    /// The prompt for `messages`; with `add_generation_prompt` it ends where the assistant's
    /// reply begins.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TextError> {
        let tmpl = self.env.get_template(NAME).map_err(TextError::TemplateRender)?;
        let ctx = context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.as_str(),
            eos_token => self.eos.as_str(),
        };
        tmpl.render(ctx).map_err(map_render_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's `CHATML_TEMPLATE_SRC`, as its server reports it for Gemma 3 (which has no
    /// template of its own): reference/gemma3/gemma3_reference.json, meta.props_subset.
    const LLAMA_CPP_CHATML: &str = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\n' -}}\n{%- endif -%}";

    fn gguf_without_template() -> gguf::Gguf {
        let mut w = gguf::write::GgufWriter::new();
        w.meta("general.architecture", gguf::Value::String("gemma3".into()));
        gguf::Gguf::parse(&w.to_bytes()).expect("parses")
    }

    #[test]
    fn missing_template_falls_back_to_llama_cpp_chatml() {
        assert_eq!(CHATML_FALLBACK, LLAMA_CPP_CHATML);
        let t = ChatTemplate::from_gguf(&gguf_without_template()).expect("falls back");
        let msgs = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi")];
        assert_eq!(
            t.render(&msgs, true).expect("render"),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(t.render(&msgs[1..], false).expect("render"), "<|im_start|>user\nHi<|im_end|>\n");
    }

    #[test]
    fn template_key_of_the_wrong_type_is_typed() {
        let mut w = gguf::write::GgufWriter::new();
        w.meta("tokenizer.chat_template", gguf::Value::U32(1));
        let g = gguf::Gguf::parse(&w.to_bytes()).expect("parses");
        assert!(matches!(ChatTemplate::from_gguf(&g), Err(TextError::MissingChatTemplate)));
    }
}
