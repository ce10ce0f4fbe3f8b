//! `pagewarden bench serve`: streaming chat load against any OpenAI-compatible server.
//!
//! C clients each send streaming chat requests back to back, with a fixed number of output
//! tokens (`ignore_eos`, understood by llama-server and pagewarden). Reported per concurrency:
//! output tokens/s over the wall time, time to first token (p50/p90/p99) and inter-token latency
//! (p50/p99).

use std::io::{BufRead, BufReader};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};

use crate::ToolError;

#[derive(Args)]
pub struct ServeBench {
    /// Base URL of the server, e.g. http://127.0.0.1:8080
    #[arg(long)]
    url: String,
    /// API key (sent as `Authorization: Bearer KEY`).
    #[arg(long, default_value = "")]
    key: String,
    /// Concurrent clients, comma separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 4, 16])]
    concurrency: Vec<usize>,
    /// Requests per client at each concurrency.
    #[arg(long, default_value_t = 4)]
    requests: usize,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Model name to send (default: the first of /v1/models).
    #[arg(long)]
    model: Option<String>,
    /// Per-request time limit in seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Hold every answer to a JSON schema (`response_format: json_schema`): the cost of
    /// constrained decoding's token masks. The schema asks for at least 1000 records
    /// `{"name": ..., "age": ...}`, so every answer still runs to max_tokens, as the
    /// unconstrained ones do with `ignore_eos`, and the two runs compare token for token.
    #[arg(long)]
    structured: bool,
    /// Hold every answer to the JSON schema in this file (`response_format: json_schema`), as
    /// `--structured` does with its own; for the noisy-neighbour benchmark's expensive schema.
    #[arg(long, value_name = "FILE", conflicts_with = "structured")]
    schema: Option<std::path::PathBuf>,
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Level {
    concurrency: usize,
    requests: usize,
    errors: usize,
    output_tokens: usize,
    /// Prompt tokens per request as the server counted them (its usage chunk), when it said:
    /// what an engine-only comparison needs to do the same work.
    mean_prompt_tokens: Option<f64>,
    /// Of those, the ones its prefix cache served (`prompt_tokens_details.cached_tokens`), when
    /// it said: the engine-only comparison has them in the KV cache already, not to prefill.
    mean_cached_tokens: Option<f64>,
    wall_s: f64,
    output_tokens_per_s: f64,
    ttft_p50_ms: f64,
    ttft_p90_ms: f64,
    ttft_p99_ms: f64,
    ttft_mean_ms: f64,
    itl_p50_ms: f64,
    itl_p99_ms: f64,
}

/// Prompts of a few shapes, so requests are not all identical.
const PROMPTS: [&str; 4] = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator works to a ten year old.",
    "List some practical tips for learning a new language as an adult.",
    "Describe the water cycle and why it matters for agriculture.",
];

struct Sample {
    ttft: Duration,
    gaps: Vec<Duration>,
    tokens: usize,
    prompt_tokens: Option<usize>,
    cached_tokens: Option<usize>,
}

use launch::agent;

/// An exchange with the server that failed below HTTP.
fn http(what: &'static str) -> impl FnOnce(ureq::Error) -> ToolError {
    move |source| ToolError::Http { what: what.into(), source }
}

fn model_name(agent: &ureq::Agent, b: &ServeBench) -> Result<String, ToolError> {
    if let Some(m) = &b.model {
        return Ok(m.clone());
    }
    let mut resp = agent
        .get(format!("{}/v1/models", b.url))
        .header("Authorization", format!("Bearer {}", b.key))
        .call()
        .map_err(http("GET /v1/models"))?;
    let text = resp.body_mut().read_to_string().map_err(http("reading GET /v1/models"))?;
    let body: Value = serde_json::from_str(&text).map_err(ToolError::json("GET /v1/models: not JSON"))?;
    body["data"][0]["id"].as_str().map(str::to_string).ok_or_else(|| ToolError::Server("no model in /v1/models".into()))
}

/// One streaming request; token count from the usage chunk, else from content chunks.
fn one(agent: &ureq::Agent, b: &ServeBench, model: &str, prompt: &str) -> Result<Sample, ToolError> {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": b.max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
        "ignore_eos": true,
    });
    if let Some(schema) = schema_of(b)? {
        body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "records", "schema": schema}});
        body["ignore_eos"] = json!(false);
    }
    let t0 = Instant::now();
    let resp = agent
        .post(format!("{}/v1/chat/completions", b.url))
        .header("Authorization", format!("Bearer {}", b.key))
        .header("Content-Type", "application/json")
        .send(body.to_string().as_bytes())
        .map_err(http("POST /v1/chat/completions"))?;
    if resp.status() != 200 {
        return Err(ToolError::Server(format!("HTTP {}", resp.status())));
    }
    let reader = BufReader::new(resp.into_body().into_reader());
    let (mut first, mut last) = (None, t0);
    let (mut gaps, mut chunks, mut usage, mut prompt_tokens, mut cached_tokens) =
        (Vec::new(), 0usize, None, None, None);
    for line in reader.lines() {
        let line =
            line.map_err(|e| ToolError::Http { what: "reading the stream".into(), source: ureq::Error::Io(e) })?;
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).map_err(ToolError::json("a stream event: not JSON"))?;
        if v.get("error").is_some() {
            return Err(ToolError::Server(format!("error event: {}", v["error"]["message"])));
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            usage = Some(n as usize);
        }
        if let Some(n) = v["usage"]["prompt_tokens"].as_u64() {
            prompt_tokens = Some(n as usize);
        }
        if let Some(n) = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() {
            cached_tokens = Some(n as usize);
        }
        let has_content = v["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty());
        if has_content {
            let now = Instant::now();
            match first {
                None => first = Some(now - t0),
                Some(_) => gaps.push(now - last),
            }
            last = now;
            chunks += 1;
        }
    }
    let ttft = first.ok_or_else(|| ToolError::Server("no content in the stream".into()))?;
    Ok(Sample { ttft, gaps, tokens: usage.unwrap_or(chunks), prompt_tokens, cached_tokens })
}

/// The schema every answer is held to, if any: `--schema FILE`, or `--structured`'s own.
fn schema_of(b: &ServeBench) -> Result<Option<Value>, ToolError> {
    if let Some(path) = &b.schema {
        let text = std::fs::read_to_string(path).map_err(ToolError::file("reading", path))?;
        return Ok(Some(
            serde_json::from_str(&text).map_err(ToolError::json(format!("{} is not JSON", path.display())))?,
        ));
    }
    if !b.structured {
        return Ok(None);
    }
    let record = json!({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": false,
    });
    Ok(Some(json!({"type": "array", "items": record, "minItems": 1000})))
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn level(b: &ServeBench, model: &str, c: usize) -> Level {
    let samples = Mutex::new(Vec::new());
    let errors = Mutex::new(0usize);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for client in 0..c {
            let (samples, errors) = (&samples, &errors);
            s.spawn(move || {
                let agent = agent(Duration::from_secs(b.timeout));
                for r in 0..b.requests {
                    match one(&agent, b, model, PROMPTS[(client + r) % PROMPTS.len()]) {
                        Ok(x) => samples.lock().unwrap_or_else(|e| e.into_inner()).push(x),
                        Err(e) => {
                            eprintln!("request failed: {}", crate::error::chain(&e));
                            *errors.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                        }
                    }
                }
            });
        }
    });
    let wall = t0.elapsed().as_secs_f64();
    let samples = samples.into_inner().unwrap_or_else(|e| e.into_inner());
    let tokens: usize = samples.iter().map(|s| s.tokens).sum();
    // Over every request, or none where one went unreported.
    let mean = |n: &dyn Fn(&Sample) -> Option<usize>| {
        let all: Option<Vec<usize>> = samples.iter().map(n).collect();
        all.filter(|v| !v.is_empty()).map(|v| v.iter().sum::<usize>() as f64 / v.len() as f64)
    };
    let (mean_prompt_tokens, mean_cached_tokens) = (mean(&|s| s.prompt_tokens), mean(&|s| s.cached_tokens));
    let mut ttft: Vec<f64> = samples.iter().map(|s| s.ttft.as_secs_f64() * 1e3).collect();
    let mut itl: Vec<f64> = samples.iter().flat_map(|s| s.gaps.iter().map(|g| g.as_secs_f64() * 1e3)).collect();
    Level {
        concurrency: c,
        requests: samples.len(),
        errors: errors.into_inner().unwrap_or_else(|e| e.into_inner()),
        output_tokens: tokens,
        mean_prompt_tokens,
        mean_cached_tokens,
        wall_s: wall,
        output_tokens_per_s: tokens as f64 / wall,
        ttft_mean_ms: ttft.iter().sum::<f64>() / ttft.len().max(1) as f64,
        ttft_p50_ms: pct(&mut ttft, 0.5),
        ttft_p90_ms: pct(&mut ttft, 0.9),
        ttft_p99_ms: pct(&mut ttft, 0.99),
        itl_p50_ms: pct(&mut itl, 0.5),
        itl_p99_ms: pct(&mut itl, 0.99),
    }
}

pub fn run(b: &ServeBench) -> Result<(), ToolError> {
    let model = model_name(&agent(Duration::from_secs(30)), b)?;
    let mut levels = Vec::new();
    for &c in &b.concurrency {
        let l = level(b, &model, c);
        if !b.json {
            println!(
                "concurrency {:>3}: {:>7.1} output tok/s  ttft p50 {:>7.1} ms p90 {:>7.1} ms p99 {:>7.1} ms (mean {:>7.1})  itl p50 {:>6.1} ms p99 {:>6.1} ms  {} ok, {} errors",
                l.concurrency, l.output_tokens_per_s, l.ttft_p50_ms, l.ttft_p90_ms, l.ttft_p99_ms, l.ttft_mean_ms, l.itl_p50_ms, l.itl_p99_ms, l.requests, l.errors
            );
        }
        levels.push(l);
    }
    if b.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({ "url": b.url, "model": model, "max_tokens": b.max_tokens, "levels": levels })
            )
            .map_err(ToolError::json("serialising the report"))?
        );
    }
    Ok(())
}
