//! A tenant's `response_format` schema or tool grammar as the gateway and the workers compile it,
//! then a walk of up to 64 steps through it: at each step the mask is computed and one token it
//! allows (picked by the input) is fed back. Properties: nothing panics out of the `grammar`
//! crate, whatever the schema or grammar text; a compile error is an error, never a crash.
#![no_main]
use std::sync::OnceLock;

use grammar::{Grammars, OutputFormat};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

#[path = "shared/vocab.rs"]
mod vocab;

fn grammars() -> &'static Grammars {
    static G: OnceLock<Grammars> = OnceLock::new();
    G.get_or_init(|| Grammars::new(&vocab::tokenizer().0).expect("the fuzz vocabulary indexes"))
}

#[derive(Debug, Arbitrary)]
struct Input {
    /// A JSON schema's text, or (with `lark`) a Lark grammar.
    text: String,
    lark: bool,
    /// Which allowed token each step takes.
    picks: Vec<u16>,
}

fuzz_target!(|input: Input| {
    let format = if input.lark {
        OutputFormat::Lark { grammar: input.text }
    } else {
        match serde_json::from_str(&input.text) {
            Ok(schema) => OutputFormat::JsonSchema { schema },
            Err(_) => return,
        }
    };
    let Ok(mut c) = grammars().compile(&format) else { return };
    let vocab = vocab::tokenizer().0.vocab_size();
    for pick in input.picks.iter().take(64) {
        let mut logits = vec![0.0f32; vocab];
        if c.mask(&mut logits).is_err() {
            return;
        }
        let allowed: Vec<u32> = (0..vocab as u32).filter(|&t| logits[t as usize].is_finite()).collect();
        if allowed.is_empty() {
            return;
        }
        let t = allowed[*pick as usize % allowed.len()];
        if c.accept(t).is_err() || c.is_complete() {
            return;
        }
    }
});
