#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Usage accounting as a provider bills with it: after a mixed run of two tenants (chat and
//! completions, streamed and not, a refused request, prefix-cache hits) across a restart, the
//! usage log, `pagewarden usage` and `/metrics` give each tenant exactly the sums of the
//! `usage` fields its responses carried.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use common::{Server, MODEL_NAME};

/// Per tenant: (requests, prompt, cached, completion).
type Sums = BTreeMap<String, [u64; 4]>;

fn add(sums: &mut Sums, tenant: &str, usage: &Value) {
    let s = sums.entry(tenant.to_string()).or_default();
    s[0] += 1;
    s[1] += usage["prompt_tokens"].as_u64().unwrap();
    s[2] += usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    s[3] += usage["completion_tokens"].as_u64().unwrap();
}

/// A streamed request with `include_usage`; returns the final usage chunk's `usage`.
fn stream(s: &Server, key: &str, path: &str, body: Value) -> Value {
    let mut r = s
        .agent()
        .post(format!("{}{path}", s.url))
        .header("Authorization", format!("Bearer {key}"))
        .header("Content-Type", "application/json")
        .send(body.to_string().as_bytes())
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut usage = Value::Null;
    for line in BufReader::new(r.body_mut().as_reader()).lines() {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            return usage;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        if !v["usage"].is_null() {
            usage = v["usage"].clone();
        }
    }
    panic!("the stream ended without [DONE]");
}

fn post(s: &Server, key: &str, path: &str, body: &Value) -> (u16, Value) {
    let url = format!("{}{path}", s.url);
    let (status, text) = launch::post_json(&url, key, &body.to_string(), Duration::from_secs(120)).unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// One tenant's mixed traffic; its successful responses' usage goes into `sums`.
fn traffic(s: &Server, tenant: &str, key: &str, sums: &mut Sums) {
    let system = format!("You are the support assistant of {tenant}'s shop. ").repeat(12);
    for q in ["What is 2 + 2?", "Name a colour.", "Say hi."] {
        // The same long system prompt each time: later requests hit the tenant's prefix cache.
        let body = json!({"model": MODEL_NAME, "max_tokens": 6, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}]});
        let (status, v) = post(s, key, "/v1/chat/completions", &body);
        assert_eq!(status, 200, "{v}");
        add(sums, tenant, &v["usage"]);
    }
    let (status, v) =
        post(s, key, "/v1/completions", &json!({"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 5}));
    assert_eq!(status, 200, "{v}");
    add(sums, tenant, &v["usage"]);
    let u = stream(
        s,
        key,
        "/v1/chat/completions",
        json!({"model": MODEL_NAME, "max_tokens": 7, "stream": true, "stream_options": {"include_usage": true},
               "messages": [{"role": "user", "content": "Count to three."}]}),
    );
    add(sums, tenant, &u);
    // Refused before it ran: a request, billed no tokens.
    let (status, _) =
        post(s, key, "/v1/chat/completions", &json!({"model": MODEL_NAME, "temperature": -1, "messages": []}));
    assert_eq!(status, 400);
    sums.entry(tenant.to_string()).or_default()[0] += 1;
}

fn usage_cli(config: &Path, extra: &[&str]) -> Value {
    let out =
        Command::new(common::bin()).args(["usage", "--json", "--config"]).arg(config).args(extra).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn by_name(v: &Value) -> Sums {
    v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let n = |k: &str| t[k].as_u64().unwrap();
            (
                t["tenant_name"].as_str().unwrap().to_string(),
                [n("requests"), n("prompt_tokens"), n("cached_tokens"), n("completion_tokens")],
            )
        })
        .collect()
}

#[test]
fn the_usage_log_the_usage_command_and_metrics_equal_the_sums_of_each_tenants_responses() {
    fetch::ensure_default_model().unwrap();
    let dir = launch::scratch_dir("pw-usage").unwrap();
    let config = dir.join("pagewarden.toml");
    // A small rotation size: the run spans several rotated files, which must all count.
    std::fs::write(
        &config,
        format!(
            "[pool]\ntokens = 16384\n[usage]\nlog = \"{}\"\nmax_bytes = 2000\nkeep = 100\n{}",
            dir.join("usage.jsonl").display(),
            common::metrics_section(&dir)
        ),
    )
    .unwrap();
    let alice = launch::tenant_add(common::bin().as_ref(), &config, "alice").unwrap();
    let bob = launch::tenant_add(common::bin().as_ref(), &config, "bob").unwrap();

    let mut sums = Sums::new();
    let s = Server::start_with(dir.clone(), alice.clone());
    traffic(&s, "alice", &alice, &mut sums);
    traffic(&s, "bob", &bob, &mut sums);
    assert!(sums["alice"][2] > 0 && sums["bob"][2] > 0, "no prefix-cache hit to bill: {sums:?}");

    // /metrics, by tenant id (alice 1, bob 2).
    let m = s.metrics();
    for (name, id) in [("alice", "1"), ("bob", "2")] {
        let f = format!("tenant=\"{id}\"");
        let got = [
            launch::metric(&m, "pagewarden_tenant_requests_total", &f),
            launch::metric(&m, "pagewarden_tenant_prompt_tokens_total", &f),
            launch::metric(&m, "pagewarden_tenant_cached_tokens_total", &f),
            launch::metric(&m, "pagewarden_tenant_completion_tokens_total", &f),
        ]
        .map(|x| x as u64);
        assert_eq!(got, sums[name], "{name}'s metrics");
    }
    assert_eq!(launch::metric(&m, "pagewarden_tenant_requests_total", "outcome=\"rejected\""), 2.0);

    // A restart continues the same log.
    assert!(s.stop().success());
    let s = Server::start_with(dir.clone(), alice.clone());
    traffic(&s, "bob", &bob, &mut sums);
    assert!(s.stop().success());

    assert!(dir.join("usage.jsonl.1").exists(), "the log rotated");
    let all = usage_cli(&config, &[]);
    assert_eq!(all["unreadable_lines"], 0);
    assert_eq!(by_name(&all), sums);
    let only_bob = usage_cli(&config, &["--tenant", "bob"]);
    assert_eq!(by_name(&only_bob), sums.iter().filter(|(k, _)| *k == "bob").map(|(k, v)| (k.clone(), *v)).collect());
    assert!(by_name(&usage_cli(&config, &["--since", "2999-01-01T00:00:00Z"])).is_empty());

    // The log holds ids, counts and timings; never the text of a prompt or an output.
    let mut log = String::new();
    for f in std::fs::read_dir(&dir).unwrap() {
        let p = f.unwrap().path();
        if p.file_name().unwrap().to_string_lossy().starts_with("usage.jsonl") {
            log.push_str(&std::fs::read_to_string(p).unwrap());
        }
    }
    assert!(!log.contains("support assistant") && !log.contains("Count to three"), "prompt text in the usage log");
    let _ = std::fs::remove_dir_all(dir);
}
