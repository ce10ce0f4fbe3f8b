#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The server's log, as an operator's collector reads it: JSON lines on stderr with levels,
//! request, tenant and route ids, sizes and timings, and never a prompt's or an output's text.

mod common;

use common::{chat, Server, MODEL_NAME};
use serde_json::{json, Value};

/// A word no log line could contain by chance.
const CANARY: &str = "zorblaxqvintemuro";

fn lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}")))
        .collect()
}

#[test]
fn json_logs_carry_request_and_tenant_ids_and_never_the_prompt_or_the_output() {
    let s = Server::start_logging("debug");
    let prompt = format!("Repeat this word exactly, three times: {CANARY}");
    let (status, body) = s.post("/v1/chat/completions", &chat(&prompt, 24));
    assert_eq!(status, 200, "{body}");
    let output = body["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let (status, done) = s.post(
        "/v1/completions",
        &json!({"model": MODEL_NAME, "prompt": format!("The word {CANARY} means"), "max_tokens": 16, "temperature": 0}),
    );
    assert_eq!(status, 200, "{done}");
    let completion = done["choices"][0]["text"].as_str().unwrap().to_string();
    // Refused requests are logged too, by reason, never by their (possibly quoting) message.
    let (status, refused) = s.post(
        "/v1/chat/completions",
        &json!({"model": MODEL_NAME, "messages": [{"role": "user", "content": CANARY}], "temperature": 9}),
    );
    assert_eq!(status, 400, "{refused}");

    // The request events are written when a request ends; give the last one a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let log = loop {
        let log = s.log();
        let requests = lines(&log).iter().filter(|l| l["fields"]["message"] == "request").count();
        if requests >= 3 || std::time::Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let events = lines(&log);

    assert!(!log.contains(CANARY), "the prompt's text reached the log:\n{log}");
    for text in [&output, &completion] {
        assert!(text.len() < 12 || !log.contains(text.as_str()), "output text {text:?} reached the log:\n{log}");
    }
    for e in &events {
        assert!(e["timestamp"].is_string() && e["level"].is_string(), "{e}");
    }

    let requests: Vec<&Value> = events.iter().filter(|e| e["fields"]["message"] == "request").collect();
    assert_eq!(requests.len(), 3, "{log}");
    let tenant = requests[0]["fields"]["tenant"].as_str().unwrap().to_string();
    assert!(tenant.parse::<u64>().is_ok(), "tenants are logged by id: {tenant}");
    let ok = requests.iter().find(|e| e["fields"]["endpoint"] == "chat" && e["fields"]["status"] == 200).unwrap();
    let f = &ok["fields"];
    assert_eq!(f["prompt_tokens"], body["usage"]["prompt_tokens"], "{ok}");
    assert_eq!(f["completion_tokens"], body["usage"]["completion_tokens"], "{ok}");
    assert!(f["ttft_ms"].as_f64().unwrap() > 0.0 && f["total_ms"].as_f64().unwrap() >= f["ttft_ms"].as_f64().unwrap());
    let bad = requests.iter().find(|e| e["fields"]["status"] == 400).unwrap();
    assert_eq!(bad["fields"]["error"], "invalid_request", "{bad}");

    // The routing events sit inside the request's span: the same request and tenant ids.
    let routed: Vec<&Value> = events.iter().filter(|e| e["fields"]["message"] == "route").collect();
    assert_eq!(routed.len(), 2, "{log}");
    let ids: Vec<u64> = requests
        .iter()
        .filter(|e| e["fields"]["status"] == 200)
        .map(|e| e["fields"]["request"].as_u64().unwrap())
        .collect();
    for r in routed {
        assert_eq!(r["level"], "DEBUG");
        let span = &r["span"];
        assert_eq!(span["tenant"].to_string(), tenant, "{r}");
        assert!(ids.contains(&span["request"].as_u64().unwrap()), "{r}");
        assert!(r["fields"]["route"].as_u64().is_some(), "{r}");
    }
}

#[test]
fn the_filter_sets_the_level_and_a_bad_filter_falls_back_to_info_and_says_so() {
    let quiet = Server::start_logging("warn");
    let (status, _) = quiet.post("/v1/chat/completions", &chat("Hi", 2));
    assert_eq!(status, 200);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let events = lines(&quiet.log());
    assert!(events.iter().all(|e| e["level"] == "WARN" || e["level"] == "ERROR"), "{events:?}");
    drop(quiet);

    let bad = Server::start_logging("info,[=nonsense");
    let (status, _) = bad.post("/v1/chat/completions", &chat("Hi", 2));
    assert_eq!(status, 200);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let events = lines(&bad.log());
    assert!(events.iter().any(|e| e["level"] == "WARN" && e["fields"]["filter"] == "info,[=nonsense"), "{events:?}");
    assert!(events.iter().any(|e| e["fields"]["message"] == "request"), "info events still logged: {events:?}");
}
