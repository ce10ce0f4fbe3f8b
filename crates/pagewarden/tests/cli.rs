#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The command-line tools, run as a user runs them: the real binary on the real default model.

use std::process::{Command, Output};

use serde_json::Value;

fn pagewarden(args: &[&str]) -> Output {
    fetch::ensure_default_model().expect("default model");
    Command::new(env!("CARGO_BIN_EXE_pagewarden")).args(args).output().expect("run pagewarden")
}

fn ok_stdout(args: &[&str]) -> String {
    let out = pagewarden(args);
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn reference(name: &str) -> Value {
    let path = format!("{}/../../reference/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn tokenize_and_detokenize_match_llamacpp_reference() {
    let r = reference("tokenizer.json");
    for case in r["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let plain: Value = serde_json::from_str(&ok_stdout(&["tokenize", text])).unwrap();
        assert_eq!(plain, case["token_ids_no_parse_special"], "{}", case["id"]);
        let special: Value = serde_json::from_str(&ok_stdout(&["tokenize", "--parse-special", text])).unwrap();
        assert_eq!(special, case["token_ids_parse_special"], "{}", case["id"]);
        let ids = serde_json::to_string(&case["token_ids_parse_special"]).unwrap();
        let back = ok_stdout(&["detokenize", &ids]);
        assert_eq!(back.strip_suffix('\n').unwrap(), case["detokenize_roundtrip"].as_str().unwrap());
    }
}

#[test]
fn greedy_generation_starts_like_llamacpp_and_is_repeatable() {
    let r = reference("raw_greedy.json");
    let case = &r["cases"][0];
    let prompt = case["prompt"].as_str().unwrap();
    let run =
        || -> Value { serde_json::from_str(&ok_stdout(&["generate", prompt, "--max-tokens", "8", "--json"])).unwrap() };
    let (a, b) = (run(), run());
    assert_eq!(a["tokens"], b["tokens"], "greedy generation must be deterministic");
    assert_eq!(a["finish_reason"], "length");
    assert_eq!(a["prompt_tokens"], case["prompt_token_ids"].as_array().unwrap().len());
    // The first tokens of this case have no near-ties in llama.cpp's log-probs.
    let want = &case["completion"]["tokens"].as_array().unwrap()[..8];
    assert_eq!(a["tokens"].as_array().unwrap()[..], want[..]);
}

#[test]
fn seeded_sampling_is_reproducible_and_seed_sensitive() {
    let args = |seed: &'static str| {
        ["generate", "Once upon a time", "--temperature", "1.0", "--seed", seed, "--max-tokens", "16", "--json"]
    };
    let a: Value = serde_json::from_str(&ok_stdout(&args("7"))).unwrap();
    let b: Value = serde_json::from_str(&ok_stdout(&args("7"))).unwrap();
    let c: Value = serde_json::from_str(&ok_stdout(&args("8"))).unwrap();
    assert_eq!(a["tokens"], b["tokens"]);
    assert_ne!(a["tokens"], c["tokens"]);
}

/// Speculative decoding on the real model: a request that copies a passage of its prompt gets
/// the same tokens and log-probs, bit for bit, with guesses verified as without, and keeps
/// guesses.
#[test]
fn speculative_decoding_copies_text_with_the_same_tokens_and_logprobs_and_keeps_guesses() {
    let text = "The quick brown fox jumps over the lazy dog near the river bank. ";
    let prompt = format!("Repeat the text exactly.\nText: {}\nRepeat: {}", text.repeat(2), &text[..20]);
    let run = |draft: &str| -> Value {
        let args =
            ["generate", &prompt, "--max-tokens", "40", "--top-logprobs", "2", "--json", "--speculative-draft", draft];
        serde_json::from_str(&ok_stdout(&args)).unwrap()
    };
    let (plain, spec) = (run("0"), run("6"));
    assert_eq!(spec["tokens"], plain["tokens"]);
    assert_eq!(spec["logprobs"], plain["logprobs"], "log-probs are the same values");
    assert_eq!(plain["draft_tokens"], 0);
    // How many guesses a sequence feeds follows the measured step time (a benchmark's matter:
    // scripts/bench-speculative.sh); that its first guess is fed and, copying, kept does not.
    let (drafted, kept) = (spec["draft_tokens"].as_u64().unwrap(), spec["draft_tokens_accepted"].as_u64().unwrap());
    assert!(kept >= 1 && drafted >= kept, "copying a passage keeps guesses: {kept} of {drafted}");
}

#[test]
fn chat_generation_stops_at_the_end_of_turn() {
    let out: Value =
        serde_json::from_str(&ok_stdout(&["generate", "--chat", "Say hi.", "--max-tokens", "200", "--json"])).unwrap();
    assert_eq!(out["finish_reason"], "stop", "{out}");
    assert!(!out["text"].as_str().unwrap().contains("<|im_end|>"));
}

#[test]
fn request_over_the_context_window_is_refused_before_any_compute() {
    let out = pagewarden(&["generate", "hello", "--max-tokens", "9000"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exceeds the context window of 8192"), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn bad_sampling_parameter_is_a_clear_error() {
    let out = pagewarden(&["generate", "hello", "--top-p", "1.5"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("top_p"));
}

#[test]
fn perplexity_of_gpl3_is_within_one_percent_of_llamacpp() {
    let out: Value = serde_json::from_str(&ok_stdout(&[
        "eval",
        "perplexity",
        "--file",
        "/usr/share/common-licenses/GPL-3",
        "--ctx",
        "512",
        "--json",
    ]))
    .unwrap();
    let ppl = out["perplexity"].as_f64().unwrap();
    assert_eq!(out["chunks"], 14);
    assert!((ppl / 18.3914 - 1.0).abs() < 0.01, "perplexity {ppl} vs llama.cpp 18.3914");
}

#[test]
fn model_bench_reports_every_figure() {
    let out: Value = serde_json::from_str(&ok_stdout(&[
        "bench",
        "model",
        "--threads",
        "1",
        "--batch",
        "1,2",
        "--prompt",
        "32",
        "--decode",
        "4",
        "--reps",
        "1",
        "--json",
    ]))
    .unwrap();
    let rows = out["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert!(r["prefill_tokens_per_s"].as_f64().unwrap() > 0.0);
        assert!(r["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
    }
    assert!(out["scrub_ns_per_page"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_model_file_that_is_not_gguf_is_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("pw-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, b"definitely not a model").unwrap();
    let out = pagewarden(&["tokenize", "--model", bad.to_str().unwrap(), "hi"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a GGUF file"));
    std::fs::remove_dir_all(&dir).unwrap();
}
