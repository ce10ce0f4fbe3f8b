#![allow(clippy::unwrap_used, clippy::expect_used)]
//! One tenant cannot hold the whole KV pool while another waits: two requests of tenant A that
//! each reserve half the pool for minutes leave room for tenant B, whose short request is
//! answered at once (A's second request waits in A's own queue).

mod common;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use common::Server;
use serde_json::{json, Value};

/// A raw completion (no chat template, so the prompt's length is known): 8180 tokens to
/// generate after a prompt of a few.
fn long_completion() -> Value {
    json!({
        "model": common::MODEL_NAME,
        "prompt": "1, 2, 3,",
        "max_tokens": 8180,
        "temperature": 0,
        "ignore_eos": true,
        "stream": true,
    })
}

#[test]
fn a_tenant_reserving_near_window_requests_cannot_starve_another_tenant() {
    fetch::ensure_default_model().expect("default model");
    let dir = std::env::temp_dir().join(format!("pw-fair-share-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("pagewarden.toml");
    // Two context windows (8192 each) of pool: A's two requests would take all of it. The
    // max_tokens ceiling (4096 by default) is lifted to the window so they can ask for it.
    std::fs::write(
        &config,
        format!("[pool]\ntokens = 16384\n[limits]\nmax_tokens_ceiling = 8192\n{}", common::metrics_section(&dir)),
    )
    .unwrap();
    let a_key = common::cluster::add_tenant(&config, "tenant-a");
    let b_key = common::cluster::add_tenant(&config, "tenant-b");
    let s = Server::start_with(dir, a_key.clone());

    // A's two long streams: each reserves a few prompt tokens + 8180, half the pool (512 of
    // 1024 pages), for minutes; together they would take every page.
    // The first decodes; the second waits in A's queue (over A's share): its answer (headers
    // included) is held until it starts, so each is sent from its own thread.
    let (tx, started) = std::sync::mpsc::channel();
    // Each of A's answers as it comes: a status, or the error that stood for one.
    let (status_tx, statuses) = std::sync::mpsc::channel::<String>();
    for _ in 0..2 {
        let (agent, url, key, tx) = (s.agent(), format!("{}/v1/completions", s.url), a_key.clone(), tx.clone());
        let status_tx = status_tx.clone();
        std::thread::spawn(move || {
            let r = agent
                .post(url)
                .header("Authorization", format!("Bearer {key}"))
                .header("Content-Type", "application/json")
                .send(long_completion().to_string().as_bytes());
            let _ = status_tx.send(match &r {
                Ok(r) => r.status().as_u16().to_string(),
                Err(e) => e.to_string(),
            });
            let Ok(mut r) = r else {
                return;
            };
            let mut lines = BufReader::new(r.body_mut().as_reader()).lines();
            // Held open (read slowly) until the server goes away.
            while let Some(Ok(line)) = lines.next() {
                if line.starts_with("data: {") {
                    let _ = tx.send(());
                }
            }
        });
    }
    started.recv_timeout(Duration::from_secs(60)).expect("one of A's requests is decoding");
    std::thread::sleep(Duration::from_millis(300));

    let t0 = Instant::now();
    let r = s
        .agent()
        .post(format!("{}/v1/chat/completions", s.url))
        .header("Authorization", format!("Bearer {b_key}"))
        .header("Content-Type", "application/json")
        .send(common::chat("Say hello.", 10).to_string().as_bytes())
        .unwrap();
    let took = t0.elapsed();
    assert_eq!(r.status(), 200);
    assert!(took < Duration::from_secs(2), "tenant B waited {took:?} behind tenant A");
    // The workers report their engine's stats every 250 ms: B's own request, answered by now,
    // may still show as queued in the last report, so the count is read until it settles.
    let t1 = Instant::now();
    let m = loop {
        let m = s.metrics();
        if common::cluster::metric(&m, "pagewarden_queue_depth", "") == 1.0 || t1.elapsed() > Duration::from_secs(5) {
            break m;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let pages_total = common::cluster::metric(&m, "pagewarden_kv_pages_total", "");
    let a_pages = common::cluster::metric(&m, "pagewarden_kv_pages_used", "tenant=\"1\"");
    assert!(a_pages > 0.0 && a_pages <= (pages_total / 2.0).ceil(), "A holds {a_pages} of {pages_total} pages");
    // A's second request was queued, not refused: one request waits, and the only answer A
    // has had is its first one's 200 (a refusal would have come at once).
    assert_eq!(common::cluster::metric(&m, "pagewarden_queue_depth", ""), 1.0, "{m}");
    let answered: Vec<String> = statuses.try_iter().collect();
    assert_eq!(answered, ["200"], "A's answers so far");
}
