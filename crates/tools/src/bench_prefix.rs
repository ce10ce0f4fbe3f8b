//! `pagewarden bench prefix-cache`: multi-turn chat with a shared system prompt, time to first
//! token with the prefix cache on and off.
//!
//! Two `pagewarden serve` children on loopback, from this executable, with configurations that
//! differ only in `[prefix_cache] enabled`, each with `threads` compute threads. Every
//! conversation shares one long system prompt; each turn goes to both servers, one after the
//! other (which one first alternates), streamed, greedy, and each server's reply is appended to
//! its own history. Reported: per turn index, median TTFT on and off and their ratio; overall;
//! the cached tokens the ON server reported; and whether both servers replied token for token
//! the same (the cache must never change output: any difference is an error).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};

use audit::stats::median_or_nan;
use audit::{filler, Rng};

use crate::ToolError;

#[derive(Args, Debug, Clone)]
pub struct PrefixCacheBench {
    /// Conversations, all sharing one system prompt.
    #[arg(long, default_value_t = 8)]
    pub conversations: usize,
    /// User turns per conversation.
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// Approximate size of the shared system prompt in tokens.
    #[arg(long, default_value_t = 400)]
    pub system_tokens: usize,
    /// Tokens generated per turn (greedy).
    #[arg(long, default_value_t = 16)]
    pub max_tokens: usize,
    /// Compute threads of each server (two servers run side by side).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Context window of both servers.
    #[arg(long, default_value_t = 2048)]
    pub context_window: usize,
    /// GGUF model file; default: the fetched default model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Questions the user asks, turn after turn (picked per conversation so conversations differ).
const QUESTIONS: [&str; 8] = [
    "Summarise the rules above in one sentence.",
    "Which of the rules matters most for a new customer, and why?",
    "Give an example of a request you would refuse.",
    "My order is two weeks late. What should I do?",
    "Explain the third rule to a child.",
    "What do you need from me to change my delivery address?",
    "Can I return an item I bought on sale?",
    "Write a short apology for a delayed shipment.",
];

/// A `pagewarden serve` child, killed on drop.
struct Server {
    label: &'static str,
    child: Child,
    url: String,
    key: String,
    log: PathBuf,
    /// The bearer token of its `/metrics` (`[metrics] token_file`).
    metrics_token: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

use launch::agent;

impl Server {
    /// Writes the configuration into `dir`, adds a tenant, starts `serve` on a free port and
    /// waits until it is ready.
    fn start(dir: &Path, label: &'static str, enabled: bool, b: &PrefixCacheBench) -> Result<Server, ToolError> {
        let exe = std::env::current_exe().map_err(ToolError::process("locating the pagewarden executable"))?;
        std::fs::create_dir_all(dir).map_err(ToolError::file("creating", dir))?;
        let server = |source| ToolError::Launch { what: format!("the {label} server"), source: Box::new(source) };
        let config = dir.join("pagewarden.toml");
        // The server's /metrics needs a token; this one is only for the bench's own scrapes.
        let token_file = dir.join("metrics-token");
        let metrics_token: String = cluster::random::<24>()?.iter().map(|b| format!("{b:02x}")).collect();
        launch::write_private(&token_file, metrics_token.as_bytes()).map_err(server)?;
        let model = b.model.as_ref().map_or(String::new(), |m| format!("model = {:?}\n", m.display().to_string()));
        std::fs::write(
            &config,
            format!(
                "{model}threads = {}\ncontext_window = {}\n\n[pool]\ntokens = {}\n\n[prefix_cache]\nenabled = {enabled}\n\n\
                 [metrics]\ntoken_file = {:?}\n",
                b.threads,
                b.context_window,
                4 * b.context_window,
                token_file.display().to_string(),
            ),
        )
        .map_err(ToolError::file("writing", &config))?;
        let key = launch::tenant_add(&exe, &config, "bench").map_err(server)?;
        let log = dir.join("serve.log");
        let mut cmd = Command::new(&exe);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .stderr(std::fs::File::create(&log).map_err(ToolError::file("creating", &log))?);
        let mut p = launch::spawn(cmd).map_err(|source| ToolError::Launch {
            what: "starting pagewarden serve".into(),
            source: Box::new(source),
        })?;
        let url = p.expect_lines(&[launch::listening::API], Duration::from_secs(180));
        let mut s = Server { label, child: p.child, url: String::new(), key, log, metrics_token };
        s.url = match url {
            Ok(u) => u.into_iter().next().unwrap_or_default(),
            Err(reason) => {
                let log_tail = tail(&s.log, 20);
                return Err(ToolError::ServerStart {
                    label,
                    failure: "did not start",
                    reason: Box::new(reason),
                    log_tail,
                });
            }
        };
        if let Err(reason) = launch::wait_ready(&s.url, Duration::from_secs(120)) {
            let log_tail = tail(&s.log, 20);
            return Err(ToolError::ServerStart {
                label,
                failure: "never became ready",
                reason: Box::new(reason),
                log_tail,
            });
        }
        Ok(s)
    }

    /// An exchange with this server that failed below HTTP.
    fn http(&self, what: &str) -> impl FnOnce(ureq::Error) -> ToolError {
        let what = format!("the {} server: {what}", self.label);
        move |source| ToolError::Http { what, source }
    }

    fn model_name(&self) -> Result<String, ToolError> {
        let mut r = agent(Duration::from_secs(30))
            .get(format!("{}/v1/models", self.url))
            .header("Authorization", format!("Bearer {}", self.key))
            .call()
            .map_err(self.http("GET /v1/models"))?;
        let text = r.body_mut().read_to_string().map_err(self.http("reading GET /v1/models"))?;
        let v: Value = serde_json::from_str(&text).map_err(ToolError::json("GET /v1/models: not JSON"))?;
        v["data"][0]["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| ToolError::Server("no model in /v1/models".into()))
    }

    /// The `pagewarden_prefix_cache*` samples of `/metrics`.
    fn cache_metrics(&self) -> std::collections::BTreeMap<String, f64> {
        let url = format!("{}/metrics", self.url);
        let text = launch::scrape(&url, &self.metrics_token, Duration::from_secs(10)).unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with("pagewarden_prefix_cache"))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    }

    /// One streamed, greedy chat turn.
    fn turn(&self, model: &str, messages: &[Value], max_tokens: usize) -> Result<Reply, ToolError> {
        let body = json!({
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": true,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let t0 = Instant::now();
        let resp = agent(Duration::from_secs(300))
            .post(format!("{}/v1/chat/completions", self.url))
            .header("Authorization", format!("Bearer {}", self.key))
            .header("Content-Type", "application/json")
            .send(body.to_string().as_bytes())
            .map_err(self.http("POST /v1/chat/completions"))?;
        if resp.status() != 200 {
            let status = resp.status();
            let text = resp.into_body().read_to_string().unwrap_or_default();
            return Err(ToolError::Server(format!("the {} server answered {status}: {text}", self.label)));
        }
        let mut r = Reply::default();
        let mut done = false;
        for line in BufReader::new(resp.into_body().into_reader()).lines() {
            let line = line.map_err(|e| self.http("reading the stream")(ureq::Error::Io(e)))?;
            let Some(data) = line.strip_prefix("data:").map(str::trim_start) else { continue };
            if data == "[DONE]" {
                done = true;
                break;
            }
            let v: Value = serde_json::from_str(data).map_err(ToolError::json("a stream event: not JSON"))?;
            if v.get("error").is_some() {
                return Err(ToolError::Server(format!(
                    "the {} server sent an error event: {}",
                    self.label, v["error"]
                )));
            }
            let choice = &v["choices"][0];
            if let Some(piece) = choice["delta"]["content"].as_str().filter(|p| !p.is_empty()) {
                if r.ttft_ms.is_none() {
                    r.ttft_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
                }
                r.text.push_str(piece);
            }
            for t in choice["logprobs"]["content"].as_array().into_iter().flatten() {
                let bytes: Vec<u8> = match t["bytes"].as_array() {
                    Some(b) => b.iter().filter_map(Value::as_u64).map(|x| x as u8).collect(),
                    None => t["token"].as_str().unwrap_or_default().as_bytes().to_vec(),
                };
                r.tokens.push(bytes);
            }
            if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                r.prompt_tokens = u["prompt_tokens"].as_u64();
                r.completion_tokens = u["completion_tokens"].as_u64();
                r.cached_tokens = u.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64);
            }
        }
        if !done {
            return Err(ToolError::Server(format!("the {} server's stream ended without [DONE]", self.label)));
        }
        r.total_ms = t0.elapsed().as_secs_f64() * 1e3;
        // An empty reply has no first token; its whole time stands in.
        r.ttft_ms.get_or_insert(r.total_ms);
        Ok(r)
    }
}

#[derive(Debug, Default, Clone, Serialize)]
struct Reply {
    ttft_ms: Option<f64>,
    total_ms: f64,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    cached_tokens: Option<u64>,
    #[serde(skip)]
    text: String,
    #[serde(skip)]
    tokens: Vec<Vec<u8>>,
}

impl Reply {
    fn ttft(&self) -> f64 {
        self.ttft_ms.unwrap_or(self.total_ms)
    }
}

#[derive(Debug, Serialize)]
struct TurnResult {
    conversation: usize,
    turn: usize,
    /// Which server got the turn first.
    first: &'static str,
    on: Reply,
    off: Reply,
    identical: bool,
}

#[derive(Debug, Serialize)]
struct TurnRow {
    turn: usize,
    n: usize,
    prompt_tokens_median: Option<u64>,
    ttft_on_median_ms: f64,
    ttft_off_median_ms: f64,
    /// off / on: how many times faster the cache makes the first token.
    ratio: f64,
    cached_tokens_on_median: Option<u64>,
    cached_tokens_on_max: Option<u64>,
}

#[derive(Debug, Serialize)]
struct Mismatch {
    conversation: usize,
    turn: usize,
    /// First differing token index (None: the token lists agree but the text differs).
    position: Option<usize>,
    on_tokens: usize,
    off_tokens: usize,
}

fn median_u64(v: impl IntoIterator<Item = u64>) -> Option<u64> {
    let mut s: Vec<u64> = v.into_iter().collect();
    s.sort_unstable();
    s.get(s.len().checked_sub(1)? / 2).copied()
}

/// The first position where two replies differ, or None when they are the same.
fn first_difference(a: &Reply, b: &Reply) -> Option<Option<usize>> {
    if let Some(i) = (0..a.tokens.len().max(b.tokens.len())).find(|&i| a.tokens.get(i) != b.tokens.get(i)) {
        return Some(Some(i));
    }
    (a.text != b.text).then_some(None)
}

/// A system prompt of about `tokens` tokens: a few fixed rules, then filler prose.
fn system_prompt(tokens: usize) -> String {
    let head = "You are the support assistant of a small online shop. Rules: 1. Be brief and polite. 2. Never \
                promise a refund before the order is checked. 3. Ask for the order number before discussing an \
                order. 4. Do not share one customer's details with another. Background notes follow.";
    // About 1.3 tokens per filler word; the head is about 60 tokens.
    let words = ((tokens.saturating_sub(60)) as f64 / 1.3).round() as usize;
    let mut rng = Rng::new(0x0051_57e3);
    format!("{head} {}", filler(&mut rng, words))
}

fn command_line(b: &PrefixCacheBench) -> String {
    let mut s = format!(
        "pagewarden bench prefix-cache --conversations {} --turns {} --system-tokens {} --max-tokens {} --threads {} \
         --context-window {}",
        b.conversations, b.turns, b.system_tokens, b.max_tokens, b.threads, b.context_window
    );
    if let Some(m) = &b.model {
        s.push_str(&format!(" --model {}", m.display()));
    }
    if b.json {
        s.push_str(" --json");
    }
    s
}

pub fn run(b: &PrefixCacheBench) -> Result<(), ToolError> {
    if b.conversations == 0 || b.turns == 0 {
        return Err(ToolError::Usage("--conversations and --turns must be at least 1".into()));
    }
    if b.model.is_none() {
        // Once, before two servers would both fetch it.
        fetch::ensure_default_model().map_err(ToolError::Fetch)?;
    }
    let base = std::env::temp_dir().join(format!("pw-bench-prefix-{}", std::process::id()));
    let result = run_in(b, &base);
    let _ = std::fs::remove_dir_all(&base);
    result
}

fn run_in(b: &PrefixCacheBench, base: &Path) -> Result<(), ToolError> {
    let on = Server::start(&base.join("on"), "ON", true, b)?;
    let off = Server::start(&base.join("off"), "OFF", false, b)?;
    let model = on.model_name()?;
    let system = system_prompt(b.system_tokens);
    let t_start = Instant::now();
    let mut results = Vec::new();
    let mut k = 0usize;
    for c in 0..b.conversations {
        let mut hist_on = vec![json!({"role": "system", "content": system})];
        let mut hist_off = hist_on.clone();
        for t in 0..b.turns {
            let q = format!("(Customer {}.) {}", c + 1, QUESTIONS[(c + t) % QUESTIONS.len()]);
            hist_on.push(json!({"role": "user", "content": q}));
            hist_off.push(json!({"role": "user", "content": q}));
            let on_first = k.is_multiple_of(2);
            k += 1;
            let (r_on, r_off) = if on_first {
                let a = on.turn(&model, &hist_on, b.max_tokens)?;
                (a, off.turn(&model, &hist_off, b.max_tokens)?)
            } else {
                let z = off.turn(&model, &hist_off, b.max_tokens)?;
                (on.turn(&model, &hist_on, b.max_tokens)?, z)
            };
            hist_on.push(json!({"role": "assistant", "content": r_on.text}));
            hist_off.push(json!({"role": "assistant", "content": r_off.text}));
            let identical = first_difference(&r_on, &r_off).is_none();
            results.push(TurnResult {
                conversation: c,
                turn: t,
                first: if on_first { "on" } else { "off" },
                on: r_on,
                off: r_off,
                identical,
            });
            if !b.json {
                eprint!("\r{}/{} turns", results.len(), b.conversations * b.turns);
            }
        }
    }
    if !b.json {
        eprintln!();
    }
    let wall_s = t_start.elapsed().as_secs_f64();
    let metrics_on = on.cache_metrics();
    let metrics_off = off.cache_metrics();

    let rows: Vec<TurnRow> = (0..b.turns)
        .map(|t| {
            let of_turn: Vec<&TurnResult> = results.iter().filter(|r| r.turn == t).collect();
            let ttft_on: Vec<f64> = of_turn.iter().map(|r| r.on.ttft()).collect();
            let ttft_off: Vec<f64> = of_turn.iter().map(|r| r.off.ttft()).collect();
            let (m_on, m_off) = (median_or_nan(&ttft_on), median_or_nan(&ttft_off));
            TurnRow {
                turn: t + 1,
                n: of_turn.len(),
                prompt_tokens_median: median_u64(of_turn.iter().filter_map(|r| r.on.prompt_tokens)),
                ttft_on_median_ms: m_on,
                ttft_off_median_ms: m_off,
                ratio: m_off / m_on,
                cached_tokens_on_median: median_u64(of_turn.iter().filter_map(|r| r.on.cached_tokens)),
                cached_tokens_on_max: of_turn.iter().filter_map(|r| r.on.cached_tokens).max(),
            }
        })
        .collect();
    let all_on: Vec<f64> = results.iter().map(|r| r.on.ttft()).collect();
    let all_off: Vec<f64> = results.iter().map(|r| r.off.ttft()).collect();
    let (m_on, m_off) = (median_or_nan(&all_on), median_or_nan(&all_off));
    let cached_reported = results.iter().any(|r| r.on.cached_tokens.is_some());
    let cached_on: u64 = results.iter().filter_map(|r| r.on.cached_tokens).sum();
    let cached_off: u64 = results.iter().filter_map(|r| r.off.cached_tokens).sum();
    let prompt_on: u64 = results.iter().filter_map(|r| r.on.prompt_tokens).sum();
    let mismatches: Vec<Mismatch> = results
        .iter()
        .filter_map(|r| {
            first_difference(&r.on, &r.off).map(|position| Mismatch {
                conversation: r.conversation + 1,
                turn: r.turn + 1,
                position,
                on_tokens: r.on.tokens.len(),
                off_tokens: r.off.tokens.len(),
            })
        })
        .collect();
    let command = command_line(b);

    if b.json {
        let report = json!({
            "command": command,
            "model": model,
            "threads": b.threads,
            "conversations": b.conversations,
            "turns": b.turns,
            "max_tokens": b.max_tokens,
            "system_prompt_tokens_target": b.system_tokens,
            "first_prompt_tokens": results.first().and_then(|r| r.on.prompt_tokens),
            "wall_s": wall_s,
            "per_turn": rows,
            "overall": {"ttft_on_median_ms": m_on, "ttft_off_median_ms": m_off, "ratio": m_off / m_on},
            "cached_tokens_reported": cached_reported,
            "cached_tokens_on": cached_on,
            "cached_tokens_off": cached_off,
            "prompt_tokens_on": prompt_on,
            "replies_identical": mismatches.is_empty(),
            "mismatches": mismatches,
            "metrics_on": metrics_on,
            "metrics_off": metrics_off,
            "requests": results,
        });
        println!("{}", serde_json::to_string_pretty(&report).map_err(ToolError::json("serialising the report"))?);
    } else {
        println!(
            "prefix cache on vs off: {} conversations x {} turns, shared system prompt of {} tokens (first prompt), \
             max_tokens {}, {} thread(s) per server, model {model}",
            b.conversations,
            b.turns,
            results.first().and_then(|r| r.on.prompt_tokens).map_or("?".into(), |n| n.to_string()),
            b.max_tokens,
            b.threads
        );
        println!(
            "{:>5} {:>4} {:>14} {:>14} {:>14} {:>10} {:>22}",
            "turn", "n", "prompt tokens", "TTFT on (ms)", "TTFT off (ms)", "off/on", "cached tokens on (med)"
        );
        for r in &rows {
            println!(
                "{:>5} {:>4} {:>14} {:>14.1} {:>14.1} {:>10.2} {:>22}",
                r.turn,
                r.n,
                r.prompt_tokens_median.map_or("-".into(), |n| n.to_string()),
                r.ttft_on_median_ms,
                r.ttft_off_median_ms,
                r.ratio,
                r.cached_tokens_on_median.map_or("-".into(), |n| n.to_string()),
            );
        }
        println!(
            "  all {:>4} {:>14} {:>14.1} {:>14.1} {:>10.2} {:>22}",
            results.len(),
            "",
            m_on,
            m_off,
            m_off / m_on,
            if cached_reported { format!("{cached_on} of {prompt_on}") } else { "not reported".into() }
        );
        println!(
            "replies: {} of {} turns identical token for token on and off; {:.1} s",
            results.len() - mismatches.len(),
            results.len(),
            wall_s
        );
        for (k, v) in &metrics_on {
            println!("ON  {k} {v}");
        }
        println!("repeat: {command}");
    }
    if !mismatches.is_empty() {
        let list: Vec<String> = mismatches
            .iter()
            .map(|m| {
                format!(
                    "conversation {} turn {} at {}",
                    m.conversation,
                    m.turn,
                    m.position.map_or("the text".into(), |p| format!("token {p}"))
                )
            })
            .collect();
        return Err(ToolError::Check(format!(
            "the prefix cache changed the output in {} of {} turns: {}",
            mismatches.len(),
            results.len(),
            list.join("; ")
        )));
    }
    if cached_off > 0 {
        return Err(ToolError::Check(format!(
            "the server with the prefix cache off reported {cached_off} cached tokens"
        )));
    }
    if !cached_reported {
        eprintln!("warning: the ON server reports no usage.prompt_tokens_details.cached_tokens");
    } else if cached_on == 0 {
        eprintln!("warning: the ON server reported no cached tokens at all (is its prefix cache working?)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_compare_token_for_token() {
        let r = |toks: &[&str]| Reply {
            tokens: toks.iter().map(|t| t.as_bytes().to_vec()).collect(),
            text: toks.concat(),
            ..Default::default()
        };
        assert_eq!(first_difference(&r(&["a", "b"]), &r(&["a", "b"])), None);
        assert_eq!(first_difference(&r(&["a", "b"]), &r(&["a", "c"])), Some(Some(1)));
        assert_eq!(first_difference(&r(&["a"]), &r(&["a", "b"])), Some(Some(1)));
        // Same text, split differently: still a difference in tokens.
        assert_eq!(first_difference(&r(&["ab"]), &r(&["a", "b"])), Some(Some(0)));
        assert_eq!(median_u64([5, 1, 3]), Some(3));
        assert_eq!(median_u64([]), None);
    }

    #[test]
    fn system_prompt_is_fixed_and_about_the_asked_size() {
        let a = system_prompt(400);
        assert_eq!(a, system_prompt(400));
        let words = a.split_whitespace().count();
        assert!((280..=340).contains(&words), "{words}");
    }
}
