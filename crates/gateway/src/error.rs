//! Every error the API returns, in OpenAI's envelope
//! `{"error": {"message", "type", "param", "code"}}`, built by one function: [`ApiError::response`].

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use protocol::{AdmissionError, RequestError};
use serde_json::json;

/// An error on its way to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds, sent as `Retry-After` (429 and 503).
    pub retry_after: Option<u64>,
    /// Label for `pagewarden_rejections_total{reason}`.
    pub reason: &'static str,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), kind, param: None, code: None, retry_after: None, reason }
    }

    /// 400 for a bad field: `param` names it.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", "invalid_request", message);
        e.param = Some(param.to_string());
        e
    }

    /// 400 for a field the endpoint does not know: never silently ignored (a typo such as
    /// `temprature` would otherwise change nothing without a word).
    pub fn unknown_param(param: &str, path: &str) -> Self {
        let mut e = Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "unknown_parameter",
            format!("unrecognized request argument `{param}`: {path} does not take it"),
        );
        e.param = Some(param.to_string());
        e.code = Some("unknown_parameter");
        e
    }

    /// 400 for a known field asking for what this server does not do.
    pub fn unsupported_param(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", "unsupported_parameter", message);
        e.param = Some(param.to_string());
        e.code = Some("unsupported_parameter");
        e
    }

    /// 400 for a body that is not a JSON object.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", "malformed_json", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", "unauthorized", message);
        e.code = Some("invalid_api_key");
        e
    }

    pub fn model_not_found(model: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("the model `{model}` does not exist"),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    pub fn not_found(path: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", "not_found", format!("no route for {path}"))
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            format!("method {method} is not allowed on {path}"),
        )
    }

    pub fn body_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "body_too_large",
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    }

    /// 408: the body did not arrive within `[limits] body_timeout_ms`. The connection is
    /// closed after it (the rest of the body is never read).
    pub fn body_timeout(timeout_ms: u128) -> Self {
        let mut e = Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "body_timeout",
            format!("the request body did not arrive within {timeout_ms} ms"),
        );
        e.code = Some("body_timeout");
        e
    }

    /// 404 for `/metrics` on the public listener when no `[metrics]` access is configured.
    pub fn metrics_disabled() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            "/metrics is not served on this listener: set `[metrics] listen` (a listener of its own) or \
             `[metrics] token_file` (a bearer token for this one) in the config",
        )
    }

    /// 429: a tenant limit.
    pub fn rate_limited(reason: &'static str, message: impl Into<String>, retry_after: u64) -> Self {
        let mut e = Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", reason, message);
        e.code = Some("rate_limit_exceeded");
        e.retry_after = Some(retry_after.max(1));
        e
    }

    /// 503: overloaded or draining.
    pub fn unavailable(reason: &'static str, message: impl Into<String>, retry_after: u64) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", reason, message);
        e.retry_after = Some(retry_after.max(1));
        e
    }

    pub fn draining() -> Self {
        Self::unavailable("draining", "the server is shutting down", 5)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "internal", message)
    }

    /// A refusal at the engine's door. `prompt_param` is `messages` or `prompt`.
    pub fn admission(e: &AdmissionError, prompt_param: &str) -> Self {
        match e {
            AdmissionError::EmptyPrompt => Self::invalid_param(prompt_param, e.to_string()),
            AdmissionError::ZeroMaxTokens => Self::invalid_param("max_tokens", e.to_string()),
            AdmissionError::ContextLengthExceeded { .. } | AdmissionError::ExceedsPool { .. } => {
                let mut err = Self::invalid_param(prompt_param, e.to_string());
                err.code = Some("context_length_exceeded");
                err.reason = "context_length_exceeded";
                err
            }
            AdmissionError::InvalidToken { .. } => Self::invalid_param(prompt_param, e.to_string()),
            AdmissionError::QueueFull { .. } => Self::unavailable("queue_full", e.to_string(), 2),
            AdmissionError::ShuttingDown => Self::draining(),
        }
    }

    /// A failure of an admitted request before anything was sent to the client.
    pub fn failed(e: &RequestError) -> Self {
        match e {
            RequestError::QueueTimeout => Self::unavailable("queue_timeout", e.to_string(), 5),
            RequestError::ShuttingDown => Self::draining(),
            RequestError::DeadlineExceeded => {
                let mut err = Self::new(StatusCode::GATEWAY_TIMEOUT, "server_error", "deadline", e.to_string());
                err.code = Some("timeout");
                err
            }
            RequestError::Refused(a) => Self::admission(a, "messages"),
            RequestError::Unavailable(_) => Self::unavailable("no_worker", e.to_string(), 2),
            RequestError::TenantRevoked => {
                let mut err = Self::unauthorized(e.to_string());
                err.reason = "key_revoked";
                err
            }
            RequestError::IsolationViolation { .. } | RequestError::Internal(_) => Self::internal(e.to_string()),
        }
    }

    /// The envelope, also used as the payload of an SSE error event.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// The one place an error response is built.
    pub fn response(&self) -> Response {
        let mut resp = Response::new(Body::from(self.body().to_string()));
        *resp.status_mut() = self.status;
        let h = resp.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(s) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_length_errors_carry_the_code_and_numbers() {
        let e = AdmissionError::ContextLengthExceeded { prompt: 10, max_tokens: 5, needed: 15, context: 12 };
        let api = ApiError::admission(&e, "messages");
        assert_eq!(api.status, StatusCode::BAD_REQUEST);
        assert_eq!(api.code, Some("context_length_exceeded"));
        assert!(api.message.contains("12") && api.message.contains("15"));
        let body = api.body();
        assert_eq!(body["error"]["param"], "messages");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn limits_carry_retry_after() {
        let r = ApiError::rate_limited("tenant_concurrency", "x", 0).response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers().get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("1"));
    }
}
