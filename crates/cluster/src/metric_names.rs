//! Every metric name pagewarden exports, in one place: the gateway's exposition
//! (`gateway::metrics`) and each worker's (`crate::metrics`) spell names only through these
//! constants.
//!
//! Naming rules (Prometheus conventions):
//! * every name starts with `pagewarden_` and is lower snake case;
//! * counters end in `_total`; measurements carry their base unit (`_seconds`, `_bytes`);
//!   gauges have no suffix (one exception, older than these rules and kept for existing
//!   dashboards: the gauge `pagewarden_kv_pages_total`);
//! * a name means one thing wherever it appears: `pagewarden_kv_pages_used` is the pool of the
//!   process that exports it (the gateway's own in `serve`, a worker's on its listener); what
//!   the gateway reports about another node is `pagewarden_worker_*`, labelled by `worker`;
//! * labels: `tenant` (numeric id, or the name with `[metrics] tenant_names`), `role`, `kind`
//!   (a `ViolationKind` label, a fixed set), `reason`, `worker` (escaped: peers choose it),
//!   `status`; never prompt or output text.

/// counter; gateway: API requests by status.
pub const REQUESTS_TOTAL: &str = "pagewarden_requests_total";
/// histogram; gateway.
pub const TIME_TO_FIRST_TOKEN: &str = "pagewarden_time_to_first_token_seconds";
/// histogram; gateway.
pub const INTER_TOKEN_LATENCY: &str = "pagewarden_inter_token_latency_seconds";
/// gauge; gateway (engine stats).
pub const QUEUE_DEPTH: &str = "pagewarden_queue_depth";
/// gauge; gateway (engine stats).
pub const RUNNING_SEQUENCES: &str = "pagewarden_running_sequences";
/// gauge; gateway and each worker: its own pool.
pub const KV_PAGES_TOTAL: &str = "pagewarden_kv_pages_total";
/// gauge; gateway and each worker: its own pool.
pub const KV_PAGES_USED: &str = "pagewarden_kv_pages_used";
/// counter; gateway.
pub const REJECTIONS_TOTAL: &str = "pagewarden_rejections_total";
/// counter; gateway and each worker: the checks it failed.
pub const ISOLATION_VIOLATIONS_TOTAL: &str = "pagewarden_isolation_violations_total";
/// counter; gateway (engine stats).
pub const ENGINE_STEPS_TOTAL: &str = "pagewarden_engine_steps_total";
/// counter; gateway (engine stats).
pub const PREFILL_TOKENS_TOTAL: &str = "pagewarden_prefill_tokens_total";
/// counter; gateway (engine stats).
pub const DECODE_TOKENS_TOTAL: &str = "pagewarden_decode_tokens_total";
/// counter; gateway (engine stats): tokens guessed for speculative decoding and verified.
pub const DRAFT_TOKENS_TOTAL: &str = "pagewarden_draft_tokens_total";
/// counter; gateway (engine stats): guessed tokens kept (each also counts as decoded).
pub const DRAFT_TOKENS_ACCEPTED_TOTAL: &str = "pagewarden_draft_tokens_accepted_total";
/// gauge; gateway.
pub const CLUSTER_WORKERS: &str = "pagewarden_cluster_workers";
/// gauge; gateway: the live gateways it shares every tenant's limits with, itself included
/// (1 without membership).
pub const GATEWAYS_LIVE: &str = "pagewarden_gateways_live";
/// counter; gateway, by reason: membership entries it ignored (not sealed under an accepted
/// secret, not signed by a pinned node, stale, malformed), each entry value once.
pub const MEMBERSHIP_ENTRIES_REJECTED_TOTAL: &str = "pagewarden_membership_entries_rejected_total";
/// gauge; gateway, per worker.
pub const WORKER_INFLIGHT: &str = "pagewarden_worker_inflight";
/// gauge{worker, role}; gateway: route tags (pages of tenants' prompts) a worker reported
/// cached, which cache-aware routing matches requests against.
pub const WORKER_ROUTE_TAGS: &str = "pagewarden_worker_route_tags";
/// gauge{worker, role}; gateway: prompt tokens its routes in flight still compute on a prefill
/// worker (as estimated when routed; cache-aware routing weighs it against a cached prefix).
pub const WORKER_QUEUED_PROMPT_TOKENS: &str = "pagewarden_worker_queued_prompt_tokens";
/// gauge{worker, role}; gateway: KV tokens (prompt and `max_tokens`) its routes in flight
/// reserve on a decode worker (cache-aware routing weighs it against the KV it would send).
pub const WORKER_RESERVED_KV_TOKENS: &str = "pagewarden_worker_reserved_kv_tokens";
/// gauge; gateway, per worker.
pub const WORKER_PAGES_USED: &str = "pagewarden_worker_kv_pages_used";
/// counter; gateway, per worker (as reported).
pub const WORKER_VIOLATIONS_TOTAL: &str = "pagewarden_worker_isolation_violations_total";
/// counter{worker, role}; gateway: routes sent to a worker since it registered.
pub const WORKER_ROUTES_TOTAL: &str = "pagewarden_worker_routes_total";
/// counter{worker, role, direction}; gateway: control messages on a worker's link since it
/// registered (`to_worker`, `from_worker`).
pub const WORKER_CONTROL_MESSAGES_TOTAL: &str = "pagewarden_worker_control_messages_total";
/// counter; gateway.
pub const PREFIX_CACHE_LOOKUPS_TOTAL: &str = "pagewarden_prefix_cache_lookups_total";
/// counter; gateway.
pub const PREFIX_CACHE_HITS_TOTAL: &str = "pagewarden_prefix_cache_hits_total";
/// counter; gateway.
pub const PREFIX_CACHE_HIT_TOKENS_TOTAL: &str = "pagewarden_prefix_cache_hit_tokens_total";
/// gauge; gateway: summed over workers.
pub const PREFIX_CACHE_PAGES: &str = "pagewarden_prefix_cache_pages";
/// counter; worker.
pub const WORKER_RESERVATIONS_TOTAL: &str = "pagewarden_worker_reservations_total";
/// counter; worker (prefill).
pub const KV_FRAMES_SENT_TOTAL: &str = "pagewarden_kv_frames_sent_total";
/// counter; worker (decode).
pub const KV_FRAMES_RECEIVED_TOTAL: &str = "pagewarden_kv_frames_received_total";
/// counter; worker (decode): KV payload bytes of the frames it accepted.
pub const KV_BYTES_RECEIVED_TOTAL: &str = "pagewarden_kv_bytes_received_total";
/// counter; worker (decode): prompt tokens its reservations held from its own cache (not sent).
pub const KV_HELD_PROMPT_TOKENS_TOTAL: &str = "pagewarden_kv_held_prompt_tokens_total";
/// counter; worker (decode).
pub const KV_TRANSFERS_COMPLETED_TOTAL: &str = "pagewarden_kv_transfers_completed_total";
/// counter; gateway and each worker.
pub const LINK_FAILURES_TOTAL: &str = "pagewarden_link_failures_total";
/// counter; worker (decode): first frame to verified end, summed over completed transfers.
pub const KV_TRANSFER_SECONDS_TOTAL: &str = "pagewarden_kv_transfer_seconds_total";
/// counter; worker.
pub const KV_CRYPTO_SECONDS_TOTAL: &str = "pagewarden_kv_crypto_seconds_total";
/// gauge; worker, by tenant id.
pub const WORKER_PREFIX_CACHE_PAGES: &str = "pagewarden_worker_prefix_cache_pages";

/// counter; gateway: generation requests by tenant and outcome (a finish reason, `error`,
/// `cancelled`, `rejected`).
pub const TENANT_REQUESTS_TOTAL: &str = "pagewarden_tenant_requests_total";
/// counter; gateway: prompt tokens of requests that ran, by tenant (cached ones included).
pub const TENANT_PROMPT_TOKENS_TOTAL: &str = "pagewarden_tenant_prompt_tokens_total";
/// counter; gateway: prompt tokens taken from the tenant's prefix cache, by tenant.
pub const TENANT_CACHED_TOKENS_TOTAL: &str = "pagewarden_tenant_cached_tokens_total";
/// counter; gateway: tokens generated, by tenant.
pub const TENANT_COMPLETION_TOKENS_TOTAL: &str = "pagewarden_tenant_completion_tokens_total";

/// Every name above.
pub const ALL: &[&str] = &[
    TENANT_REQUESTS_TOTAL,
    TENANT_PROMPT_TOKENS_TOTAL,
    TENANT_CACHED_TOKENS_TOTAL,
    TENANT_COMPLETION_TOKENS_TOTAL,
    REQUESTS_TOTAL,
    TIME_TO_FIRST_TOKEN,
    INTER_TOKEN_LATENCY,
    QUEUE_DEPTH,
    RUNNING_SEQUENCES,
    KV_PAGES_TOTAL,
    KV_PAGES_USED,
    REJECTIONS_TOTAL,
    ISOLATION_VIOLATIONS_TOTAL,
    ENGINE_STEPS_TOTAL,
    PREFILL_TOKENS_TOTAL,
    DECODE_TOKENS_TOTAL,
    DRAFT_TOKENS_TOTAL,
    DRAFT_TOKENS_ACCEPTED_TOTAL,
    CLUSTER_WORKERS,
    GATEWAYS_LIVE,
    MEMBERSHIP_ENTRIES_REJECTED_TOTAL,
    WORKER_INFLIGHT,
    WORKER_ROUTE_TAGS,
    WORKER_QUEUED_PROMPT_TOKENS,
    WORKER_RESERVED_KV_TOKENS,
    WORKER_PAGES_USED,
    WORKER_VIOLATIONS_TOTAL,
    WORKER_ROUTES_TOTAL,
    WORKER_CONTROL_MESSAGES_TOTAL,
    PREFIX_CACHE_LOOKUPS_TOTAL,
    PREFIX_CACHE_HITS_TOTAL,
    PREFIX_CACHE_HIT_TOKENS_TOTAL,
    PREFIX_CACHE_PAGES,
    WORKER_RESERVATIONS_TOTAL,
    KV_FRAMES_SENT_TOTAL,
    KV_FRAMES_RECEIVED_TOTAL,
    KV_BYTES_RECEIVED_TOTAL,
    KV_HELD_PROMPT_TOKENS_TOTAL,
    KV_TRANSFERS_COMPLETED_TOTAL,
    LINK_FAILURES_TOTAL,
    KV_TRANSFER_SECONDS_TOTAL,
    KV_CRYPTO_SECONDS_TOTAL,
    WORKER_PREFIX_CACHE_PAGES,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_follows_the_rules_and_none_is_declared_twice() {
        let mut seen = std::collections::HashSet::new();
        for n in ALL {
            assert!(n.starts_with("pagewarden_"), "{n}");
            assert!(n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'), "{n}");
            assert!(seen.insert(*n), "{n} declared twice");
        }
    }
}
