//! The SentencePiece tokenizer (`tokenizer.ggml.model = "llama"`) on the real Gemma 3 270M GGUF,
//! against llama.cpp's outputs in reference/gemma3/gemma3_reference.json.

#![allow(clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::sync::OnceLock;

use common::{ids, reference};
use proptest::prelude::*;
use text::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};

struct Gemma {
    tokenizer: Tokenizer,
    template: ChatTemplate,
}

fn gemma() -> &'static Gemma {
    static G: OnceLock<Gemma> = OnceLock::new();
    G.get_or_init(|| {
        let path = fetch::ensure_model(&fetch::GEMMA3_270M).expect("Gemma 3 270M available");
        let file = gguf::GgufFile::open(&path).expect("Gemma 3 GGUF parses");
        Gemma {
            tokenizer: Tokenizer::from_gguf(&file).expect("SPM tokenizer builds"),
            template: ChatTemplate::from_gguf(&file).expect("chat template (fallback) compiles"),
        }
    })
}

fn tok() -> &'static Tokenizer {
    &gemma().tokenizer
}

fn gemma_reference() -> serde_json::Value {
    reference("gemma3/gemma3_reference.json")
}

const BOS: u32 = 2;
const EOS: u32 = 1;
const START_OF_TURN: u32 = 105;
const END_OF_TURN: u32 = 106;
const NEWLINE: u32 = 107;
/// `<0x00>`; `<0xXX>` is this plus XX.
const BYTE_0: u32 = 238;

#[test]
fn reference_texts_tokenize_like_llama_cpp_with_and_without_special_parsing() {
    let r = gemma_reference();
    let cases = r["tokenizer"].as_array().expect("tokenizer cases");
    assert_eq!(cases.len(), 4);
    let mut failures = Vec::new();
    for case in cases {
        let id = case["id"].as_str().expect("id");
        let text = case["text"].as_str().expect("text");
        let with = tok().encode(text, true).expect("encode");
        let without = tok().encode(text, false).expect("encode");
        if with != ids(&case["token_ids_parse_special"]) {
            failures.push(format!("{id} parse_special: got {with:?}"));
        }
        if without != ids(&case["token_ids_no_parse_special"]) {
            failures.push(format!("{id} no_parse_special: got {without:?}"));
        }
    }
    assert!(failures.is_empty(), "mismatches with llama.cpp:\n{}", failures.join("\n"));
}

#[test]
fn decode_is_the_exact_inverse_for_the_reference_texts() {
    let r = gemma_reference();
    for case in r["tokenizer"].as_array().expect("tokenizer cases") {
        let id = case["id"].as_str().expect("id");
        let text = case["text"].as_str().expect("text");
        for key in ["token_ids_parse_special", "token_ids_no_parse_special"] {
            let ids = ids(&case[key]);
            assert_eq!(tok().decode_bytes(&ids).expect("decode_bytes"), text.as_bytes(), "{id} {key}");
            assert_eq!(tok().decode(&ids).expect("decode"), text, "{id} {key}");
        }
        let ours = tok().encode(text, false).expect("encode");
        assert_eq!(tok().decode_bytes(&ours).expect("decode_bytes"), text.as_bytes(), "{id}: our ids");
    }
}

#[test]
fn greedy_prompts_encode_like_llama_cpp_which_adds_bos() {
    let r = gemma_reference();
    assert_eq!(tok().bos(), Some(BOS));
    assert!(tok().add_bos(), "Gemma's tokenizer.ggml.add_bos_token is true");
    for case in r["greedy"].as_array().expect("greedy cases") {
        let id = case["id"].as_str().expect("id");
        let prompt = case["prompt"].as_str().expect("prompt");
        let want = ids(&case["prompt_token_ids"]);
        assert_eq!(want.first(), Some(&BOS), "{id}: llama.cpp adds BOS");
        assert_eq!(tok().encode(prompt, true).expect("encode"), want[1..], "{id}: prompt ids");
        assert_eq!(tok().encode(prompt, false).expect("encode"), want[1..], "{id}: prompt ids, no special parsing");
    }
}

#[test]
fn greedy_generations_decode_to_llama_cpp_content_whole_and_streamed() {
    let r = gemma_reference();
    for case in r["greedy"].as_array().expect("greedy cases") {
        let id = case["id"].as_str().expect("id");
        let tokens = ids(&case["tokens"]);
        let content = case["content"].as_str().expect("content");
        assert_eq!(tok().decode(&tokens).expect("decode"), content, "{id}: decode");

        let mut stream = StreamDecoder::new();
        let mut streamed = String::new();
        for &t in &tokens {
            streamed.push_str(&stream.push(tok(), t).expect("push"));
        }
        streamed.push_str(&stream.finish());
        assert_eq!(streamed, content, "{id}: streamed");

        // Every generated token (and its top alternatives) has the bytes llama.cpp reported.
        for p in case["probs"].as_array().expect("probs") {
            let alts = p["top_logprobs"].as_array().expect("top_logprobs");
            for entry in std::iter::once(p).chain(alts) {
                let pid = u32::try_from(entry["id"].as_u64().expect("id")).expect("u32");
                let bytes: Vec<u8> = entry["bytes"]
                    .as_array()
                    .expect("bytes")
                    .iter()
                    .map(|b| u8::try_from(b.as_u64().expect("byte")).expect("u8"))
                    .collect();
                if tok().is_special(pid) {
                    // llama.cpp's server renders control tokens (here <eos>) as nothing; our
                    // decode keeps their text, as it does for the byte-level BPE vocabulary.
                    assert!(bytes.is_empty(), "{id}: llama.cpp bytes of control token {pid}");
                    continue;
                }
                assert_eq!(tok().token_bytes(pid), Some(&bytes[..]), "{id}: bytes of token {pid}");
            }
        }
    }
}

#[test]
fn a_character_without_a_token_falls_back_to_its_utf8_byte_tokens() {
    // U+0132 (Ĳ, C4 B2) is in no Gemma token at all.
    let text = "Ĳ";
    let (hi, lo) = (BYTE_0 + 0xC4, BYTE_0 + 0xB2);
    assert_eq!(tok().token_bytes(hi), Some(&[0xC4][..]), "<0xC4>");
    assert_eq!(tok().token_bytes(lo), Some(&[0xB2][..]), "<0xB2>");
    assert_eq!(tok().encode(text, false).expect("encode"), [hi, lo]);

    // Between other text it stays one symbol during merging and splits only at the end.
    let text = "aĲ bĲĲ";
    let got = tok().encode(text, false).expect("encode");
    assert_eq!(got.iter().filter(|&&id| id == hi).count(), 3, "{got:?}");
    assert_eq!(tok().decode_bytes(&got).expect("decode_bytes"), text.as_bytes());

    // Streaming holds the first byte back until the character is complete.
    let mut stream = StreamDecoder::new();
    assert_eq!(stream.push(tok(), hi).expect("push"), "");
    assert!(stream.has_pending());
    assert_eq!(stream.push(tok(), lo).expect("push"), "Ĳ");
}

#[test]
fn control_tokens_split_out_only_with_parse_special_user_defined_always() {
    let text = "<start_of_turn>user\nHi<end_of_turn>\n";
    let with = tok().encode(text, true).expect("encode");
    assert_eq!(with.first(), Some(&START_OF_TURN), "{with:?}");
    assert_eq!(with[with.len() - 2..], [END_OF_TURN, NEWLINE], "{with:?}");
    assert_eq!(tok().decode_bytes(&with).expect("decode_bytes"), text.as_bytes());

    let without = tok().encode(text, false).expect("encode");
    assert!(!without.iter().any(|&id| tok().is_special(id)), "{without:?}");
    assert_eq!(tok().decode_bytes(&without).expect("decode_bytes"), text.as_bytes());
    // "\n" is a user-defined token in Gemma: split out before merging even without parse_special.
    assert_eq!(without.last(), Some(&NEWLINE), "{without:?}");
    assert!(tok().is_special(START_OF_TURN) && tok().is_special(END_OF_TURN));
    assert!(!tok().is_special(NEWLINE));
}

#[test]
fn spaces_become_sentencepiece_spaces_without_a_space_prefix() {
    // Gemma's add_space_prefix is false: "hello" at the start has no leading space, and neither
    // does text right after a control token.
    let hello = tok().encode("hello", false).expect("encode");
    assert_eq!(tok().decode_bytes(&hello).expect("decode"), b"hello");
    let world = tok().encode("hello world", false).expect("encode");
    assert_eq!(world[..hello.len()], hello[..]);
    assert_eq!(tok().token_bytes(world[hello.len()]), Some(&b" world"[..]), "{world:?}");
    let after = tok().encode("<start_of_turn>hello", true).expect("encode");
    assert_eq!(after[1..], hello[..]);
    assert!(tok().encode("", true).expect("encode").is_empty());
}

#[test]
fn stop_tokens_are_eos_and_end_of_turn() {
    assert_eq!(tok().eos(), EOS);
    assert_eq!(tok().stop_tokens(), vec![EOS, END_OF_TURN]);
    assert_eq!(tok().vocab_size(), 262_144);
}

#[test]
fn missing_chat_template_falls_back_to_the_chatml_llama_cpp_reported() {
    let r = gemma_reference();
    let props = &r["meta"]["props_subset"];
    let llama_cpp = ChatTemplate::from_source(
        props["chat_template"].as_str().expect("chat_template"),
        props["bos_token"].as_str().expect("bos_token"),
        props["eos_token"].as_str().expect("eos_token"),
    )
    .expect("reference template compiles");
    let msgs = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi")];
    for gen in [true, false] {
        let ours = gemma().template.render(&msgs, gen).expect("render");
        assert_eq!(ours, llama_cpp.render(&msgs, gen).expect("render"));
    }
    assert_eq!(
        gemma().template.render(&msgs[1..], true).expect("render"),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn long_text_encodes_and_round_trips() {
    let r = gemma_reference();
    let mut text = String::new();
    for case in r["tokenizer"].as_array().expect("tokenizer cases") {
        text.push_str(case["text"].as_str().expect("text"));
        text.push(' ');
    }
    let text = text.repeat(300);
    let ids = tok().encode(&text, false).expect("encode");
    assert_eq!(tok().decode_bytes(&ids).expect("decode_bytes"), text.as_bytes());
}

/// Whitespace runs (many are user-defined tokens in Gemma), control-token texts, HTML-like
/// user-defined tokens, byte-fallback characters and edge cases.
const EXTRA: &[&str] = &[
    "",
    " ",
    "   ",
    "a   b    c     ",
    "\t\t\tx\n\n\n\n  y",
    "line one\nline two\r\nline three\n\n  indented\n\t\ttabbed",
    "<start_of_turn>user\nnot parsed<end_of_turn>",
    "<start_of_turn<end_of_turn>>",
    "<b>bold</b> <table><tr><td>x</td></tr></table>",
    "\u{0}\u{1}\u{7f}\u{80}\u{ff}\u{fffd}\u{10ffff}\u{132}",
    "emoji: 😀😃😄 🦀🔥 👍🏽 🏳️‍🌈 🇫🇷",
    "combining: e\u{301} a\u{300}\u{316} n\u{303}",
    "    def f(x):\n        return x ** 2  # comment\n",
];

#[test]
fn extra_strings_round_trip_exactly() {
    for s in EXTRA {
        for parse_special in [false, true] {
            let ids = tok().encode(s, parse_special).expect("encode");
            assert_eq!(tok().decode_bytes(&ids).expect("decode_bytes"), s.as_bytes(), "{s:?} ({parse_special})");
        }
    }
}

#[test]
fn a_literal_sentencepiece_space_decodes_as_a_space_like_llama_cpp() {
    // U+2581 in the input is indistinguishable from an escaped space: llama.cpp loses it too.
    let ids = tok().encode("a\u{2581}b", false).expect("encode");
    assert_eq!(ids, tok().encode("a b", false).expect("encode"));
    assert_eq!(tok().decode(&ids).expect("decode"), "a b");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any text without U+2581 survives encode then decode byte for byte, with every id in the
    /// vocabulary (Gemma has every byte-fallback token, so nothing is lost).
    #[test]
    fn encode_decode_is_identity(s in any::<String>().prop_map(|s| s.replace('\u{2581}', ""))) {
        let ids = tok().encode(&s, false).expect("encode");
        prop_assert!(ids.iter().all(|&i| (i as usize) < tok().vocab_size()));
        prop_assert_eq!(tok().decode_bytes(&ids).expect("decode"), s.as_bytes());
    }

    #[test]
    fn encode_decode_is_identity_with_specials(parts in proptest::collection::vec(
        prop_oneof![
            any::<String>().prop_map(|s| s.replace('\u{2581}', "")),
            Just("<start_of_turn>".to_string()),
            Just("<end_of_turn>".to_string()),
            Just("<bos>".to_string()),
            "[ a-z\n\t]{0,12}",
        ],
        0..8,
    )) {
        let s: String = parts.concat();
        let ids = tok().encode(&s, true).expect("encode");
        prop_assert_eq!(tok().decode(&ids).expect("decode"), s);
    }
}

#[test]
fn a_template_that_prints_bos_on_a_vocabulary_that_adds_it_gives_one_bos() {
    // Llama 3's templates begin with `{{ bos_token }}` and its vocabulary adds BOS: llama.cpp
    // drops the printed one before tokenizing. Gemma's vocabulary adds BOS too.
    assert!(tok().add_bos());
    let bos_text = std::str::from_utf8(tok().token_bytes(BOS).expect("BOS has text")).expect("utf-8");
    let t = ChatTemplate::from_source("{{ bos_token }}{{ messages[0]['content'] }}", bos_text, "").expect("compiles");
    let rendered = t.render(&[ChatMessage::new("user", "Hello")], false).expect("renders");
    assert!(rendered.starts_with(bos_text), "{rendered:?}");
    let ids = t.encode(tok(), &rendered).expect("encodes");
    assert_eq!(ids.iter().filter(|&&i| i == BOS).count(), 1, "{ids:?}");
    assert_eq!(ids[0], BOS);
    assert_eq!(&ids[1..], tok().encode("Hello", true).expect("encodes"));
    // A template that prints no BOS still gets the vocabulary's one.
    let plain = ChatTemplate::from_source("{{ messages[0]['content'] }}", bos_text, "").expect("compiles");
    let ids = plain
        .encode(tok(), &plain.render(&[ChatMessage::new("user", "Hello")], false).expect("renders"))
        .expect("encodes");
    assert_eq!(ids[0], BOS);
    assert_eq!(ids.iter().filter(|&&i| i == BOS).count(), 1);
}
