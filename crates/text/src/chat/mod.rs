//! Chat prompts rendered from the model's own Jinja template (`tokenizer.chat_template`), with
//! the settings HF transformers and llama.cpp use, so that the prompt the model sees is the one
//! it was trained on.

mod caps;
mod clock;
mod context;
mod conversation;
mod functions;
mod json;
mod tool_syntax;

use minijinja::{Environment, UndefinedBehavior};
use serde::{Deserialize, Serialize};

pub use caps::TemplateCaps;
pub use conversation::{Conversation, FunctionCall, Message, Tool, ToolCall};
pub use json::Json;
pub use tool_syntax::ToolSyntax;

use crate::TextError;

const NAME: &str = "chat";

/// The template llama.cpp uses for a model without `tokenizer.chat_template`
/// (`CHATML_TEMPLATE_SRC` in llama.cpp's common/chat.cpp): ChatML, no system prompt added.
pub(crate) const CHATML_FALLBACK: &str = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\n' -}}\n{%- endif -%}";

/// One turn of a plain-text conversation, as in the OpenAI chat API. (A turn with tool calls
/// or a tool result is a [`Message`].)
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

/// A compiled chat template, what it supports (probed once, as llama.cpp does at load) and the
/// BOS/EOS texts it may reference.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    caps: TemplateCaps,
    /// GPT-OSS style templates (`<|channel|>`) know the `developer` role; llama.cpp maps it to
    /// `system` for every other template.
    knows_developer: bool,
    tool_syntax: ToolSyntax,
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
    /// `Undefined`), llama.cpp's `tojson` and `strftime_now`, `raise_exception` and common Python
    /// string methods; then probes what the template supports ([`TemplateCaps`]).
    pub fn from_source(src: &str, bos: &str, eos: &str) -> Result<ChatTemplate, TextError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.add_function("raise_exception", functions::raise_exception);
        env.add_filter("tojson", functions::tojson);
        env.set_unknown_method_callback(functions::python_method);
        env.add_template_owned(NAME, src.to_string()).map_err(TextError::TemplateSyntax)?;
        let caps = caps::detect(&env.get_template(NAME).map_err(TextError::TemplateSyntax)?);
        let knows_developer = src.contains("<|channel|>");
        let tool_syntax = ToolSyntax::detect(src, caps.supports_tools);
        Ok(ChatTemplate { env, bos: bos.to_string(), eos: eos.to_string(), caps, knows_developer, tool_syntax })
    }

    /// The ids of a prompt this template rendered, as llama.cpp tokenizes one: control-token
    /// texts parsed, BOS added when the vocabulary adds it, and then a BOS text the template
    /// printed at the start dropped first, so the model never sees two (Llama 3's templates
    /// print `bos_token` and its vocabulary adds BOS too).
    pub fn encode(&self, tokenizer: &crate::Tokenizer, rendered: &str) -> Result<Vec<u32>, TextError> {
        let text = match tokenizer.add_bos() && !self.bos.is_empty() {
            true => rendered.strip_prefix(self.bos.as_str()).unwrap_or(rendered),
            false => rendered,
        };
        tokenizer.encode_prompt(text, true)
    }

    /// What the template was found to support; decides how conversations are adapted to it.
    pub fn caps(&self) -> TemplateCaps {
        self.caps
    }

    /// How this template's model writes a function call.
    pub fn tool_syntax(&self) -> ToolSyntax {
        self.tool_syntax
    }

    /// The prompt for plain-text `messages`; with `add_generation_prompt` it ends where the
    /// assistant's reply begins. The same as [`render_with`](Self::render_with) on them.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TextError> {
        let mut conv =
            Conversation::new(messages.iter().map(|m| Message::new(m.role.as_str(), m.content.as_str())).collect());
        conv.add_generation_prompt = add_generation_prompt;
        self.render_with(&conv)
    }

    /// The prompt for `conv` as llama.cpp's `--jinja` renders it: messages adapted to the
    /// template's [`caps`](Self::caps) (context.rs), tools, tool calls and results, and the
    /// variables llama-server always sets.
    pub fn render_with(&self, conv: &Conversation) -> Result<String, TextError> {
        let tmpl = self.env.get_template(NAME).map_err(TextError::TemplateRender)?;
        let ctx = context::globals(conv, &self.caps, self.knows_developer, &self.bos, &self.eos)?;
        tmpl.render(ctx).map_err(functions::map_render_error)
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

    #[test]
    fn arguments_that_are_not_json_are_refused_where_read_as_objects() {
        let src = "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}";
        let t = ChatTemplate::from_source(src, "", "").expect("compiles");
        assert!(t.caps().supports_object_arguments);
        let mut call = Message::new("assistant", "");
        call.tool_calls
            .push(ToolCall { id: None, function: FunctionCall { name: "f".into(), arguments: "{not json".into() } });
        let conv = Conversation::new(vec![Message::new("user", "x"), call]);
        assert!(matches!(t.render_with(&conv), Err(TextError::ToolArguments { .. })));
    }
}
