//! Prometheus metrics in the text exposition format. Every metric name is a constant of
//! `cluster::metric_names` (with the naming rules); nothing else spells one.
//!
//! Tenants are labelled by numeric id unless `[metrics] tenant_names` is set, and every label
//! value that is not a fixed string of this crate (worker names from registration, kinds a
//! worker reports) goes through [`label`]: a peer must not be able to write exposition lines.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use cluster::metric_names::*;
use engine::EngineStats;

/// Registered workers by role, and each worker's load, pages and reported violations.
pub fn render_workers(workers: &[cluster::WorkerInfo]) -> String {
    let mut out = String::new();
    let _ =
        writeln!(out, "# HELP {CLUSTER_WORKERS} Workers registered with this gateway.\n# TYPE {CLUSTER_WORKERS} gauge");
    for role in ["prefill", "decode"] {
        let n = workers.iter().filter(|w| w.role == role).count();
        let _ = writeln!(out, "{CLUSTER_WORKERS}{{role=\"{role}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# TYPE {WORKER_INFLIGHT} gauge\n# TYPE {WORKER_PAGES_USED} gauge\n# TYPE {WORKER_VIOLATIONS_TOTAL} counter"
    );
    for w in workers {
        let l = format!("worker=\"{}\",role=\"{}\"", label(&w.name), label(w.role));
        let _ = writeln!(out, "{WORKER_INFLIGHT}{{{l}}} {}", w.inflight);
        let _ = writeln!(out, "{WORKER_PAGES_USED}{{{l}}} {}", w.stats.pages_used);
        for (kind, n) in &w.stats.violations {
            let _ = writeln!(out, "{WORKER_VIOLATIONS_TOTAL}{{{l},kind=\"{}\"}} {n}", kind.label());
        }
    }
    out
}

/// Kinds of isolation violation, always exported (0 until one happens).
pub const ISOLATION_KINDS: [&str; 11] = [
    "generation_mismatch",
    "unwritten_read",
    "owner_mismatch",
    "bad_mac",
    "out_of_order",
    "unknown_ticket",
    "wrong_ticket",
    "token_count",
    "prompt_digest",
    "incomplete",
    "truncated",
];

const TTFT_BUCKETS: [f64; 12] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
const ITL_BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 5.0];

#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            if secs <= *b {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sum_micros.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {}", c.load(Ordering::Relaxed));
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    requests: Mutex<BTreeMap<u16, u64>>,
    rejections: Mutex<BTreeMap<&'static str, u64>>,
    violations: Mutex<BTreeMap<&'static str, u64>>,
    ttft: Histogram,
    itl: Histogram,
    /// Per tenant: (lookups, hits, hit tokens).
    prefix: Mutex<BTreeMap<kv::TenantId, [u64; 3]>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::default(),
            rejections: Mutex::default(),
            violations: Mutex::new(ISOLATION_KINDS.iter().map(|k| (*k, 0)).collect()),
            ttft: Histogram::new(&TTFT_BUCKETS),
            itl: Histogram::new(&ITL_BUCKETS),
            prefix: Mutex::default(),
        }
    }
}

fn bump<K: Ord>(m: &Mutex<BTreeMap<K, u64>>, k: K) {
    *m.lock().unwrap_or_else(|e| e.into_inner()).entry(k).or_default() += 1;
}

/// The most characters of a label value kept (a longer one is cut, on a character boundary).
pub const MAX_LABEL_CHARS: usize = 64;

/// A label value, escaped as the exposition format wants (backslash, double quote, newline)
/// and cut to [`MAX_LABEL_CHARS`] characters: values a peer chose (a worker's name) can then
/// neither end the label early nor start a line of their own, nor grow the scrape without end.
/// Other control characters are replaced, so that no log viewer or terminal acts on them.
pub fn label(v: &str) -> String {
    let mut out = String::with_capacity(v.len().min(MAX_LABEL_CHARS) + 2);
    for c in v.chars().take(MAX_LABEL_CHARS) {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

impl Metrics {
    pub fn request(&self, status: u16) {
        bump(&self.requests, status);
    }

    pub fn rejection(&self, reason: &'static str) {
        bump(&self.rejections, reason);
    }

    /// Invariant 10: an ownership or integrity violation.
    pub fn isolation_violation(&self, kind: engine::ViolationKind) {
        bump(&self.violations, kind.label());
    }

    pub fn time_to_first_token(&self, d: Duration) {
        self.ttft.observe(d);
    }

    pub fn inter_token_latency(&self, d: Duration) {
        self.itl.observe(d);
    }

    /// One request's prefix-cache lookup: `cached_tokens` served from the tenant's cache.
    pub fn prefix_lookup(&self, tenant: kv::TenantId, cached_tokens: usize) {
        let mut m = self.prefix.lock().unwrap_or_else(|e| e.into_inner());
        let c = m.entry(tenant).or_default();
        c[0] += 1;
        if cached_tokens > 0 {
            c[1] += 1;
            c[2] += cached_tokens as u64;
        }
    }

    /// The exposition text; `tenant_label` gives a tenant's label value (its id, or its name
    /// when `[metrics] tenant_names` is set).
    pub fn render(&self, stats: &EngineStats, tenant_label: impl Fn(kv::TenantId) -> String) -> String {
        let mut out = String::new();
        let counter_map = |out: &mut String, name: &str, help: &str, key: &str, rows: Vec<(String, u64)>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (k, v) in rows {
                let _ = writeln!(out, "{name}{{{key}=\"{}\"}} {v}", label(&k));
            }
        };
        let snapshot = |m: &Mutex<BTreeMap<&'static str, u64>>| -> Vec<(String, u64)> {
            m.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (k.to_string(), *v)).collect()
        };
        let requests: Vec<(String, u64)> =
            self.requests.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (k.to_string(), *v)).collect();
        counter_map(&mut out, REQUESTS_TOTAL, "API requests by HTTP status.", "status", requests);
        counter_map(&mut out, REJECTIONS_TOTAL, "Refused requests by reason.", "reason", snapshot(&self.rejections));
        counter_map(
            &mut out,
            ISOLATION_VIOLATIONS_TOTAL,
            "Ownership or integrity violations (each failed its request).",
            "kind",
            snapshot(&self.violations),
        );
        self.ttft.render(&mut out, TIME_TO_FIRST_TOKEN, "Time from request arrival to the first token.");
        self.itl.render(&mut out, INTER_TOKEN_LATENCY, "Time between consecutive tokens of a request.");
        let gauge = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        gauge(&mut out, QUEUE_DEPTH, "Requests waiting for KV pages.", stats.queued as u64);
        gauge(&mut out, RUNNING_SEQUENCES, "Sequences prefilling or decoding.", stats.running as u64);
        gauge(&mut out, KV_PAGES_TOTAL, "Pages in the KV pool.", stats.pages_total as u64);
        let _ = writeln!(out, "# HELP {KV_PAGES_USED} KV pages leased, by tenant.\n# TYPE {KV_PAGES_USED} gauge");
        for (t, pages) in &stats.pages_by_tenant {
            let _ = writeln!(out, "{KV_PAGES_USED}{{tenant=\"{}\"}} {pages}", label(&tenant_label(*t)));
        }
        counter(&mut out, ENGINE_STEPS_TOTAL, "Forward steps run.", stats.steps);
        counter(&mut out, PREFILL_TOKENS_TOTAL, "Prompt tokens prefilled.", stats.prefill_tokens);
        counter(&mut out, DECODE_TOKENS_TOTAL, "Tokens decoded.", stats.decode_tokens);
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
            counter_map(&mut out, name, help, "tenant", prefix.iter().map(|(t, c)| (t.clone(), c[i])).collect());
        }
        gauge(&mut out, PREFIX_CACHE_PAGES, "KV pages held by the prefix caches.", stats.cached_pages as u64);
        out
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
        m.prefix_lookup(kv::TenantId(1), 0);
        m.prefix_lookup(kv::TenantId(1), 32);
        let stats = EngineStats { pages_by_tenant: vec![(kv::TenantId(1), 3)], ..Default::default() };
        let text = m.render(&stats, |t| format!("tenant-{}", t.0));
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
            PREFIX_CACHE_LOOKUPS_TOTAL,
            PREFIX_CACHE_HITS_TOTAL,
            PREFIX_CACHE_HIT_TOKENS_TOTAL,
            PREFIX_CACHE_PAGES,
        ] {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
        }
        assert!(text.contains("pagewarden_requests_total{status=\"200\"} 1"));
        assert!(text.contains("pagewarden_prefix_cache_lookups_total{tenant=\"tenant-1\"} 2"));
        assert!(text.contains("pagewarden_prefix_cache_hits_total{tenant=\"tenant-1\"} 1"));
        assert!(text.contains("pagewarden_prefix_cache_hit_tokens_total{tenant=\"tenant-1\"} 32"));
        assert!(text.contains("pagewarden_kv_pages_used{tenant=\"tenant-1\"} 3"));
        assert!(text.contains("pagewarden_isolation_violations_total{kind=\"generation_mismatch\"} 0"));
        assert!(text.contains("pagewarden_time_to_first_token_seconds_bucket{le=\"0.05\"} 1"));
    }

    #[test]
    fn label_values_are_escaped_and_capped() {
        assert_eq!(label(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(label("a\nb\rc"), "a\\nb?c");
        assert_eq!(label(&"é".repeat(100)).chars().count(), MAX_LABEL_CHARS);
    }

    #[test]
    fn a_worker_name_cannot_write_exposition_lines() {
        let w = cluster::WorkerInfo {
            name: "evil\"} 1\npagewarden_isolation_violations_total{kind=\"x\"} 99\n#".into(),
            role: "decode",
            inflight: 0,
            stats: cluster::proto::Stats { violations: vec![(engine::ViolationKind::BadMac, 1)], ..Default::default() },
        };
        let text = render_workers(&[w]);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("pagewarden_"), "{line}");
            assert!(!line.starts_with("pagewarden_isolation_violations_total"), "{text}");
        }
        assert!(text.contains(r#"worker="evil\"} 1\npagewarden_isolation"#), "{text}");
        assert!(text.contains(r#"kind="bad_mac""#), "{text}");
    }
}
