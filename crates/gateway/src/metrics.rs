//! The gateway's metrics: live counters and histograms the API updates, and its exposition,
//! built per scrape through `cluster::exposition` (one registry, OpenMetrics text). Every
//! metric name is a constant of `cluster::metric_names` (with the naming rules); nothing else
//! spells one.
//!
//! Tenants are labelled by numeric id unless `[metrics] tenant_names` is set; every label value
//! is escaped by `cluster::exposition::LabelValue` (worker names come from registration, and a
//! peer must not be able to write exposition lines).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use cluster::exposition::{histogram, label, CounterFamily, Exposition};
use cluster::metric_names::*;
use prometheus_client::metrics::histogram::Histogram;
use protocol::{PoolStats, ViolationKind};

/// Registered workers by role, and each worker's load, pages and reported violations.
pub fn expose_workers(e: &mut Exposition, workers: &[cluster::WorkerInfo]) {
    let by_role = ["prefill", "decode"]
        .map(|role| (vec![label("role", role)], workers.iter().filter(|w| w.role == role).count() as i64));
    let id = |w: &cluster::WorkerInfo| vec![label("worker", &w.name), label("role", w.role)];
    let prefill = || workers.iter().filter(|w| w.role == "prefill");
    e.gauges(CLUSTER_WORKERS, "Workers registered with this gateway.", by_role)
        .gauges(WORKER_INFLIGHT, "Requests in flight on a worker.", workers.iter().map(|w| (id(w), w.inflight as i64)))
        .gauges(
            WORKER_ROUTE_TAGS,
            "Route tags (pages of tenants' prompts) a worker reported cached.",
            workers.iter().map(|w| (id(w), w.route_tags as i64)),
        )
        .gauges(
            WORKER_QUEUED_PROMPT_TOKENS,
            "Prompt tokens a prefill worker's routes in flight still compute.",
            prefill().map(|w| (id(w), w.queued_prompt_tokens as i64)),
        )
        .gauges(
            WORKER_RESERVED_KV_TOKENS,
            "KV tokens (prompt and max_tokens) a decode worker's routes in flight reserve.",
            workers.iter().filter(|w| w.role == "decode").map(|w| (id(w), w.reserved_kv_tokens as i64)),
        )
        .counters(
            WORKER_ROUTES_TOTAL,
            "Routes sent to a worker since it registered.",
            workers.iter().map(|w| (id(w), w.routes)),
        )
        .counters(
            WORKER_CONTROL_MESSAGES_TOTAL,
            "Control messages on a worker's link since it registered.",
            workers.iter().flat_map(|w| {
                [("to_worker", w.messages.0), ("from_worker", w.messages.1)].map(|(d, n)| {
                    let mut l = id(w);
                    l.push(label("direction", d));
                    (l, n)
                })
            }),
        )
        .gauges(
            WORKER_PAGES_USED,
            "KV pages a worker reports in use.",
            workers.iter().map(|w| (id(w), w.stats.pool.pages_used as i64)),
        )
        .counters(
            WORKER_VIOLATIONS_TOTAL,
            "Isolation violations a worker reports, by kind.",
            workers.iter().flat_map(|w| {
                w.stats.violations.iter().map(move |(kind, n)| {
                    let mut l = id(w);
                    l.push(label("kind", kind.label()));
                    (l, *n)
                })
            }),
        );
}

/// Membership entries this gateway ignored, by reason (counted by the node's membership
/// watch, each entry value once; exposed here with the gateway's other metrics).
#[derive(Debug, Default)]
pub struct RejectedEntries(Mutex<BTreeMap<&'static str, u64>>);

impl RejectedEntries {
    pub fn count(&self, reason: &'static str) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()).entry(reason).or_default() += 1;
    }

    pub fn expose(&self, e: &mut Exposition) {
        let rows: Vec<_> = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(reason, n)| (vec![label("reason", reason)], *n))
            .collect();
        e.counters(
            MEMBERSHIP_ENTRIES_REJECTED_TOTAL,
            "Membership entries ignored (not sealed under an accepted secret, not signed by a pinned node, stale or malformed), by reason.",
            rows,
        );
    }
}

/// The live gateways this one shares every tenant's limits with (see `crate::limits`).
pub fn expose_gateways(e: &mut Exposition, live: usize) {
    e.gauges(GATEWAYS_LIVE, "Live gateways sharing every tenant's limits, this one included.", [(vec![], live as i64)]);
}

const TTFT_BUCKETS: [f64; 12] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
const ITL_BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 5.0];

/// The server's live metrics.
#[derive(Debug)]
pub struct Metrics {
    requests: CounterFamily,
    rejections: CounterFamily,
    violations: CounterFamily,
    ttft: Histogram,
    itl: Histogram,
    /// Per tenant: (lookups, hits, hit tokens); labelled at scrape time, when the tenant's
    /// label (id or current name) is known.
    prefix: Mutex<BTreeMap<types::TenantId, [u64; 3]>>,
    /// Per tenant: its usage (labelled at scrape time, like `prefix`).
    usage: Mutex<BTreeMap<types::TenantId, TenantUsage>>,
}

/// One tenant's requests by outcome and tokens, as billed.
#[derive(Debug, Default)]
struct TenantUsage {
    requests: BTreeMap<&'static str, u64>,
    prompt: u64,
    cached: u64,
    completion: u64,
}

impl Default for Metrics {
    fn default() -> Self {
        let violations = CounterFamily::default();
        // Every kind is exported, 0 until one happens: a dashboard sees the series exist.
        for k in ViolationKind::ALL {
            let _ = violations.get_or_create(&vec![label("kind", k.label())]);
        }
        Metrics {
            requests: CounterFamily::default(),
            rejections: CounterFamily::default(),
            violations,
            ttft: histogram(&TTFT_BUCKETS),
            itl: histogram(&ITL_BUCKETS),
            prefix: Mutex::default(),
            usage: Mutex::default(),
        }
    }
}

impl Metrics {
    pub fn request(&self, status: u16) {
        self.requests.get_or_create(&vec![label("status", status.to_string())]).inc();
    }

    pub fn rejection(&self, reason: &'static str) {
        self.rejections.get_or_create(&vec![label("reason", reason)]).inc();
    }

    /// An ownership or integrity violation (docs/invariants.md, invariant 10).
    pub fn isolation_violation(&self, kind: ViolationKind) {
        self.violations.get_or_create(&vec![label("kind", kind.label())]).inc();
    }

    pub fn time_to_first_token(&self, d: Duration) {
        self.ttft.observe(d.as_secs_f64());
    }

    pub fn inter_token_latency(&self, d: Duration) {
        self.itl.observe(d.as_secs_f64());
    }

    /// One request's prefix-cache lookup: `cached_tokens` served from the tenant's cache.
    pub fn prefix_lookup(&self, tenant: types::TenantId, cached_tokens: usize) {
        let mut m = self.prefix.lock().unwrap_or_else(|e| e.into_inner());
        let c = m.entry(tenant).or_default();
        c[0] += 1;
        if cached_tokens > 0 {
            c[1] += 1;
            c[2] += cached_tokens as u64;
        }
    }

    /// `tenant`'s usage so far: (requests, prompt, cached, completion tokens).
    pub fn usage_of(&self, tenant: types::TenantId) -> [u64; 4] {
        let m = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&tenant).map_or([0; 4], |u| [u.requests.values().sum(), u.prompt, u.cached, u.completion])
    }

    /// Isolation violations the gateway saw, by kind (every kind, 0 included).
    pub fn violation_counts(&self) -> Vec<(&'static str, u64)> {
        ViolationKind::ALL
            .iter()
            .map(|k| (k.label(), self.violations.get_or_create(&vec![label("kind", k.label())]).get()))
            .collect()
    }

    /// One generation request of `tenant` ended with `outcome`, having used these tokens.
    pub fn tenant_usage(
        &self,
        tenant: types::TenantId,
        outcome: &'static str,
        prompt: usize,
        cached: usize,
        completion: usize,
    ) {
        let mut m = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let u = m.entry(tenant).or_default();
        *u.requests.entry(outcome).or_default() += 1;
        u.prompt += prompt as u64;
        u.cached += cached as u64;
        u.completion += completion as u64;
    }

    /// Adds the gateway's own families to `e`; `tenant_label` gives a tenant's label value
    /// (its id, or its name when `[metrics] tenant_names` is set).
    pub fn expose(&self, e: &mut Exposition, stats: &PoolStats, tenant_label: impl Fn(types::TenantId) -> String) {
        let one = |v: u64| [(vec![], v)];
        let gauge = |v: usize| [(vec![], v as i64)];
        e.live(REQUESTS_TOTAL, "API requests by HTTP status.", self.requests.clone())
            .live(REJECTIONS_TOTAL, "Refused requests by reason.", self.rejections.clone())
            .live(
                ISOLATION_VIOLATIONS_TOTAL,
                "Ownership or integrity violations (each failed its request).",
                self.violations.clone(),
            )
            .live(TIME_TO_FIRST_TOKEN, "Time from request arrival to the first token.", self.ttft.clone())
            .live(INTER_TOKEN_LATENCY, "Time between consecutive tokens of a request.", self.itl.clone())
            .gauges(QUEUE_DEPTH, "Requests waiting for KV pages.", gauge(stats.queued))
            .gauges(RUNNING_SEQUENCES, "Sequences prefilling or decoding.", gauge(stats.running))
            .gauges(KV_PAGES_TOTAL, "Pages in the KV pool.", gauge(stats.pages_total))
            .gauges(
                KV_PAGES_USED,
                "KV pages leased, by tenant.",
                stats.pages_by_tenant.iter().map(|(t, pages)| (vec![label("tenant", tenant_label(*t))], *pages as i64)),
            )
            .counters(ENGINE_STEPS_TOTAL, "Forward steps run.", one(stats.steps))
            .counters(PREFILL_TOKENS_TOTAL, "Prompt tokens prefilled.", one(stats.prefill_tokens))
            .counters(DECODE_TOKENS_TOTAL, "Tokens decoded.", one(stats.decode_tokens))
            .counters(DRAFT_TOKENS_TOTAL, "Guessed tokens verified (speculative decoding).", one(stats.draft_tokens))
            .counters(DRAFT_TOKENS_ACCEPTED_TOTAL, "Guessed tokens kept.", one(stats.draft_tokens_accepted));
        let prefix: Vec<(String, [u64; 3])> =
            self.prefix.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (tenant_label(*k), *v)).collect();
        for (i, (name, help)) in [
            (PREFIX_CACHE_LOOKUPS_TOTAL, "Prefix-cache lookups (one per prefilled request), by tenant."),
            (PREFIX_CACHE_HITS_TOTAL, "Prefix-cache lookups that reused at least one page, by tenant."),
            (PREFIX_CACHE_HIT_TOKENS_TOTAL, "Prompt tokens served from the prefix cache, by tenant."),
        ]
        .into_iter()
        .enumerate()
        {
            e.counters(name, help, prefix.iter().map(|(t, c)| (vec![label("tenant", t)], c[i])));
        }
        e.gauges(PREFIX_CACHE_PAGES, "KV pages held by the prefix caches.", gauge(stats.cached_pages));
        self.expose_usage(e, &tenant_label);
    }

    fn expose_usage(&self, e: &mut Exposition, tenant_label: &impl Fn(types::TenantId) -> String) {
        let usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let rows: Vec<(String, &TenantUsage)> = usage.iter().map(|(t, u)| (tenant_label(*t), u)).collect();
        let per_tenant = |f: fn(&TenantUsage) -> u64| rows.iter().map(move |(t, u)| (vec![label("tenant", t)], f(u)));
        e.counters(
            TENANT_REQUESTS_TOTAL,
            "Generation requests by tenant and outcome.",
            rows.iter().flat_map(|(t, u)| {
                u.requests.iter().map(move |(o, n)| (vec![label("tenant", t), label("outcome", o)], *n))
            }),
        )
        .counters(
            TENANT_PROMPT_TOKENS_TOTAL,
            "Prompt tokens of requests that ran, by tenant.",
            per_tenant(|u| u.prompt),
        )
        .counters(
            TENANT_CACHED_TOKENS_TOTAL,
            "Prompt tokens taken from the prefix cache, by tenant.",
            per_tenant(|u| u.cached),
        )
        .counters(TENANT_COMPLETION_TOKENS_TOTAL, "Tokens generated, by tenant.", per_tenant(|u| u.completion));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_rendered() {
        let m = Metrics::default();
        m.request(200);
        m.rejection("invalid_request");
        m.time_to_first_token(Duration::from_millis(30));
        m.prefix_lookup(types::TenantId(1), 0);
        m.prefix_lookup(types::TenantId(1), 32);
        m.tenant_usage(types::TenantId(1), "stop", 40, 32, 7);
        m.tenant_usage(types::TenantId(1), "rejected", 0, 0, 0);
        let stats = PoolStats { pages_by_tenant: vec![(types::TenantId(1), 3)], ..Default::default() };
        let mut e = Exposition::new();
        m.expose(&mut e, &stats, |t| format!("tenant-{}", t.0));
        let text = e.text();
        for name in [
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
            PREFIX_CACHE_LOOKUPS_TOTAL,
            PREFIX_CACHE_HITS_TOTAL,
            PREFIX_CACHE_HIT_TOKENS_TOTAL,
            PREFIX_CACHE_PAGES,
            TENANT_REQUESTS_TOTAL,
            TENANT_PROMPT_TOKENS_TOTAL,
            TENANT_CACHED_TOKENS_TOTAL,
            TENANT_COMPLETION_TOKENS_TOTAL,
        ] {
            let counter = name.strip_suffix("_total").map(|f| format!("# TYPE {f} counter"));
            let declared = text.contains(&format!("# TYPE {name} ")) || counter.is_some_and(|c| text.contains(&c));
            assert!(declared, "{name} missing");
        }
        assert!(text.contains("pagewarden_requests_total{status=\"200\"} 1"));
        assert!(text.contains("pagewarden_prefix_cache_lookups_total{tenant=\"tenant-1\"} 2"));
        assert!(text.contains("pagewarden_prefix_cache_hits_total{tenant=\"tenant-1\"} 1"));
        assert!(text.contains("pagewarden_prefix_cache_hit_tokens_total{tenant=\"tenant-1\"} 32"));
        assert!(text.contains("pagewarden_kv_pages_used{tenant=\"tenant-1\"} 3"));
        assert!(text.contains("pagewarden_tenant_requests_total{tenant=\"tenant-1\",outcome=\"stop\"} 1"), "{text}");
        assert!(text.contains("pagewarden_tenant_requests_total{tenant=\"tenant-1\",outcome=\"rejected\"} 1"));
        assert!(text.contains("pagewarden_tenant_prompt_tokens_total{tenant=\"tenant-1\"} 40"));
        assert!(text.contains("pagewarden_tenant_cached_tokens_total{tenant=\"tenant-1\"} 32"));
        assert!(text.contains("pagewarden_tenant_completion_tokens_total{tenant=\"tenant-1\"} 7"));
        assert!(text.contains("pagewarden_isolation_violations_total{kind=\"generation_mismatch\"} 0"));
        assert!(text.contains("pagewarden_time_to_first_token_seconds_bucket{le=\"0.05\"} 1"));
    }

    #[test]
    fn a_worker_name_cannot_write_exposition_lines() {
        let w = cluster::WorkerInfo {
            name: "evil\"} 1\npagewarden_isolation_violations_total{kind=\"x\"} 99\n#".into(),
            role: "decode",
            inflight: 0,
            routes: 0,
            messages: (0, 0),
            route_tags: 0,
            queued_prompt_tokens: 0,
            reserved_kv_tokens: 0,
            stats: cluster::proto::Stats { violations: vec![(ViolationKind::BadMac, 1)], ..Default::default() },
        };
        let mut e = Exposition::new();
        expose_workers(&mut e, &[w]);
        let text = e.text();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("pagewarden_"), "{line}");
            assert!(!line.starts_with("pagewarden_isolation_violations_total"), "{text}");
        }
        assert!(text.contains(r#"worker="evil\"} 1\npagewarden_isolation"#), "{text}");
        assert!(text.contains(r#"kind="bad_mac""#), "{text}");
    }
}
