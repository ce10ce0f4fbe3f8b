//! A client's text as the gateway turns it into tokens: arbitrary chat messages (any role and
//! content, control-token texts included) through a ChatML template, and arbitrary prompt text,
//! through each tokenizer family: a byte-level BPE tokenizer built from GGUF metadata the way the
//! default model's is (SmolLM pre-tokenizer, control tokens, merges) and a SentencePiece one built
//! the way Gemma 3's is (scores, byte fallback, user-defined tokens, ChatML fallback template).
//! Properties: nothing panics; every id is in the vocabulary; raw text (no special-token parsing)
//! decodes back to itself byte for byte (for SentencePiece, a literal `▁` in the text comes back
//! as the space it stands for, as in llama.cpp).
#![no_main]
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use text::{ChatMessage, Tokenizer};

#[path = "shared/vocab.rs"]
mod vocab;
use vocab::{spm_tokenizer, tokenizer};

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
    for (spm, (tok, template)) in [(false, tokenizer()), (true, spm_tokenizer())] {
        match &input {
            Input::Prompt(text) => {
                if let Ok(ids) = tok.encode(text, false) {
                    in_vocab(tok, &ids);
                    let back = tok.decode_bytes(&ids).expect("our own ids decode");
                    let want = if spm { text.replace('\u{2581}', " ") } else { text.clone() };
                    assert_eq!(back, want.as_bytes(), "raw text did not round-trip (spm: {spm})");
                }
                if let Ok(ids) = tok.encode(text, true) {
                    in_vocab(tok, &ids);
                }
            }
            Input::Chat(messages) => {
                let messages: Vec<ChatMessage> =
                    messages.iter().map(|(r, c)| ChatMessage::new(r.clone(), c.clone())).collect();
                if let Ok(rendered) = template.render(&messages, true) {
                    if let Ok(ids) = tok.encode(&rendered, true) {
                        in_vocab(tok, &ids);
                    }
                }
            }
        }
    }
});
