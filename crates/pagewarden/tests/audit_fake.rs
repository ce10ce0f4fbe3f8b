#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The audit judged against fake servers that each get one thing wrong, and one that gets
//! nothing wrong. Each fake counts prompts with the real tokenizer and answers
//! deterministically, so whatever fails an audit is the one fault it was built with:
//! * the 2026 incident's placeholder (an over-long prompt answered, `prompt_tokens: 1`) fails
//!   on the audit's own count of what it sent, whatever the server reports;
//! * a prefix cache shared by every tenant, that reports no cached tokens, fails the timing
//!   probe at its default settings;
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
    let (out, r) = audit(&url, &dir, &["--timing-probe", "0", "--tokenizer", model.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the audit passed the placeholder server:\n{stdout}");
    assert!(stdout.contains("FINDING overlong_accepted"), "{stdout}");
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
    assert_eq!(p["buckets"].as_array().unwrap().len(), 3);
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
