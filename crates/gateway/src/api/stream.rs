//! From a request's events to text: detokenization, stop strings, and the SSE body.
//!
//! [`Generation`] turns a request's [`EventStream`] into [`Step`]s: text (UTF-8 safe, stop
//! strings cut and never emitted, text that could begin a stop string held back), then exactly
//! one `Done` or `Error`. Dropping it drops the `EventStream`, which cancels the request in the
//! engine (its pages are freed within one step).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use protocol::{Event, EventStream};
use serde_json::Value;
use text::StreamDecoder;
use tokio::sync::mpsc;

use super::request_log::RequestLog;
use super::tools::Tools;
use super::types::{finish_reason, logprobs_json, ResponseMeta, TokenLogprob, Usage};
use crate::error::ApiError;
use crate::limits::SharedPermit;
use crate::served::ServedModel;
use crate::state::AppState;

/// Cuts text at the first stop string; holds back a tail that could be the start of one.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher { stops, held: String::new() }
    }

    /// Adds text; returns what may be emitted now and whether a stop string was found (then
    /// nothing after it is ever emitted).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        let hit = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(at) = hit {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        let keep = self.holdback();
        let cut = self.held.len() - keep;
        let out: String = self.held.drain(..cut).collect();
        (out, false)
    }

    /// Length of the longest tail of `held` that is a proper prefix of a stop string.
    fn holdback(&self) -> usize {
        let mut best = 0;
        for s in &self.stops {
            for (k, _) in s.char_indices().skip(1) {
                if k > best && self.held.ends_with(&s[..k]) {
                    best = k;
                }
            }
        }
        best
    }

    /// The end of generation: whatever was held back is plain text.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// One unit of output.
#[derive(Debug)]
pub enum Step {
    Text { text: String, logprobs: Vec<TokenLogprob> },
    Done { reason: &'static str, usage: Usage },
    Error(ApiError),
}

/// A running request, seen as text.
pub struct Generation {
    st: Arc<AppState>,
    /// The model it runs on (its vocabulary decodes the tokens).
    model: Arc<ServedModel>,
    rs: Option<EventStream>,
    permit: SharedPermit,
    dec: StreamDecoder,
    stop: StopMatcher,
    want_logprobs: bool,
    prompt_tokens: usize,
    max_tokens: usize,
    completion_tokens: usize,
    /// Set once the prefix cache was consulted (the last report wins: a retried route
    /// reports again).
    cached_tokens: Option<usize>,
    tenant: types::TenantId,
    arrived: Instant,
    last_token: Option<Instant>,
    pub(crate) ttft: Option<Duration>,
    out: VecDeque<Step>,
}

impl Generation {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        st: Arc<AppState>,
        model: Arc<ServedModel>,
        rs: EventStream,
        permit: SharedPermit,
        stops: Vec<String>,
        want_logprobs: bool,
        prompt_tokens: usize,
        max_tokens: usize,
        arrived: Instant,
        tenant: types::TenantId,
    ) -> Self {
        Generation {
            st,
            model,
            rs: Some(rs),
            permit,
            dec: StreamDecoder::new(),
            stop: StopMatcher::new(stops),
            want_logprobs,
            prompt_tokens,
            max_tokens,
            completion_tokens: 0,
            cached_tokens: None,
            tenant,
            arrived,
            last_token: None,
            ttft: None,
            out: VecDeque::new(),
        }
    }

    pub fn completion_tokens(&self) -> usize {
        self.completion_tokens
    }

    /// Ends the request in the engine (cancels it if still running) and settles the limits.
    fn end(&mut self) {
        self.count_lookup();
        self.rs = None;
        self.permit.refund(self.max_tokens.saturating_sub(self.completion_tokens));
    }

    /// Counts the request's prefix-cache lookup once, when it ends (however it ends).
    fn count_lookup(&mut self) {
        if let Some(n) = self.cached_tokens.take() {
            self.st.metrics.prefix_lookup(self.tenant, n);
        }
    }

    /// The next step; `None` after `Done` or `Error`.
    pub async fn next(&mut self) -> Option<Step> {
        loop {
            if let Some(s) = self.out.pop_front() {
                return Some(s);
            }
            let rs = self.rs.as_mut()?;
            let Some(ev) = rs.next().await else {
                self.end();
                return Some(Step::Error(ApiError::internal("the engine ended the request without a result")));
            };
            match ev {
                Event::Started => self.permit.started(),
                Event::PrefixCache { cached_tokens } => self.cached_tokens = Some(cached_tokens),
                Event::Token(t) => {
                    let now = Instant::now();
                    match self.last_token {
                        None => {
                            let d = now.duration_since(self.arrived);
                            self.ttft = Some(d);
                            self.st.metrics.time_to_first_token(d);
                        }
                        Some(prev) => self.st.metrics.inter_token_latency(now.duration_since(prev)),
                    }
                    self.last_token = Some(now);
                    self.completion_tokens += 1;
                    let piece = match self.dec.push(&self.model.tokenizer, t.token) {
                        Ok(p) => p,
                        Err(e) => {
                            self.end();
                            return Some(Step::Error(ApiError::internal(format!("detokenization failed: {e}"))));
                        }
                    };
                    let logprobs = match (self.want_logprobs, t.logprob) {
                        (false, _) => Vec::new(),
                        (true, Some(logprob)) => vec![TokenLogprob { token: t.token, logprob, top: t.top }],
                        // The request's sampling parameters ask for it; a token without it
                        // comes from an engine that ignored them.
                        (true, None) => {
                            self.end();
                            let e =
                                ApiError::internal("a token came without the log-probability the request asked for");
                            return Some(Step::Error(e));
                        }
                    };
                    let (text, hit) = self.stop.push(&piece);
                    if !text.is_empty() || !logprobs.is_empty() {
                        self.out.push_back(Step::Text { text, logprobs });
                    }
                    if hit {
                        let usage = Usage {
                            prompt_tokens: self.prompt_tokens,
                            completion_tokens: self.completion_tokens,
                            cached_tokens: self.cached_tokens.unwrap_or(0),
                        };
                        self.out.push_back(Step::Done { reason: "stop", usage });
                        self.end();
                    }
                }
                Event::Finished { reason, usage } => {
                    let tail = std::mem::take(&mut self.dec).finish();
                    let (mut text, hit) = self.stop.push(&tail);
                    let reason = if hit {
                        "stop"
                    } else {
                        text.push_str(&self.stop.finish());
                        finish_reason(reason)
                    };
                    if !text.is_empty() {
                        self.out.push_back(Step::Text { text, logprobs: Vec::new() });
                    }
                    let usage = Usage {
                        prompt_tokens: usage.prompt_tokens,
                        completion_tokens: usage.completion_tokens,
                        cached_tokens: self.cached_tokens.unwrap_or(usage.cached_tokens),
                    };
                    self.completion_tokens = usage.completion_tokens;
                    self.out.push_back(Step::Done { reason, usage });
                    self.end();
                }
                Event::Failed(e) => {
                    if let protocol::RequestError::IsolationViolation { kind } = e {
                        self.st.metrics.isolation_violation(kind);
                    }
                    self.end();
                    self.out.push_back(Step::Error(ApiError::failed(&e)));
                }
            }
        }
    }
}

/// The SSE body: a channel of frames.
struct Frames(mpsc::Receiver<Bytes>);

impl futures_core::Stream for Frames {
    type Item = Result<Bytes, Infallible>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|o| o.map(Ok))
    }
}

fn frame(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// What a stream carries besides the choices' text.
pub struct Shape {
    pub include_usage: bool,
    /// Completions' `echo`: each choice's text begins with the prompt.
    pub echo: Option<String>,
    /// A choice's answer is held back until it is complete, then sent as `tool_calls` when it
    /// has calls (what the model said before them first, as content), as content when not.
    pub tools: Option<Arc<Tools>>,
}

/// What one choice's forwarder sends the SSE task.
struct ChoiceStep {
    index: usize,
    step: Step,
}

/// Streams the choices as server-sent events, each starting with its `first` step (already
/// taken, so that errors before the first token were proper HTTP errors); with `echo`, each
/// choice's text begins with the prompt. Every choice runs on a forwarder task of its own; a
/// client that goes away closes the channel, which ends the forwarders, whose dropped
/// generations cancel their requests.
pub fn sse_response(
    model: Arc<ServedModel>,
    gens: Vec<(Generation, Step)>,
    meta: ResponseMeta,
    shape: Shape,
    mut log: RequestLog,
) -> Response {
    let Shape { include_usage, echo, tools } = shape;
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let n = gens.len();
    let (step_tx, mut steps) = mpsc::channel::<ChoiceStep>(64);
    let generated: Vec<Arc<AtomicUsize>> = (0..n).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    log.ttft = gens.iter().filter_map(|(g, _)| g.ttft).min();
    for (index, (mut gen, first)) in gens.into_iter().enumerate() {
        let (step_tx, count) = (step_tx.clone(), generated[index].clone());
        tokio::spawn(async move {
            let mut pending = Some(first);
            loop {
                let step = match pending.take() {
                    Some(s) => s,
                    None => tokio::select! {
                        s = gen.next() => match s { Some(s) => s, None => break },
                        _ = step_tx.closed() => break,
                    },
                };
                count.store(gen.completion_tokens(), Ordering::Relaxed);
                let last = !matches!(step, Step::Text { .. });
                if step_tx.send(ChoiceStep { index, step }).await.is_err() || last {
                    break;
                }
            }
            count.store(gen.completion_tokens(), Ordering::Relaxed);
        });
    }
    drop(step_tx);
    tokio::spawn(async move {
        // The whole log (and with it the in-flight count) lives in this task.
        let mut log = log;
        let mut first_chunk = vec![true; n];
        let mut held = vec![String::new(); n];
        let mut offset = vec![0usize; n];
        let mut open = n;
        let mut total = Usage::default();
        let mut finished = "stop";
        log.status = 200;
        let mut frames: Vec<Bytes> = Vec::new();
        if let Some(prompt) = &echo {
            for (index, first) in first_chunk.iter_mut().enumerate() {
                frames.push(frame(&meta.chunk(index, prompt, true, None, None, include_usage)));
                *first = false;
            }
        }
        while open > 0 {
            let Some(ChoiceStep { index, step }) = (tokio::select! {
                s = steps.recv() => s,
                _ = tx.closed() => { log.outcome = "cancelled"; break; }
            }) else {
                break;
            };
            match step {
                Step::Text { text, .. } if tools.is_some() => held[index].push_str(&text),
                Step::Text { text, logprobs } => {
                    let lp = (!logprobs.is_empty())
                        .then(|| logprobs_json(meta.endpoint, &model.tokenizer, &logprobs, offset[index]));
                    offset[index] += text.len();
                    frames.push(frame(&meta.chunk(index, &text, first_chunk[index], None, lp, include_usage)));
                    first_chunk[index] = false;
                }
                Step::Done { reason, usage } => {
                    let answer = std::mem::take(&mut held[index]);
                    let calls = tools.as_ref().filter(|_| reason == "stop").and_then(|t| t.calls(&answer));
                    let reason = match (calls, tools.as_ref()) {
                        (Some(answer), Some(t)) => {
                            // What the model said before its calls goes first, as content.
                            if let Some(content) = &answer.content {
                                frames.push(frame(&meta.chunk(
                                    index,
                                    content,
                                    first_chunk[index],
                                    None,
                                    None,
                                    include_usage,
                                )));
                                first_chunk[index] = false;
                            }
                            let calls = t.calls_json(&answer.calls, &meta.call_id(index), true);
                            frames.push(frame(&meta.tool_calls_chunk(index, first_chunk[index], calls, include_usage)));
                            first_chunk[index] = false;
                            "tool_calls"
                        }
                        _ => {
                            if !answer.is_empty() || first_chunk[index] {
                                frames.push(frame(&meta.chunk(
                                    index,
                                    &answer,
                                    first_chunk[index],
                                    None,
                                    None,
                                    include_usage,
                                )));
                                first_chunk[index] = false;
                            }
                            reason
                        }
                    };
                    frames.push(frame(&meta.chunk(index, "", false, Some(reason), None, include_usage)));
                    total.prompt_tokens = usage.prompt_tokens;
                    total.completion_tokens += usage.completion_tokens;
                    if index == 0 {
                        total.cached_tokens = usage.cached_tokens;
                    }
                    // One choice stopped by length makes the request's outcome `length`.
                    if reason != "stop" {
                        finished = reason;
                    }
                    open -= 1;
                    if open == 0 {
                        if include_usage {
                            frames.push(frame(&meta.usage_chunk(total)));
                        }
                        frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
                        log.prompt_tokens = total.prompt_tokens;
                        log.completion_tokens = total.completion_tokens;
                        log.cached_tokens = total.cached_tokens;
                        log.outcome = finished;
                    }
                }
                Step::Error(e) => {
                    // Streaming began: the failure is an error event, and no [DONE] follows; the
                    // other choices end with the stream.
                    log.outcome = "error";
                    log.error = Some(e.reason);
                    frames.push(frame(&e.body()));
                    open = 0;
                }
            }
            let mut closed = false;
            for f in frames.drain(..) {
                if tx.send(f).await.is_err() {
                    closed = true;
                    break;
                }
            }
            if closed {
                log.outcome = "cancelled";
                break;
            }
        }
        // Dropping the receiver ends the forwarders (and cancels what still runs).
        drop(steps);
        log.completion_tokens = log.completion_tokens.max(generated.iter().map(|c| c.load(Ordering::Relaxed)).sum());
    });
    let mut resp = Response::new(Body::from_stream(Frames(rx)));
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

impl Drop for Generation {
    /// A client that went away still made its request look the cache up.
    fn drop(&mut self) {
        self.count_lookup();
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (t, hit) = m.push(p);
            out.push_str(&t);
            if hit {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_string_split_across_pieces_is_cut_and_not_emitted() {
        assert_eq!(run(&["END"], &["hello E", "N", "D more"]), ("hello ".into(), true));
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn held_text_that_is_not_a_stop_is_released() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("abc E"), ("abc ".into(), false));
        assert_eq!(m.push("X"), ("EX".into(), false));
        assert_eq!(m.push("EN"), ("".into(), false));
        assert_eq!(m.finish(), "EN");
    }

    #[test]
    fn earliest_of_several_stops_wins_and_multibyte_is_safe() {
        assert_eq!(run(&["zz", "é!"], &["aé", "! zz"]), ("a".into(), true));
        assert_eq!(run(&["éa"], &["xé"]), ("xé".into(), false));
    }
}
