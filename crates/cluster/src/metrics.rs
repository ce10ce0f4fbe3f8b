//! A worker's counters and their exposition (through [`crate::exposition`]) (served by the worker's metrics listener,
//! `gateway::http::serve_worker_metrics`); its names come from [`crate::metric_names`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use engine::{EngineHandle, ViolationKind};

use crate::exposition::{label, Exposition, Labels};
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

/// Link failures by reason, each sample also carrying `labels` (empty at the gateway).
pub fn expose_link_failures(e: &mut Exposition, labels: &Labels, failures: &[(String, u64)]) {
    let rows = failures.iter().map(|(reason, n)| {
        let mut l = labels.clone();
        l.push(label("reason", reason));
        (l, *n)
    });
    e.counters(LINK_FAILURES_TOTAL, "Node links that failed (handshake refused or record rejected), by reason.", rows);
}

#[derive(Default)]
pub struct WorkerMetrics {
    pub reservations: AtomicU64,
    pub frames_sent: AtomicU64,
    pub frames_received: AtomicU64,
    pub kv_bytes_received: AtomicU64,
    pub held_prompt_tokens: AtomicU64,
    pub transfers_completed: AtomicU64,
    /// Nanoseconds from each completed transfer's first frame to its verified end (decode).
    pub transfer_ns: AtomicU64,
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
        Stats {
            engine: engine.instance_id(),
            pool: engine.stats(),
            reservations: self.reservations.load(Ordering::Relaxed),
            frames_sent: self.frames_sent.load(Ordering::Relaxed),
            frames_received: self.frames_received.load(Ordering::Relaxed),
            kv_bytes_received: self.kv_bytes_received.load(Ordering::Relaxed),
            held_prompt_tokens: self.held_prompt_tokens.load(Ordering::Relaxed),
            kv_crypto_ns: self.kv_crypto_ns.load(Ordering::Relaxed),
            transfers_completed: self.transfers_completed.load(Ordering::Relaxed),
            transfer_ns: self.transfer_ns.load(Ordering::Relaxed),
            violations: self
                .violations
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(k, v)| (*k, *v))
                .collect(),
            link_failures: self.links.snapshot(),
            page_map: engine.page_map(),
        }
    }
}

/// A worker's exposition (its own `/metrics`).
pub fn render(role: &str, s: &Stats) -> String {
    let r = || vec![label("role", role)];
    let one = |v: u64| [(r(), v)];
    let mut e = Exposition::new();
    e.counters(WORKER_RESERVATIONS_TOTAL, "Page reservations this worker granted.", one(s.reservations))
        .counters(KV_FRAMES_SENT_TOTAL, "KV frames sealed and sent.", one(s.frames_sent))
        .counters(KV_FRAMES_RECEIVED_TOTAL, "KV frames received and checked.", one(s.frames_received))
        .counters(KV_BYTES_RECEIVED_TOTAL, "KV payload bytes of the frames accepted.", one(s.kv_bytes_received))
        .counters(
            KV_HELD_PROMPT_TOKENS_TOTAL,
            "Prompt tokens reservations held from this worker's own cache (not transferred).",
            one(s.held_prompt_tokens),
        )
        .counters(KV_TRANSFERS_COMPLETED_TOTAL, "KV transfers completed.", one(s.transfers_completed))
        .gauges(KV_PAGES_USED, "Pages of this worker's pool in use.", [(r(), s.pool.pages_used as i64)])
        .gauges(KV_PAGES_TOTAL, "Pages in this worker's pool.", [(r(), s.pool.pages_total as i64)])
        // Tenant ids only: this listener is the operator's, but names stay at the gateway.
        .gauges(
            WORKER_PREFIX_CACHE_PAGES,
            "Pages in this worker's prefix caches, by tenant id.",
            s.pool
                .cached_pages_by_tenant
                .iter()
                .map(|(t, n)| (vec![label("role", role), label("tenant", t.0.to_string())], *n as i64)),
        )
        .seconds_counter(
            KV_TRANSFER_SECONDS_TOTAL,
            "Time from each completed KV transfer's first frame to its verified end (decode): over the \
             transfers completed, the mean time the KV spends on the network and in checking.",
            r(),
            s.transfer_ns as f64 / 1e9,
        )
        .seconds_counter(
            KV_CRYPTO_SECONDS_TOTAL,
            "Time spent on KV link handshakes and sealing frames (prefill), or opening and checking frames (decode).",
            r(),
            s.kv_crypto_ns as f64 / 1e9,
        )
        .counters(
            ISOLATION_VIOLATIONS_TOTAL,
            "Integrity or ownership checks this worker failed, by kind.",
            s.violations.iter().map(|(k, v)| (vec![label("role", role), label("kind", k.label())], *v)),
        );
    expose_link_failures(&mut e, &r(), &s.link_failures);
    e.text()
}
