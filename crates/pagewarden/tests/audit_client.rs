#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `pagewarden audit` (the client half) as a user runs it:
//! * against a real `pagewarden serve` with three tenants (real default model): it passes, its
//!   report says so, and every tenant took part;
//! * against a fake server that answers each tenant with another tenant's prompt (a leak by
//!   construction): it fails, non-zero, and the report names whose canary reached whom.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{json, Value};

use common::fake_openai::{read_request, respond, serve, Request};

fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A `pagewarden serve` child, killed on drop.
struct Serve {
    child: Child,
    url: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The served context window. The model's own (8,192) is too slow here: one prompt near it
/// takes over 30 s to prefill on two cores, past serve's transfer timeout. 2,048 keeps a
/// near-context prompt at a few seconds.
const CONTEXT: usize = 2048;

/// Starts `serve` with three tenants; returns it and the tenants file for the audit.
fn serve_with_three_tenants(dir: &Path) -> (Serve, PathBuf) {
    fetch::ensure_default_model().expect("default model");
    let config = dir.join("pagewarden.toml");
    // Pool: four windows, so a burst exhausts it. Queue timeout: a burst that exhausts the pool
    // leaves requests waiting for this long (the default 30 s would dominate the test).
    std::fs::write(
        &config,
        format!(
            "context_window = {CONTEXT}\n\n[pool]\ntokens = {}\n\n[engine]\nqueue_timeout_ms = 10000\n\n{}",
            4 * CONTEXT,
            common::metrics_section(dir),
        ),
    )
    .unwrap();
    let mut tenants = String::new();
    for name in ["alice", "bob", "carol"] {
        let key = launch::tenant_add(common::bin().as_ref(), &config, name).unwrap();
        tenants.push_str(&format!("[[tenants]]\nname = \"{name}\"\nkey = \"{key}\"\n\n"));
    }
    let tenants_file = dir.join("tenants.toml");
    std::fs::write(&tenants_file, tenants).unwrap();

    let mut cmd = Command::new(common::bin());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--config"]).arg(&config).stderr(Stdio::null());
    let mut p = launch::spawn(cmd).unwrap();
    let url = p.expect_lines(&[launch::listening::API], launch::START_TIMEOUT).unwrap().remove(0);
    let s = Serve { child: p.child, url };
    launch::wait_ready(&s.url, launch::START_TIMEOUT).unwrap();
    (s, tenants_file)
}

/// The audit reads the gateway's `/metrics` with the token [`common::metrics_section`] wrote
/// into `dir`.
fn audit(url: &str, tenants: &Path, report: &Path, extra: &[&str]) -> Output {
    let dir = tenants.parent().unwrap();
    if !dir.join("metrics-token").exists() {
        common::write_secret(&dir.join("metrics-token"), common::METRICS_TOKEN);
    }
    Command::new(common::bin())
        .args(["audit", "--url", url, "--tenants"])
        .arg(tenants)
        .arg("--metrics-token-file")
        .arg(dir.join("metrics-token"))
        .args(["--requests", "40", "--concurrency", "4", "--seed", "20260517", "--report"])
        .arg(report)
        .args(extra)
        .output()
        .unwrap()
}

fn json_file(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn an_audit_of_a_real_server_passes_for_three_tenants() {
    let dir = scratch("audit-client");
    let (server, tenants) = serve_with_three_tenants(&dir);
    let report = dir.join("report");
    let t0 = Instant::now();
    let out = audit(
        &server.url,
        &tenants,
        &report,
        &["--context-window", &CONTEXT.to_string(), "--timing-probe", "8", "--skip-check", "probe-power"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    eprintln!("audit took {:.1} s:\n{stdout}", t0.elapsed().as_secs_f64());
    assert!(out.status.success(), "the audit failed:\n{stdout}\n{stderr}");
    assert!(stdout.starts_with("pagewarden audit: PASS"), "{stdout}");
    // No prompt text on stdout.
    assert!(!stdout.contains("secret code"), "{stdout}");

    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    assert!(md.starts_with("# pagewarden audit: PASS"), "{md}");
    let svg = std::fs::read_to_string(report.join("report.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("<circle"));

    let r = json_file(&report.join("report.json"));
    assert_eq!(r["passed"], true);
    for k in ["cross_tenant_canaries", "cross_request_canaries", "divergences", "leaked_pages", "overlong_accepted"] {
        assert_eq!(r["counts"][k], 0, "{k}: {}", r["findings"]);
    }
    assert_eq!(r["requests_sent"], 40);
    let names: Vec<&str> = r["tenants"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["alice", "bob", "carol"]);
    for t in r["tenants"].as_array().unwrap() {
        assert!(t["requests"].as_u64().unwrap() > 0, "{t}");
        assert!(t["ok"].as_u64().unwrap() > 0, "{t}");
    }
    // The mix happened: over-long prompts refused, streams dropped, re-runs compared.
    assert!(r["outcomes"]["refused_400"].as_u64().unwrap() >= 1, "{}", r["outcomes"]);
    assert!(r["outcomes"]["disconnected_by_us"].as_u64().unwrap() >= 1, "{}", r["outcomes"]);
    assert!(r["divergence_checks"]["compared"].as_u64().unwrap() >= 3, "{}", r["divergence_checks"]);
    assert_eq!(r["near_context"]["planned"], 1);
    assert_eq!(r["calibration"]["measured"], true);
    assert_eq!(r["metrics"][0]["pages_returned_to_zero"], true, "{}", r["metrics"]);
    // The timing probe ran: tenant B never got a cached token, tenant A's repeats did.
    let p = &r["timing_probe"];
    assert_eq!(p["samples"], 8, "{p}");
    assert!(p["auc"].as_f64().is_some(), "{p}");
    assert!(p["b_on_a_cached"]["cached_tokens"].as_array().unwrap().iter().all(|n| n == 0), "{p}");
    assert!(p["cross_tenant_hits"].as_array().unwrap().is_empty(), "{p}");
    assert!(p["a_warm"]["cached_tokens"].as_array().unwrap().iter().any(|n| n.as_u64().unwrap() > 0), "{p}");
    assert!(r["metrics"][0]["violations"].as_array().unwrap().iter().all(|v| v["delta"] == 0.0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the fake server remembers: each tenant's latest prompt.
type Prompts = Arc<Mutex<HashMap<String, String>>>;

/// One request of the fake server: OpenAI-shaped answers whose text is the latest prompt of
/// another tenant; the context-window refusal in pagewarden's wording; idle metrics.
fn fake_handle(mut s: TcpStream, prompts: Prompts) {
    let Request { path, key, body: req } = read_request(&s);
    match path.as_str() {
        "/v1/models" => {
            return respond(s, 200, "application/json", &json!({"data": [{"id": "fake"}]}).to_string());
        }
        // Like pagewarden's: only with the metrics token.
        "/metrics" if key != common::METRICS_TOKEN.to_ascii_lowercase() => {
            return respond(
                s,
                401,
                "application/json",
                r#"{"error":{"message":"no","type":"x","param":null,"code":null}}"#,
            );
        }
        "/metrics" => {
            return respond(
                s,
                200,
                "text/plain",
                "pagewarden_kv_pages_used{tenant=\"alice\"} 0\npagewarden_isolation_violations_total{kind=\"bad_mac\"} 0\n",
            );
        }
        _ => {}
    }
    let prompt = req["messages"][0]["content"].as_str().or(req["prompt"].as_str()).unwrap_or("").to_string();
    let max_tokens = req["max_tokens"].as_u64().unwrap_or(16) as usize;
    // One token per word: close enough for the audit's sizing, which it measures anyway.
    let tokens = prompt.split_whitespace().count() + 10;
    if tokens + max_tokens > 2048 {
        let msg = format!(
            "this model's maximum context length is 2048 tokens; the request needs {} ({tokens} in the prompt + \
             {max_tokens} to generate)",
            tokens + max_tokens
        );
        let e = json!({"error": {"message": msg, "type": "invalid_request_error", "code": "context_length_exceeded"}});
        return respond(s, 400, "application/json", &e.to_string());
    }
    // The leak: the latest prompt any other tenant sent.
    let leaked = {
        let mut p = prompts.lock().unwrap();
        let other = p.iter().find(|(k, _)| **k != key).map(|(_, v)| v.clone()).unwrap_or_default();
        p.insert(key, prompt);
        other
    };
    let text = format!("Here you go: {leaked}");
    if req["stream"] == true {
        let chunk = json!({"choices": [{"index": 0, "delta": {"content": text}, "text": text, "finish_reason": null}]});
        let end = json!({"choices": [{"index": 0, "delta": {}, "text": "", "finish_reason": "length"}]});
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n\
             data: {chunk}\n\ndata: {end}\n\ndata: [DONE]\n\n"
        );
    } else {
        let v = json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "text": text,
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": tokens, "completion_tokens": max_tokens},
        });
        respond(s, 200, "application/json", &v.to_string());
    }
}

#[test]
fn an_audit_of_a_leaking_server_fails_and_names_the_leak() {
    let dir = scratch("audit-client-leak");
    let prompts: Prompts = Arc::default();
    let url = serve(move |s| fake_handle(s, prompts.clone()));
    let tenants = common::fake_openai::three_tenants_file(&dir);
    let report = dir.join("report");
    // No --context-window: discovered from the refusal.
    let out = audit(&url, &tenants, &report, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "the audit passed a leaking server:\n{stdout}");
    assert!(stdout.starts_with("pagewarden audit: FAIL"), "{stdout}");
    assert!(stdout.contains("FINDING cross_tenant_canary"), "{stdout}");
    assert!(stderr.contains("the audit failed"), "{stderr}");

    let r = json_file(&report.join("report.json"));
    assert_eq!(r["passed"], false);
    assert_eq!(r["context_window"], 2048);
    // It read the fake /metrics with the token (the fake refuses it without).
    assert!(r["metrics"][0].get("before_error").is_none(), "{}", r["metrics"]);
    assert_eq!(r["metrics"][0]["pages_returned_to_zero"], true, "{}", r["metrics"]);
    assert!(r["counts"]["cross_tenant_canaries"].as_u64().unwrap() > 0);
    // The text changes with what other tenants sent last: the isolated re-run differs.
    assert!(r["counts"]["divergences"].as_u64().unwrap() > 0, "{}", r["divergence_checks"]);
    let leak = r["findings"].as_array().unwrap().iter().find(|f| f["kind"] == "cross_tenant_canary").unwrap();
    assert_ne!(leak["tenant"], leak["canary_owner"]);
    let canary = leak["canary"].as_str().unwrap();
    assert!(leak["context"].as_str().unwrap().contains(canary), "{leak}");
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    assert!(md.starts_with("# pagewarden audit: FAIL") && md.contains(canary));
    let _ = std::fs::remove_dir_all(&dir);
}
