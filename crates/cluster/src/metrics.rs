//! A worker's counters and their exposition (served by the worker's metrics listener,
//! `gateway::http::serve_worker_metrics`); its names come from [`crate::metric_names`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use engine::{EngineHandle, ViolationKind};

use crate::metric_names::*;
use crate::proto::Stats;

/// Node links that failed, by reason ([`crate::link::refusal_reason`]): handshakes refused
/// (another secret, a reflection, a full handshake gate, a pairing mismatch, a timeout) and
/// established links that ended in an error (a record that failed to open: tampering).
#[derive(Default, Debug)]
pub struct LinkMetrics(Mutex<BTreeMap<&'static str, u64>>);

impl LinkMetrics {
    pub fn failure(&self, reason: &'static str) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()).entry(reason).or_default() += 1;
    }

    pub fn snapshot(&self) -> Vec<(String, u64)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }
}

/// Prometheus text of link failures; `labels` come before the reason (may be empty).
pub fn render_link_failures(labels: &str, failures: &[(String, u64)]) -> String {
    let mut out = format!("# TYPE {LINK_FAILURES_TOTAL} counter\n");
    for (reason, n) in failures {
        out.push_str(&format!("{LINK_FAILURES_TOTAL}{{{labels}reason=\"{reason}\"}} {n}\n"));
    }
    out
}

#[derive(Default)]
pub struct WorkerMetrics {
    pub reservations: AtomicU64,
    pub frames_sent: AtomicU64,
    pub frames_received: AtomicU64,
    pub transfers_completed: AtomicU64,
    /// Nanoseconds spent on KV links' handshakes and sealing frames (prefill), or opening and
    /// checking frames (decode).
    pub kv_crypto_ns: AtomicU64,
    violations: Mutex<BTreeMap<ViolationKind, u64>>,
    pub links: LinkMetrics,
}

impl WorkerMetrics {
    pub fn violation(&self, kind: ViolationKind) {
        *self.violations.lock().unwrap_or_else(|e| e.into_inner()).entry(kind).or_default() += 1;
    }

    pub fn snapshot(&self, engine: &EngineHandle) -> Stats {
        let e = engine.stats();
        Stats {
            engine: engine.instance_id(),
            pages_by_tenant: e.pages_by_tenant.iter().map(|(t, n)| (t.0, *n)).collect(),
            steps: e.steps,
            prefill_tokens: e.prefill_tokens,
            decode_tokens: e.decode_tokens,
            pages_total: e.pages_total,
            pages_used: e.pages_used,
            cached_pages: e.cached_pages,
            cached_pages_by_tenant: e.cached_pages_by_tenant.iter().map(|(t, n)| (t.0, *n)).collect(),
            queued: e.queued,
            running: e.running,
            reservations: self.reservations.load(Ordering::Relaxed),
            frames_sent: self.frames_sent.load(Ordering::Relaxed),
            frames_received: self.frames_received.load(Ordering::Relaxed),
            kv_crypto_ns: self.kv_crypto_ns.load(Ordering::Relaxed),
            transfers_completed: self.transfers_completed.load(Ordering::Relaxed),
            violations: self
                .violations
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(k, v)| (*k, *v))
                .collect(),
            link_failures: self.links.snapshot(),
        }
    }
}

/// Prometheus text of a worker's stats.
pub fn render(role: &str, s: &Stats) -> String {
    let mut out = String::new();
    let mut line = |name: &str, kind: &str, v: u64| {
        out.push_str(&format!("# TYPE {name} {kind}\n{name}{{role=\"{role}\"}} {v}\n"));
    };
    line(WORKER_RESERVATIONS_TOTAL, "counter", s.reservations);
    line(KV_FRAMES_SENT_TOTAL, "counter", s.frames_sent);
    line(KV_FRAMES_RECEIVED_TOTAL, "counter", s.frames_received);
    line(KV_TRANSFERS_COMPLETED_TOTAL, "counter", s.transfers_completed);
    line(KV_PAGES_USED, "gauge", s.pages_used as u64);
    line(KV_PAGES_TOTAL, "gauge", s.pages_total as u64);
    // Tenant ids only: this listener is the operator's, but names stay at the gateway.
    out.push_str(&format!(
        "# HELP {WORKER_PREFIX_CACHE_PAGES} Pages in this worker's prefix caches, by tenant id.\n# TYPE {WORKER_PREFIX_CACHE_PAGES} gauge\n"
    ));
    for (t, n) in &s.cached_pages_by_tenant {
        out.push_str(&format!("{WORKER_PREFIX_CACHE_PAGES}{{role=\"{role}\",tenant=\"{t}\"}} {n}\n"));
    }
    out.push_str(&format!(
        "# HELP {KV_CRYPTO_SECONDS_TOTAL} Time spent on KV link handshakes and sealing frames (prefill), or opening and checking frames (decode).\n\
         # TYPE {KV_CRYPTO_SECONDS_TOTAL} counter\n{KV_CRYPTO_SECONDS_TOTAL}{{role=\"{role}\"}} {}\n",
        s.kv_crypto_ns as f64 / 1e9
    ));
    out.push_str(&format!("# TYPE {ISOLATION_VIOLATIONS_TOTAL} counter\n"));
    for (k, v) in &s.violations {
        out.push_str(&format!("{ISOLATION_VIOLATIONS_TOTAL}{{role=\"{role}\",kind=\"{k}\"}} {v}\n"));
    }
    out.push_str(&render_link_failures(&format!("role=\"{role}\","), &s.link_failures));
    out
}
