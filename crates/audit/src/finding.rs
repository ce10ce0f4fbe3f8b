//! What the audit records: each finding (kind, evidence) and each request's row. Every phase
//! writes these; the report only reads them.

use serde::Serialize;

use crate::client::{Exchange, Outcome};

/// Kinds of finding. Whether one fails the audit is its `fails` field: leaks, divergences,
/// leaked pages, over-long answers, under-counts, cross-tenant cache hits, side channels, a
/// probe that could not run to power, a tokenizer or window the target lies about, refusals
/// not repeated and checks not verified fail; the rest are reported for the operator.
pub mod kind {
    pub const CROSS_TENANT_CANARY: &str = "cross_tenant_canary";
    /// Another request's canary of the same tenant: still leaked KV (there is no legitimate
    /// way for a response to know it).
    pub const CROSS_REQUEST_CANARY: &str = "cross_request_canary";
    /// A fragment of another canary inside a garbled copy of the request's own canary (see
    /// `CanaryIndex::echoes_own`): reported, not failed.
    pub const FRAGMENT_IN_OWN_CANARY: &str = "fragment_in_own_canary_copy";
    pub const DIVERGENCE: &str = "divergence";
    pub const LEAKED_PAGES: &str = "leaked_pages";
    /// A 200 for a request over the window by the audit's own count of its prompt.
    pub const OVERLONG_ACCEPTED: &str = "overlong_accepted";
    /// A response whose `usage.prompt_tokens` is smaller than the prompt sent, by the audit's
    /// own count: the server ran something other than what it was sent (the incident's
    /// one-token placeholder).
    pub const PROMPT_UNDERCOUNTED: &str = "prompt_tokens_undercounted";
    /// A category of requests with too few re-run comparisons to vouch for it.
    pub const TOO_FEW_COMPARISONS: &str = "too_few_comparisons";
    /// An over-long prompt refused otherwise than 400 `context_length_exceeded`.
    pub const OVERLONG_OTHER_ANSWER: &str = "overlong_other_answer";
    /// A request that fits was refused with 400.
    pub const UNEXPECTED_400: &str = "unexpected_400";
    /// `finish_reason: length` with fewer tokens than `max_tokens` (a truncated "success").
    pub const SHORT_LENGTH: &str = "length_before_max_tokens";
    pub const VIOLATIONS_REPORTED: &str = "isolation_violations_reported";
    pub const METRICS_UNAVAILABLE: &str = "metrics_unavailable";
    /// The timing probe: a request of tenant B on a prefix it never sent reported cached
    /// tokens (another tenant's KV served to it).
    pub const CROSS_TENANT_CACHE_HIT: &str = "cross_tenant_cache_hit";
    /// The timing probe: tenant B tells the prefixes tenant A has cached from fresh ones by time
    /// to first token (the AUC's 95 % interval lies above the target, or, with enough samples,
    /// its upper bound does).
    pub const TIMING_SIDE_CHANNEL: &str = "timing_side_channel";
    /// The timing probe's B tells the end of another tenant's prompt, sent past a gap, from
    /// fresh text: a cache that reuses chunks that are not a prefix, across tenants.
    pub const CHUNK_REUSE_SIDE_CHANNEL: &str = "chunk_reuse_side_channel";
    /// Probe requests the server did not answer (after 429s and `Retry-After` were honoured):
    /// an unanswered probe proves nothing, and the burden of proof is on the server.
    pub const PROBE_UNANSWERED: &str = "probe_unanswered";
    /// Too few completed probe samples to show the AUC under the target (failing unless the
    /// operator waived it: `--skip-check probe-power`), or no probe possible (one tenant).
    pub const PROBE_UNDERPOWERED: &str = "probe_underpowered";
    /// The target's tokenizer endpoint counts otherwise than the model file the audit holds
    /// for the model it serves.
    pub const TOKENIZER_DISAGREES: &str = "tokenizer_disagrees";
    /// The target declares a context window larger than its model file's.
    pub const WINDOW_OVERSTATED: &str = "context_window_overstated";
    /// Without any tokenizer: a reported `prompt_tokens` below what the prompt's bytes need.
    pub const PROMPT_IMPLAUSIBLE: &str = "prompt_tokens_implausible";
    /// A request that must be refused (over the window, over budget) was refused under load
    /// and answered 200 alone, or refused alone with another class of status.
    pub const REFUSAL_NOT_REPEATED: &str = "refusal_not_repeated";
    /// A check that found nothing to measure (no page gauge readable after the run, no
    /// request that must be refused): failing unless the operator skipped it by name.
    pub const NOT_VERIFIED: &str = "not_verified";
}

/// One thing the audit found.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Finding {
    pub kind: &'static str,
    /// Whether it fails the audit.
    pub fails: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scenario: Option<&'static str>,
    pub detail: String,
    /// Leaks: the canary found, its owner and the request it was sent in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary_owner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary_request: Option<usize>,
    /// Where it was found ("response text", "stream text", "raw body", with "re-run" when
    /// found in the isolated second pass).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The matched text with a little of the response around it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub whole: Option<bool>,
    /// Divergences: first differing token position and the log-prob difference there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<f64>,
}

/// One request as the report lists it (no prompt or output text).
#[derive(Debug, Clone, Serialize)]
pub struct RequestRow {
    pub id: usize,
    /// "main"; "top_up" for a re-run request sent again under load because its first answer
    /// carried nothing to compare; "rerun" for the isolated second pass; "probe" for the
    /// timing probe.
    pub phase: &'static str,
    pub tenant: String,
    pub scenario: &'static str,
    pub endpoint: &'static str,
    pub stream: bool,
    pub max_tokens: usize,
    pub canaries: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disconnect_after: Option<usize>,
    pub status: Option<u16>,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<u64>,
    /// Prompt tokens the server took from its prefix cache, when it reports them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    pub events: usize,
    pub start_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    pub total_ms: f64,
}

impl RequestRow {
    /// The row of request `id`: what its exchange says filled in, the request's shape (stream,
    /// max_tokens, canaries, disconnect) left at "none" for the caller to set.
    pub(crate) fn answered(
        id: usize,
        phase: &'static str,
        tenant: String,
        scenario: &'static str,
        endpoint: &'static str,
        ex: &Exchange,
    ) -> RequestRow {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        RequestRow {
            id,
            phase,
            tenant,
            scenario,
            endpoint,
            stream: false,
            max_tokens: 0,
            canaries: 0,
            disconnect_after: None,
            status: ex.status,
            outcome: ex.outcome,
            error_kind: ex.error_kind.clone(),
            finish_reason: ex.finish_reason.clone(),
            prompt_tokens: ex.prompt_tokens,
            completion_tokens: ex.completion_tokens,
            cached_tokens: ex.cached_tokens,
            events: ex.events,
            start_ms: ms(ex.started),
            ttft_ms: ex.ttft.map(ms),
            total_ms: ms(ex.total),
        }
    }
}
