#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `pagewarden bench prefix-cache` as a user runs it: the real binary starting two `serve`
//! children (prefix cache on and off) with the real default model; and `bench serve`'s report
//! of what the cache served, which the serving comparison's engine run is sized by. Speed is
//! never asserted, only that the cache was used, changed no reply and was reported.

mod common;

use std::process::Command;

use serde_json::Value;

#[test]
fn prefix_cache_bench_hits_the_cache_and_changes_no_reply() {
    fetch::ensure_default_model().expect("default model");
    let out = Command::new(env!("CARGO_BIN_EXE_pagewarden"))
        .args(["bench", "prefix-cache", "--conversations", "2", "--turns", "2", "--json"])
        .output()
        .expect("run pagewarden");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed:\n{stdout}\n{stderr}");
    let r: Value = serde_json::from_str(&stdout).expect("one JSON object");
    assert_eq!(r["replies_identical"], true, "{}", r["mismatches"]);
    assert_eq!(r["requests"].as_array().map(Vec::len), Some(4), "{}", r["requests"]);
    assert_eq!(r["cached_tokens_reported"], true);
    assert!(r["cached_tokens_on"].as_u64().unwrap() > 0, "the ON server reported no cached tokens: {r}");
    assert_eq!(r["cached_tokens_off"], 0);
    // The second conversation's first turn shares the system prompt with the first one.
    let second = r["requests"].as_array().unwrap().iter().find(|q| q["conversation"] == 1 && q["turn"] == 0).unwrap();
    assert!(second["on"]["cached_tokens"].as_u64().unwrap() > 0, "{second}");
    assert_eq!(r["per_turn"].as_array().map(Vec::len), Some(2));
    assert!(r["overall"]["ttft_on_median_ms"].as_f64().unwrap() > 0.0);
    assert!(r["command"].as_str().unwrap().starts_with("pagewarden bench prefix-cache --conversations 2 --turns 2"));
}

#[test]
fn bench_serve_reports_the_prompt_tokens_the_prefix_cache_served() {
    let server = common::Server::start(&[]);
    let bench = || {
        let out = Command::new(env!("CARGO_BIN_EXE_pagewarden"))
            .args(["bench", "serve", "--url", &server.url, "--key", &server.key])
            .args(["--concurrency", "2", "--requests", "2", "--max-tokens", "4", "--json"])
            .output()
            .expect("run pagewarden");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "bench failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let r: Value = serde_json::from_str(&stdout).expect("one JSON object");
        r["levels"][0].clone()
    };
    // The second run sends the prompts the first one did: all but the last token of each is
    // in the cache (the tokens that produce the first output token are always computed).
    let _ = bench();
    let level = bench();
    assert_eq!(level["errors"], 0, "{level}");
    let prompt = level["mean_prompt_tokens"].as_f64().expect("prompt tokens reported");
    let cached = level["mean_cached_tokens"].as_f64().expect("cached tokens reported");
    assert!(prompt > 1.0 && cached >= 1.0 && cached < prompt, "prompt {prompt}, cached {cached}: {level}");
}
