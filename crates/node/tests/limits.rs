#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A tenant's limits come before any work for it: its concurrency slot is taken before its body
//! is read or tokenized, the body has a deadline, and a tenant may have a body limit of its own.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[test]
fn the_concurrency_limit_refuses_before_the_prompt_is_tokenized() {
    let mut cfg = test_config();
    cfg.tenants = vec![tenant("alice", ALICE, 1), tenant("bob", BOB, 8)];
    let server = start(cfg);
    let url = server.url("/v1/completions");
    let held = json!({"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 400, "temperature": 0, "stream": true});
    let (status, mut stream) = open_stream(&url, ALICE, &held);
    assert_eq!(status, 200);
    assert!(next_event(&mut stream).is_some());

    // Far over the 1024-token window: tokenizing it would show that (400), but the limit is
    // checked first.
    let huge = json!({"model": MODEL, "prompt": "hello ".repeat(5000), "max_tokens": 4});
    let r = post_json(&url, Some(ALICE), &huge);
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.error()["code"], "rate_limit_exceeded");
    assert!(r.error()["message"].as_str().unwrap().contains("concurrent"), "{}", r.body);
    assert!(r.header("retry-after").is_some());
    let m = metrics_text(&server);
    assert_eq!(metric_or_zero(&m, "pagewarden_rejections_total{reason=\"tenant_concurrency\"}"), 1.0);
    assert_eq!(metric_or_zero(&m, "pagewarden_rejections_total{reason=\"context_length_exceeded\"}"), 0.0);

    // Once the slot is free the same request is judged on its content.
    drop(stream);
    let t0 = Instant::now();
    let r = loop {
        let r = post_json(&url, Some(ALICE), &huge);
        if r.status != 429 || t0.elapsed() > Duration::from_secs(10) {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.error()["code"], "context_length_exceeded");
}

/// Sends the head of a request declaring `Content-Length: 200`, then its body at one byte a
/// second; returns what the server answered, how long after the head, and whether it closed
/// the connection.
async fn slow_upload(addr: std::net::SocketAddr, key: &str) -> (String, Duration, bool) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
    );
    wr.write_all(head.as_bytes()).await.unwrap();
    let t0 = Instant::now();
    let writer = tokio::spawn(async move {
        for _ in 0..200 {
            if wr.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let mut closed = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        match tokio::time::timeout_at(deadline, rd.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    let elapsed = t0.elapsed();
    writer.abort();
    (String::from_utf8_lossy(&got).into_owned(), elapsed, closed)
}

#[test]
fn a_body_not_complete_by_the_deadline_gets_408_and_nothing_runs() {
    let mut cfg = test_config();
    cfg.limits.body_timeout = Duration::from_millis(1500);
    cfg.tenants = vec![tenant("alice", ALICE, 1)];
    let server = start(cfg);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (text, elapsed, closed) = rt.block_on(slow_upload(server.addr, ALICE));
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(elapsed >= Duration::from_millis(1400) && elapsed < Duration::from_secs(10), "{elapsed:?}");
    assert!(closed, "the connection stayed open after the 408");
    let body = &text[text.find("\r\n\r\n").expect("a body") + 4..];
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(v["error"]["code"], "body_timeout", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");

    let m = metrics_text(&server);
    assert_eq!(metric_or_zero(&m, "pagewarden_rejections_total{reason=\"body_timeout\"}"), 1.0);
    assert_eq!(metric(&m, "pagewarden_prefill_tokens_total"), 0.0, "nothing was submitted");
    // The slow upload's concurrency slot was given back.
    let ok = json!({"model": MODEL, "prompt": "1, 2,", "max_tokens": 2, "temperature": 0});
    let r = post_json(&server.url("/v1/completions"), Some(ALICE), &ok);
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn a_tenants_own_body_limit_overrides_the_servers() {
    let mut cfg = test_config();
    let mut bob = tenant("bob", BOB, 8);
    bob.max_body_bytes = Some(1000);
    cfg.tenants = vec![tenant("alice", ALICE, 8), bob];
    let server = start(cfg);
    let url = server.url("/v1/completions");
    let body = json!({"model": MODEL, "prompt": "hi ".repeat(500), "max_tokens": 2, "temperature": 0});
    assert!(body.to_string().len() > 1000);
    let r = post_json(&url, Some(BOB), &body);
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(r.error()["message"].as_str().unwrap().contains("1000"), "{}", r.body);
    let r = post_json(&url, Some(ALICE), &body);
    assert_eq!(r.status, 200, "{}", r.body);
}
