#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What one tenant sends never ends a link, stalls a worker or fails another tenant's request
//! (invariant 14): schemas and tool parameters at the documented bounds and one past them, on
//! `serve` and on gateway + prefill + decode processes, with another tenant's requests in
//! flight; and a worker that receives a control message it cannot read fails that route alone.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::proto::{Spec, ToGateway, ToWorker};
use common::cluster::{metric, Cluster, DirectGateway};
use grammar::{EncodedFormat, MAX_FORMAT_BYTES, MAX_SCHEMA_DEPTH};
use protocol::{RequestError, RequestId, RouteRequest, TenantId};
use sampling::{SamplingParams, StopTokens};
use serde_json::{json, Value};
use wire::Role;

/// `levels` of arrays around a 0.
fn nested(levels: usize) -> Value {
    (1..levels).fold(json!(0), |v, _| json!([v]))
}

/// A schema that is `depth` levels deep, as the attacker's: the nesting sits in `default`,
/// which the grammar engine ignores, so only the bound can stop it.
fn schema_of_depth(ty: &str, depth: usize) -> Value {
    json!({"type": ty, "default": nested(depth - 1)})
}

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": common::MODEL_NAME,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 4,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn response_format(schema: Value) -> Value {
    chat(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}))
}

fn tool_call(parameters: Value, choice: Value) -> Value {
    chat(json!({
        "tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}],
        "tool_choice": choice,
    }))
}

/// Each hostile request, the status its sender must get, and the field a 400 must name.
fn hostile_requests() -> Vec<(&'static str, Value, u16, Option<&'static str>)> {
    let text_of = |n: usize| json!({"type": "string", "description": "d".repeat(n)});
    vec![
        ("schema at the depth limit", response_format(schema_of_depth("string", MAX_SCHEMA_DEPTH)), 200, None),
        (
            "schema one level deeper",
            response_format(schema_of_depth("string", MAX_SCHEMA_DEPTH + 1)),
            400,
            Some("response_format.json_schema.schema"),
        ),
        // The schema that took a link down: it parsed at the gateway, and its control
        // message, one wrapper deeper than serde_json reads, did not at the worker.
        (
            "schema 123 deep",
            response_format(schema_of_depth("string", 123)),
            400,
            Some("response_format.json_schema.schema"),
        ),
        // The encoded format holds the schema and about 60 bytes around it.
        ("schema near the size limit", response_format(text_of(MAX_FORMAT_BYTES - 200)), 200, None),
        ("schema over the size limit", response_format(text_of(MAX_FORMAT_BYTES)), 400, Some("response_format")),
        (
            "required tool call with parameters at the depth limit",
            tool_call(schema_of_depth("object", MAX_SCHEMA_DEPTH), json!("required")),
            200,
            None,
        ),
        (
            "auto tool call with parameters at the depth limit",
            tool_call(schema_of_depth("object", MAX_SCHEMA_DEPTH), json!("auto")),
            200,
            None,
        ),
        (
            "tool parameters one level deeper",
            tool_call(schema_of_depth("object", MAX_SCHEMA_DEPTH + 1), json!("required")),
            400,
            Some("tools[0].function.parameters"),
        ),
    ]
}

/// Sends every hostile request while another tenant's requests run; checks each answer and
/// that the bystander lost nothing.
fn hostile_beside_a_bystander(post: impl Fn(&Value) -> (u16, String), url: &str, bystander_key: &str) {
    let stop = Arc::new(AtomicBool::new(false));
    let other = common::cluster::bystander(url, bystander_key, stop.clone());
    for (what, body, status, param) in hostile_requests() {
        let (got, text) = post(&body);
        assert_eq!(got, status, "{what}: {text}");
        if let Some(p) = param {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["error"]["param"], json!(p), "{what}: {text}");
        }
    }
    stop.store(true, Ordering::SeqCst);
    let (ok, failed) = other.join().unwrap();
    assert!(failed.is_empty(), "the other tenant's requests failed: {failed:?}");
    assert!(ok >= 1, "the other tenant's requests ran beside the hostile ones");
}

fn link_failures(metrics: &str) -> f64 {
    metric(metrics, "pagewarden_link_failures_total", "")
}

#[test]
fn schemas_at_the_bounds_and_past_them_answer_their_sender_alone_on_serve() {
    let (dir, key) = common::Server::configure(&[]);
    let other = common::cluster::add_tenant(&dir.join("pagewarden.toml"), "other");
    let s = common::Server::start_with(dir, key.clone());
    let post = |body: &Value| {
        launch::post_json(&format!("{}/v1/chat/completions", s.url), &key, &body.to_string(), Duration::from_secs(120))
            .unwrap()
    };
    hostile_beside_a_bystander(post, &s.url, &other);
    let m = s.metrics();
    assert_eq!(link_failures(&m), 0.0, "{m}");
    // The in-process workers are the ones that started: still registered, still serving.
    assert_eq!(post(&chat(json!({}))).0, 200);
}

#[test]
fn schemas_at_the_bounds_and_past_them_end_no_link_between_processes() {
    let mut c = Cluster::start("");
    let other = c.add_tenant("other");
    c.reload();
    c.add_worker("prefill", "prefill-0", None);
    c.add_worker("decode", "decode-0", None);
    c.wait_workers(1, 1);
    let before: Vec<f64> = (0..2).map(|i| link_failures(&c.worker_metrics(i))).collect();
    hostile_beside_a_bystander(|b| c.post("/v1/chat/completions", b), &c.url.clone(), &other);
    let m = c.gateway_metrics();
    assert_eq!(link_failures(&m), 0.0, "{m}");
    for (i, b) in before.iter().enumerate() {
        assert_eq!(link_failures(&c.worker_metrics(i)), *b, "worker {i}");
    }
    assert_eq!(metric(&m, "pagewarden_cluster_workers", ""), 2.0, "both workers are still registered: {m}");
    assert_eq!(c.post("/v1/chat/completions", &chat(json!({}))).0, 200);
}

fn spec(route: u64, output: Option<EncodedFormat>) -> Spec {
    Spec {
        route,
        request: RouteRequest {
            id: RequestId(route),
            tenant: TenantId(1),
            prompt: vec![1, 100, 200, 300],
            max_tokens: 4,
            sampling: SamplingParams::default(),
            stop_tokens: StopTokens::new([2]),
            deadline: Some(Instant::now() + Duration::from_millis(30_000)),
            cache_salt: None,
            output,
        },
        cache_tags: Vec::new(),
    }
}

#[test]
fn a_worker_fails_only_the_route_whose_message_it_cannot_read_and_keeps_the_link() {
    let c = Cluster::start("");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut g = DirectGateway::start(Role::Decode, &c.config).await;
        // A message nested deeper than any decoder reads, naming route 5 (what a peer with a
        // bug, or a bound that was missed, would send).
        let mut msg = serde_json::to_value(ToWorker::Reserve(spec(5, None))).unwrap();
        msg["Reserve"]["request"]["output"] = nested(300);
        g.wr.send(&msg).await.unwrap();
        // A format that arrives whole but is no format: route 6.
        let garbage = EncodedFormat::from_wire(format!("{{\"kind\":\"json_schema\",\"schema\":{}}}", nested(100)));
        g.wr.send(&ToWorker::Reserve(spec(6, Some(garbage)))).await.unwrap();
        // A good route on the same link after both.
        g.wr.send(&ToWorker::Reserve(spec(7, None))).await.unwrap();
        let (got, stats) = g.answers(Duration::from_secs(3)).await;
        let failed = |r: u64| {
            got.iter()
                .any(|m| matches!(m, ToGateway::Failed { route, failure: RequestError::Internal(_) } if *route == r))
        };
        assert!(failed(5) && failed(6), "{got:?}");
        assert!(got.iter().any(|m| matches!(m, ToGateway::Reserved { route: 7, .. })), "{got:?}");
        let stats = stats.expect("the worker reports its stats over the same link");
        let undecodable = stats.link_failures.iter().find(|(r, _)| r == "undecodable_message").map(|(_, n)| *n);
        assert_eq!(undecodable, Some(1), "{stats:?}");
    });
}
