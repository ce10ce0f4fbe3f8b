#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `pagewarden audit --spawn` with faults: it passes against the normal build, and against a
//! build with the 2026 incident put back (`--features incident-replay`, built here into its own
//! target directory) it fails and names the leak. This proves the audit can fail.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn audit(bin: &Path, report: &Path) -> (bool, String) {
    fetch::ensure_default_model().expect("default model");
    let out = Command::new(bin)
        .args(["audit", "--spawn", "--requests", "200", "--concurrency", "6", "--seed", "11", "--timing-probe", "8"])
        .arg("--report")
        .arg(report)
        .output()
        .unwrap();
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn report_json(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap()
}

fn incident_build() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("incident-build");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .current_dir(&root)
        .args(["build", "-q", "-p", "pagewarden", "--features", "incident-replay", "--target-dir"])
        .arg(&target)
        .status()
        .unwrap();
    assert!(st.success(), "building the incident build");
    target.join("debug/pagewarden")
}

#[test]
fn a_spawned_audit_with_faults_passes_on_the_normal_build_and_names_the_incident_builds_leak() {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("audit-{}", std::process::id()));
    let normal = base.join("normal");
    let (ok, out) = audit(Path::new(common::bin()), &normal);
    assert!(ok, "the audit failed against the normal build:\n{out}");
    let r = report_json(&normal);
    assert!(std::fs::read_to_string(normal.join("report.md")).unwrap().contains("PASS"));
    assert!(normal.join("report.svg").exists());
    assert_eq!(r["counts"]["failing_findings"], 0, "{}", r["counts"]);
    assert_eq!(r["tenants"].as_array().map(Vec::len), Some(3), "{}", r["tenants"]);
    assert!(r["requests_sent"].as_u64().unwrap() >= 200);
    assert!(!r["fault_log"].as_array().unwrap().is_empty(), "no fault was injected");
    assert!(r["timing_probe"]["cross_tenant_hits"].as_array().unwrap().is_empty(), "{}", r["timing_probe"]);
    let _ = std::fs::remove_dir_all(&normal);

    let broken = base.join("incident");
    let (ok, out) = audit(&incident_build(), &broken);
    assert!(!ok, "the audit passed against the incident build:\n{out}");
    let md = std::fs::read_to_string(broken.join("report.md")).unwrap();
    assert!(md.contains("FAIL"), "{md}");
    let r = report_json(&broken);
    let c = &r["counts"];
    let leaks = c["cross_tenant_canaries"].as_u64().unwrap() + c["divergences"].as_u64().unwrap();
    assert!(leaks > 0, "the report names no leak: {c}\n{md}");
    assert!(md.contains("cross-tenant canary") || md.contains("**divergence**"), "{md}");
    let _ = std::fs::remove_dir_all(&base);
}
