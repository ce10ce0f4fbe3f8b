//! A client's text as the gateway turns it into tokens: arbitrary chat messages (any role and
//! content, control-token texts included) through a ChatML template, and arbitrary prompt text,
//! through a byte-level BPE tokenizer built from GGUF metadata the way the default model's is
//! (SmolLM pre-tokenizer, control tokens, merges). Properties: nothing panics; every id is in
//! the vocabulary; raw text (no special-token parsing) decodes back to itself byte for byte.
#![no_main]
use std::sync::OnceLock;

use gguf::write::GgufWriter;
use gguf::{Gguf, Value};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use text::{ChatMessage, ChatTemplate, Tokenizer};

const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}\
{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}\
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn s(v: &str) -> Value {
    Value::String(v.to_string())
}

fn tokenizer() -> &'static (Tokenizer, ChatTemplate) {
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

#[derive(Debug, Arbitrary)]
enum Input {
    /// `/v1/completions`: raw text, control-token texts stay text.
    Prompt(String),
    /// `/v1/chat/completions`: rendered, then tokenized with special-token parsing.
    Chat(Vec<(String, String)>),
}

fn in_vocab(t: &Tokenizer, ids: &[u32]) {
    assert!(ids.iter().all(|&i| (i as usize) < t.vocab_size()), "an id outside the vocabulary");
}

fuzz_target!(|input: Input| {
    let (tok, template) = tokenizer();
    match input {
        Input::Prompt(text) => {
            if let Ok(ids) = tok.encode(&text, false) {
                in_vocab(tok, &ids);
                let back = tok.decode_bytes(&ids).expect("our own ids decode");
                assert_eq!(back, text.as_bytes(), "raw text did not round-trip");
            }
            if let Ok(ids) = tok.encode(&text, true) {
                in_vocab(tok, &ids);
            }
        }
        Input::Chat(messages) => {
            let messages: Vec<ChatMessage> = messages.into_iter().map(|(r, c)| ChatMessage::new(r, c)).collect();
            if let Ok(rendered) = template.render(&messages, true) {
                if let Ok(ids) = tok.encode(&rendered, true) {
                    in_vocab(tok, &ids);
                }
            }
        }
    }
});
