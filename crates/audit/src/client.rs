//! One HTTP exchange with the deployment: send a planned request, read the answer (a JSON body
//! or a server-sent event stream, possibly dropped on purpose), classify how it ended, and keep
//! what the checks need: the text, the raw bytes, the generated tokens and their log-probs.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use super::workload::ReqSpec;
use crate::error::AuditError;

/// How a request ended, from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    Ok,
    /// 400 (for over-long prompts the expected answer).
    Refused400,
    RateLimited429,
    Unavailable503,
    ServerError5xx,
    /// Any other status (401, 404, 413, ...): usually a misconfigured audit.
    OtherStatus,
    /// The audit dropped the stream on purpose.
    DisconnectedByUs,
    /// The stream carried an error event (a failure after streaming began).
    StreamErrorEvent,
    /// The stream ended with neither `[DONE]` nor an error event.
    StreamTruncated,
    /// No HTTP answer: refused connection, reset, timeout.
    TransportError,
}

impl Outcome {
    pub const ALL: [Outcome; 10] = [
        Outcome::Ok,
        Outcome::Refused400,
        Outcome::RateLimited429,
        Outcome::Unavailable503,
        Outcome::ServerError5xx,
        Outcome::OtherStatus,
        Outcome::DisconnectedByUs,
        Outcome::StreamErrorEvent,
        Outcome::StreamTruncated,
        Outcome::TransportError,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Refused400 => "refused_400",
            Outcome::RateLimited429 => "rate_limited_429",
            Outcome::Unavailable503 => "unavailable_503",
            Outcome::ServerError5xx => "server_error_5xx",
            Outcome::OtherStatus => "other_status",
            Outcome::DisconnectedByUs => "disconnected_by_us",
            Outcome::StreamErrorEvent => "stream_error_event",
            Outcome::StreamTruncated => "stream_truncated",
            Outcome::TransportError => "transport_error",
        }
    }

    fn of_status(status: u16) -> Outcome {
        match status {
            200 => Outcome::Ok,
            400 => Outcome::Refused400,
            429 => Outcome::RateLimited429,
            503 => Outcome::Unavailable503,
            500..=599 => Outcome::ServerError5xx,
            _ => Outcome::OtherStatus,
        }
    }
}

impl Serialize for Outcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// What came back for one request.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub status: Option<u16>,
    pub outcome: Outcome,
    /// The error's code (or type and message, numbers masked) for grouping errors by kind.
    pub error_kind: Option<String>,
    /// When the request was sent, since the audit started.
    pub started: Duration,
    /// Until the first generated text (streams only).
    pub ttft: Option<Duration>,
    pub total: Duration,
    /// SSE data events read.
    pub events: usize,
    /// The generated text (assembled from the stream's deltas).
    pub text: String,
    /// Everything the server sent in the body, as read.
    pub raw: String,
    /// Generated tokens (their bytes) and log-probs, from the `logprobs` fields.
    pub tokens: Vec<Vec<u8>>,
    pub logprobs: Vec<f64>,
    pub finish_reason: Option<String>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`: prompt tokens whose KV the server took
    /// from its prefix cache (None when the server does not report it).
    pub cached_tokens: Option<u64>,
    /// A refusal's `Retry-After`, in seconds (what a rate limit asks the client to wait).
    pub retry_after: Option<Duration>,
}

impl Exchange {
    pub(super) fn new(started: Duration) -> Self {
        Exchange {
            status: None,
            outcome: Outcome::TransportError,
            error_kind: None,
            started,
            ttft: None,
            total: Duration::ZERO,
            events: 0,
            text: String::new(),
            raw: String::new(),
            tokens: Vec::new(),
            logprobs: Vec::new(),
            finish_reason: None,
            prompt_tokens: None,
            completion_tokens: None,
            cached_tokens: None,
            retry_after: None,
        }
    }

    /// A completed generation whose tokens a re-run must reproduce.
    pub fn comparable(&self) -> bool {
        self.outcome == Outcome::Ok && matches!(self.finish_reason.as_deref(), Some("length" | "stop"))
    }
}

/// Numbers in a message become `N`, so that "queue is full (256 requests waiting)" and
/// "(255 ...)" are one kind; long messages are cut.
fn mask(msg: &str) -> String {
    let mut out = String::new();
    let mut in_num = false;
    for c in msg.chars() {
        if c.is_ascii_digit() {
            if !in_num {
                out.push('N');
            }
            in_num = true;
        } else {
            in_num = false;
            out.push(c);
        }
        if out.len() >= 100 {
            out.push('…');
            break;
        }
    }
    out
}

/// The kind of an OpenAI error envelope: its `code` when it has one, else `type: message`.
pub fn error_kind(v: &Value) -> Option<String> {
    let e = v.get("error")?;
    if let Some(code) = e.get("code").and_then(Value::as_str) {
        return Some(code.to_string());
    }
    let kind = e.get("type").and_then(Value::as_str).unwrap_or("error");
    match e.get("message").and_then(Value::as_str) {
        Some(m) => Some(format!("{kind}: {}", mask(m))),
        None => Some(kind.to_string()),
    }
}

/// Appends the tokens and log-probs of one choice's `logprobs` (chat: `content[]` with
/// `bytes`; completions: `tokens[]` and `token_logprobs[]`).
fn take_logprobs(lp: &Value, tokens: &mut Vec<Vec<u8>>, logprobs: &mut Vec<f64>) {
    if let Some(content) = lp.get("content").and_then(Value::as_array) {
        for t in content {
            let bytes = match t.get("bytes").and_then(Value::as_array) {
                Some(b) => b.iter().filter_map(Value::as_u64).map(|x| x as u8).collect(),
                None => t.get("token").and_then(Value::as_str).unwrap_or_default().as_bytes().to_vec(),
            };
            tokens.push(bytes);
            logprobs.push(t.get("logprob").and_then(Value::as_f64).unwrap_or(f64::NAN));
        }
    } else if let Some(toks) = lp.get("tokens").and_then(Value::as_array) {
        let lps = lp.get("token_logprobs").and_then(Value::as_array);
        for (i, t) in toks.iter().enumerate() {
            tokens.push(t.as_str().unwrap_or_default().as_bytes().to_vec());
            logprobs.push(lps.and_then(|l| l.get(i)).and_then(Value::as_f64).unwrap_or(f64::NAN));
        }
    }
}

fn take_usage(v: &Value, ex: &mut Exchange) {
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        ex.prompt_tokens = u.get("prompt_tokens").and_then(Value::as_u64);
        ex.completion_tokens = u.get("completion_tokens").and_then(Value::as_u64);
        ex.cached_tokens = u.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64);
    }
}

/// The HTTP side of the audit.
pub struct Client {
    agent: ureq::Agent,
    base: String,
}

impl Client {
    pub fn new(base: &str, timeout: Duration) -> Self {
        Client { agent: launch::agent(timeout), base: base.trim_end_matches('/').to_string() }
    }

    /// GET an absolute URL (metrics) or a path on the deployment; (status, body).
    pub fn get(&self, url_or_path: &str, key: Option<&str>) -> Result<(u16, String), AuditError> {
        let url = if url_or_path.starts_with("http") {
            url_or_path.to_string()
        } else {
            format!("{}{url_or_path}", self.base)
        };
        let mut req = self.agent.get(&url);
        if let Some(k) = key {
            req = req.header("Authorization", format!("Bearer {k}"));
        }
        let mut resp = req.call().map_err(|source| AuditError::Http { request: format!("GET {url}"), source })?;
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .read_to_string()
            .map_err(|source| AuditError::Http { request: format!("reading GET {url}"), source })?;
        Ok((status, body))
    }

    /// POST a JSON body; (status, body).
    pub fn post(&self, path: &str, key: &str, body: &Value) -> Result<(u16, String), AuditError> {
        let url = format!("{}{path}", self.base);
        let mut resp = self
            .agent
            .post(&url)
            .header("Authorization", format!("Bearer {key}"))
            .header("Content-Type", "application/json")
            .send(body.to_string().as_bytes())
            .map_err(|source| AuditError::Http { request: format!("POST {url}"), source })?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|source| AuditError::Http { request: format!("reading POST {url}"), source })?;
        Ok((status, text))
    }

    /// Sends `spec` as tenant `key` and reads the answer. Never fails: a transport error is an
    /// outcome like any other.
    pub fn exchange(&self, key: &str, spec: &ReqSpec, t0: Instant) -> Exchange {
        let stop = Stop { events: spec.disconnect_after, tokens: None };
        self.send_until(key, spec.endpoint.path(), &spec.body, stop, t0)
    }

    /// Sends `body` (the re-run of a partial answer) and drops the stream once `tokens` tokens
    /// have arrived.
    pub fn exchange_until_tokens(
        &self,
        key: &str,
        spec: &ReqSpec,
        body: &Value,
        tokens: usize,
        t0: Instant,
    ) -> Exchange {
        self.send_until(key, spec.endpoint.path(), body, Stop { events: None, tokens: Some(tokens) }, t0)
    }

    /// Sends `body` to `path` as tenant `key` and reads the answer (a stream is dropped after
    /// `disconnect_after` events when given). Never fails, like [`Client::exchange`].
    pub fn send(&self, key: &str, path: &str, body: &Value, disconnect_after: Option<usize>, t0: Instant) -> Exchange {
        self.send_until(key, path, body, Stop { events: disconnect_after, tokens: None }, t0)
    }

    fn send_until(&self, key: &str, path: &str, body: &Value, stop: Stop, t0: Instant) -> Exchange {
        let sent = Instant::now();
        let mut ex = Exchange::new(sent.duration_since(t0));
        let url = format!("{}{path}", self.base);
        let result = self
            .agent
            .post(&url)
            .header("Authorization", format!("Bearer {key}"))
            .header("Content-Type", "application/json")
            .send(body.to_string().as_bytes());
        let mut resp = match result {
            Ok(r) => r,
            Err(e) => {
                ex.error_kind = Some(mask(&e.to_string()));
                ex.total = sent.elapsed();
                return ex;
            }
        };
        let status = resp.status().as_u16();
        ex.status = Some(status);
        ex.retry_after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(retry_after);
        let is_sse = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if status == 200 && is_sse {
            read_stream(resp.into_body(), stop, sent, &mut ex);
        } else {
            match resp.body_mut().read_to_string() {
                Ok(body) => {
                    ex.outcome = Outcome::of_status(status);
                    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                    if status == 200 {
                        read_full(&v, &mut ex);
                    } else {
                        ex.error_kind = error_kind(&v).or_else(|| Some(format!("HTTP {status}")));
                    }
                    ex.raw = body;
                }
                Err(e) => {
                    ex.outcome = Outcome::TransportError;
                    ex.error_kind = Some(format!("reading the body: {}", mask(&e.to_string())));
                }
            }
        }
        ex.total = sent.elapsed();
        ex
    }
}

/// A `Retry-After` in seconds; None for anything else (an HTTP date, a negative or
/// non-finite number, garbage). How long to honour it is the caller's cap: a server says.
fn retry_after(v: &str) -> Option<Duration> {
    v.trim().parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e9).map(Duration::from_secs_f64)
}

/// A complete (non-streaming) response.
fn read_full(v: &Value, ex: &mut Exchange) {
    let choice = &v["choices"][0];
    let text = choice["message"]["content"].as_str().or(choice["text"].as_str()).unwrap_or_default();
    ex.text = text.to_string();
    ex.finish_reason = choice["finish_reason"].as_str().map(str::to_string);
    take_logprobs(&choice["logprobs"], &mut ex.tokens, &mut ex.logprobs);
    take_usage(v, ex);
    if choice.is_null() {
        // A 200 without a choice is not a success the checks can use.
        ex.outcome = Outcome::ServerError5xx;
        ex.error_kind = Some("200 without choices".into());
    }
}

/// When the audit drops a stream on purpose.
#[derive(Debug, Clone, Copy)]
struct Stop {
    /// After this many SSE data events.
    events: Option<usize>,
    /// Once this many tokens have arrived.
    tokens: Option<usize>,
}

/// Reads server-sent events until `[DONE]`, an error event, the end of the body, or (when asked)
/// the `stop` point, when it drops the connection.
fn read_stream(body: ureq::Body, stop: Stop, sent: Instant, ex: &mut Exchange) {
    if stop.events == Some(0) {
        ex.outcome = Outcome::DisconnectedByUs;
        return;
    }
    let reader = BufReader::new(body.into_reader());
    for line in reader.lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                ex.outcome = Outcome::TransportError;
                ex.error_kind = Some(format!("mid-stream: {}", mask(&e.to_string())));
                return;
            }
        };
        ex.raw.push_str(&line);
        ex.raw.push('\n');
        let Some(data) = line.strip_prefix("data:") else { continue };
        let data = data.trim_start();
        if data == "[DONE]" {
            ex.outcome = Outcome::Ok;
            return;
        }
        ex.events += 1;
        let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
        if v.get("error").is_some() {
            ex.outcome = Outcome::StreamErrorEvent;
            ex.error_kind = error_kind(&v);
            return;
        }
        let choice = &v["choices"][0];
        let piece = choice["delta"]["content"].as_str().or(choice["text"].as_str()).unwrap_or_default();
        if !piece.is_empty() && ex.ttft.is_none() {
            ex.ttft = Some(sent.elapsed());
        }
        ex.text.push_str(piece);
        take_logprobs(&choice["logprobs"], &mut ex.tokens, &mut ex.logprobs);
        if let Some(r) = choice["finish_reason"].as_str() {
            ex.finish_reason = Some(r.to_string());
        }
        take_usage(&v, ex);
        let reached = stop.events.is_some_and(|k| ex.events >= k) || stop.tokens.is_some_and(|k| ex.tokens.len() >= k);
        if reached && ex.finish_reason.is_none() {
            // Dropping the reader closes the connection: the server sees the client go away.
            ex.outcome = Outcome::DisconnectedByUs;
            return;
        }
    }
    ex.outcome = Outcome::StreamTruncated;
}

#[cfg(test)]
mod tests {

    #[test]
    fn retry_after_takes_seconds_and_nothing_a_server_could_break_it_with() {
        assert_eq!(retry_after(" 2 "), Some(Duration::from_secs(2)));
        assert_eq!(retry_after("0.5"), Some(Duration::from_millis(500)));
        for bad in ["-1", "NaN", "inf", "1e300", "Wed, 21 Oct 2026 07:28:00 GMT", ""] {
            assert_eq!(retry_after(bad), None, "{bad}");
        }
    }
    use super::*;
    use serde_json::json;

    #[test]
    fn error_kinds_group_by_code_or_masked_message() {
        let v =
            json!({"error": {"code": "context_length_exceeded", "type": "invalid_request_error", "message": "x 10"}});
        assert_eq!(error_kind(&v).as_deref(), Some("context_length_exceeded"));
        let v = json!({"error": {"code": null, "type": "server_error", "message": "the queue is full (256 requests)"}});
        assert_eq!(error_kind(&v).as_deref(), Some("server_error: the queue is full (N requests)"));
        assert_eq!(error_kind(&json!({"x": 1})), None);
    }

    #[test]
    fn logprobs_of_both_endpoints() {
        let (mut t, mut l) = (Vec::new(), Vec::new());
        take_logprobs(
            &json!({"content": [{"token": "a", "logprob": -0.5, "bytes": [97]}, {"token": "é", "logprob": -1.0}]}),
            &mut t,
            &mut l,
        );
        take_logprobs(&json!({"tokens": ["x"], "token_logprobs": [-2.0]}), &mut t, &mut l);
        assert_eq!(t, vec![b"a".to_vec(), "é".as_bytes().to_vec(), b"x".to_vec()]);
        assert_eq!(l, vec![-0.5, -1.0, -2.0]);
    }
}
