#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A server that shares one cache across customers cannot dodge the audit. Each test puts a
//! proxy in front of a real `pagewarden serve` that maps every tenant's key to one upstream
//! tenant, so all their prompts share one prefix cache (the deployment the audit exists to
//! catch), then tries one dodge:
//! * none: the audit fails on the cached tokens the server itself reports across tenants, in
//!   the load and in the probe;
//! * every key shown its own alias of the one model (so no two tenants list the same id, and
//!   the audit has no tokenizer by name): the probe still pairs the tenants, and fails;
//! * 503 (with `Retry-After: 0`) to the probe's requests: a failing `probe_unanswered`;
//! * the probe skipped by name: the load phase alone fails on the cross-tenant cached tokens,
//!   and the report's first line says the cache was not checked.

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

use serde_json::{json, Value};

use common::fake_openai::{read_request, respond, serve};

/// What the proxy does besides sharing one upstream tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dodge {
    None,
    /// `/v1/models` lists `model-of-<key>` for each key; requests naming it go to the model.
    Aliases,
    /// Streamed one-token requests (the probe's) get 503 with `Retry-After: 0`.
    RefuseProbe,
}

/// The context window served: short prompts, so a debug build answers quickly.
const CONTEXT: usize = 1024;

/// One audit against a real server at a time: they share two cores.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// `serve` with one tenant, behind a proxy that gives every key that tenant's; (server, proxy
/// URL).
fn shared_cache_behind_proxy(dodge: Dodge) -> (common::Server, String) {
    let (dir, key) = common::Server::configure(&[]);
    let config = dir.join("pagewarden.toml");
    let cfg = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("context_window = {CONTEXT}\n{cfg}")).unwrap();
    let server = common::Server::start_with(dir, key.clone());
    let upstream = server.url.trim_start_matches("http://").to_string();
    let model = upstream_model(&server.url, &key);
    let proxy = serve(move |s| relay(s, &upstream, &key, &model, dodge));
    (server, proxy)
}

/// The model id the server lists.
fn upstream_model(url: &str, key: &str) -> String {
    let agent = launch::agent(launch::START_TIMEOUT);
    let mut resp =
        agent.get(format!("{url}/v1/models")).header("Authorization", format!("Bearer {key}")).call().unwrap();
    let v: Value = serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
    v["data"][0]["id"].as_str().unwrap().to_string()
}

/// One request through the proxy: answered by the dodge, or sent upstream as the one tenant
/// (the metrics token passes as it came) and the answer copied back byte for byte.
fn relay(mut s: TcpStream, upstream: &str, upstream_key: &str, model: &str, dodge: Dodge) {
    let req = read_request(&s);
    if dodge == Dodge::Aliases && req.path == "/v1/models" {
        let m = json!({"object": "list", "data": [{"id": format!("model-of-{}", req.key), "object": "model",
                                                   "context_length": CONTEXT}]});
        return respond(s, 200, "application/json", &m.to_string());
    }
    if dodge == Dodge::RefuseProbe && req.body["stream"] == true && req.body["max_tokens"] == 1 {
        let e = r#"{"error":{"message":"busy","type":"server_error","param":null,"code":"unavailable"}}"#;
        let _ = write!(
            s,
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 0\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{e}",
            e.len()
        );
        return;
    }
    let mut body = req.body.clone();
    if dodge == Dodge::Aliases && body.get("model").is_some() {
        body["model"] = json!(model);
    }
    let get = body.is_null();
    let key = if req.path == "/metrics" { req.key.as_str() } else { upstream_key };
    let payload = if get { String::new() } else { body.to_string() };
    let Ok(mut up) = TcpStream::connect(upstream) else { return };
    let _ = write!(
        up,
        "{} {} HTTP/1.1\r\nHost: {upstream}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        if get { "GET" } else { "POST" },
        req.path,
        payload.len()
    );
    let _ = std::io::copy(&mut up, &mut s);
}

fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `pagewarden audit` through the proxy as alice, bob and carol, 12 requests with `clients`
/// at once; `extra` flags after.
fn audit(url: &str, dir: &Path, clients: usize, extra: &[&str]) -> (Output, Value) {
    let tenants = common::fake_openai::three_tenants_file(dir);
    common::write_secret(&dir.join("metrics-token"), common::METRICS_TOKEN);
    let report = dir.join("report");
    let out = Command::new(common::bin())
        .args(["audit", "--url", url, "--tenants"])
        .arg(&tenants)
        .arg("--metrics-token-file")
        .arg(dir.join("metrics-token"))
        .args(["--requests", "12", "--concurrency", &clients.to_string(), "--seed", "5", "--report"])
        .arg(&report)
        .args(extra)
        .output()
        .unwrap();
    let text = std::fs::read_to_string(report.join("report.json")).unwrap_or_else(|e| {
        panic!("no report ({e}):\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    (out, serde_json::from_str(&text).unwrap())
}

fn failing(r: &Value) -> Vec<&Value> {
    r["findings"].as_array().unwrap().iter().filter(|f| f["fails"] == true).collect()
}

fn failing_kinds(r: &Value) -> BTreeSet<String> {
    failing(r).iter().map(|f| f["kind"].as_str().unwrap().to_string()).collect()
}

/// Whether some failing cross-tenant hit came from the timing probe (its scenarios).
fn probe_found_a_hit(r: &Value) -> bool {
    failing(r).iter().any(|f| {
        f["kind"] == "cross_tenant_cache_hit" && f["scenario"].as_str().is_some_and(|s| s.starts_with("probe_"))
    })
}

/// The fewest samples the probe judges (the audit's `MIN_SAMPLES`): a shared cache reports
/// another tenant's cached tokens on its first sample.
const SHORT_PROBE: [&str; 4] = ["--timing-probe", "8", "--skip-check", "probe-power"];

/// Audits a shared cache behind the proxy with `dodge` (one audit at a time, `clients` at
/// once, `extra` flags); asserts it failed, saying `what` passed otherwise. Returns the report
/// and stdout; the scratch directory goes once the caller's assertions held.
fn audit_must_fail(dodge: Dodge, name: &str, clients: usize, extra: &[&str], what: &str) -> (Value, String, PathBuf) {
    let dir = scratch(name);
    let (_server, url) = shared_cache_behind_proxy(dodge);
    let (out, r) = audit(&url, &dir, clients, extra);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!out.status.success(), "the audit passed {what}:\n{stdout}");
    (r, stdout, dir)
}

#[test]
fn one_cache_shared_by_every_key_fails_on_the_cached_tokens_the_server_reports() {
    let _one = one_at_a_time();
    let (r, _, dir) = audit_must_fail(Dodge::None, "audit-dodge-none", 3, &SHORT_PROBE, "one cache for every customer");
    assert!(failing_kinds(&r).contains("cross_tenant_cache_hit"), "{}", r["findings"]);
    assert!(probe_found_a_hit(&r), "{}", r["findings"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_model_alias_per_key_does_not_keep_the_tenants_apart_in_the_probe() {
    let _one = one_at_a_time();
    let what = "per-key aliases of one shared cache";
    let (r, _, dir) = audit_must_fail(Dodge::Aliases, "audit-dodge-aliases", 3, &SHORT_PROBE, what);
    // Three model ids, every pair probed all the same.
    let models: BTreeSet<&str> = r["models"].as_array().unwrap().iter().map(|m| m["model"].as_str().unwrap()).collect();
    assert_eq!(models.len(), 3, "{}", r["models"]);
    assert_eq!(r["timing_probe"]["pairs"].as_array().unwrap().len(), 3, "{}", r["timing_probe"]);
    assert!(probe_found_a_hit(&r), "{}", r["findings"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn refusing_the_probes_requests_is_a_failing_finding_not_a_pass() {
    let _one = one_at_a_time();
    let what = "a server that refused its probe";
    let (r, _, dir) = audit_must_fail(Dodge::RefuseProbe, "audit-dodge-refuse-probe", 3, &SHORT_PROBE, what);
    assert!(failing_kinds(&r).contains("probe_unanswered"), "{}", r["findings"]);
    let p = &r["timing_probe"];
    assert_eq!(p["b_on_a_cached"]["n"], 0, "{p}");
    // It honoured Retry-After before giving up on each request.
    assert!(p["retries"].as_u64().unwrap() > 0, "{p}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn with_the_probe_skipped_the_load_alone_fails_on_cross_tenant_cached_tokens() {
    let _one = one_at_a_time();
    // One request at a time: each tenant's first request comes after another tenant's, with
    // none of its own in flight, so the template head the others sent is all it may hit.
    let skip = ["--skip-check", "timing-probe"];
    let what = "a shared cache with the probe off";
    let (r, stdout, dir) = audit_must_fail(Dodge::None, "audit-dodge-probe-skipped", 1, &skip, what);
    assert!(stdout.starts_with("pagewarden audit: FAIL (the prefix cache was NOT checked"), "{stdout}");
    assert!(r["timing_probe"].is_null());
    let hits: Vec<&Value> = failing(&r).into_iter().filter(|f| f["kind"] == "cross_tenant_cache_hit").collect();
    assert!(!hits.is_empty(), "{}", r["findings"]);
    assert!(hits.iter().all(|f| !f["scenario"].as_str().unwrap().starts_with("probe_")), "{hits:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
