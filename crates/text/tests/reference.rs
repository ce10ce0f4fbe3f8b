//! Every case of the llama.cpp reference data (shared/reference) on the real default model.

#![allow(clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use common::{ids, model, reference, tok};
use text::ChatMessage;

#[test]
fn tokenizer_reference_cases_match_llama_cpp() {
    let r = reference("tokenizer.json");
    assert_eq!(r["meta"]["add_special"], false);
    let cases = r["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    let mut failures = Vec::new();
    for case in cases {
        let id = case["id"].as_str().expect("id");
        let text = case["text"].as_str().expect("text");
        // The hex is the ground truth for the bytes of the text.
        let hex: String = text.bytes().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, case["utf8_hex"].as_str().expect("utf8_hex"), "{id}: text bytes");

        let with = tok().encode(text, true).expect("encode");
        let without = tok().encode(text, false).expect("encode");
        if with != ids(&case["token_ids_parse_special"]) {
            failures.push(format!("{id} parse_special: got {with:?}"));
        }
        if without != ids(&case["token_ids_no_parse_special"]) {
            failures.push(format!("{id} no_parse_special: got {without:?}"));
        }

        let round = tok().decode(&ids(&case["token_ids_parse_special"])).expect("decode");
        assert_eq!(round, case["detokenize_roundtrip"].as_str().expect("roundtrip"), "{id}: detokenize");
        if case["roundtrip_exact"] == true {
            assert_eq!(round, text, "{id}: exact round trip");
        }
        let bytes = tok().decode_bytes(&without).expect("decode_bytes");
        assert_eq!(bytes, text.as_bytes(), "{id}: byte round trip");

        if let Some(pieces) = case["pieces_parse_special"].as_array() {
            for p in pieces {
                let pid = u32::try_from(p["id"].as_u64().expect("piece id")).expect("u32");
                let want: Vec<u8> = match &p["piece"] {
                    serde_json::Value::String(s) => s.as_bytes().to_vec(),
                    serde_json::Value::Array(a) => {
                        a.iter().map(|b| u8::try_from(b.as_u64().expect("byte")).expect("u8")).collect()
                    }
                    other => panic!("{id}: piece {other}"),
                };
                assert_eq!(tok().token_bytes(pid), Some(&want[..]), "{id}: piece of token {pid}");
            }
        }
    }
    assert!(failures.is_empty(), "mismatches with llama.cpp:\n{}", failures.join("\n"));
}

#[test]
fn chat_reference_cases_render_and_tokenize_like_llama_cpp() {
    let r = reference("chat_greedy.json");
    // The reference server reported the same template and BOS/EOS texts that the GGUF holds.
    let cases = r["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    for case in cases {
        let id = case["id"].as_str().expect("id");
        let messages: Vec<ChatMessage> =
            serde_json::from_value(case["messages"].clone()).expect("messages deserialize");
        let prompt = model().template.render(&messages, true).expect("render");
        assert_eq!(prompt, case["templated_prompt"].as_str().expect("templated_prompt"), "{id}: prompt text");
        let got = tok().encode(&prompt, true).expect("encode");
        assert_eq!(got, ids(&case["prompt_token_ids"]), "{id}: prompt ids");
        assert_eq!(got.len() as u64, case["n_prompt_tokens"].as_u64().expect("n"), "{id}: prompt length");
    }
}

#[test]
fn reference_template_from_server_props_matches_gguf_template() {
    let r = reference("chat_greedy.json");
    let props = &r["meta"]["server_props_subset"];
    let tmpl = text::ChatTemplate::from_source(
        props["chat_template"].as_str().expect("template"),
        props["bos_token"].as_str().expect("bos"),
        props["eos_token"].as_str().expect("eos"),
    )
    .expect("compiles");
    let msgs = [ChatMessage::new("user", "hi")];
    assert_eq!(tmpl.render(&msgs, true).expect("render"), model().template.render(&msgs, true).expect("render"));
}

#[test]
fn metadata_matches_reference() {
    let r = reference("model_metadata.json");
    let hp = &r["hyperparameters"];
    let t = tok();
    assert_eq!(t.vocab_size() as u64, hp["vocab_size_tokens"].as_u64().expect("vocab"));
    assert_eq!(t.bos().map(u64::from), hp["bos_token_id"].as_u64());
    assert_eq!(u64::from(t.eos()), hp["eos_token_id"].as_u64().expect("eos"));
    for nt in r["non_normal_tokens"].as_array().expect("non_normal_tokens") {
        let id = u32::try_from(nt["id"].as_u64().expect("id")).expect("u32");
        let text = nt["text"].as_str().expect("text");
        assert_eq!(t.token_bytes(id), Some(text.as_bytes()));
        assert_eq!(t.is_special(id), nt["type"] == 3, "token {id}");
        assert_eq!(t.encode(text, true).expect("encode"), vec![id], "{text} parses as one token");
        assert_ne!(t.encode(text, false).expect("encode"), vec![id], "{text} stays text without parse_special");
    }
    assert!(!t.is_special(38699));
    // eos <|im_end|> = 2, <|endoftext|> = 0.
    assert_eq!(t.stop_tokens(), vec![2, 0]);
}
