#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The audit judged against fake servers that each get one thing wrong, and one that gets
//! nothing wrong. Each fake counts prompts with the real tokenizer and answers
//! deterministically, so whatever fails an audit is the one fault it was built with:
//! * the 2026 incident's placeholder (an over-long prompt answered, `prompt_tokens: 1`) fails
//!   on the audit's own count of what it sent, whatever the server reports;
//! * a prefix cache shared by every tenant, that reports no cached tokens, fails the timing
//!   probe at its default settings;
//! * the placeholder with a cover story (a `/tokenize` that under-counts, a window declared
//!   four times the model's) fails on the model file the audit holds;
//! * a cache that reuses another tenant's text past a gap (llama.cpp's `--cache-reuse`),
//!   reporting nothing, fails the probe's chunk variant;
//! * a server that refuses an over-long prompt under load but answers it alone fails on the
//!   re-run;
//! * the honest fake passes, with re-run comparisons in every category.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use common::fake_openai::{Fake, Fault};

fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `pagewarden audit` against `url` as three tenants, 60 requests; `extra` flags after.
fn audit(url: &str, dir: &Path, extra: &[&str]) -> (Output, Value) {
    let tenants = common::fake_openai::three_tenants_file(dir);
    let report = dir.join("report");
    let out = Command::new(common::bin())
        .args(["audit", "--url", url, "--tenants"])
        .arg(&tenants)
        .args(["--requests", "60", "--concurrency", "4", "--seed", "7", "--report"])
        .arg(&report)
        .args(extra)
        .output()
        .unwrap();
    let r = serde_json::from_str(&std::fs::read_to_string(report.join("report.json")).unwrap()).unwrap();
    (out, r)
}

fn failing_kinds(r: &Value) -> BTreeSet<String> {
    r["findings"].as_array().unwrap().iter().filter(|f| f["fails"] == true).map(|f| f["kind"].to_string()).collect()
}

#[test]
fn the_incidents_placeholder_fails_on_the_audits_own_count_of_what_it_sent() {
    let dir = scratch("audit-fake-placeholder");
    let url = Fake::start(Fault::Placeholder);
    let model = fetch::ensure_default_model().unwrap();
    let (out, r) = audit(&url, &dir, &["--skip-check", "timing-probe", "--tokenizer", model.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the audit passed the placeholder server:\n{stdout}");
    assert!(stdout.contains("FINDING overlong_accepted"), "{stdout}");
    // Skipped by name, and said so first.
    assert!(stdout.starts_with("pagewarden audit: FAIL (the prefix cache was NOT checked"), "{stdout}");
    assert_eq!(r["skipped_checks"], serde_json::json!(["timing-probe"]));
    // That rule alone: nothing else is wrong with this server.
    let kinds = failing_kinds(&r);
    let want: BTreeSet<String> = ["\"overlong_accepted\"", "\"prompt_tokens_undercounted\""].map(String::from).into();
    assert_eq!(kinds, want, "{}", r["findings"]);
    assert_eq!(r["prompt_lengths"]["source"], "model_file");
    let f = r["findings"].as_array().unwrap().iter().find(|f| f["kind"] == "overlong_accepted").unwrap();
    let detail = f["detail"].as_str().unwrap();
    assert!(detail.contains("by the audit's count") && detail.contains("reported 1 prompt tokens"), "{detail}");
    // Every over-long request the plan made was answered, and every one is named.
    let over = r["outcomes_by_scenario"]["over_long"]["ok"].as_u64().unwrap_or(0)
        + r["outcomes_by_scenario"]["over_budget"]["ok"].as_u64().unwrap_or(0);
    assert!(over >= 3, "{}", r["outcomes_by_scenario"]);
    assert!(r["counts"]["overlong_accepted"].as_u64().unwrap() >= over, "{}", r["counts"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_prefix_cache_shared_by_every_tenant_fails_the_timing_probe_at_its_default_settings() {
    let dir = scratch("audit-fake-shared-cache");
    let url = Fake::start(Fault::SharedCache);
    let (out, r) = audit(&url, &dir, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the audit passed a shared cache:\n{stdout}");
    assert!(stdout.contains("FINDING timing_side_channel"), "{stdout}");
    let want: BTreeSet<String> = ["\"timing_side_channel\""].map(String::from).into();
    assert_eq!(failing_kinds(&r), want, "{}", r["findings"]);
    let p = &r["timing_probe"];
    assert_eq!(p["samples"], 300, "{p}");
    assert_eq!(p["powered"], true, "{p}");
    assert!(p["auc"].as_f64().unwrap() > 0.9, "{p}");
    // No hit was reported: the channel is time alone.
    assert!(p["cross_tenant_hits"].as_array().unwrap().is_empty());
    assert!(p["unanswered"].as_array().unwrap().is_empty());
    assert_eq!(p["buckets"].as_array().unwrap().len(), 3);
    // Every pair of the three tenants took part, and each shows the channel.
    let pairs = p["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 3, "{p}");
    assert!(pairs.iter().all(|c| c["auc"].as_f64().unwrap() > 0.9), "{p}");
    // Both chunk classes share a head with one of A's prompts: a prefix cache serves them
    // alike, and only reuse past a gap would tell them apart.
    assert!(p["chunks"]["auc"].as_f64().unwrap() < 0.75, "{p}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_honest_server_passes_with_re_run_comparisons_in_every_category() {
    let dir = scratch("audit-fake-honest");
    let url = Fake::start(Fault::None);
    let (out, r) = audit(&url, &dir, &["--long-prompts", "2"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the audit failed an honest server:\n{stdout}\n{}", r["findings"]);
    assert_eq!(r["context_window"], common::fake_openai::WINDOW);
    let d = &r["divergence_checks"];
    assert_eq!(d["batch_invariant"], true, "{d}");
    assert_eq!(d["logprob_tolerance"], 0.0, "{d}");
    let by = d["by_scenario"].as_object().unwrap();
    for k in ["short", "medium", "near_context", "over_long", "disconnect", "burst", "shared_prefix"] {
        let c = &by.get(k).unwrap_or_else(|| panic!("{k} missing: {d}"));
        assert!(c["compared"].as_u64().unwrap() >= c["required"].as_u64().unwrap().max(1), "{k}: {c}");
        assert_eq!(c["rerun_failed"], 0, "{k}: {c}");
    }
    // Dropped streams are compared on what they received.
    assert!(by["disconnect"]["prefixes"].as_u64().unwrap() >= 1, "{d}");
    assert!(by["burst"]["prefixes"].as_u64().unwrap() >= 1, "{d}");
    assert_eq!(r["timing_probe"]["powered"], true);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tokenize_endpoint_that_under_counts_and_an_overstated_window_fail_on_the_model_file() {
    let dir = scratch("audit-fake-lying-tokenizer");
    let url = Fake::start(Fault::LyingTokenizer);
    // No --tokenizer: the audit finds the packaged model by the name the fake serves.
    let (out, r) = audit(&url, &dir, &["--timing-probe", "16", "--skip-check", "probe-power"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the audit passed a lying tokenizer:\n{stdout}");
    let kinds = failing_kinds(&r);
    for k in ["tokenizer_disagrees", "context_window_overstated", "overlong_accepted", "prompt_tokens_undercounted"] {
        assert!(kinds.contains(&format!("\"{k}\"")), "{k} missing: {kinds:?}\n{}", r["findings"]);
    }
    // Its own count won, and the window it judged by is the model file's, not the declared one.
    assert_eq!(r["prompt_lengths"]["source"], "model_file");
    assert_eq!(r["context_window"], 8192);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cache_that_reuses_another_tenants_text_past_a_gap_fails_the_chunk_probe() {
    let dir = scratch("audit-fake-chunk-reuse");
    let url = Fake::start(Fault::ChunkReuse);
    let (out, r) = audit(&url, &dir, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the audit passed chunk reuse across tenants:\n{stdout}");
    let want: BTreeSet<String> = ["\"chunk_reuse_side_channel\""].map(String::from).into();
    assert_eq!(failing_kinds(&r), want, "{}", r["findings"]);
    let p = &r["timing_probe"];
    assert!(p["chunks"]["auc"].as_f64().unwrap() > 0.9, "{p}");
    // Prefixes are per tenant here: no prefix channel.
    assert!(p["auc"].as_f64().unwrap() < 0.6, "{p}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_over_long_prompt_refused_under_load_but_answered_alone_fails_on_its_re_run() {
    let dir = scratch("audit-fake-refuses-under-load");
    let url = Fake::start(Fault::RefusesOnlyUnderLoad);
    let (out, r) = audit(&url, &dir, &["--timing-probe", "16", "--skip-check", "probe-power"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the audit passed a refusal that was not repeated:\n{stdout}");
    let kinds = failing_kinds(&r);
    assert!(kinds.contains("\"refusal_not_repeated\""), "{kinds:?}\n{}", r["findings"]);
    let f = r["findings"].as_array().unwrap().iter().find(|f| f["kind"] == "refusal_not_repeated").unwrap();
    assert!(f["detail"].as_str().unwrap().contains("answered 200 alone"), "{f}");
    let _ = std::fs::remove_dir_all(&dir);
}
