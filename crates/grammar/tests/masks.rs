#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Masks over the default model's real vocabulary: the tokens of a valid document always pass,
//! tokens that would break it never do, and a document ends only where the grammar does.

use grammar::{Grammars, OutputFormat};
use serde_json::json;

fn grammars() -> (Grammars, text::Tokenizer) {
    let path = fetch::ensure_default_model().unwrap();
    let file = gguf::GgufFile::open(&path).unwrap();
    let tok = text::Tokenizer::from_gguf(&file).unwrap();
    (Grammars::new(&tok).unwrap(), tok)
}

fn person() -> OutputFormat {
    OutputFormat::JsonSchema {
        schema: json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": false,
        }),
    }
}

#[test]
fn a_valid_document_passes_every_mask_and_completes_the_grammar() {
    let (g, tok) = grammars();
    let mut c = g.compile(&person()).unwrap();
    let doc = r#"{"name":"Ann","age":42}"#;
    for t in tok.encode(doc, false).unwrap() {
        let mut logits = vec![0.0f32; tok.vocab_size()];
        c.mask(&mut logits).unwrap();
        assert!(logits[t as usize].is_finite(), "token {t} of a valid document was masked");
        assert!(!c.is_complete(), "complete before the end");
        c.accept(t).unwrap();
    }
    assert!(c.is_complete());
    let mut logits = vec![0.0f32; tok.vocab_size()];
    c.mask(&mut logits).unwrap();
    assert!(logits[tok.eos() as usize].is_finite(), "end-of-sequence is allowed once the document is whole");
    assert_eq!(logits.iter().filter(|l| l.is_finite()).count(), 1, "and nothing else");
}

#[test]
fn tokens_that_break_the_schema_are_masked() {
    let (g, tok) = grammars();
    let mut c = g.compile(&person()).unwrap();
    let mut logits = vec![0.0f32; tok.vocab_size()];
    c.mask(&mut logits).unwrap();
    for text in ["Hello", " {", "[", "\"", "<|im_end|>"] {
        let ids = tok.encode(text, true).unwrap();
        assert!(logits[ids[0] as usize] == f32::NEG_INFINITY, "{text:?} may not begin the object");
    }
    // After `{"name":` a number is refused: name is a string.
    for t in tok.encode(r#"{"name":"#, false).unwrap() {
        c.accept(t).unwrap();
    }
    let mut logits = vec![0.0f32; tok.vocab_size()];
    c.mask(&mut logits).unwrap();
    let seven = tok.encode("7", false).unwrap()[0];
    assert_eq!(logits[seven as usize], f32::NEG_INFINITY);
    // A token the mask refused is refused by the parser too.
    assert!(c.accept(seven).is_err());
}

#[test]
fn any_json_object_and_a_bad_schema() {
    let (g, tok) = grammars();
    let mut c = g.compile(&OutputFormat::JsonObject).unwrap();
    for t in tok.encode(r#"{"x":[1,2,{"y":null}],"z":"w"}"#, false).unwrap() {
        let mut logits = vec![0.0f32; tok.vocab_size()];
        c.mask(&mut logits).unwrap();
        assert!(logits[t as usize].is_finite());
        c.accept(t).unwrap();
    }
    assert!(c.is_complete());
    let bad = OutputFormat::JsonSchema { schema: json!({"type": "no-such-type"}) };
    assert!(matches!(g.compile(&bad), Err(grammar::GrammarError::Compile(_))));
}
