//! A fake OpenAI-compatible server for testing the audit itself: real HTTP on a loopback port,
//! one thread per connection, with the behaviour a test wants to catch (or not) plugged in.
//! It counts prompts with the default model's real tokenizer and chat template, as
//! pagewarden does, so that everything it does not fake is what an honest server would say.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

/// One request as the fake read it.
pub struct Request {
    pub path: String,
    /// The bearer token, lower-cased (as the header came).
    pub key: String,
    pub body: Value,
}

/// Reads one HTTP/1.1 request (head and a `Content-Length` body).
pub fn read_request(s: &TcpStream) -> Request {
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let lower = head.to_ascii_lowercase();
    let len: usize =
        lower.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    // Header names in any case (ureq sends them in lower case).
    let key = lower.lines().find_map(|l| l.strip_prefix("authorization: bearer ")).unwrap_or("").trim().to_string();
    let mut body = vec![0u8; len];
    let _ = reader.read_exact(&mut body);
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
    Request { path, key, body: serde_json::from_slice(&body).unwrap_or(Value::Null) }
}

/// A whole response, then the connection closes.
pub fn respond(mut s: TcpStream, status: u16, ctype: &str, body: &str) {
    let _ = write!(
        s,
        "HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// Serves `handle` on a free loopback port; returns the base URL.
pub fn serve(handle: impl Fn(TcpStream) + Send + Sync + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let handle = Arc::new(handle);
    std::thread::spawn(move || {
        for s in listener.incoming().map_while(Result::ok) {
            let h = handle.clone();
            std::thread::spawn(move || h(s));
        }
    });
    url
}

/// What the fake server does wrong, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Nothing: refuses over-window prompts, counts honestly, caches per tenant.
    None,
    /// The 2026 incident: a prompt over the window is replaced by a one-token placeholder and
    /// answered (from whatever the pages held), with `usage.prompt_tokens: 1`.
    Placeholder,
    /// One prefix cache for every tenant: a prompt whose start anyone sent before answers
    /// fast. It reports no cached tokens, so only time tells.
    SharedCache,
    /// The placeholder server with a cover story: its `/tokenize` counts half of every prompt,
    /// its `/v1/models` declares a window four times the model's, and it answers every prompt
    /// up to that window with 200 and the halved count.
    LyingTokenizer,
    /// Prefix hits only within a tenant, but a prompt that parts from any earlier prompt and
    /// then carries on with that prompt's later text (a gap cut out) answers fast, as
    /// llama.cpp's `--cache-reuse` shifts the chunk, across keys; no cached tokens reported.
    ChunkReuse,
    /// Refuses over-long prompts with 400 while other requests are in flight, and answers them
    /// with 200 when one is alone.
    RefusesOnlyUnderLoad,
}

/// The fake's model: the default model's name (so the audit finds its tokenizer) and window.
pub const WINDOW: usize = 2048;
const WORDS: [&str; 12] =
    ["the", "river", "stone", "garden", "window", "morning", "quiet", "market", "winter", "light", "paper", "bridge"];
/// Time to first token on a cache miss and on a hit.
const MISS: Duration = Duration::from_millis(12);
const HIT: Duration = Duration::from_millis(2);
/// Bytes of a prompt that key its cache entry: the probe's "Record <nonce>." and more.
const PREFIX_BYTES: usize = 40;
/// The window [`Fault::LyingTokenizer`] declares: past the model file's 8,192.
pub const LYING_WINDOW: usize = 32768;

pub struct Fake {
    fault: Fault,
    tokenizer: text::Tokenizer,
    template: text::ChatTemplate,
    /// Prompt prefixes seen, by (cache scope, prefix).
    seen: Mutex<HashSet<(String, String)>>,
    /// Every prompt so far, of every tenant ([`Fault::ChunkReuse`]).
    prompts: Mutex<Vec<String>>,
    in_flight: AtomicUsize,
}

/// Decrements the in-flight count when a request's handling ends.
struct Flight<'a>(&'a AtomicUsize);

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Fake {
    pub fn start(fault: Fault) -> String {
        let f = gguf::GgufFile::open(&fetch::ensure_default_model().unwrap()).unwrap();
        let fake = Arc::new(Fake {
            fault,
            tokenizer: text::Tokenizer::from_gguf(&f).unwrap(),
            template: text::ChatTemplate::from_gguf(&f).unwrap(),
            seen: Mutex::new(HashSet::new()),
            prompts: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
        });
        serve(move |s| fake.handle(s))
    }

    /// The prompt in tokens, as pagewarden counts it.
    fn count(&self, body: &Value) -> usize {
        if let Some(ms) = body["messages"].as_array() {
            let msgs: Vec<text::ChatMessage> = ms
                .iter()
                .map(|m| text::ChatMessage::new(m["role"].as_str().unwrap_or(""), m["content"].as_str().unwrap_or("")))
                .collect();
            let rendered = self.template.render(&msgs, true).unwrap();
            self.template.encode(&self.tokenizer, &rendered).unwrap().len()
        } else {
            self.tokenizer.encode(body["prompt"].as_str().unwrap_or(""), false).unwrap().len()
        }
    }

    fn handle(&self, s: TcpStream) {
        let req = read_request(&s);
        let lying = self.fault == Fault::LyingTokenizer;
        let window = if lying { LYING_WINDOW } else { WINDOW };
        match req.path.as_str() {
            "/v1/models" => {
                let m = json!({"data": [{"id": super::MODEL_NAME, "object": "model", "context_length": window,
                                         "batch_invariant": true}]});
                return respond(s, 200, "application/json", &m.to_string());
            }
            // As pagewarden's: every pool empty once the run is over.
            "/metrics" => {
                let m = "pagewarden_kv_pages_total 4096\npagewarden_kv_pages_used{tenant=\"1\"} 0\n";
                return respond(s, 200, "text/plain", m);
            }
            // vLLM's dialect, halved.
            "/tokenize" if lying => {
                let text = req.body["prompt"].as_str().unwrap_or("");
                let ids = self.tokenizer.encode(text, false).unwrap();
                let half: Vec<u32> = ids[..ids.len() / 2].to_vec();
                let v = json!({"count": half.len(), "tokens": half, "max_model_len": LYING_WINDOW});
                return respond(s, 200, "application/json", &v.to_string());
            }
            "/v1/chat/completions" | "/v1/completions" => {}
            _ => return respond(s, 404, "application/json", r#"{"error":{"message":"not found","code":null}}"#),
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let _flight = Flight(&self.in_flight);
        let body = &req.body;
        let chat = body.get("messages").is_some();
        let max_tokens = body["max_tokens"].as_u64().unwrap_or(16) as usize;
        let mut prompt_tokens = self.count(body);
        if lying {
            prompt_tokens /= 2;
        }
        // Alone (this request the only one in flight) the refusal is forgotten.
        let alone = self.in_flight.load(Ordering::SeqCst) == 1;
        if prompt_tokens + max_tokens > window {
            if self.fault == Fault::Placeholder && max_tokens < WINDOW {
                prompt_tokens = 1;
            } else if self.fault == Fault::RefusesOnlyUnderLoad && alone && max_tokens < WINDOW {
                // Answered as if it fit.
            } else {
                let msg = format!(
                    "this model's maximum context length is {window} tokens; the request needs {} ({prompt_tokens} \
                     in the prompt + {max_tokens} to generate)",
                    prompt_tokens + max_tokens
                );
                let e = json!({"error": {"message": msg, "type": "invalid_request_error", "param": "messages",
                                         "code": "context_length_exceeded"}});
                return respond(s, 400, "application/json", &e.to_string());
            }
        }
        let text = body["messages"][0]["content"].as_str().or(body["prompt"].as_str()).unwrap_or("").to_string();
        let scope = if self.fault == Fault::SharedCache { String::new() } else { req.key.clone() };
        let prefix: String = text.chars().take(PREFIX_BYTES).collect();
        let mut hit = !self.seen.lock().unwrap().insert((scope, prefix));
        if self.fault == Fault::ChunkReuse {
            let mut prompts = self.prompts.lock().unwrap();
            hit |= prompts.iter().any(|earlier| reuses_past_a_gap(earlier.as_bytes(), text.as_bytes()));
            prompts.push(text.clone());
        }
        // The answer depends on the prompt alone (deterministic, batch-invariant), and never
        // repeats anything of it.
        let seed = text.bytes().fold(7usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize));
        let tokens: Vec<(String, f64)> = (0..max_tokens)
            .map(|i| (format!(" {}", WORDS[(seed + i * 7) % WORDS.len()]), -0.25 - (i % 5) as f64 * 0.1))
            .collect();
        let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                           "total_tokens": prompt_tokens + max_tokens,
                           "prompt_tokens_details": {"cached_tokens": 0}});
        std::thread::sleep(if hit { HIT } else { MISS });
        let logprobs = |toks: &[(String, f64)]| {
            if chat {
                json!({"content": toks.iter().map(|(t, l)| json!({"token": t, "logprob": l,
                        "bytes": t.as_bytes()})).collect::<Vec<_>>()})
            } else {
                json!({"tokens": toks.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>(),
                       "token_logprobs": toks.iter().map(|(_, l)| *l).collect::<Vec<_>>()})
            }
        };
        if body["stream"] != true {
            let all: String = tokens.iter().map(|(t, _)| t.as_str()).collect();
            let choice = if chat {
                json!({"index": 0, "message": {"role": "assistant", "content": all}, "logprobs": logprobs(&tokens),
                       "finish_reason": "length"})
            } else {
                json!({"index": 0, "text": all, "logprobs": logprobs(&tokens), "finish_reason": "length"})
            };
            return respond(s, 200, "application/json", &json!({"choices": [choice], "usage": usage}).to_string());
        }
        let mut s = s;
        if write!(s, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n").is_err() {
            return;
        }
        for tok in tokens.chunks(1) {
            let choice = if chat {
                json!({"index": 0, "delta": {"content": tok[0].0}, "logprobs": logprobs(tok), "finish_reason": null})
            } else {
                json!({"index": 0, "text": tok[0].0, "logprobs": logprobs(tok), "finish_reason": null})
            };
            // The client dropped the stream: stop.
            if write!(s, "data: {}\n\n", json!({"choices": [choice]})).is_err() {
                return;
            }
        }
        let end = json!({"choices": [{"index": 0, "delta": {}, "text": "", "finish_reason": "length"}]});
        let _ = write!(s, "data: {end}\n\ndata: {}\n\ndata: [DONE]\n\n", json!({"choices": [], "usage": usage}));
    }
}

/// Whether `new` parts from `earlier` and then goes on with [`PREFIX_BYTES`] of `earlier`'s
/// text from further on: a chunk a cache could shift into place past the point they part.
fn reuses_past_a_gap(earlier: &[u8], new: &[u8]) -> bool {
    let common = earlier.iter().zip(new).take_while(|(a, b)| a == b).count();
    // A cache picks the prompt to reuse by a shared head first (llama.cpp's slots do).
    if common < 8 {
        return false;
    }
    let Some(next) = new.get(common..common + PREFIX_BYTES) else { return false };
    earlier.get(common + 1..).is_some_and(|later| later.windows(next.len()).any(|w| w == next))
}

/// A tenants file for an audit of a fake server: alice, bob and carol with keys ka, kb, kc.
pub fn three_tenants_file(dir: &std::path::Path) -> std::path::PathBuf {
    let tenants = dir.join("tenants.toml");
    std::fs::write(
        &tenants,
        "[[tenants]]\nname = \"alice\"\nkey = \"ka\"\n[[tenants]]\nname = \"bob\"\nkey = \"kb\"\n\
         [[tenants]]\nname = \"carol\"\nkey = \"kc\"\n",
    )
    .unwrap();
    tenants
}
