#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Gateway, prefill and decode workers as separate processes on loopback ports: outputs equal
//! the single-process path, and the 2026 incident replayed at small scale is refused at every
//! door without a page reserved or a frame sent.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use cluster::proto::{Spec, Stats, TicketWire, ToGateway, ToWorker};
use common::cluster::{metric, Cluster, DirectGateway};
use common::{chat, generate_cli, PROMPTS};
use protocol::{RequestError, RequestId, RouteRequest, TenantId};
use sampling::{SamplingParams, StopTokens};
use serde_json::Value;
use wire::Role;

fn content(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap();
    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

fn counters(c: &Cluster) -> Vec<f64> {
    (0..c.workers.len())
        .flat_map(|i| {
            let m = c.worker_metrics(i);
            [
                metric(&m, "pagewarden_worker_reservations_total", ""),
                metric(&m, "pagewarden_kv_frames_sent_total", ""),
                metric(&m, "pagewarden_kv_frames_received_total", ""),
                metric(&m, "pagewarden_kv_pages_used", ""),
            ]
        })
        .collect()
}

#[test]
fn two_prefill_and_two_decode_workers_give_the_greedy_outputs_of_one_process() {
    let mut c = Cluster::start("");
    for (role, name) in
        [("prefill", "prefill-a"), ("prefill", "prefill-b"), ("decode", "decode-a"), ("decode", "decode-b")]
    {
        c.add_worker(role, name, None);
    }
    c.wait_workers(2, 2);
    let want: Vec<String> = PROMPTS.iter().map(|p| generate_cli(p, 24)["text"].as_str().unwrap().to_string()).collect();
    for (p, w) in PROMPTS.iter().zip(&want) {
        let (status, body) = c.post("/v1/chat/completions", &chat(p, 24));
        assert_eq!(status, 200, "{body}");
        assert_eq!(&content(&body), w, "prompt {p:?}");
    }
    // Concurrently: the router spreads them over both workers of each role.
    let got: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|i| {
                let c = &c;
                s.spawn(move || {
                    let (status, body) = c.post("/v1/chat/completions", &chat(PROMPTS[i % 4], 24));
                    assert_eq!(status, 200, "{body}");
                    content(&body)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g, &want[i % 4], "concurrent request {i}");
    }
    for i in 0..4 {
        let m = c.worker_metrics(i);
        let work =
            metric(&m, "pagewarden_kv_frames_sent_total", "") + metric(&m, "pagewarden_worker_reservations_total", "");
        assert!(work > 0.0, "worker {} got no work:\n{m}", c.workers[i].name);
        assert_eq!(metric(&m, "pagewarden_isolation_violations_total", ""), 0.0, "{m}");
        // The worker's listener is the API's HTTP stack: anything but /metrics and /health is
        // the same 404 envelope.
        let base = c.workers[i].metrics_url.trim_end_matches("/metrics").to_string();
        let mut r = ureq::get(format!("{base}/nope")).config().http_status_as_error(false).build().call().unwrap();
        assert_eq!(r.status().as_u16(), 404);
        let body: serde_json::Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        assert_eq!(body["error"]["message"], "no route for /nope", "{body}");
        assert_eq!(ureq::get(format!("{base}/health")).call().unwrap().status().as_u16(), 200);
    }
    c.wait_pools_empty(&[0, 1, 2, 3]);

    // The incident's request: a prompt over the context window. The gateway refuses it with a
    // 400 before any worker hears of it.
    let before = counters(&c);
    let long = "lorem ipsum dolor sit amet ".repeat(2000);
    let (status, body) = c.post("/v1/chat/completions", &chat(&long, 16));
    assert_eq!(status, 400, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{body}");
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(counters(&c), before, "a worker reserved, sent or received something for a refused request");
}

#[test]
fn a_worker_whose_pool_cannot_hold_the_context_window_refuses_to_start() {
    let c = Cluster::start("");
    let config = c.dir.join("small-pool.toml");
    let text = std::fs::read_to_string(&c.config).unwrap().replace("tokens = 16384", "tokens = 4096");
    std::fs::write(&config, text).unwrap();
    for role in ["prefill", "decode"] {
        let out = Command::new(common::bin())
            .args([role, "--config", config.to_str().unwrap(), "--gateway", &c.cluster_addr])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{role} started with a pool under the context window");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("4096") && err.contains("8192") && err.contains("16384"), "{role}: {err}");
    }
}

#[test]
fn a_worker_with_another_page_size_or_secret_is_refused_and_exits_naming_the_reason() {
    let c = Cluster::start("");
    let page = c.dir.join("page32.toml");
    let text = std::fs::read_to_string(&c.config).unwrap().replace("[pool]\n", "[pool]\npage_size = 32\n");
    std::fs::write(&page, text).unwrap();
    let secret = c.dir.join("other-secret.toml");
    common::write_secret(&c.dir.join("other-secret"), &"a5".repeat(32));
    let text = std::fs::read_to_string(&c.config).unwrap().replace("/secret\"", "/other-secret\"");
    std::fs::write(&secret, text).unwrap();
    for (config, why) in [(&page, "PageSize"), (&secret, "cluster secret")] {
        let out = Command::new(common::bin())
            .args(["decode", "--config", config.to_str().unwrap(), "--gateway", &c.cluster_addr])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{why}: {err}");
    }
    let m = c.gateway_metrics();
    assert_eq!(metric(&m, "pagewarden_cluster_workers", ""), 0.0, "{m}");
}

/// Acts as a gateway (it knows the cluster secret) that skips the gateway's door check and
/// sends a real worker process an over-long request directly. Returns what the worker answered
/// and its last reported counters.
async fn direct(role: Role, config: &std::path::Path) -> (Vec<ToGateway>, Stats) {
    let mut g = DirectGateway::start(role, config).await;
    let spec = Spec {
        route: 1,
        request: RouteRequest {
            id: RequestId(1),
            tenant: TenantId(1),
            prompt: (0..9000).map(|i| 100 + (i % 1000)).collect(),
            max_tokens: 16,
            sampling: SamplingParams::default(),
            stop_tokens: StopTokens::new([2]),
            deadline: Some(Instant::now() + Duration::from_millis(30_000)),
            cache_salt: None,
            output: None,
        },
        cache_tags: Vec::new(),
    };
    let msg = if role == Role::Prefill {
        let ticket = TicketWire { request: 1, tenant: 1, nonce: [7; 16], pages: 564, tokens: 9000, held: 0 };
        ToWorker::Prefill { spec, ticket, decode_addr: "127.0.0.1:1".into() }
    } else {
        ToWorker::Reserve(spec)
    };
    g.wr.send(&msg).await.unwrap();
    // Long enough for a refusal and several stats reports after it.
    let (got, stats) = g.answers(Duration::from_secs(3)).await;
    (got, stats.expect("the worker reports its stats"))
}

#[test]
fn workers_refuse_an_over_long_request_sent_directly_without_reserving_or_sending() {
    let c = Cluster::start("");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    for role in [Role::Decode, Role::Prefill] {
        let (got, stats) = rt.block_on(direct(role, &c.config));
        assert_eq!(got.len(), 1, "{role:?}: {got:?}");
        match &got[0] {
            ToGateway::Failed { route: 1, failure: RequestError::Refused(e) } => {
                let text = e.to_string();
                assert!(text.contains("8192") && text.contains("9016"), "{text}");
            }
            other => panic!("{role:?}: expected a refusal, got {other:?}"),
        }
        assert_eq!((stats.reservations, stats.frames_sent, stats.pool.pages_used), (0, 0, 0), "{role:?}: {stats:?}");
    }
}

#[test]
fn a_prefill_worker_reuses_its_tenants_cached_prefix_and_the_output_is_unchanged() {
    let mut c = Cluster::start("");
    c.add_worker("prefill", "prefill-a", None);
    c.add_worker("decode", "decode-a", None);
    c.wait_workers(1, 1);
    let system = "You are the assistant of a bicycle shop. Answer briefly. We sell bicycles, helmets, \
                  lights, locks and repair kits; delivery takes three to five days; returns are accepted \
                  within thirty days with a receipt.";
    let body = serde_json::json!({
        "model": common::MODEL_NAME,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Do you sell locks?"}],
        "max_tokens": 12,
        "temperature": 0,
    });
    let run = || {
        let (status, text) = c.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let usage = &v["usage"];
        (
            content(&text),
            usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
            usage["prompt_tokens"].as_u64().unwrap(),
        )
    };
    let (first, cached_first, _) = run();
    let (again, cached_again, prompt) = run();
    assert_eq!(cached_first, 0);
    assert_eq!(cached_again + 1, prompt, "the same prompt computes only its last token");
    assert_eq!(again, first);
    // The decode worker still received and verified every prompt token's KV.
    let m = c.worker_metrics(1);
    assert_eq!(metric(&m, "pagewarden_kv_transfers_completed_total", ""), 2.0, "{m}");
}

#[test]
fn structured_outputs_and_tool_calls_across_processes_equal_one_process_and_validate() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer", "maximum": 99999999}},
        "required": ["city", "population"],
        "additionalProperties": false,
    });
    let structured = |prompt: &str| {
        let mut b = chat(prompt, 60);
        b["response_format"] =
            serde_json::json!({"type": "json_schema", "json_schema": {"name": "c", "schema": schema}});
        b
    };
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"], "additionalProperties": false}}}]);
    let mut call = chat("What is the weather in Rome?", 60);
    call["tools"] = tools;
    call["tool_choice"] = serde_json::json!("required");

    // One process: the reference answers.
    let one = common::Server::start(&[]);
    let want: Vec<(u16, Value)> = PROMPTS.iter().map(|p| one.post("/v1/chat/completions", &structured(p))).collect();
    let want_call = one.post("/v1/chat/completions", &call);
    drop(one);

    let mut c = Cluster::start("");
    c.add_worker("prefill", "prefill-a", None);
    c.add_worker("decode", "decode-a", None);
    c.wait_workers(1, 1);
    for (p, (status, w)) in PROMPTS.iter().zip(&want) {
        assert_eq!(*status, 200, "{w}");
        let (status, body) = c.post("/v1/chat/completions", &structured(p));
        assert_eq!(status, 200, "{body}");
        let got = content(&body);
        // The first token was drawn under the mask on the prefill worker, the rest on decode.
        assert_eq!(got, w["choices"][0]["message"]["content"].as_str().unwrap(), "prompt {p:?}");
        let doc: Value = serde_json::from_str(&got).unwrap_or_else(|e| panic!("{got:?} is not JSON: {e}"));
        assert!(doc["city"].is_string() && doc["population"].is_i64(), "{doc}");
        assert_eq!(doc.as_object().unwrap().len(), 2, "{doc}");
    }
    let (status, body) = c.post("/v1/chat/completions", &call);
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{body}");
    let f = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(f, &want_call.1["choices"][0]["message"]["tool_calls"][0]["function"]);
    assert_eq!(f["name"], "get_weather");
    let args: Value = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string(), "{args}");
    c.wait_pools_empty(&[0, 1]);
}

/// One chat turn of `messages` from `key`: (reply, prompt tokens, cached tokens).
fn turn(url: &str, key: &str, messages: &[Value]) -> (String, u64, u64) {
    let body =
        serde_json::json!({"model": common::MODEL_NAME, "messages": messages, "max_tokens": 6, "temperature": 0});
    let (status, text) =
        launch::post_json(&format!("{url}/v1/chat/completions"), key, &body.to_string(), Duration::from_secs(180))
            .unwrap();
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let usage = &v["usage"];
    (
        content(&text),
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
    )
}

#[test]
fn each_conversations_next_turns_find_its_prefix_on_whichever_prefill_worker_holds_it_and_cross_only_as_new_pages() {
    let mut c = Cluster::start("");
    c.add_worker("prefill", "prefill-a", None);
    c.add_worker("prefill", "prefill-b", None);
    c.add_worker("decode", "decode-a", None);
    c.wait_workers(2, 1);
    let shops = ["bicycle", "garden", "book", "coffee"];
    let mut conversations: Vec<Vec<Value>> = shops
        .iter()
        .map(|shop| {
            let system = format!(
                "You are the assistant of a {shop} shop. Answer briefly and politely. We sell {shop} goods of \
                 every kind; delivery takes three to five days; returns are accepted within thirty days with \
                 a receipt; gift cards never expire; our {shop} experts answer questions on weekdays."
            );
            vec![serde_json::json!({"role": "system", "content": system})]
        })
        .collect();
    let questions = ["What do you sell?", "How long is delivery?", "Can I return a gift?"];
    let mut previous_prompt = vec![0u64; shops.len()];
    let frames_received = || metric(&c.worker_metrics(2), "pagewarden_kv_frames_received_total", "");
    for (t, q) in questions.iter().enumerate() {
        let frames_before = frames_received();
        // Every conversation's turn at once: least-loaded routing would spread them over the
        // two workers whatever each one holds.
        let results: Vec<(String, u64, u64)> = std::thread::scope(|s| {
            let handles: Vec<_> = conversations
                .iter_mut()
                .map(|m| {
                    m.push(serde_json::json!({"role": "user", "content": q}));
                    let (url, key, m) = (&c.url, &c.key, &*m);
                    s.spawn(move || turn(url, key, m))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // The decode worker is sent one frame per page it lacks and a close: after the first
        // turn it holds each conversation's previous prompt (whole pages), verified then.
        let most: u64 = results
            .iter()
            .zip(&previous_prompt)
            .map(|((_, prompt, _), prev)| prompt.div_ceil(16) - (prev / 16).min((prompt - 1) / 16) + 1)
            .sum();
        let frames = frames_received() - frames_before;
        assert!(frames <= most as f64, "turn {t}: the decode worker received {frames} frames, at most {most} needed");
        if t > 0 {
            let whole: u64 = results.iter().map(|(_, prompt, _)| prompt.div_ceil(16) + 1).sum();
            assert!(frames < whole as f64, "turn {t}: {frames} frames, as many as whole prompts ({whole})");
        }
        for (i, (reply, prompt, cached)) in results.into_iter().enumerate() {
            if t > 0 {
                // The previous turn's prompt is a prefix of this one: all its whole pages but
                // the one that held its last token are cached where it ran.
                let ideal = (previous_prompt[i] - 1) / 16 * 16;
                assert!(cached >= ideal, "turn {t} of conversation {i}: {cached} cached of {prompt}, ideal {ideal}");
            }
            previous_prompt[i] = prompt;
            conversations[i].push(serde_json::json!({"role": "assistant", "content": reply}));
        }
    }
    let m = c.gateway_metrics();
    let tags: Vec<f64> = ["prefill-a", "prefill-b"]
        .iter()
        .map(|w| metric(&m, "pagewarden_worker_route_tags", &format!("worker=\"{w}\"")))
        .collect();
    assert!(tags.iter().sum::<f64>() > 0.0, "the workers reported the pages they cache: {m}");
    // Another tenant sending a conversation's exact messages gains nothing from it.
    let other = c.add_tenant("other");
    c.reload();
    let until = Instant::now() + Duration::from_secs(20);
    let probe = common::chat("hello", 1).to_string();
    while launch::post_json(&format!("{}/v1/chat/completions", c.url), &other, &probe, Duration::from_secs(60))
        .unwrap()
        .0
        != 200
    {
        assert!(Instant::now() < until, "the gateway never took the new tenant");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, prompt, cached) = turn(&c.url, &other, &conversations[0][..conversations[0].len() - 1]);
    assert!(prompt > 64);
    assert_eq!(cached, 0, "another tenant's prefix is never a hit");
}
