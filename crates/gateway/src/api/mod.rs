//! The OpenAI-compatible API: authentication, body reading, the path of one generation request
//! (concurrency and queue limits, body, validate, token limit, submit, wait for the first event,
//! then a response or a stream), and the per-request log line (ids, tenant id, sizes, timings;
//! never prompt or output text).

pub mod chat;
pub mod completions;
pub mod endpoint;
pub mod fields;
mod native_calls;
pub mod request_log;
pub mod stream;
pub mod tools;
pub mod types;
pub mod validate;
pub mod validation_error;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::types::RequestId;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use protocol::RouteRequest;

use self::endpoint::Endpoint;
use self::request_log::RequestLog;
use self::stream::{sse_response, Generation, Step};
use self::types::{logprobs_json, Choice, ResponseMeta, Usage};
use self::validate::validate;
use crate::error::ApiError;
use crate::limits::SharedPermit;
use crate::state::AppState;
use crate::tenants::Tenant;

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
        let route_req = RouteRequest {
            id: RequestId(id),
            tenant: tenant.id,
            prompt: v.prompt.clone(),
            max_tokens: v.max_tokens,
            sampling: v.sampling.with_seed(seed),
            stop_tokens: if v.ignore_eos { sampling::StopTokens::new([]) } else { model.stop_tokens.clone() },
            deadline: Some(arrived + st.settings.limits.request_timeout),
            cache_salt: v.cache_salt.clone(),
            output: v.output.clone(),
        };
        // A refusal drops the choices submitted so far, which cancels them.
        let rs = model.backend.submit(route_req, mark).map_err(|e| ApiError::admission(&e, prompt_param))?;
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
                    let calls = v.tools.as_ref().filter(|_| reason == "stop").and_then(|t| t.calls(&text));
                    let (reason, text, tool_calls) = match (calls, v.tools.as_ref()) {
                        (Some(answer), Some(t)) => {
                            let calls = t.calls_json(&answer.calls, &meta.call_id(index), false);
                            ("tool_calls", answer.content.unwrap_or_default(), Some(calls))
                        }
                        _ => (reason, text, None),
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
