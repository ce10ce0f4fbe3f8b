//! Exactness against llama.cpp's own tokenizer tests (tests/test-tokenizer-0.cpp): for each
//! vocabulary, every input of `ggml-vocab-NAME.gguf.inp` must become exactly the ids of
//! `ggml-vocab-NAME.gguf.out`, tokenized as that test does (no BOS, special tokens not parsed).
//! The files come from the pinned llama-cpp-python sdist (fetch::LLAMA_CPP_TEST_DATA), each
//! checked against its SHA-256.
//!
//! These tests are what lets the crate accept a `tokenizer.ggml.pre` value: each asserts the
//! file's own value, so a vocabulary of that name is proven, not assumed.

#![allow(clippy::expect_used)] // test helpers outside #[test] fns

use std::path::PathBuf;
use std::sync::OnceLock;

use text::Tokenizer;

fn data_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| fetch::ensure_sdist(&fetch::LLAMA_CPP_TEST_DATA).expect("llama.cpp test data available"))
}

/// The inputs and expected ids, read as test-tokenizer-0.cpp reads them: inputs are separated by
/// the marker line (text after the last marker, if any, is one more input); line i of the
/// output file holds the ids of input i, separated by spaces, stripped.
fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let read = |ext: &str| {
        let path = data_dir().join(format!("ggml-vocab-{name}.gguf.{ext}"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
    };
    let (inp, out) = (read("inp"), read("out"));
    let mut inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    if inputs.last() == Some(&"") {
        inputs.pop(); // the file ends with a marker: C++'s loop stops there
    }
    let outputs: Vec<&str> = out.lines().collect();
    assert_eq!(inputs.len(), outputs.len(), "{name}: inputs and outputs differ in number");
    inputs
        .into_iter()
        .zip(outputs)
        .map(|(text, ids)| {
            let ids = ids.split_whitespace().map(|t| t.parse().expect("token id")).collect();
            (text.to_string(), ids)
        })
        .collect()
}

fn tokenizer(name: &str) -> (Tokenizer, gguf::GgufFile) {
    let path = data_dir().join(format!("ggml-vocab-{name}.gguf"));
    let file = gguf::GgufFile::open(&path).expect("vocab GGUF parses");
    (Tokenizer::from_gguf(&file).expect("tokenizer builds"), file)
}

/// Every case of one vocabulary; the failure lists each differing input with its first
/// differing position.
fn assert_matches_llama_cpp(name: &str, pre: &str, inputs: usize) -> Tokenizer {
    let (tok, file) = tokenizer(name);
    assert_eq!(file.str("tokenizer.ggml.pre").expect("tokenizer.ggml.pre"), pre, "{name}");
    let cases = cases(name);
    assert_eq!(cases.len(), inputs, "{name}: number of inputs");
    let mut failures = Vec::new();
    for (i, (text, want)) in cases.iter().enumerate() {
        let got = tok.encode(text, false).expect("encode");
        if &got == want {
            continue;
        }
        let at = got.iter().zip(want).position(|(g, w)| g != w).unwrap_or(got.len().min(want.len()));
        let window = |ids: &[u32]| ids[at..].iter().take(6).copied().collect::<Vec<_>>();
        failures.push(format!(
            "{name} input {i} {text:?}: first difference at position {at}: llama.cpp {:?}, ours {:?}\n  llama.cpp {want:?}\n  ours      {got:?}",
            window(want),
            window(&got),
        ));
    }
    assert!(
        failures.is_empty(),
        "{} of {} inputs differ from llama.cpp:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    tok
}

#[test]
fn llama3_matches_llama_cpp() {
    let tok = assert_matches_llama_cpp("llama-bpe", "llama-bpe", 46);
    // llama.cpp turns BOS on for Llama 3 when the file does not say.
    assert_eq!((tok.bos(), tok.add_bos()), (Some(128000), true));
}

#[test]
fn qwen2_matches_llama_cpp() {
    let tok = assert_matches_llama_cpp("qwen2", "qwen2", 46);
    assert!(!tok.add_bos());
}

#[test]
fn qwen35_matches_llama_cpp() {
    assert_matches_llama_cpp("qwen35", "qwen35", 50);
}

#[test]
fn gpt2_matches_llama_cpp() {
    assert_matches_llama_cpp("gpt-2", "gpt-2", 46);
}

#[test]
fn starcoder_and_so_smollm_match_llama_cpp() {
    assert_matches_llama_cpp("starcoder", "starcoder", 46);
}

#[test]
fn llama2_spm_matches_llama_cpp() {
    let tok = assert_matches_llama_cpp("llama-spm", "default", 46);
    assert_eq!((tok.bos(), tok.add_bos()), (Some(1), true));
}

#[test]
fn phi3_spm_matches_llama_cpp() {
    assert_matches_llama_cpp("phi-3", "default", 46);
}

#[test]
fn phi3_special_tokens_swallow_the_blanks_after_them() {
    // llama.cpp's RSTRIP for Phi-3 (recognised by general.name, "Phi3" here): a chat turn's
    // newline after `<|user|>` is dropped, but not after `<s>` or `<|endoftext|>`.
    let (tok, _) = tokenizer("phi-3");
    let id = |text: &str| tok.encode(text, true).expect("encode");
    let user = id("<|user|>");
    assert_eq!(user.len(), 1);
    let hi = id("Hi");
    assert_eq!(id("<|user|>\n Hi"), [&user[..], &hi[..]].concat());
    assert_eq!(id("<|user|>\n \t"), user);
    let bos = id("<s>");
    assert_eq!(bos, [1]);
    assert_ne!(id("<s>\nHi"), [&bos[..], &hi[..]].concat());
}

#[test]
fn phi3_user_defined_end_of_text_is_control_as_in_llama_cpp() {
    // "</s>" is user-defined in this file; llama.cpp makes it control for its end-of-generation
    // text, so without special parsing it is plain text, not token 2.
    let (tok, _) = tokenizer("phi-3");
    assert_eq!(tok.encode("</s>", true).expect("encode"), [2]);
    let plain = tok.encode("</s>", false).expect("encode");
    assert!(!plain.contains(&2), "{plain:?}");
    assert_eq!(tok.decode(&plain).expect("decode"), " </s>");
    assert!(tok.is_special(2));
}
