//! The fuzz targets' vocabulary: a byte-level BPE tokenizer and ChatML template built from GGUF
//! metadata the way the default model's are (SmolLM pre-tokenizer, control tokens, merges).

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
