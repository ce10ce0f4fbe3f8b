//! Typed errors, and the tokenizer and template rules checked on small GGUFs built in the test.

#![allow(clippy::expect_used)] // test helpers outside #[test] fns

use gguf::write::GgufWriter;
use gguf::{Gguf, Value};
use text::{ChatMessage, ChatTemplate, TextError, Tokenizer};

fn s(v: &str) -> Value {
    Value::String(v.to_string())
}

fn strs(v: &[&str]) -> Value {
    Value::Array(v.iter().map(|x| s(x)).collect())
}

/// GPT-2 byte-level characters for all 256 bytes, in byte order.
fn byte_chars() -> Vec<String> {
    let mut extra = 0;
    (0..=255u32)
        .map(|b| {
            let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
            let cp = if printable {
                b
            } else {
                extra += 1;
                255 + extra
            };
            char::from_u32(cp).expect("char").to_string()
        })
        .collect()
}

/// A tiny vocabulary: 3 control-ish tokens, the 256 byte characters, then merged tokens.
fn tiny(model: &str, pre: Option<&str>, extra: &[(&str, &str)]) -> Gguf {
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|c|>".into(), "<u>".into()];
    let mut types: Vec<Value> = vec![Value::I32(3), Value::I32(3), Value::I32(4)];
    for c in byte_chars() {
        tokens.push(c);
        types.push(Value::I32(1));
    }
    for t in ["Ġa", "Ġab", "12"] {
        tokens.push(t.into());
        types.push(Value::I32(1));
    }
    let tok_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut w = GgufWriter::new();
    w.meta("general.architecture", s("llama"))
        .meta("tokenizer.ggml.model", s(model))
        .meta("tokenizer.ggml.tokens", strs(&tok_refs))
        .meta("tokenizer.ggml.token_type", Value::Array(types))
        .meta("tokenizer.ggml.merges", strs(&["Ġ a", "Ġa b", "1 2"]))
        .meta("tokenizer.ggml.eos_token_id", Value::U32(0));
    if let Some(p) = pre {
        w.meta("tokenizer.ggml.pre", s(p));
    }
    for (k, v) in extra {
        w.meta(k, s(v));
    }
    Gguf::parse(&w.to_bytes()).expect("tiny gguf parses")
}

fn id_of(t: &Tokenizer, text: &str) -> u32 {
    (0..t.vocab_size() as u32).find(|&i| t.token_bytes(i) == Some(text.as_bytes())).expect("token")
}

#[test]
fn unsupported_tokenizer_model_is_named_with_the_supported_ones() {
    let err = Tokenizer::from_gguf(&tiny("bert", Some("default"), &[])).expect_err("wpm refused");
    assert!(matches!(&err, TextError::UnsupportedModel(m) if m == "bert"), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("\"bert\"") && msg.contains("\"gpt2\"") && msg.contains("\"llama\""), "{msg}");
}

#[test]
fn unsupported_pre_tokenizer_is_named() {
    // Mistral Nemo's: llama.cpp knows it, but no test here proves a splitter for it.
    let err = Tokenizer::from_gguf(&tiny("gpt2", Some("tekken"), &[])).expect_err("pre refused");
    assert!(matches!(&err, TextError::UnsupportedPre(p) if p == "tekken"), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("\"tekken\""), "{msg}");
    for supported in ["\"llama-bpe\"", "\"qwen2\"", "\"qwen35\"", "\"smollm\""] {
        assert!(msg.contains(supported), "{msg}");
    }
}

#[test]
fn missing_tokenizer_metadata_is_typed() {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", s("llama"));
    let g = Gguf::parse(&w.to_bytes()).expect("parses");
    assert!(matches!(Tokenizer::from_gguf(&g), Err(TextError::Metadata(_))));
}

#[test]
fn missing_chat_template_falls_back_to_chatml_like_llama_cpp() {
    let t = ChatTemplate::from_gguf(&tiny("gpt2", Some("gpt2"), &[])).expect("ChatML fallback");
    assert_eq!(
        t.render(&[ChatMessage::new("user", "x")], true).expect("render"),
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn unknown_token_id_is_typed() {
    let t = Tokenizer::from_gguf(&tiny("gpt2", Some("smollm"), &[])).expect("builds");
    let n = t.vocab_size() as u32;
    let err = t.decode_bytes(&[3, n]).expect_err("unknown id");
    assert!(matches!(err, TextError::UnknownToken { id, vocab_size } if id == n && vocab_size == n as usize));
    assert!(matches!(t.decode(&[u32::MAX]), Err(TextError::UnknownToken { .. })));
    assert_eq!(t.token_bytes(n), None);
    assert!(!t.is_special(n));
}

#[test]
fn tiny_vocab_merges_and_special_rules() {
    let t = Tokenizer::from_gguf(&tiny("gpt2", Some("smollm"), &[])).expect("builds");
    let (c, u, ab) = (id_of(&t, "<|c|>"), id_of(&t, "<u>"), id_of(&t, " ab"));
    assert_eq!(t.encode(" ab", false).expect("encode"), vec![ab], "merges with Ġ apply");
    // Control tokens parse only with parse_special; user-defined ones always (llama.cpp).
    assert_eq!(t.encode("<|c|>", true).expect("encode"), vec![c]);
    assert_ne!(t.encode("<|c|>", false).expect("encode"), vec![c]);
    assert_eq!(t.encode("<u>", false).expect("encode"), vec![u]);
    assert_eq!(t.encode(" ab<u> ab", false).expect("encode"), vec![ab, u, ab]);
    assert!(t.is_special(c) && !t.is_special(u));
    assert_eq!(t.bos(), None);
    assert_eq!(t.eos(), 0);
    assert_eq!(t.stop_tokens(), vec![0]);
    // smollm splits digits; gpt2 keeps them together so the "1 2" merge applies.
    let twelve = id_of(&t, "12");
    assert_ne!(t.encode("12", false).expect("encode"), vec![twelve]);
    let g = Tokenizer::from_gguf(&tiny("gpt2", Some("gpt2"), &[])).expect("builds");
    assert_eq!(g.encode("12", false).expect("encode"), vec![twelve]);
    // A missing pre-tokenizer key means "default", as in llama.cpp.
    assert!(Tokenizer::from_gguf(&tiny("gpt2", None, &[])).is_ok());
}

#[test]
fn template_from_tiny_gguf_uses_vocab_texts() {
    let g = tiny(
        "gpt2",
        Some("gpt2"),
        &[("tokenizer.chat_template", "{{ bos_token }}|{{ eos_token }}|{{ messages[0].content }}")],
    );
    let t = ChatTemplate::from_gguf(&g).expect("template");
    assert_eq!(t.render(&[ChatMessage::new("user", "x")], false).expect("render"), "|<|endoftext|>|x");
}

#[test]
fn template_syntax_error_is_typed() {
    let err = ChatTemplate::from_source("{% for m in messages %}", "", "").expect_err("bad syntax");
    assert!(matches!(err, TextError::TemplateSyntax(_)), "{err}");
}

#[test]
fn raise_exception_is_typed_with_its_message() {
    let t = ChatTemplate::from_source(
        "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok",
        "",
        "",
    )
    .expect("compiles");
    assert_eq!(t.render(&[ChatMessage::new("user", "x")], true).expect("render"), "ok");
    let err = t.render(&[ChatMessage::new("assistant", "x")], true).expect_err("raises");
    assert!(matches!(&err, TextError::TemplateRaised(m) if m == "Conversation must start with user"), "{err}");
}

#[test]
fn undefined_attribute_of_undefined_is_a_render_error() {
    let t = ChatTemplate::from_source("{{ nothing.field }}", "", "").expect("compiles");
    assert!(matches!(t.render(&[], true), Err(TextError::TemplateRender(_))));
}

/// Expected output produced by Python Jinja2 3.1 with HF transformers' settings
/// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks).
#[test]
fn template_renders_like_hf_jinja2() {
    let src = "{{ bos_token }}\n{% for message in messages %}\n    {% if message['role'] not in ['system', 'user', 'assistant'] %}\n        {{ raise_exception('unknown role ' + message['role']) }}\n    {% endif %}\n    {% if loop.first and message.role == 'system' %}\n[SYS] {{ message['content'].strip() }}\n    {% elif message.content.startswith('!') %}\n<{{ message.role.upper() }}!>{{ message.content.lstrip('!') | trim }}{{ eos_token }}\n    {% else %}\n<{{ message.role }}>{{ message.content }}{% if message.name %} ({{ message.name }}){% endif %}{{ eos_token }}\n    {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}\n<assistant>\n{% endif %}\n";
    let t = ChatTemplate::from_source(src, "<s>", "</s>").expect("compiles");
    let msgs = [
        ChatMessage::new("system", "  Be brief.  "),
        ChatMessage::new("user", "!! hello "),
        ChatMessage::new("assistant", "Hi\nthere"),
        ChatMessage::new("user", "x"),
    ];
    assert_eq!(
        t.render(&msgs, true).expect("render"),
        "<s>\n[SYS] Be brief.\n<USER!>hello</s>\n<assistant>Hi\nthere</s>\n<user>x</s>\n<assistant>\n"
    );
    assert_eq!(
        t.render(&msgs, false).expect("render"),
        "<s>\n[SYS] Be brief.\n<USER!>hello</s>\n<assistant>Hi\nthere</s>\n<user>x</s>\n"
    );
    let err = t.render(&[ChatMessage::new("tool", "x")], true).expect_err("raises");
    assert!(matches!(&err, TextError::TemplateRaised(m) if m == "unknown role tool"), "{err}");
}

#[test]
fn chat_message_serde_shape() {
    let m: ChatMessage = serde_json::from_str(r#"{"role":"user","content":"hi"}"#).expect("deserialize");
    assert_eq!(m, ChatMessage::new("user", "hi"));
    assert_eq!(serde_json::to_string(&m).expect("serialize"), r#"{"role":"user","content":"hi"}"#);
}

/// A tiny SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, a user-defined `<u>`, the 256 byte
/// tokens, then `▁`, `h`, `i`, `hi`, `▁hi` with scores (no BOS/EOS keys: llama.cpp's defaults apply).
fn tiny_spm(extra: &[(&str, Value)], scores: Option<usize>) -> Gguf {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into(), "<u>".into()];
    let mut types: Vec<Value> = vec![Value::I32(2), Value::I32(3), Value::I32(3), Value::I32(4)];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(Value::I32(6));
    }
    for t in ["▁", "h", "i", "hi", "▁hi"] {
        tokens.push(t.into());
        types.push(Value::I32(1));
    }
    let n = scores.unwrap_or(tokens.len());
    let score = |t: &str| match t {
        "▁hi" => -1.0,
        "hi" => -5.0,
        _ => -10.0,
    };
    let score_values = tokens.iter().cycle().take(n).map(|t| Value::F32(score(t))).collect();
    let tok_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut w = GgufWriter::new();
    w.meta("general.architecture", s("gemma3"))
        .meta("tokenizer.ggml.model", s("llama"))
        .meta("tokenizer.ggml.pre", s("no-such-pre-tokenizer"))
        .meta("tokenizer.ggml.tokens", strs(&tok_refs))
        .meta("tokenizer.ggml.token_type", Value::Array(types))
        .meta("tokenizer.ggml.scores", Value::Array(score_values));
    for (k, v) in extra {
        w.meta(k, v.clone());
    }
    Gguf::parse(&w.to_bytes()).expect("tiny spm gguf parses")
}

#[test]
fn tiny_spm_vocab_follows_llama_cpp_defaults_and_space_prefix_rules() {
    // The pre-tokenizer key means nothing to SPM (llama.cpp ignores it): no UnsupportedPre.
    let t = Tokenizer::from_gguf(&tiny_spm(&[], None)).expect("builds");
    let (s_, u, sp, h, i, hi, sp_hi) = (1, 3, 260, 261, 262, 263, 264);
    assert_eq!((t.bos(), t.eos(), t.add_bos()), (Some(1), 2, true), "llama.cpp's SPM defaults");
    assert_eq!(t.stop_tokens(), vec![2]);
    // add_space_prefix defaults to true: a space before text at the start and after a special
    // token (user-defined ones included), not elsewhere.
    assert_eq!(t.encode("hi", false).expect("encode"), vec![sp_hi]);
    assert_eq!(t.encode("hi hi", false).expect("encode"), vec![sp_hi, sp_hi]);
    assert_eq!(t.encode("<s>hi", true).expect("encode"), vec![s_, sp_hi]);
    assert_eq!(t.encode("hi<u>hi", false).expect("encode"), vec![sp_hi, u, sp_hi]);
    assert_eq!(t.encode("hih", false).expect("encode"), vec![sp_hi, h]);
    assert!(t.encode("", false).expect("encode").is_empty(), "no fragment, no prefix");
    // Control tokens only with parse_special; without, their text is merged and byte-falls-back.
    let raw = t.encode("<s>", false).expect("encode");
    assert_eq!(raw, vec![sp, 4 + u32::from(b'<'), 4 + u32::from(b's'), 4 + u32::from(b'>')]);
    assert!(t.is_special(s_) && t.is_special(0) && !t.is_special(u));
    // Decoding: ▁ is a space, <0xXX> its byte, control and user-defined tokens their text.
    assert_eq!(
        t.decode_bytes(&[sp_hi, sp, h, i, 4 + 0xC3, 4 + 0xA9, u, s_]).expect("decode"),
        " hi hié<u><s>".as_bytes()
    );

    let no_prefix = ("tokenizer.ggml.add_space_prefix", Value::Bool(false));
    let t = Tokenizer::from_gguf(&tiny_spm(&[no_prefix], None)).expect("builds");
    assert_eq!(t.encode("hi hi", false).expect("encode"), vec![hi, sp_hi]);
    assert_eq!(t.encode("ih", false).expect("encode"), vec![i, h]);
    assert_eq!(t.decode_bytes(&t.encode("hi hié", false).expect("encode")).expect("decode"), "hi hié".as_bytes());

    let keyed = [
        ("tokenizer.ggml.bos_token_id", Value::U32(0)),
        ("tokenizer.ggml.eos_token_id", Value::U32(1)),
        ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
    ];
    let t = Tokenizer::from_gguf(&tiny_spm(&keyed, None)).expect("builds");
    assert_eq!((t.bos(), t.eos(), t.add_bos()), (Some(0), 1, false));
}

#[test]
fn spm_scores_of_the_wrong_length_are_typed() {
    let err = Tokenizer::from_gguf(&tiny_spm(&[], Some(3))).expect_err("bad scores");
    assert!(matches!(&err, TextError::InvalidVocab(m) if m.contains("scores")), "{err}");
}
