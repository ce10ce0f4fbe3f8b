#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Admission, limits, cancellation and drain, each on its own server (their counters must not
//! be disturbed by other tests).

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

fn counting(max_tokens: usize, stream: bool) -> Value {
    json!({"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": max_tokens, "temperature": 0, "stream": stream})
}

fn pages_used(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("pagewarden_kv_pages_used{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Metrics once the engine is idle and its published counters have stopped moving (they are
/// published after each step, a moment after the step's events reach the client).
fn settled_metrics(server: &Server) -> String {
    let t0 = Instant::now();
    let mut prev = metrics_text(server);
    loop {
        // Longer than the workers' stats period (250 ms): two reads within one period would
        // look settled while the last steps are still unreported.
        std::thread::sleep(Duration::from_millis(600));
        let now = metrics_text(server);
        let idle = metric(&now, "pagewarden_running_sequences") == 0.0 && metric(&now, "pagewarden_queue_depth") == 0.0;
        let same = metric(&now, "pagewarden_engine_steps_total") == metric(&prev, "pagewarden_engine_steps_total");
        if idle && same {
            return now;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "engine did not settle:\n{now}");
        prev = now;
    }
}

/// Waits until `cond` holds for the metrics text.
fn wait_metrics(server: &Server, what: &str, cond: impl Fn(&str) -> bool) {
    let t0 = Instant::now();
    loop {
        let m = metrics_text(server);
        if cond(&m) {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{what}:\n{m}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn oversized_prompt_is_rejected_before_any_page_is_reserved() {
    let server = start(test_config());
    // Warm up so that counters are non-trivial, then wait until nothing runs.
    assert_eq!(post_json(&server.url("/v1/completions"), Some(ALICE), &counting(2, false)).status, 200);
    let before = settled_metrics(&server);
    let long = "hello ".repeat(1100);
    let cases = [
        (server.url("/v1/completions"), json!({"model": MODEL, "prompt": long, "max_tokens": 4})),
        (server.url("/v1/chat/completions"), json!({"model": MODEL, "messages": [{"role": "user", "content": long}]})),
        // A short prompt whose max_tokens pushes it over the window.
        (server.url("/v1/completions"), json!({"model": MODEL, "prompt": "hi", "max_tokens": 1024})),
    ];
    for (url, body) in &cases {
        let r = post_json(url, Some(BOB), body);
        assert_eq!(r.status, 400, "{}", r.body);
        let e = r.error();
        assert_eq!(e["code"], "context_length_exceeded");
        assert!(e["message"].as_str().unwrap().contains("1024"), "{e}");
    }
    let after = metrics_text(&server);
    for m in ["pagewarden_engine_steps_total", "pagewarden_prefill_tokens_total", "pagewarden_decode_tokens_total"] {
        assert_eq!(metric(&before, m), metric(&after, m), "{m} moved");
    }
    assert_eq!(pages_used(&after), 0.0);
    assert_eq!(metric(&after, "pagewarden_queue_depth"), 0.0);
    let rejected = metric_or_zero(&after, "pagewarden_rejections_total{reason=\"context_length_exceeded\"}");
    assert_eq!(rejected, 3.0);
}

#[test]
fn tenant_over_max_concurrent_gets_429_with_retry_after() {
    let mut cfg = test_config();
    cfg.tenants = vec![tenant("alice", ALICE, 1), tenant("bob", BOB, 8)];
    let server = start(cfg);
    let (status, mut stream) = open_stream(&server.url("/v1/completions"), ALICE, &counting(400, true));
    assert_eq!(status, 200);
    assert!(next_event(&mut stream).is_some());
    let r = post_json(&server.url("/v1/completions"), Some(ALICE), &counting(2, false));
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.error()["type"], "rate_limit_error");
    let retry: u64 = r.header("retry-after").expect("Retry-After").parse().unwrap();
    assert!(retry >= 1);
    // Another tenant is not affected.
    assert_eq!(post_json(&server.url("/v1/completions"), Some(BOB), &counting(2, false)).status, 200);
    drop(stream);
}

#[test]
fn tenant_over_tokens_per_minute_gets_429_with_retry_after() {
    let mut cfg = test_config();
    let mut carol = tenant("carol", "key-carol", 8);
    carol.tokens_per_minute = 60;
    cfg.tenants = vec![carol];
    let server = start(cfg);
    // 17 prompt tokens + 30 = 47 of 60: admitted. Charged up front, so the next one is refused
    // even though fewer tokens may be generated (the unused part is refunded at the end).
    let r = post_json(&server.url("/v1/completions"), Some("key-carol"), &counting(30, false));
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post_json(&server.url("/v1/completions"), Some("key-carol"), &counting(30, false));
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.error()["code"], "rate_limit_exceeded");
    assert!(r.header("retry-after").and_then(|v| v.parse::<u64>().ok()).is_some_and(|s| s >= 1));
    // A request larger than the whole per-minute budget can never pass: said so.
    let r = post_json(&server.url("/v1/completions"), Some("key-carol"), &counting(100, false));
    assert_eq!(r.status, 429);
    assert!(r.error()["message"].as_str().unwrap().contains("lower max_tokens"));
}

#[test]
fn client_disconnect_cancels_and_frees_pages() {
    let server = start(test_config());
    let (status, mut stream) = open_stream(&server.url("/v1/completions"), ALICE, &counting(500, true));
    assert_eq!(status, 200);
    assert!(next_event(&mut stream).is_some());
    wait_metrics(&server, "the running request holds no pages", |m| pages_used(m) > 0.0);
    drop(stream);
    wait_metrics(&server, "pages not freed after disconnect", |m| {
        pages_used(m) == 0.0 && metric(m, "pagewarden_running_sequences") == 0.0
    });
    // It asked for 500 tokens: the engine stopped well before.
    let decoded = metric(&settled_metrics(&server), "pagewarden_decode_tokens_total");
    assert!(decoded < 400.0, "{decoded} tokens decoded: the request was not cancelled");
}

#[test]
fn drain_refuses_new_requests_and_lets_in_flight_ones_finish() {
    let mut server = start(test_config());
    let (status, mut stream) = open_stream(&server.url("/v1/completions"), ALICE, &counting(40, true));
    assert_eq!(status, 200);
    assert!(next_event(&mut stream).is_some());
    server.begin_shutdown();
    let t0 = Instant::now();
    while get(&server.url("/ready"), None).status != 503 {
        assert!(t0.elapsed() < Duration::from_secs(5), "/ready did not turn 503");
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = post_json(&server.url("/v1/completions"), Some(BOB), &counting(2, false));
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.header("retry-after").is_some());
    let mut last = None;
    while let Some(e) = next_event(&mut stream) {
        last = Some(e);
    }
    assert_eq!(last.as_deref(), Some("[DONE]"));
    server.shutdown().expect("clean exit");
}

#[test]
fn stream_cut_by_drain_timeout_ends_with_an_error_event_not_done() {
    let mut cfg = test_config();
    cfg.limits.drain_timeout = Duration::from_millis(300);
    let server = start(cfg);
    let (status, mut stream) = open_stream(&server.url("/v1/completions"), ALICE, &counting(900, true));
    assert_eq!(status, 200);
    assert!(next_event(&mut stream).is_some());
    let done = std::thread::spawn(move || server.shutdown());
    let mut events = Vec::new();
    while let Some(e) = next_event(&mut stream) {
        events.push(e);
    }
    let last: Value = serde_json::from_str(events.last().expect("events")).expect("json");
    assert!(last.get("error").is_some(), "last event: {last}");
    assert!(!events.iter().any(|e| e == "[DONE]"));
    done.join().unwrap().expect("clean exit");
}
