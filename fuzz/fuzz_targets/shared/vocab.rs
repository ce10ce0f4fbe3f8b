//! The fuzz targets' vocabularies: a byte-level BPE tokenizer and ChatML template built from GGUF
//! metadata the way the default model's are (SmolLM pre-tokenizer, control tokens, merges), and
//! a SentencePiece one built the way Gemma 3's is (scores, `▁`, byte fallback, user-defined
//! whitespace and tag tokens, no space prefix, no chat template: llama.cpp's ChatML fallback).

use std::sync::OnceLock;

use gguf::write::GgufWriter;
use gguf::{Gguf, Value};
use text::{ChatTemplate, Tokenizer};

const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}\
{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}\
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn s(v: &str) -> Value {
    Value::String(v.to_string())
}

pub fn tokenizer() -> &'static (Tokenizer, ChatTemplate) {
    static T: OnceLock<(Tokenizer, ChatTemplate)> = OnceLock::new();
    T.get_or_init(|| {
        let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_start|>".into(), "<|im_end|>".into()];
        let mut types = vec![Value::I32(3), Value::I32(3), Value::I32(3)];
        for c in text::bytes_to_chars() {
            tokens.push(c.to_string());
            types.push(Value::I32(1));
        }
        let merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "1 2", "Ċ Ċ", "u s", "us er"];
        for m in merges {
            tokens.push(m.replace(' ', ""));
            types.push(Value::I32(1));
        }
        let mut w = GgufWriter::new();
        w.meta("general.architecture", s("llama"))
            .meta("tokenizer.ggml.model", s("gpt2"))
            .meta("tokenizer.ggml.pre", s("smollm"))
            .meta("tokenizer.ggml.tokens", Value::Array(tokens.iter().map(|t| s(t)).collect()))
            .meta("tokenizer.ggml.token_type", Value::Array(types))
            .meta("tokenizer.ggml.merges", Value::Array(merges.iter().map(|m| s(m)).collect()))
            .meta("tokenizer.ggml.eos_token_id", Value::U32(2))
            .meta("tokenizer.ggml.bos_token_id", Value::U32(1))
            .meta("tokenizer.chat_template", s(CHATML));
        let g = Gguf::parse(&w.to_bytes()).expect("the fuzz vocabulary parses");
        (
            Tokenizer::from_gguf(&g).expect("the fuzz tokenizer builds"),
            ChatTemplate::from_gguf(&g).expect("the fuzz template compiles"),
        )
    })
}

/// The SentencePiece (`tokenizer.ggml.model = "llama"`) vocabulary, shaped like Gemma 3's.
#[allow(dead_code)] // not every target that includes this file uses it
pub fn spm_tokenizer() -> &'static (Tokenizer, ChatTemplate) {
    static T: OnceLock<(Tokenizer, ChatTemplate)> = OnceLock::new();
    T.get_or_init(|| {
        let mut tokens: Vec<String> = Vec::new();
        let mut types = Vec::new();
        let mut scores = Vec::new();
        let mut add = |t: &str, ty: i32, score: f32| {
            tokens.push(t.to_string());
            types.push(Value::I32(ty));
            scores.push(Value::F32(score));
        };
        add("<pad>", 3, -1000.0);
        add("<eos>", 3, -1000.0);
        add("<bos>", 3, -1000.0);
        add("<unk>", 2, -1000.0);
        for t in ["<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>"] {
            add(t, 3, -1000.0);
        }
        for t in ["\n", "\n\n", "  ", "\t\t", "<b>", "</b>"] {
            add(t, 4, -1000.0);
        }
        for b in 0..=255u8 {
            add(&format!("<0x{b:02X}>"), 6, 0.0);
        }
        // Single characters, then merges; scores chosen so that merge order matters.
        let pieces = [
            "▁", "t", "h", "e", "i", "n", "a", "r", "u", "s", "1", "2", "<", ">", "é", "th", "he", "▁t", "▁th", "▁the",
            "in", "▁a", "er", "us", "use", "user", "12", "▁▁", "<|", "▁<",
        ];
        for (i, p) in pieces.iter().enumerate() {
            add(p, 1, -(i as f32) / 2.0 - if p.chars().count() == 1 { 100.0 } else { 0.0 });
        }
        let mut w = GgufWriter::new();
        w.meta("general.architecture", s("gemma3"))
            .meta("tokenizer.ggml.model", s("llama"))
            .meta("tokenizer.ggml.pre", s("default"))
            .meta("tokenizer.ggml.tokens", Value::Array(tokens.iter().map(|t| s(t)).collect()))
            .meta("tokenizer.ggml.scores", Value::Array(scores))
            .meta("tokenizer.ggml.token_type", Value::Array(types))
            .meta("tokenizer.ggml.bos_token_id", Value::U32(2))
            .meta("tokenizer.ggml.eos_token_id", Value::U32(1))
            .meta("tokenizer.ggml.add_space_prefix", Value::Bool(false));
        let g = Gguf::parse(&w.to_bytes()).expect("the fuzz SPM vocabulary parses");
        (
            Tokenizer::from_gguf(&g).expect("the fuzz SPM tokenizer builds"),
            ChatTemplate::from_gguf(&g).expect("the ChatML fallback compiles"),
        )
    })
}
