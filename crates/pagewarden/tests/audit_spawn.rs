#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `pagewarden audit --spawn` with faults: it passes against the normal build, and against a
//! build with the 2026 incident put back (`--features incident-replay`, built here beside the
//! normal one) it fails and names the leak. This proves the audit can fail.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock};

use serde_json::Value;

/// The normal build's audit: 200 requests under every fault, and the timing probe.
const FULL: [&str; 6] = ["--requests", "200", "--timing-probe", "8", "--skip-check", "probe-power"];
/// The incident build leaks, overcounts and undercounts from its first requests: a short load
/// and no timing probe show it (the long audit cost CI minutes and showed nothing more).
const SHORT: [&str; 4] = ["--requests", "60", "--skip-check", "timing-probe"];

fn audit(bin: &Path, report: &Path, size: &[&str]) -> (bool, String) {
    fetch::ensure_default_model().expect("default model");
    let out = Command::new(bin)
        .args(["audit", "--spawn", "--concurrency", "6", "--seed", "11"])
        .args(size)
        // Four near-window prompts: a kill during the load can cost one its comparison.
        .args(["--long-prompts", "4"])
        // Re-runs three at a time (always of one tenant): the isolated pass was most of the
        // test's time one by one, and pagewarden answers batched re-runs bit for bit alike.
        .args(["--rerun-concurrency", "3"])
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

/// The tests of this file one at a time: the audit's deployment has a fault schedule and
/// deadlines, and on a 2-core machine a concurrent `cargo build` (the incident build takes
/// minutes from scratch) or a second deployment starves it into queue timeouts (CI saw 164 of
/// 200 requests refused with 503 that way).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The incident build, built once per run of this file.
fn incident_build() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(build_incident).clone()
}

/// Built in the test run's own target directory, so only the crates the feature changes are
/// compiled (a separate target directory rebuilt every dependency: minutes of CI on 2 cores).
/// Cargo puts the result where the normal binary is, so the incident binary is moved aside and
/// the normal one put back (a new file each, never writing through the hard link cargo keeps
/// to its own copy).
fn build_incident() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let normal = Path::new(common::bin());
    let target = normal.parent().and_then(Path::parent).expect("the binary lies in <target>/<profile>/");
    let aside = Path::new(env!("CARGO_TARGET_TMPDIR")).join("incident-build");
    std::fs::create_dir_all(&aside).unwrap();
    let (kept, incident) = (aside.join("pagewarden-normal"), aside.join("pagewarden-incident"));
    let _ = std::fs::remove_file(&kept);
    std::fs::copy(normal, &kept).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .current_dir(&root)
        .args(["build", "-q", "-p", "pagewarden", "--features", "incident-replay", "--target-dir"])
        .arg(target)
        .status()
        .unwrap();
    let _ = std::fs::remove_file(&incident);
    let moved = std::fs::copy(normal, &incident);
    std::fs::remove_file(normal).unwrap();
    std::fs::copy(&kept, normal).unwrap();
    assert!(st.success(), "building the incident build");
    moved.unwrap();
    incident
}

/// Runs the incident build's `args` with the self-test variable set or not; it must exit by
/// itself within a minute (a role that started serving would not).
fn run_incident(bin: &Path, args: &[&str], self_test: bool) -> (Option<i32>, String) {
    let mut cmd = Command::new(bin);
    cmd.args(args).stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
    cmd.stderr(std::process::Stdio::piped()).env_remove("PAGEWARDEN_INCIDENT_SELF_TEST");
    if self_test {
        cmd.env("PAGEWARDEN_INCIDENT_SELF_TEST", "1");
    }
    let mut child = cmd.spawn().unwrap();
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`{}` kept running: the incident build served", args.join(" "));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn the_incident_build_refuses_every_serving_role_unless_told_it_is_the_self_test() {
    let _serial = one_at_a_time();
    let bin = incident_build();
    let missing = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-config.toml");
    let missing = missing.to_str().unwrap();
    for role in ["serve", "gateway", "prefill", "decode"] {
        let (code, err) = run_incident(&bin, &[role, "--config", missing], false);
        assert_eq!(code, Some(2), "{role}: {err}");
        assert!(err.contains("refusing to run") && err.contains("incident-replay"), "{role}: {err}");
        assert!(err.contains("PAGEWARDEN_INCIDENT_SELF_TEST=1"), "{role}: {err}");
        // Allowed, it goes on (here to fail on the missing config) after a banner.
        let (code, err) = run_incident(&bin, &[role, "--config", missing], true);
        assert_ne!(code, Some(0), "{role}: {err}");
        assert!(err.contains("INCIDENT BUILD") && !err.contains("refusing to run"), "{role}: {err}");
    }
    // Commands that serve nothing are not affected.
    let (code, err) = run_incident(&bin, &["--version"], false);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_spawned_audit_with_faults_passes_on_the_normal_build_and_names_the_incident_builds_leak() {
    let _serial = one_at_a_time();
    // Built before the first audit starts, so no compiler runs beside either audit.
    let incident = incident_build();
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("audit-{}", std::process::id()));
    let normal = base.join("normal");
    let (ok, out) = audit(Path::new(common::bin()), &normal, &FULL);
    assert!(ok, "the audit failed against the normal build:\n{out}");
    let r = report_json(&normal);
    assert!(std::fs::read_to_string(normal.join("report.md")).unwrap().contains("PASS"));
    assert!(normal.join("report.svg").exists());
    assert_eq!(r["counts"]["failing_findings"], 0, "{}", r["counts"]);
    assert_eq!(r["tenants"].as_array().map(Vec::len), Some(3), "{}", r["tenants"]);
    assert!(r["requests_sent"].as_u64().unwrap() >= 200);
    assert!(!r["fault_log"].as_array().unwrap().is_empty(), "no fault was injected");
    assert!(r["timing_probe"]["cross_tenant_hits"].as_array().unwrap().is_empty(), "{}", r["timing_probe"]);
    // Every category compared with its re-run alone, exactly (pagewarden is batch-invariant),
    // and no re-run lost to a fault: faults pause when the load ends.
    let d = &r["divergence_checks"];
    assert_eq!(d["batch_invariant"], true, "{d}");
    for k in ["short", "medium", "near_context", "over_long", "disconnect", "burst", "shared_prefix"] {
        let c = d["by_scenario"].get(k).unwrap_or_else(|| panic!("{k} missing: {d}"));
        assert!(c["compared"].as_u64().unwrap() >= 1, "{k}: {c}");
        assert_eq!(c["rerun_failed"], 0, "{k}: {c}");
    }
    assert_eq!(r["prompt_lengths"]["source"], "model_file", "{}", r["prompt_lengths"]);
    let _ = std::fs::remove_dir_all(&normal);

    let broken = base.join("incident");
    let (ok, out) = audit(&incident, &broken, &SHORT);
    assert!(!ok, "the audit passed against the incident build:\n{out}");
    let md = std::fs::read_to_string(broken.join("report.md")).unwrap();
    assert!(md.contains("FAIL"), "{md}");
    let r = report_json(&broken);
    let c = &r["counts"];
    let leaks = c["cross_tenant_canaries"].as_u64().unwrap() + c["divergences"].as_u64().unwrap();
    assert!(leaks > 0, "the report names no leak: {c}\n{md}");
    assert!(md.contains("cross-tenant canary") || md.contains("**divergence**"), "{md}");
    // The incident's placeholder fails on the audit's own count of what it sent, too.
    assert!(c["overlong_accepted"].as_u64().unwrap() > 0, "{c}\n{md}");
    assert!(c["prompt_tokens_undercounted"].as_u64().unwrap() > 0, "{c}\n{md}");
    let _ = std::fs::remove_dir_all(&base);
}
