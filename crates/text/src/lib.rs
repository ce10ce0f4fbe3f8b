//! Text in and out of the model.
//!
//! A served prompt must become exactly the token ids the model was trained to read, and generated
//! ids must become exactly the bytes the model meant: a tokenizer that disagrees with the
//! reference (llama.cpp) by one id silently degrades every answer, and a prompt template that
//! differs by one newline changes what the model does. This crate builds both from the model
//! file itself, from GGUF metadata only, so there is no second source of truth to drift:
//!
//! * [`Tokenizer`]: byte-level BPE (`"gpt2"`) or SentencePiece (`"llama"`: Llama 2, Phi-3,
//!   Gemma 3) from `tokenizer.ggml.*`, matching llama.cpp's tokenization (special-token parsing,
//!   pre-tokenizer splits, merge ranks or scores, byte fallback) and decoding losslessly to
//!   bytes. BPE pre-tokenizers (`tokenizer.ggml.pre`): GPT-2, SmolLM/StarCoder, Llama 3, Qwen2
//!   (Qwen2.5, Qwen3) and Qwen 3.5, each proven id for id on llama.cpp's own test vectors
//!   (tests/llama_cpp_vocabs.rs; the list and how each is verified: pretokenize.rs);
//! * [`StreamDecoder`]: incremental detokenization that never emits half a UTF-8 character;
//! * [`ChatTemplate`]: the model's own Jinja chat template (`tokenizer.chat_template`), or
//!   llama.cpp's ChatML fallback when the model has none, rendering a [`Conversation`] (tools,
//!   tool calls and results included) byte for byte as llama.cpp's `--jinja` does
//!   (tests/templates_vs_llamacpp.rs).
//!
//! Unsupported tokenizers are refused with a typed [`TextError`] at load time rather than
//! approximated.

#![forbid(unsafe_code)]

mod bpe;
mod chat;
mod error;
mod pretokenize;
mod spm;
mod stream;
mod tokenizer;

pub use chat::{
    ChatMessage, ChatTemplate, Conversation, FunctionCall, Json, Message, TemplateCaps, Tool, ToolCall, ToolSyntax,
};
pub use error::TextError;
pub use stream::StreamDecoder;
pub use tokenizer::{bytes_to_chars, Tokenizer};

#[cfg(test)]
mod tests {
    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn shared_types_are_send_sync() {
        assert_send_sync::<crate::Tokenizer>();
        assert_send_sync::<crate::ChatTemplate>();
        assert_send_sync::<crate::TextError>();
    }
}
