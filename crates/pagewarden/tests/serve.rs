#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `pagewarden serve` as a separate process, driven over HTTP like a client would.

mod common;

use common::{chat, generate_cli, PROMPTS};

#[test]
fn greedy_output_through_the_api_equals_generate_alone_and_under_load() {
    let server = common::Server::start(&["max_concurrent = 32", "max_queued = 32"]);
    let want: Vec<String> = PROMPTS.iter().map(|p| generate_cli(p, 24)["text"].as_str().unwrap().to_string()).collect();
    // Alone.
    for (p, w) in PROMPTS.iter().zip(&want) {
        let (status, body) = server.post("/v1/chat/completions", &chat(p, 24));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["message"]["content"].as_str().unwrap(), w, "prompt {p:?} alone");
    }
    // With 15 other requests running at the same time: batching changes nothing.
    let got: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let server = &server;
                s.spawn(move || {
                    let (status, body) = server.post("/v1/chat/completions", &chat(PROMPTS[i % 4], 24));
                    assert_eq!(status, 200, "{body}");
                    body["choices"][0]["message"]["content"].as_str().unwrap().to_string()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g, &want[i % 4], "request {i} under load");
    }
}

#[test]
fn over_long_prompt_is_a_400_and_moves_no_counter() {
    let server = common::Server::start(&[]);
    let metric = |m: &str, name: &str| -> f64 {
        m.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let before = server.metrics();
    let (status, body) = server.post("/v1/chat/completions", &chat(&"hello ".repeat(9000), 16));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    assert!(body["error"]["message"].as_str().unwrap().contains("8192"), "{body}");
    let after = server.metrics();
    for name in ["pagewarden_engine_steps_total", "pagewarden_prefill_tokens_total", "pagewarden_kv_pages_used"] {
        assert_eq!(metric(&before, name), metric(&after, name), "{name} moved");
    }
}
