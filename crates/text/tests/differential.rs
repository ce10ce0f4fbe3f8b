//! Differential check of our BPE merge loop against the `tokenizers` crate's BPE on the real
//! vocabulary, for text every byte of which has a token (where the two algorithms must agree;
//! they differ only on bytes without a token, see roundtrip.rs).

#![allow(clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::sync::OnceLock;

use proptest::prelude::*;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;

fn hf() -> &'static tokenizers::Tokenizer {
    static HF: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
    HF.get_or_init(|| {
        let path = fetch::ensure_default_model().expect("model");
        let file = gguf::GgufFile::open(&path).expect("parses");
        let tokens = file.str_array("tokenizer.ggml.tokens").expect("tokens");
        let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.to_string(), i as u32)).collect();
        let merges = file
            .str_array("tokenizer.ggml.merges")
            .expect("merges")
            .iter()
            .map(|m| {
                let (a, b) = m.split_once(' ').expect("space");
                (a.to_string(), b.to_string())
            })
            .collect();
        let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().expect("bpe");
        let mut t = tokenizers::Tokenizer::new(bpe);
        t.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, false, true).into(),
        ]))));
        t
    })
}

fn check(s: &str) -> Result<(), TestCaseError> {
    let ours = common::tok().encode(s, false).expect("encode");
    let theirs = hf().encode_fast(s, false).expect("hf encode").get_ids().to_vec();
    prop_assert_eq!(ours, theirs, "{:?}", s);
    Ok(())
}

#[test]
fn agrees_with_hf_bpe_on_fixed_texts() {
    for s in [
        "Hello world, this is a test of the tokenizer!",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "                                                         x",
        "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!",
        "ababababababababababababab abababab babababa",
        "\n\n\n\n\n\n\n\n\t\t\t\t\t\t    \r\n\r\n",
        "naïve café — déjà vu, Straße, 日本語のテキスト, Привет мир 🦀👨‍👩‍👧‍👦",
    ] {
        check(s).expect("agree");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn agrees_with_hf_bpe(s in "[a-zA-Z0-9 \n\t.,!?'\"()_éüßçñ日本語\u{1F980}-]{0,80}") {
        check(&s)?;
    }

    #[test]
    fn agrees_with_hf_bpe_on_ascii_words(words in proptest::collection::vec("[a-z]{1,12}", 1..20)) {
        check(&words.join(" "))?;
    }
}
