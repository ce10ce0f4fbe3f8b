//! The OpenAI-compatible API: authentication, body reading, the path of one generation request
//! (concurrency and queue limits, body, validate, token limit, submit, wait for the first event,
//! then a response or a stream), and the per-request log line (ids, tenant id, sizes, timings;
//! never prompt or output text).

pub mod chat;
pub mod completions;
pub mod fields;
pub mod stream;
pub mod tools;
pub mod types;
pub mod validate;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use engine::GenRequest;
use kv::RequestId;

use self::stream::{sse_response, Generation, Step};
use self::types::{logprobs_json, Choice, ResponseMeta, Usage};
use self::validate::{validate, Endpoint};
use crate::error::ApiError;
use crate::limits::SharedPermit;
use crate::state::AppState;
use crate::tenants::Tenant;
use crate::usage::UsageRecord;

/// One request's log line and status metric, written when it is dropped. It also counts the
/// request as in flight (the drain waits for these).
pub struct RequestLog {
    st: Arc<AppState>,
    pub id: u64,
    pub endpoint: &'static str,
    /// The tenant's numeric id ("-" before authentication): names are the operator's labels,
    /// and a log line should not need the tenant table to be read, nor change with it.
    pub tenant: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub status: u16,
    pub outcome: &'static str,
    /// The error's reason label (never its message: that could quote the request).
    pub error: Option<&'static str>,
    pub ttft: Option<Duration>,
    /// Set once a generation request is authenticated: whose usage this request is.
    pub billed: Option<(kv::TenantId, String)>,
    /// Whether the request was submitted (its prompt computed or taken from the cache).
    pub ran: bool,
    pub cached_tokens: usize,
    /// The model the request named, once validated (the usage log's `model`).
    pub model: Option<String>,
    started: Instant,
    armed: bool,
}

impl RequestLog {
    pub fn new(st: Arc<AppState>, endpoint: &'static str) -> Self {
        st.inflight.fetch_add(1, Ordering::SeqCst);
        let id = st.next_id.fetch_add(1, Ordering::Relaxed);
        RequestLog {
            st,
            id,
            endpoint,
            tenant: "-".into(),
            prompt_tokens: 0,
            completion_tokens: 0,
            // Until a path sets them: the client went away before an answer (nginx's 499).
            status: 499,
            outcome: "cancelled",
            error: None,
            ttft: None,
            billed: None,
            ran: false,
            cached_tokens: 0,
            model: None,
            started: Instant::now(),
            armed: true,
        }
    }

    /// Moves the duty to log (and the in-flight count) to a new value, e.g. a streaming task.
    pub fn take(&mut self) -> RequestLog {
        self.armed = false;
        RequestLog {
            st: self.st.clone(),
            id: self.id,
            endpoint: self.endpoint,
            tenant: std::mem::take(&mut self.tenant),
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            status: self.status,
            outcome: self.outcome,
            error: self.error,
            ttft: self.ttft,
            billed: self.billed.take(),
            ran: self.ran,
            cached_tokens: self.cached_tokens,
            model: self.model.take(),
            started: self.started,
            armed: true,
        }
    }

    /// The tenant's usage of this request: the metrics, and a record in the usage log.
    fn bill(&self, tenant: kv::TenantId, name: &str, total: Duration) {
        // A request refused before it ran computed nothing: it is counted, with no tokens.
        let (prompt, cached) = if self.ran { (self.prompt_tokens, self.cached_tokens) } else { (0, 0) };
        self.st.metrics.tenant_usage(tenant, self.outcome, prompt, cached, self.completion_tokens);
        if let Some(log) = &self.st.usage {
            let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
            log.record(UsageRecord {
                ts: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or_default(),
                request: self.id,
                tenant: tenant.0,
                tenant_name: name.to_string(),
                model: self.model.clone().unwrap_or_else(|| "-".into()),
                endpoint: self.endpoint.to_string(),
                status: self.status,
                outcome: self.outcome.to_string(),
                prompt_tokens: prompt as u64,
                cached_tokens: cached as u64,
                completion_tokens: self.completion_tokens as u64,
                ttft_ms: self.ttft.map(ms),
                total_ms: ms(total),
            });
        }
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.st.metrics.request(self.status);
        if let Some((tenant, name)) = &self.billed {
            self.bill(*tenant, name, self.started.elapsed());
        }
        // Ids, sizes and timings only: the prompt and the output never reach a log.
        tracing::info!(
            target: "pagewarden::request",
            request = self.id,
            endpoint = self.endpoint,
            tenant = %self.tenant,
            status = self.status,
            outcome = self.outcome,
            error = self.error.unwrap_or("-"),
            prompt_tokens = self.prompt_tokens,
            completion_tokens = self.completion_tokens,
            ttft_ms = self.ttft.map(|d| (d.as_secs_f64() * 1e4).round() / 10.0),
            total_ms = (self.started.elapsed().as_secs_f64() * 1e4).round() / 10.0,
            "request"
        );
        self.st.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `Authorization: Bearer KEY` to a tenant (constant-time digest comparison).
pub fn authenticate(st: &AppState, headers: &HeaderMap) -> Result<Tenant, ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(ApiError::unauthorized("missing API key: send `Authorization: Bearer KEY`"));
    };
    let text = value.to_str().unwrap_or_default().trim();
    let key = match text.split_once(' ') {
        Some((scheme, key)) if scheme.eq_ignore_ascii_case("bearer") => key.trim(),
        _ => return Err(ApiError::unauthorized("malformed Authorization header: expected `Bearer KEY`")),
    };
    st.tenants.current().authenticate(key).cloned().ok_or_else(|| ApiError::unauthorized("incorrect API key"))
}

/// The body, at most `limit` bytes (413 beyond).
async fn read_body(body: Body, headers: &HeaderMap, limit: usize) -> Result<Bytes, ApiError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|s| s.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::body_too_large(limit));
    }
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let next =
            std::future::poll_fn(|cx| futures_core::Stream::poll_next(std::pin::Pin::new(&mut stream), cx)).await;
        match next {
            None => break,
            Some(Ok(chunk)) => {
                if buf.len() + chunk.len() > limit {
                    return Err(ApiError::body_too_large(limit));
                }
                buf.extend_from_slice(&chunk);
            }
            Some(Err(e)) => return Err(ApiError::malformed(format!("cannot read the request body: {e}"))),
        }
    }
    Ok(Bytes::from(buf))
}

fn json_response(status: StatusCode, v: &serde_json::Value) -> Response {
    let mut resp = Response::new(Body::from(v.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// `GET /v1/models`.
pub async fn models(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let mut log = RequestLog::new(st.clone(), "models");
    match authenticate(&st, &headers) {
        Ok(t) => {
            log.tenant = t.id.0.to_string();
            log.status = 200;
            log.outcome = "ok";
            let served: Vec<(&str, usize)> =
                st.models.allowed(&t.config).map(|m| (m.name.as_str(), m.context)).collect();
            json_response(StatusCode::OK, &types::models(&served, st.started_at))
        }
        Err(e) => reject(&st, &mut log, e),
    }
}

fn reject(st: &AppState, log: &mut RequestLog, e: ApiError) -> Response {
    st.metrics.rejection(e.reason);
    log.status = e.status.as_u16();
    log.outcome = "rejected";
    log.error = Some(e.reason);
    e.response()
}

/// The path of a chat or text completion request.
pub async fn generate(st: Arc<AppState>, endpoint: Endpoint, req: Request) -> Response {
    let name = match endpoint {
        Endpoint::Chat => "chat",
        Endpoint::Completions => "completions",
    };
    let mut log = RequestLog::new(st.clone(), name);
    // Ids only: the tenant is recorded once the key is checked.
    let span = tracing::info_span!("request", request = log.id, endpoint = name, tenant = tracing::field::Empty);
    match tracing::Instrument::instrument(generate_inner(&st, endpoint, req, &mut log), span).await {
        Ok(resp) => resp,
        Err(e) => {
            let timed_out = e.reason == "body_timeout";
            let mut resp = reject(&st, &mut log, e);
            if timed_out {
                // The rest of the body is never read: the connection cannot carry another
                // request, and a slow client must not keep it.
                resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            resp
        }
    }
}

async fn generate_inner(
    st: &Arc<AppState>,
    endpoint: Endpoint,
    req: Request,
    log: &mut RequestLog,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    if st.is_draining() {
        return Err(ApiError::draining());
    }
    // Taken before the key is checked: a revocation after it ends this request (each model's
    // cluster counts its own).
    let marks: Vec<u64> = st.backends().map(|b| b.revocation_mark()).collect();
    let tenant = authenticate(st, req.headers())?;
    log.tenant = tenant.id.0.to_string();
    log.billed = Some((tenant.id, tenant.config.name.clone()));
    tracing::Span::current().record("tenant", tenant.id.0);
    // The tenant's concurrency and queue slots come before any work for it: reading the body,
    // rendering and tokenizing cost as much as queueing, and must count against its limits.
    let mut permit = st.limiter.acquire(tenant.id)?;
    let (parts, body) = req.into_parts();
    let limit = tenant.config.max_body_bytes.unwrap_or(st.settings.limits.max_body_bytes);
    let body_timeout = st.settings.limits.body_timeout;
    let body = tokio::time::timeout(body_timeout, read_body(body, &parts.headers, limit))
        .await
        .map_err(|_| ApiError::body_timeout(body_timeout.as_millis()))??;

    // Rendering and tokenizing a large prompt is CPU work: keep it off the async workers.
    let (st2, tenant_config) = (st.clone(), tenant.config.clone());
    let v = tokio::task::spawn_blocking(move || validate(&body, endpoint, &st2, &tenant_config))
        .await
        .map_err(|e| ApiError::internal(format!("validation task failed: {e}")))??;
    log.prompt_tokens = v.prompt.len();
    log.model = Some(v.model.name.clone());
    let model = v.model.clone();
    let mark = st.models.iter().position(|m| Arc::ptr_eq(m, &model)).and_then(|i| marks.get(i).copied()).unwrap_or(0);

    // Every choice is a sequence of its own: it takes a concurrency slot, computes its prompt
    // and may generate max_tokens.
    permit.widen(v.choices)?;
    permit.charge(v.choices * (v.prompt.len() + v.max_tokens))?;
    let permit = SharedPermit::new(permit);
    let prompt_param = match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completions => "prompt",
    };
    let prompt_tokens = v.prompt.len();
    let mut gens = Vec::with_capacity(v.choices);
    for index in 0..v.choices {
        // Choice 0 is the request itself; the others are sequences of their own in the engine.
        let id = if index == 0 { log.id } else { st.next_id.fetch_add(1, Ordering::Relaxed) };
        // A seeded request stays reproducible, and its choices differ.
        let seed = v.sampling.seed().map(|s| s.wrapping_add(index as u64));
        let gen_req = GenRequest {
            id: RequestId(id),
            tenant: tenant.id,
            prompt: v.prompt.clone(),
            max_tokens: v.max_tokens,
            sampling: v.sampling.with_seed(seed),
            stop_tokens: if v.ignore_eos { sampling::StopTokens::new([]) } else { model.stop_tokens.clone() },
            deadline: Some(arrived + st.settings.limits.request_timeout),
            cache_salt: v.cache_salt.clone(),
            constraint: v.constraint.clone(),
        };
        // A refusal drops the choices submitted so far, which cancels them.
        let rs = model.backend.submit(gen_req, mark).map_err(|e| ApiError::admission(&e, prompt_param))?;
        log.ran = true;
        gens.push(Generation::new(
            st.clone(),
            model.clone(),
            rs,
            permit.clone(),
            v.stop.clone(),
            v.logprobs.is_some(),
            prompt_tokens,
            v.max_tokens,
            arrived,
            tenant.id,
        ));
    }
    drop(permit);
    let meta = ResponseMeta::new(endpoint, log.id, &model.name);

    // Nothing is sent before every choice has its first result: a failure up to here is a
    // proper HTTP error.
    let mut started = Vec::with_capacity(gens.len());
    for mut gen in gens {
        let first = gen.next().await.ok_or_else(|| ApiError::internal("the request ended without a result"))?;
        if let Step::Error(e) = first {
            return Err(e);
        }
        started.push((gen, first));
    }
    if v.stream {
        let shape = stream::Shape { include_usage: v.include_usage, echo: v.echo, tools: v.tools };
        return Ok(sse_response(model.clone(), started, meta, shape, log.take()));
    }

    let mut choices = Vec::with_capacity(started.len());
    let mut total = Usage { prompt_tokens, ..Usage::default() };
    let mut outcome = "stop";
    let mut ttft: Option<Duration> = None;
    for (index, (mut gen, first)) in started.into_iter().enumerate() {
        let mut text = v.echo.clone().unwrap_or_default();
        let mut lps = Vec::new();
        let mut step = Some(first);
        loop {
            match step {
                Some(Step::Text { text: t, logprobs }) => {
                    text.push_str(&t);
                    lps.extend(logprobs);
                }
                Some(Step::Done { reason, usage }) => {
                    let logprobs = v.logprobs.map(|_| logprobs_json(endpoint, &model.tokenizer, &lps, 0));
                    // A complete answer that is a call becomes `tool_calls`.
                    let call = v.tools.as_ref().filter(|_| reason == "stop").and_then(|t| t.call(&text));
                    let (reason, tool_calls) = match call {
                        Some(c) => ("tool_calls", Some(serde_json::json!([c.json(&meta.call_id(index), None)]))),
                        None => (reason, None),
                    };
                    choices.push(Choice { text, reason, logprobs, tool_calls });
                    total.completion_tokens += usage.completion_tokens;
                    if index == 0 {
                        total.cached_tokens = usage.cached_tokens;
                    }
                    if reason != "stop" {
                        outcome = reason;
                    }
                    break;
                }
                Some(Step::Error(e)) => return Err(e),
                None => return Err(ApiError::internal("the request ended without a result")),
            }
            step = gen.next().await;
            // Kept current: a client that goes away mid-generation is billed what was generated.
            log.completion_tokens = total.completion_tokens + gen.completion_tokens();
        }
        ttft = ttft.into_iter().chain(gen.ttft).min();
    }
    log.status = 200;
    log.outcome = outcome;
    log.completion_tokens = total.completion_tokens;
    log.cached_tokens = total.cached_tokens;
    log.ttft = ttft;
    Ok(json_response(StatusCode::OK, &meta.full(&choices, total)))
}
