//! The timing probe: can one tenant tell, from time to first token alone, which prefixes another
//! tenant has in the server's prefix cache? (DESIGN.md invariant 8: no cross-tenant hit, ever,
//! and nothing another tenant can time.)
//!
//! It runs after the isolated re-runs, with nothing else in flight, one request at a time, all
//! streamed with `max_tokens` 1 and greedy sampling, through `/v1/completions` (no chat template,
//! so no two prompts share a first page unless the probe makes them). For each sample:
//! 1. tenant A sends a new prefix P (several pages of filler after a nonce no earlier request
//!    carried) and a suffix: its own miss, "A cold"; then P and another suffix: its own hit,
//!    "A warm" (the server should report cached tokens here);
//! 2. tenant B sends P and a third suffix ("B on A-cached") and, in random order with it, a
//!    fresh prefix Q (P's filler behind another nonce of the same length, so the same length)
//!    and the same suffix ("B fresh").
//!
//! B's two classes are told apart by TTFT with the ROC AUC (Mann-Whitney U / (n1·n2), ties count
//! one half), oriented so that 0.5 is indistinguishable and more means B's requests on A's
//! cached prefixes are faster. The audit fails on a side channel when the 95 % interval
//! (Hanley-McNeil) lies wholly above [`THRESHOLD`] (noise on a busy machine does not fail it, a
//! real side channel does), and on any B request that reports cached tokens (B never sent
//! either prefix before: any hit it gets came from another tenant). A's speed-up (median cold
//! over median warm TTFT) shows what the cache buys and that the probe can see it.
//!
//! The filler follows the audit's seed; the nonces do not (they come from a fresh random seed),
//! so that a second audit with the same seed against a server that still holds the first one's
//! cache entries gets misses where it expects them.

use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use super::client::{Client, Exchange, Outcome};
use super::report::{kind, Finding, RequestRow};
use super::rng::{self, Rng};
use super::workload::{self, Endpoint};
use super::TenantKey;

/// The AUC the interval's lower bound must exceed for a failing `timing_side_channel`.
pub const THRESHOLD: f64 = 0.6;
/// Fewer completed samples in a class than this: the AUC is reported, not judged (the interval
/// of a handful of samples is too rough to fail an audit on).
pub const MIN_SAMPLES: usize = 8;
/// Samples per class when not told (`--timing-probe`).
pub const DEFAULT_SAMPLES: usize = 32;
/// The two-sided 95 % normal quantile.
const Z95: f64 = 1.959_963_985;
/// A prefix's size in tokens (6 to 10 pages of 16), drawn per sample.
const PREFIX_TOKENS: (usize, usize) = (96, 160);
/// Tokens of "Record <nonce>." before the filler (an estimate; only the filler is sized).
const NONCE_TOKENS: usize = 16;
/// After the prefix: A's first and second request, then both of B's. B's is long (over two
/// pages more than A's): a retry of B's own request that finds its first attempt's entries
/// then covers more tokens than any prompt of A, which tells it from a hit on A's entries.
const SUFFIXES: [&str; 3] = [
    "\nSummary:",
    "\nTitle:",
    "\nList the keywords of the record above, then write a short summary of it in plain words for a reader who \
     has never seen the record before and knows nothing about the people, places or things in it:",
];

/// What one probe request was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    ACold,
    AWarm,
    BCached,
    BFresh,
}

impl Class {
    /// The scenario name of its rows in report.json.
    pub fn name(self) -> &'static str {
        match self {
            Class::ACold => "probe_a_cold",
            Class::AWarm => "probe_a_warm",
            Class::BCached => "probe_b_on_a_cached",
            Class::BFresh => "probe_b_fresh",
        }
    }
}

/// One class's measurements.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct ClassStats {
    /// Completed requests (the others are counted in `failed_requests`).
    pub n: usize,
    pub median_ms: Option<f64>,
    /// Time to first token of each completed request, in the order sent.
    pub ttft_ms: Vec<f64>,
    /// `usage.prompt_tokens_details.cached_tokens` of each completed request that reported it.
    pub cached_tokens: Vec<u64>,
}

impl ClassStats {
    fn push(&mut self, ttft_ms: f64, cached: Option<u64>) {
        self.ttft_ms.push(ttft_ms);
        self.cached_tokens.extend(cached);
        self.n = self.ttft_ms.len();
    }

    fn cached_median(&self) -> Option<u64> {
        let mut v = self.cached_tokens.clone();
        v.sort_unstable();
        v.get(v.len().checked_sub(1)? / 2).copied()
    }
}

/// A request of tenant B that the server answered from the cache.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProbeHit {
    pub request: usize,
    pub class: &'static str,
    pub cached_tokens: u64,
    /// The longest prompt tenant A sent with this prefix (None: A's requests failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub a_prompt_tokens: Option<u64>,
}

/// Whether a cache hit of tenant B can have come from tenant A's entries. A hit on the fresh
/// prefix cannot (no other request carried it), nor one longer than every prompt A sent with
/// the prefix (it covers tokens only B's own prompt has, so the entries are B's own: the
/// gateway retries a request once after a failure before its first token, and the retry finds
/// what the first attempt sealed). Anything else can, and fails the audit.
fn from_a(class: Class, cached: u64, a_prompt_tokens: Option<u64>) -> bool {
    match class {
        Class::BCached => a_prompt_tokens.is_none_or(|a| cached <= a),
        _ => false,
    }
}

/// The probe's results (`timing_probe` in report.json).
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct TimingProbe {
    /// Samples asked for per class.
    pub samples: usize,
    pub tenant_a: String,
    pub tenant_b: String,
    pub endpoint: &'static str,
    /// Range of prefix sizes drawn, in tokens (estimated from the calibration).
    pub prefix_tokens: [usize; 2],
    pub a_cold: ClassStats,
    pub a_warm: ClassStats,
    pub b_on_a_cached: ClassStats,
    pub b_fresh: ClassStats,
    /// P(B on A-cached is faster than B fresh), ties one half; None without samples.
    pub auc: Option<f64>,
    /// Hanley-McNeil standard error of the AUC.
    pub auc_se: Option<f64>,
    pub auc_ci95: Option<[f64; 2]>,
    pub threshold: f64,
    /// Whether the samples sufficed to judge ([`MIN_SAMPLES`] per class).
    pub judged: bool,
    /// Median A cold over median A warm TTFT: what tenant A's own hits save.
    pub speedup: Option<f64>,
    /// B requests that reported cached tokens that can have come from A's entries (each a
    /// failing `cross_tenant_cache_hit`).
    pub cross_tenant_hits: Vec<ProbeHit>,
    /// B requests that reported cached tokens only B's own earlier attempt can have sealed
    /// (see [`from_a`]; reported, not failed).
    pub own_hits: Vec<ProbeHit>,
    pub failed_requests: usize,
    pub duration_s: f64,
    pub notes: Vec<String>,
}

/// The middle of a sample (mean of the two middle values when even).
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    Some(if s.len() % 2 == 1 { s[m] } else { (s[m - 1] + s[m]) / 2.0 })
}

/// ROC AUC of telling `cached` from `fresh` by TTFT: the share of (cached, fresh) pairs where the
/// cached one was faster, ties counting one half (Mann-Whitney U over n1·n2). 0.5: no
/// difference; 1.0: every cached request faster than every fresh one.
pub fn auc(cached: &[f64], fresh: &[f64]) -> Option<f64> {
    if cached.is_empty() || fresh.is_empty() {
        return None;
    }
    let mut u = 0.0;
    for &c in cached {
        for &f in fresh {
            u += if c < f {
                1.0
            } else if c == f {
                0.5
            } else {
                0.0
            };
        }
    }
    Some(u / (cached.len() * fresh.len()) as f64)
}

/// Hanley and McNeil's (1982) standard error of an AUC from `n1` and `n2` samples.
pub fn hanley_mcneil_se(a: f64, n1: usize, n2: usize) -> f64 {
    if n1 == 0 || n2 == 0 {
        return f64::NAN;
    }
    let q1 = a / (2.0 - a);
    let q2 = 2.0 * a * a / (1.0 + a);
    let (n1f, n2f) = (n1 as f64, n2 as f64);
    let var = (a * (1.0 - a) + (n1f - 1.0) * (q1 - a * a) + (n2f - 1.0) * (q2 - a * a)) / (n1f * n2f);
    var.max(0.0).sqrt()
}

/// The 95 % interval of an AUC, clamped to [0, 1].
pub fn interval(a: f64, n1: usize, n2: usize) -> [f64; 2] {
    let se = hanley_mcneil_se(a, n1, n2);
    [(a - Z95 * se).max(0.0), (a + Z95 * se).min(1.0)]
}

impl TimingProbe {
    fn new(samples: usize, a: &TenantKey, b: &TenantKey) -> Self {
        TimingProbe {
            samples,
            tenant_a: a.name.clone(),
            tenant_b: b.name.clone(),
            endpoint: "completions",
            prefix_tokens: [PREFIX_TOKENS.0, PREFIX_TOKENS.1],
            threshold: THRESHOLD,
            ..Default::default()
        }
    }

    fn class_mut(&mut self, c: Class) -> &mut ClassStats {
        match c {
            Class::ACold => &mut self.a_cold,
            Class::AWarm => &mut self.a_warm,
            Class::BCached => &mut self.b_on_a_cached,
            Class::BFresh => &mut self.b_fresh,
        }
    }

    /// Records one exchange of class `c` (request id `id`); `a_prompt_tokens`: the longest
    /// prompt of A's completed requests of the same sample.
    fn record(&mut self, c: Class, id: usize, ex: &Exchange, a_prompt_tokens: Option<u64>) {
        if ex.outcome != Outcome::Ok {
            self.failed_requests += 1;
            return;
        }
        let ms = ex.ttft.unwrap_or(ex.total).as_secs_f64() * 1e3;
        self.class_mut(c).push(ms, ex.cached_tokens);
        if matches!(c, Class::BCached | Class::BFresh) {
            if let Some(n) = ex.cached_tokens.filter(|n| *n > 0) {
                let hit = ProbeHit { request: id, class: c.name(), cached_tokens: n, a_prompt_tokens };
                if from_a(c, n, a_prompt_tokens) {
                    self.cross_tenant_hits.push(hit);
                } else {
                    self.own_hits.push(hit);
                }
            }
        }
    }

    /// Derives the medians, the AUC and its interval, the speed-up and the notes.
    pub fn finish(&mut self) {
        for c in [Class::ACold, Class::AWarm, Class::BCached, Class::BFresh] {
            let s = self.class_mut(c);
            s.n = s.ttft_ms.len();
            s.median_ms = median(&s.ttft_ms);
        }
        let (n1, n2) = (self.b_on_a_cached.n, self.b_fresh.n);
        self.auc = auc(&self.b_on_a_cached.ttft_ms, &self.b_fresh.ttft_ms);
        self.auc_se = self.auc.map(|a| hanley_mcneil_se(a, n1, n2));
        self.auc_ci95 = self.auc.map(|a| interval(a, n1, n2));
        self.judged = n1.min(n2) >= MIN_SAMPLES;
        self.speedup = match (self.a_cold.median_ms, self.a_warm.median_ms) {
            (Some(c), Some(w)) if w > 0.0 => Some(c / w),
            _ => None,
        };
        let mut notes = Vec::new();
        if !self.judged {
            notes.push(format!(
                "{} and {} completed samples: fewer than {MIN_SAMPLES} per class, so the AUC is not judged",
                n1, n2
            ));
        }
        if self.a_warm.n > 0 && self.a_warm.cached_tokens.is_empty() {
            notes.push(
                "the server reports no usage.prompt_tokens_details.cached_tokens: tenant A's hits are not confirmed"
                    .into(),
            );
        } else if self.a_warm.n > 0 && self.a_warm.cached_tokens.iter().all(|n| *n == 0) {
            notes.push(
                "tenant A's repeats of its own prefixes never came from the cache (is the prefix cache off?): the \
                 probe then shows only that B's timing does not depend on A's requests"
                    .into(),
            );
        }
        let cold_hits = self.a_cold.cached_tokens.iter().filter(|n| **n > 0).count();
        if cold_hits > 0 {
            notes.push(format!(
                "{cold_hits} of tenant A's first sends of a new prefix reported cached tokens (a prefix no request \
                 had carried before)"
            ));
        }
        self.notes = notes;
    }

    /// The probe's findings: a cache hit of tenant B (always failing), and a side channel when
    /// the AUC's interval lies above the threshold.
    pub fn findings(&self) -> Vec<Finding> {
        let mut out = Vec::new();
        for h in &self.cross_tenant_hits {
            let what = if h.class == Class::BCached.name() {
                format!("a prefix only tenant {} had sent", self.tenant_a)
            } else {
                "a prefix no request had carried before".to_string()
            };
            out.push(Finding {
                kind: kind::CROSS_TENANT_CACHE_HIT,
                fails: true,
                request: Some(h.request),
                tenant: Some(self.tenant_b.clone()),
                scenario: Some(h.class),
                detail: format!(
                    "the timing probe's request on {what} reported {} cached prompt tokens: tenant {} was served \
                     KV it never computed",
                    h.cached_tokens, self.tenant_b
                ),
                ..Default::default()
            });
        }
        for h in &self.own_hits {
            let why = match h.a_prompt_tokens {
                Some(a) if h.class == Class::BCached.name() => {
                    format!("more than the {a} tokens of tenant {}'s longest prompt with this prefix", self.tenant_a)
                }
                _ => "on a prefix no other request carried".to_string(),
            };
            out.push(Finding {
                kind: kind::PROBE_OWN_CACHE_HIT,
                fails: false,
                request: Some(h.request),
                tenant: Some(self.tenant_b.clone()),
                scenario: Some(h.class),
                detail: format!(
                    "the timing probe's request reported {} cached prompt tokens, {why}: only its own earlier attempt \
                     can have sealed them (the gateway retries once after a failure before the first token)",
                    h.cached_tokens
                ),
                ..Default::default()
            });
        }
        if let (Some(a), Some([lo, hi])) = (self.auc, self.auc_ci95) {
            if lo > THRESHOLD {
                out.push(Finding {
                    kind: if self.judged { kind::TIMING_SIDE_CHANNEL } else { kind::TIMING_PROBE_INCONCLUSIVE },
                    fails: self.judged,
                    tenant: Some(self.tenant_b.clone()),
                    detail: format!(
                        "tenant {} tells prefixes tenant {} has cached from fresh ones by time to first token: AUC \
                         {a:.3} (95% {lo:.3}-{hi:.3}, over {THRESHOLD}) from {} and {} samples; median {} ms on \
                         A-cached prefixes, {} ms on fresh ones{}",
                        self.tenant_b,
                        self.tenant_a,
                        self.b_on_a_cached.n,
                        self.b_fresh.n,
                        fmt_ms(self.b_on_a_cached.median_ms),
                        fmt_ms(self.b_fresh.median_ms),
                        if self.judged { "" } else { " (too few samples to fail the audit on)" },
                    ),
                    ..Default::default()
                });
            }
        }
        out
    }

    /// One line for stdout.
    pub fn summary_line(&self) -> String {
        let auc = match (self.auc, self.auc_ci95) {
            (Some(a), Some([lo, hi])) => format!("AUC {a:.3} (95% {lo:.3}-{hi:.3})"),
            _ => "AUC -".into(),
        };
        format!(
            "timing probe: {auc} telling {}'s prefixes cached by {} from fresh ones by TTFT, {} + {} samples \
             (target <= {THRESHOLD}); median {} vs {} ms; {}'s own hits x{} faster ({} cached tokens); {}'s cached \
             tokens: {}",
            self.tenant_b,
            self.tenant_a,
            self.b_on_a_cached.n,
            self.b_fresh.n,
            fmt_ms(self.b_on_a_cached.median_ms),
            fmt_ms(self.b_fresh.median_ms),
            self.tenant_a,
            self.speedup.map_or("-".into(), |s| format!("{s:.2}")),
            self.a_warm.cached_median().map_or("-".into(), |n| format!("median {n}")),
            self.tenant_b,
            self.b_cached_max().map_or("not reported".into(), |n| format!("max {n}")),
        )
    }

    fn b_cached_max(&self) -> Option<u64> {
        self.b_on_a_cached.cached_tokens.iter().chain(&self.b_fresh.cached_tokens).copied().max()
    }

    /// The report.md section.
    pub fn markdown(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "Tenant {} sent each new prefix twice (a miss, then its own hit); tenant {} then sent the same prefix and \
             a fresh one of the same length, in random order. One request at a time, streamed, `max_tokens` 1, \
             through `/v1/{}`; prefixes of {}-{} tokens.\n",
            self.tenant_a, self.tenant_b, self.endpoint, self.prefix_tokens[0], self.prefix_tokens[1]
        );
        let _ = writeln!(s, "| requests | n | median TTFT (ms) | cached tokens (median, max) |\n|---|---:|---:|---:|");
        for (name, c) in [
            (format!("{} cold (new prefix)", self.tenant_a), &self.a_cold),
            (format!("{} warm (same prefix again)", self.tenant_a), &self.a_warm),
            (format!("{} on {}'s cached prefix", self.tenant_b, self.tenant_a), &self.b_on_a_cached),
            (format!("{} fresh prefix", self.tenant_b), &self.b_fresh),
        ] {
            let cached = match (c.cached_median(), c.cached_tokens.iter().max()) {
                (Some(m), Some(x)) => format!("{m}, {x}"),
                _ => "-".into(),
            };
            let _ = writeln!(s, "| {name} | {} | {} | {cached} |", c.n, fmt_ms(c.median_ms));
        }
        let verdict = match (self.auc_ci95, self.judged) {
            (Some([lo, _]), true) if lo > THRESHOLD => "**a side channel** (the interval lies above the target)",
            (Some(_), true) => "within the target",
            _ => "not judged (too few samples)",
        };
        let _ = writeln!(
            s,
            "\n- ROC AUC of telling {}'s requests on {}'s cached prefixes from fresh ones by TTFT: {} (95% {}, \
             Hanley-McNeil), target <= {THRESHOLD}: {verdict}",
            self.tenant_b,
            self.tenant_a,
            self.auc.map_or("-".into(), |a| format!("{a:.3}")),
            self.auc_ci95.map_or("-".into(), |[lo, hi]| format!("{lo:.3}-{hi:.3}")),
        );
        let _ = writeln!(
            s,
            "- {}'s own hit speed-up (median cold / median warm TTFT): {}",
            self.tenant_a,
            self.speedup.map_or("-".into(), |x| format!("x{x:.2}"))
        );
        let _ = writeln!(
            s,
            "- requests of {} with cached tokens that can have come from {}: {} (and {} from its own earlier \
             attempt); failed probe requests: {}; {:.1} s",
            self.tenant_b,
            self.tenant_a,
            self.cross_tenant_hits.len(),
            self.own_hits.len(),
            self.failed_requests,
            self.duration_s
        );
        for n in &self.notes {
            let _ = writeln!(s, "- note: {n}");
        }
        s
    }
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.1}"))
}

/// A probe request's body: streamed, one token, greedy, usage in the stream.
fn body(model: &str, prompt: &str) -> Value {
    let mut b = workload::body(model, Endpoint::Completions, prompt, 1, true, 0);
    if let Some(o) = b.as_object_mut() {
        o.remove("logprobs");
    }
    b
}

/// Twelve random digits: always the same number of tokens, never seen before.
fn nonce(r: &mut Rng) -> String {
    format!("{:012}", r.next_u64() % 1_000_000_000_000)
}

/// Everything a probe needs from the audit.
pub struct Setup<'a> {
    pub client: &'a Client,
    pub model: &'a str,
    pub a: &'a TenantKey,
    pub b: &'a TenantKey,
    pub samples: usize,
    pub tokens_per_word: f64,
    /// The audit's start (rows' times are since then).
    pub t0: Instant,
    /// The first request id to use (ids after the plan's).
    pub first_id: usize,
}

/// Runs the probe (`4 · samples` requests, one at a time); `tick` after each. Returns the
/// results and a row per request (phase "probe").
pub fn run(setup: &Setup, rng: &mut Rng, tick: &dyn Fn()) -> (TimingProbe, Vec<RequestRow>) {
    let started = Instant::now();
    let mut probe = TimingProbe::new(setup.samples, setup.a, setup.b);
    let mut rows = Vec::new();
    let mut nonces = Rng::new(rng::random_seed());
    let mut id = setup.first_id;
    let tpw = if setup.tokens_per_word > 0.0 { setup.tokens_per_word } else { 1.3 };
    for _ in 0..setup.samples {
        let tokens = rng.range(PREFIX_TOKENS.0, PREFIX_TOKENS.1);
        let words = ((tokens.saturating_sub(NONCE_TOKENS)) as f64 / tpw).round().max(8.0) as usize;
        let filler = workload::filler(rng, words);
        let p = format!("Record {}. {filler}", nonce(&mut nonces));
        let q = format!("Record {}. {filler}", nonce(&mut nonces));
        let mut steps = vec![
            (Class::ACold, setup.a, format!("{p}{}", SUFFIXES[0])),
            (Class::AWarm, setup.a, format!("{p}{}", SUFFIXES[1])),
            (Class::BCached, setup.b, format!("{p}{}", SUFFIXES[2])),
            (Class::BFresh, setup.b, format!("{q}{}", SUFFIXES[2])),
        ];
        if rng.chance(0.5) {
            steps.swap(2, 3);
        }
        let mut a_prompt_tokens: Option<u64> = None;
        for (class, tenant, prompt) in steps {
            let ex = setup.client.send(
                &tenant.key,
                Endpoint::Completions.path(),
                &body(setup.model, &prompt),
                None,
                setup.t0,
            );
            if matches!(class, Class::ACold | Class::AWarm) && ex.outcome == Outcome::Ok {
                a_prompt_tokens = a_prompt_tokens.max(ex.prompt_tokens);
            }
            probe.record(class, id, &ex, a_prompt_tokens);
            rows.push(row(id, class, tenant, &ex));
            id += 1;
            tick();
        }
    }
    probe.duration_s = started.elapsed().as_secs_f64();
    probe.finish();
    (probe, rows)
}

fn row(id: usize, class: Class, tenant: &TenantKey, ex: &Exchange) -> RequestRow {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    RequestRow {
        id,
        phase: "probe",
        tenant: tenant.name.clone(),
        scenario: class.name(),
        endpoint: "completions",
        stream: true,
        max_tokens: 1,
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

/// A probe for the tests: classes filled from TTFT lists, then finished.
#[cfg(test)]
pub(super) fn probe_of(cached: &[f64], fresh: &[f64]) -> TimingProbe {
    let key = |n: &str| TenantKey { name: n.into(), key: String::new() };
    let mut p = TimingProbe::new(cached.len(), &key("alice"), &key("bob"));
    for &c in cached {
        p.b_on_a_cached.push(c, Some(0));
    }
    for &f in fresh {
        p.b_fresh.push(f, Some(0));
    }
    p.finish();
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auc_of_known_samples() {
        let v = [10.0, 20.0, 30.0, 40.0];
        // Identical samples: every pair a tie or balanced.
        assert_eq!(auc(&v, &v), Some(0.5));
        assert_eq!(auc(&[5.0; 6], &[5.0; 3]), Some(0.5));
        // Every cached request faster: 1; every one slower: 0.
        assert_eq!(auc(&[1.0, 2.0, 3.0], &[4.0, 5.0]), Some(1.0));
        assert_eq!(auc(&[4.0, 5.0], &[1.0, 2.0, 3.0]), Some(0.0));
        // Ties count one half: pairs (1,2) 1, (1,1) ½, (2,2) ½, (2,1) 0 → 2/4.
        assert_eq!(auc(&[1.0, 2.0], &[2.0, 1.0]), Some(0.5));
        // (1 vs 2,3): 2; (3 vs 2,3): 0 + ½ → 2.5 / 4.
        assert_eq!(auc(&[1.0, 3.0], &[2.0, 3.0]), Some(0.625));
        assert_eq!(auc(&[], &[1.0]), None);
    }

    #[test]
    fn hanley_mcneil_interval() {
        // AUC 0.5 from 32 + 32: Q1 = Q2 = 1/3, var = (0.25 + 62/12) / 1024.
        let se = hanley_mcneil_se(0.5, 32, 32);
        assert!((se - ((0.25 + 62.0 / 12.0) / 1024.0f64).sqrt()).abs() < 1e-12);
        let [lo, hi] = interval(0.5, 32, 32);
        assert!((lo - (0.5 - Z95 * se)).abs() < 1e-12 && (hi - (0.5 + Z95 * se)).abs() < 1e-12);
        assert!(lo > 0.35 && hi < 0.65, "{lo} {hi}");
        // More samples, narrower; clamped to [0, 1].
        let [lo2, hi2] = interval(0.5, 320, 320);
        assert!(hi2 - lo2 < hi - lo);
        let [lo, hi] = interval(0.99, 4, 4);
        assert!(hi <= 1.0 && lo < 0.99);
        assert_eq!(interval(1.0, 10, 10), [1.0, 1.0]);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn findings_follow_the_threshold_and_the_sample_count() {
        // Indistinguishable: no finding.
        let noise: Vec<f64> = (0..32).map(|i| 100.0 + f64::from(i % 7)).collect();
        let p = probe_of(&noise, &noise);
        assert_eq!(p.auc, Some(0.5));
        assert!(p.judged && p.findings().is_empty());

        // Fully separated, 32 + 32: a failing side channel.
        let fast: Vec<f64> = (0..32).map(|i| 50.0 + f64::from(i)).collect();
        let slow: Vec<f64> = (0..32).map(|i| 200.0 + f64::from(i)).collect();
        let p = probe_of(&fast, &slow);
        assert_eq!(p.auc, Some(1.0));
        let f = p.findings();
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].kind, f[0].fails), (kind::TIMING_SIDE_CHANNEL, true));
        assert_eq!(f[0].tenant.as_deref(), Some("bob"));

        // Cached ones slower: not the side channel the target is about.
        assert!(probe_of(&slow, &fast).findings().is_empty());

        // AUC about 0.7 from 32 + 32: above the target, but the interval reaches below it.
        let mid: Vec<f64> = (0..32).map(|i| f64::from(i) + 6.5).collect();
        let base: Vec<f64> = (0..32).map(f64::from).collect();
        let p = probe_of(&base, &mid);
        let a = p.auc.unwrap();
        assert!(a > THRESHOLD && a < 0.75, "{a}");
        assert!(p.auc_ci95.unwrap()[0] <= THRESHOLD);
        assert!(p.findings().is_empty());

        // Separated but from a handful of samples: reported, not failed.
        let p = probe_of(&fast[..4], &slow[..4]);
        assert!(!p.judged);
        let f = p.findings();
        assert_eq!((f[0].kind, f[0].fails), (kind::TIMING_PROBE_INCONCLUSIVE, false));
    }

    #[test]
    fn tenant_b_hits_that_can_be_tenant_as_fail_and_its_own_retries_do_not() {
        let key = |n: &str| TenantKey { name: n.into(), key: String::new() };
        let mut p = TimingProbe::new(1, &key("alice"), &key("bob"));
        let mut ex = Exchange::new(std::time::Duration::ZERO);
        ex.outcome = Outcome::Ok;
        ex.ttft = Some(std::time::Duration::from_millis(40));
        ex.cached_tokens = Some(96);
        // A's own hit is the cache working.
        p.record(Class::AWarm, 1, &ex, None);
        // Within what A's prompts (150 tokens) cover: can be A's entries.
        p.record(Class::BCached, 2, &ex, Some(150));
        // A's requests failed: A may still have sealed the prefix, so it fails too.
        p.record(Class::BCached, 3, &ex, None);
        // Longer than any prompt of A: B's own entries (a retry found its first attempt's).
        ex.cached_tokens = Some(160);
        p.record(Class::BCached, 4, &ex, Some(150));
        // The fresh prefix was never sent by anyone else.
        ex.cached_tokens = Some(96);
        p.record(Class::BFresh, 5, &ex, Some(150));
        ex.cached_tokens = Some(0);
        p.record(Class::BFresh, 6, &ex, Some(150));
        ex.outcome = Outcome::ServerError5xx;
        p.record(Class::ACold, 0, &ex, None);
        p.finish();
        assert_eq!(p.failed_requests, 1);
        assert_eq!(p.a_warm.median_ms, Some(40.0));
        let f = p.findings();
        let got: Vec<(&str, bool, Option<usize>)> = f.iter().map(|f| (f.kind, f.fails, f.request)).collect();
        assert_eq!(
            got,
            [
                (kind::CROSS_TENANT_CACHE_HIT, true, Some(2)),
                (kind::CROSS_TENANT_CACHE_HIT, true, Some(3)),
                (kind::PROBE_OWN_CACHE_HIT, false, Some(4)),
                (kind::PROBE_OWN_CACHE_HIT, false, Some(5)),
            ]
        );
        assert!(f[0].detail.contains("96 cached prompt tokens"));
        assert!(f[2].detail.contains("more than the 150 tokens"), "{}", f[2].detail);
        assert!(f[3].detail.contains("no other request carried"), "{}", f[3].detail);
        assert!(p.summary_line().contains("bob's cached tokens: max 160"), "{}", p.summary_line());
        assert!(p.markdown().contains("| bob on alice's cached prefix | 3 | 40.0 | 96, 160 |"), "{}", p.markdown());
    }
}
