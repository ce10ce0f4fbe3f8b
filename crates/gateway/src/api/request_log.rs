//! One request's log line, status metric and usage record, written when its `RequestLog` is
//! dropped (so every path out of a request, early refusal or stream end, writes exactly one).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::state::AppState;
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
    pub billed: Option<(types::TenantId, String)>,
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
    fn bill(&self, tenant: types::TenantId, name: &str, total: Duration) {
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
