//! Control messages between the gateway and the workers (sealed by [`crate::link`]). Every
//! message about a request names its route: one attempt of one request on one pair of workers,
//! so a late message of an abandoned attempt can never be taken for a retry's.

use std::time::{Duration, Instant};

use engine::{AdmissionError, EngineError, FinishReason, GenRequest, TokenEvent, Usage, ViolationKind};
use grammar::EncodedFormat;
use sampling::{RawSamplingParams, SamplingParams, StopTokens};
use serde::{Deserialize, Serialize};
use types::{RequestId, TenantId};
use wire::{Ticket, TicketNonce};

/// Sent by a worker right after the handshake.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Register {
    pub name: String,
    /// Where prefill workers send this decode worker's KV frames.
    pub kv_addr: Option<String>,
    pub context: usize,
    pub capacity_tokens: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Registered {
    /// Accepted, with the gateway's tenant table: the worker applies it before it serves.
    Accepted(TenantTable),
    Rejected(String),
}

/// The gateway's tenants as workers need them: who may run, and an epoch per tenant that
/// changes when its key does. A worker drops the cached prefixes (and ends the requests) of a
/// tenant that left the table or whose epoch changed. Ids are never reused, so a cache keyed
/// by id can never answer another tenant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantTable {
    pub tenants: Vec<TenantEntry>,
    /// The most of a decode pool one tenant may hold while the table has several tenants.
    pub max_share: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantEntry {
    pub id: u64,
    /// A digest of the tenant's key digest: equal epochs, same key.
    pub epoch: [u8; 16],
}

/// A route's time limit when the request has no deadline of its own.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(600);

/// A request as a worker receives it; the worker builds (and so re-validates) its own
/// [`GenRequest`] from it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Spec {
    pub route: u64,
    pub request: u64,
    pub tenant: u64,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    /// Validated again by the worker ([`Spec::to_request`]).
    pub sampling: RawSamplingParams,
    pub stop_tokens: Vec<u32>,
    /// Time left until the request's deadline, when it has one.
    pub deadline_ms: Option<u64>,
    /// The client's prefix-cache salt; the prefill worker derives the scope from `tenant`
    /// first, so the salt only narrows.
    #[serde(default)]
    pub cache_salt: Option<String>,
    /// The shape the output must have, as an opaque bounded string: whatever a tenant's schema
    /// holds, this message stays shallow, and a format that does not decode fails this route
    /// alone ([`Spec::output_format`]).
    #[serde(default)]
    pub output: Option<EncodedFormat>,
}

impl Spec {
    /// The route's spec; `Err` when the request's output format cannot travel (the gateway's
    /// validation refuses such a format first, so this is that request's error alone).
    pub fn of(route: u64, req: &GenRequest) -> Result<Spec, grammar::GrammarError> {
        let output = req.constraint.as_ref().map(|c| EncodedFormat::encode(c.format())).transpose()?;
        Ok(Spec {
            route,
            request: req.id.0,
            tenant: req.tenant.0,
            prompt: req.prompt.clone(),
            max_tokens: req.max_tokens,
            sampling: req.sampling.to_raw(),
            stop_tokens: req.stop_tokens.iter().collect(),
            deadline_ms: req.deadline.map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64),
            cache_salt: req.cache_salt.clone(),
            output,
        })
    }

    /// The worker's own request, without its constraint (compiled after the worker's door
    /// check: `crate::constraints`); sampling parameters are validated again here.
    pub fn to_request(&self) -> Result<GenRequest, String> {
        let sampling = SamplingParams::new(self.sampling.clone()).map_err(|e| e.to_string())?;
        Ok(GenRequest {
            id: RequestId(self.request),
            tenant: TenantId(self.tenant),
            prompt: self.prompt.clone(),
            max_tokens: self.max_tokens,
            sampling,
            stop_tokens: StopTokens::new(self.stop_tokens.iter().copied()),
            deadline: self.deadline_ms.map(after_ms),
            cache_salt: self.cache_salt.clone(),
            constraint: None,
        })
    }

    /// When the route must be over on a worker (a generous bound when the gateway sent none).
    pub fn deadline(&self) -> Instant {
        self.deadline_ms.map_or_else(|| Instant::now() + DEFAULT_DEADLINE, after_ms)
    }
}

/// `ms` from now. A peer may send any `u64`; past what `Instant` can hold (centuries), the
/// deadline is a year away, which no route outlives, instead of an overflow panic.
fn after_ms(ms: u64) -> Instant {
    let now = Instant::now();
    now.checked_add(Duration::from_millis(ms)).unwrap_or_else(|| now + FAR_DEADLINE)
}

const FAR_DEADLINE: Duration = Duration::from_secs(365 * 24 * 3600);

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct TicketWire {
    pub request: u64,
    pub tenant: u64,
    pub nonce: [u8; 16],
    pub pages: u32,
    pub tokens: u32,
}

impl From<&Ticket> for TicketWire {
    fn from(t: &Ticket) -> Self {
        TicketWire { request: t.request.0, tenant: t.tenant.0, nonce: t.nonce.0, pages: t.pages, tokens: t.tokens }
    }
}

impl From<TicketWire> for Ticket {
    fn from(t: TicketWire) -> Self {
        Ticket {
            request: RequestId(t.request),
            tenant: TenantId(t.tenant),
            nonce: TicketNonce(t.nonce),
            pages: t.pages,
            tokens: t.tokens,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToWorker {
    /// Decode: reserve the whole sequence and answer with a ticket.
    Reserve(Spec),
    /// Prefill: compute the prompt and send its KV to `decode_addr` under `ticket` (the frames'
    /// key is derived on both ends of the KV link, never sent).
    Prefill { spec: Spec, ticket: TicketWire, decode_addr: String },
    /// Stop the route and free everything it holds.
    Cancel { route: u64 },
    /// The gateway's tenant table changed (a tenant added, removed, or its key rotated).
    Tenants(TenantTable),
}

/// Why a route failed, on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Failure {
    /// The worker's own door refused the request.
    Refused(AdmissionError),
    QueueTimeout,
    DeadlineExceeded,
    ShuttingDown,
    /// An integrity or ownership check failed; `kind` labels the violations counter (one of
    /// a fixed set: a peer cannot mint labels).
    Violation(ViolationKind),
    /// The request's tenant was removed or its key rotated.
    Revoked,
    /// The prefill worker could not reach the decode worker (retryable).
    Unreachable(String),
    Internal(String),
}

impl Failure {
    pub fn of(e: &EngineError) -> Failure {
        match e {
            EngineError::QueueTimeout => Failure::QueueTimeout,
            EngineError::DeadlineExceeded => Failure::DeadlineExceeded,
            EngineError::ShuttingDown => Failure::ShuttingDown,
            EngineError::IsolationViolation { kind } => Failure::Violation(*kind),
            EngineError::TenantRevoked => Failure::Revoked,
            EngineError::Refused(a) => Failure::Refused(a.clone()),
            EngineError::Unavailable(m) => Failure::Unreachable(m.clone()),
            EngineError::Internal(m) => Failure::Internal(m.clone()),
        }
    }

    pub fn to_engine(&self) -> EngineError {
        match self {
            Failure::Refused(a) => EngineError::Refused(a.clone()),
            Failure::QueueTimeout => EngineError::QueueTimeout,
            Failure::DeadlineExceeded => EngineError::DeadlineExceeded,
            Failure::ShuttingDown => EngineError::ShuttingDown,
            Failure::Violation(kind) => EngineError::IsolationViolation { kind: *kind },
            Failure::Revoked => EngineError::TenantRevoked,
            Failure::Unreachable(m) => EngineError::Unavailable(m.clone()),
            Failure::Internal(m) => EngineError::Internal(m.clone()),
        }
    }
}

/// A worker's counters, pushed to the gateway periodically (and served on its metrics port).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Stats {
    /// [`engine::EngineHandle::instance_id`]: roles sharing one engine report it once.
    pub engine: u64,
    pub pages_by_tenant: Vec<(u64, usize)>,
    pub steps: u64,
    pub prefill_tokens: u64,
    pub decode_tokens: u64,
    pub pages_total: usize,
    pub pages_used: usize,
    /// Prompt tokens served from the prefix cache.
    #[serde(default)]
    pub cached_tokens: u64,
    /// Pages held by the worker's prefix cache.
    #[serde(default)]
    pub cached_pages: usize,
    /// The same, per tenant id.
    #[serde(default)]
    pub cached_pages_by_tenant: Vec<(u64, usize)>,
    pub queued: usize,
    pub running: usize,
    pub reservations: u64,
    pub frames_sent: u64,
    pub frames_received: u64,
    #[serde(default)]
    pub kv_crypto_ns: u64,
    pub transfers_completed: u64,
    /// Nanoseconds from a transfer's first frame to its verified end, summed over transfers.
    #[serde(default)]
    pub transfer_ns: u64,
    pub violations: Vec<(ViolationKind, u64)>,
    /// Handshakes and links this worker refused, by reason.
    #[serde(default)]
    pub link_failures: Vec<(String, u64)>,
    /// Who holds each page of the worker's pools, run-length coded (the admin dashboard).
    #[serde(default)]
    pub page_map: Vec<engine::PageRun>,
}

impl Stats {
    /// The engine's part of these stats, as the gateway sums them over workers
    /// ([`EngineStats::absorb`]: one sum for every field, here and in `serve`).
    pub fn engine_stats(&self) -> engine::EngineStats {
        let tenants = |v: &[(u64, usize)]| v.iter().map(|&(t, n)| (types::TenantId(t), n)).collect();
        engine::EngineStats {
            queued: self.queued,
            running: self.running,
            pages_total: self.pages_total,
            pages_used: self.pages_used,
            pages_by_tenant: tenants(&self.pages_by_tenant),
            steps: self.steps,
            prefill_tokens: self.prefill_tokens,
            decode_tokens: self.decode_tokens,
            cached_tokens: self.cached_tokens,
            cached_pages: self.cached_pages,
            cached_pages_by_tenant: tenants(&self.cached_pages_by_tenant),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToGateway {
    /// Decode: pages reserved; the ticket to send the KV under.
    Reserved {
        route: u64,
        ticket: TicketWire,
    },
    /// Prefill: the first sampled token (held by the gateway until decode verified the KV).
    First {
        route: u64,
        token: TokenEvent,
        /// Prompt tokens the prefill worker served from its prefix cache, when it consulted
        /// one (usage only: the whole prompt's KV is sent and verified either way).
        #[serde(default)]
        cached_tokens: Option<usize>,
    },
    /// Prefill: every frame was sent.
    Sent {
        route: u64,
        frames: u32,
    },
    /// Decode: the transfer was verified complete; decoding starts after `first`.
    Verified {
        route: u64,
        first: u32,
    },
    Token {
        route: u64,
        token: TokenEvent,
    },
    Finished {
        route: u64,
        reason: FinishReason,
        usage: (usize, usize),
    },
    Failed {
        route: u64,
        failure: Failure,
    },
    /// Boxed: far larger than the per-route messages that share this enum.
    Stats(Box<Stats>),
    /// The worker is shutting down: it finishes the routes it has and takes no new one.
    Draining,
}

impl ToGateway {
    pub fn route(&self) -> Option<u64> {
        use ToGateway::*;
        match self {
            Reserved { route, .. }
            | First { route, .. }
            | Sent { route, .. }
            | Verified { route, .. }
            | Token { route, .. }
            | Finished { route, .. }
            | Failed { route, .. } => Some(*route),
            Stats(_) | Draining => None,
        }
    }

    pub fn finished(route: u64, reason: FinishReason, usage: Usage) -> ToGateway {
        ToGateway::Finished { route, reason, usage: (usage.prompt_tokens, usage.completion_tokens) }
    }
}

/// The route a control message names, read without decoding the rest of it: when a message
/// opens but does not decode (a peer's bug, or a value no bound caught), only that route
/// fails and the link goes on. serde_json skips the fields it ignores without recursion, so
/// no nesting inside them can stop this.
pub fn route_of(body: &[u8]) -> Option<u64> {
    #[derive(Deserialize)]
    struct Probe {
        #[serde(default)]
        route: Option<u64>,
        #[serde(default)]
        spec: Option<SpecProbe>,
    }
    #[derive(Deserialize)]
    struct SpecProbe {
        route: u64,
    }
    // Every message about a route is a one-key object (its variant) holding `route` or a
    // `spec` that does.
    let m: std::collections::HashMap<String, Probe> = serde_json::from_slice(body).ok()?;
    let mut it = m.into_values();
    let p = it.next()?;
    if it.next().is_some() {
        return None;
    }
    p.route.or(p.spec.map(|s| s.route))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_stats_sum_every_engine_field_the_cache_ones_included() {
        let a = Stats {
            cached_tokens: 40,
            cached_pages: 3,
            cached_pages_by_tenant: vec![(1, 2), (2, 1)],
            pages_by_tenant: vec![(1, 5)],
            prefill_tokens: 7,
            ..Default::default()
        };
        let b = Stats { cached_tokens: 2, cached_pages: 1, cached_pages_by_tenant: vec![(2, 1)], ..Default::default() };
        let mut sum = engine::EngineStats::default();
        sum.absorb(&a.engine_stats());
        sum.absorb(&b.engine_stats());
        assert_eq!((sum.cached_tokens, sum.cached_pages, sum.prefill_tokens), (42, 4, 7));
        assert_eq!(sum.cached_pages_by_tenant, vec![(types::TenantId(1), 2), (types::TenantId(2), 2)]);
        assert_eq!(sum.pages_by_tenant, vec![(types::TenantId(1), 5)]);
    }

    fn spec(deadline_ms: Option<u64>) -> Spec {
        Spec {
            route: 1,
            request: 2,
            tenant: 3,
            prompt: vec![1, 2, 3],
            max_tokens: 4,
            sampling: RawSamplingParams::default(),
            stop_tokens: vec![],
            deadline_ms,
            cache_salt: None,
            output: None,
        }
    }

    #[test]
    fn a_deadline_past_what_an_instant_holds_is_far_away_instead_of_a_panic() {
        let s = spec(Some(u64::MAX));
        let req = s.to_request().expect("valid sampling");
        let far = Instant::now() + Duration::from_secs(300 * 24 * 3600);
        assert!(req.deadline.expect("has a deadline") > far);
        assert!(s.deadline() > far);
    }

    #[test]
    fn the_route_of_a_message_that_does_not_decode_is_still_read() {
        let deep = format!("{}0{}", "[".repeat(5000), "]".repeat(5000));
        let body = format!("{{\"Prefill\":{{\"spec\":{{\"route\":7,\"output\":{deep}}},\"ticket\":1}}}}");
        assert!(serde_json::from_str::<ToWorker>(&body).is_err());
        assert_eq!(route_of(body.as_bytes()), Some(7));
        let reserve = format!("{{\"Reserve\":{{\"output\":{deep},\"route\":9}}}}");
        assert_eq!(route_of(reserve.as_bytes()), Some(9));
        let token = serde_json::to_vec(&ToGateway::Sent { route: 11, frames: 2 }).unwrap();
        assert_eq!(route_of(&token), Some(11));
        assert_eq!(route_of(br#""Draining""#), None);
        assert_eq!(route_of(b"garbage"), None);
    }

    #[test]
    fn a_spec_carries_its_output_format_as_one_opaque_string() {
        let mut s = spec(None);
        let deep = (0..grammar::MAX_SCHEMA_DEPTH - 1).fold(serde_json::json!(0), |v, _| serde_json::json!([v]));
        let format =
            grammar::OutputFormat::JsonSchema { schema: serde_json::json!({"type": "string", "default": deep}) };
        s.output = Some(EncodedFormat::encode(&format).unwrap());
        let msg = serde_json::to_vec(&ToWorker::Prefill {
            spec: s,
            ticket: TicketWire { request: 2, tenant: 3, nonce: [0; 16], pages: 1, tokens: 3 },
            decode_addr: "mem:x".into(),
        })
        .unwrap();
        let back: ToWorker = serde_json::from_slice(&msg).unwrap();
        let ToWorker::Prefill { spec, .. } = back else { panic!("a prefill message") };
        assert_eq!(spec.output.unwrap().decode().unwrap(), format);
    }

    #[test]
    fn a_deadline_is_the_time_left_the_gateway_sent() {
        let s = spec(Some(1500));
        let left = s.deadline().saturating_duration_since(Instant::now());
        assert!(left <= Duration::from_millis(1500) && left > Duration::from_millis(1000), "{left:?}");
        let none = spec(None).deadline().saturating_duration_since(Instant::now());
        assert!(none > DEFAULT_DEADLINE - Duration::from_secs(5));
    }
}
