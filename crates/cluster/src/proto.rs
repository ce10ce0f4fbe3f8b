//! Control messages between the gateway and the workers (sealed by [`crate::link`]). Every
//! message about a request names its route: one attempt of one request on one pair of workers,
//! so a late message of an abandoned attempt can never be taken for a retry's.

use std::time::Instant;

use engine::{FinishReason, GenRequest, TokenEvent, Usage, ViolationKind};
use protocol::{PageRun, PoolStats, RequestError, RouteRequest};
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

/// A request as a worker receives it: one route (attempt) of the gateway's [`RouteRequest`],
/// which travels as itself and is read again on arrival (see its doc).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Spec {
    pub route: u64,
    pub request: RouteRequest,
    /// The router's names for the prompt's shareable pages (`router::cache_map`): a prefill
    /// worker attaches them to the pages it caches and reports them back. Hints only: a worker
    /// never trusts them for a hit.
    #[serde(default)]
    pub cache_tags: Vec<[u8; 16]>,
}

impl Spec {
    /// The worker's own engine request (the one conversion from the contract), without its
    /// constraint: the worker compiles that from `output` after its door check
    /// (`crate::constraints`).
    pub fn to_request(&self) -> GenRequest {
        let r = &self.request;
        GenRequest {
            id: r.id,
            tenant: r.tenant,
            prompt: r.prompt.clone(),
            max_tokens: r.max_tokens,
            sampling: r.sampling.clone(),
            stop_tokens: r.stop_tokens.clone(),
            deadline: r.deadline,
            cache_salt: r.cache_salt.clone(),
            constraint: None,
            route_tags: self.cache_tags.iter().map(|t| kv::RouteTag(*t)).collect(),
        }
    }

    /// When the route must be over on a worker (a generous bound when the gateway sent none).
    pub fn deadline(&self) -> Instant {
        self.request.deadline_or_default()
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct TicketWire {
    pub request: u64,
    pub tenant: u64,
    pub nonce: [u8; 16],
    pub pages: u32,
    pub tokens: u32,
    /// Leading prompt tokens the decode worker holds already (see [`wire::Ticket::held`]).
    #[serde(default)]
    pub held: u32,
}

impl From<&Ticket> for TicketWire {
    fn from(t: &Ticket) -> Self {
        TicketWire {
            request: t.request.0,
            tenant: t.tenant.0,
            nonce: t.nonce.0,
            pages: t.pages,
            tokens: t.tokens,
            held: t.held,
        }
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
            held: t.held,
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

/// A worker's counters, pushed to the gateway periodically (and served on its metrics port).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Stats {
    /// [`engine::EngineHandle::instance_id`]: roles sharing one engine report it once.
    pub engine: u64,
    /// The engine's pool and steps, summed over workers by [`PoolStats::absorb`] (one sum for
    /// every field, here and in `serve`).
    pub pool: PoolStats,
    pub reservations: u64,
    pub frames_sent: u64,
    pub frames_received: u64,
    #[serde(default)]
    pub kv_bytes_received: u64,
    #[serde(default)]
    pub held_prompt_tokens: u64,
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
    pub page_map: Vec<PageRun>,
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
        failure: RequestError,
    },
    /// Boxed: far larger than the per-route messages that share this enum.
    Stats(Box<Stats>),
    /// Prefill: route tags whose pages became cached or were dropped since the last report;
    /// on `reset`, `cached` is everything tagged now (a new link's first report).
    CacheTags {
        reset: bool,
        cached: Vec<[u8; 16]>,
        dropped: Vec<[u8; 16]>,
    },
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
            Stats(_) | CacheTags { .. } | Draining => None,
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
    use sampling::{SamplingParams, StopTokens};

    fn spec(deadline: Option<Instant>) -> Spec {
        Spec {
            route: 1,
            request: RouteRequest {
                id: RequestId(2),
                tenant: TenantId(3),
                prompt: vec![1, 2, 3],
                max_tokens: 4,
                sampling: SamplingParams::greedy(),
                stop_tokens: StopTokens::new([]),
                deadline,
                cache_salt: None,
                output: None,
            },
            cache_tags: Vec::new(),
        }
    }

    #[test]
    fn the_route_of_a_message_that_does_not_decode_is_still_read() {
        let deep = format!("{}0{}", "[".repeat(5000), "]".repeat(5000));
        let body = format!("{{\"Prefill\":{{\"spec\":{{\"route\":7,\"request\":{deep}}},\"ticket\":1}}}}");
        assert!(serde_json::from_str::<ToWorker>(&body).is_err());
        assert_eq!(route_of(body.as_bytes()), Some(7));
        let reserve = format!("{{\"Reserve\":{{\"request\":{deep},\"route\":9}}}}");
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
        s.request.output = Some(grammar::EncodedFormat::encode(&format).unwrap());
        let msg = serde_json::to_vec(&ToWorker::Prefill {
            spec: s,
            ticket: TicketWire { request: 2, tenant: 3, nonce: [0; 16], pages: 1, tokens: 3, held: 0 },
            decode_addr: "mem:x".into(),
        })
        .unwrap();
        let back: ToWorker = serde_json::from_slice(&msg).unwrap();
        let ToWorker::Prefill { spec, .. } = back else { panic!("a prefill message") };
        assert_eq!(spec.request.output.unwrap().decode().unwrap(), format);
    }

    #[test]
    fn the_workers_request_keeps_every_field_and_its_deadline() {
        let at = Instant::now() + std::time::Duration::from_millis(1500);
        let back: Spec = serde_json::from_slice(&serde_json::to_vec(&spec(Some(at))).unwrap()).unwrap();
        let req = back.to_request();
        assert_eq!(
            (req.id, req.tenant, req.prompt.as_slice(), req.max_tokens),
            (RequestId(2), TenantId(3), &[1, 2, 3][..], 4)
        );
        let left = req.deadline.unwrap().saturating_duration_since(Instant::now());
        assert!(left > std::time::Duration::from_millis(1000), "{left:?}");
        assert_eq!(back.deadline(), req.deadline.unwrap());
        assert!(spec(None).to_request().deadline.is_none());
    }

    #[test]
    fn a_failure_travels_as_its_kind() {
        let f =
            ToGateway::Failed { route: 4, failure: RequestError::IsolationViolation { kind: ViolationKind::BadMac } };
        let back: ToGateway = serde_json::from_slice(&serde_json::to_vec(&f).unwrap()).unwrap();
        let ToGateway::Failed { failure, .. } = back else { panic!("a failure") };
        assert_eq!(failure, RequestError::IsolationViolation { kind: ViolationKind::BadMac });
        let minted = br#"{"Failed":{"route":4,"failure":{"IsolationViolation":{"kind":"made_up"}}}}"#;
        assert!(serde_json::from_slice::<ToGateway>(minted).is_err());
        assert_eq!(route_of(minted), Some(4));
    }
}
