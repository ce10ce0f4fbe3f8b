//! The timing probe: can one tenant tell, from time to first token alone, which prefixes another
//! tenant has in the server's prefix cache? (invariant 8 of docs/invariants.md: no cross-tenant hit, ever,
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
//! cached prefixes are faster. The burden of proof is on the server: with at least
//! [`POWERED_SAMPLES`] per class the audit passes only when the one-sided 95 % upper bound of
//! the AUC (Hanley-McNeil) is at most [`THRESHOLD`], so a side channel of AUC 0.6 fails 95 % of
//! runs (and a server with none, AUC 0.5, passes about 99 % of them at the default
//! [`DEFAULT_SAMPLES`]). With fewer samples that bound is not judged, but a channel whose
//! two-sided interval lies wholly above the threshold still fails. The same AUC is reported per
//! prefix length ([`BUCKETS`]), each bucket failing on the same clear-channel rule. Any B request
//! that reports cached tokens fails too: B never sent either prefix before, so any hit it gets
//! is KV it did not compute. A's speed-up (median cold over median warm TTFT) shows what the
//! cache buys and that the probe can see it.
//!
//! The filler follows the audit's seed; the nonces do not (they come from a fresh random seed),
//! so that a second audit with the same seed against a server that still holds the first one's
//! cache entries gets misses where it expects them.

use std::time::Instant;

use serde::Serialize;

use crate::stats::{auc, hanley_mcneil_se, interval, median, Z95_ONE_SIDED};
use serde_json::Value;

use super::client::{Client, Exchange, Outcome};
use super::finding::{kind, Finding, RequestRow};
use super::rng::{self, Rng};
use super::tenants::TenantKey;
use super::workload::{self, Endpoint};

/// The largest AUC a server may show (the target of invariant 8, docs/invariants.md).
pub const THRESHOLD: f64 = 0.6;
/// Fewer completed samples in a class than this: the AUC is reported, not judged (the interval
/// of a handful of samples is too rough to fail an audit on).
pub const MIN_SAMPLES: usize = 8;
/// Completed samples per class from which the AUC's upper bound must be under the threshold:
/// a server without a side channel (AUC 0.5) then passes about 98.8 % of runs (the bound is
/// 0.5 + 1.645 · 0.0255), one with AUC 0.6 fails 95 % of them.
pub const POWERED_SAMPLES: usize = 256;
/// Samples per class when not told (`--timing-probe`): enough to reach [`POWERED_SAMPLES`]
/// with a tenth of the requests failing.
pub const DEFAULT_SAMPLES: usize = 300;
/// Prefix sizes in tokens, by bucket: a sample draws a bucket in turn, then a size in it. A
/// cache that leaks only long prefixes (or only short ones) shows in its bucket.
pub const BUCKETS: [(usize, usize); 3] = [(32, 64), (80, 160), (176, 320)];
/// Tokens of "Record <nonce>." before the filler (an estimate; only the filler is sized).
const NONCE_TOKENS: usize = 16;
/// After the prefix: A's first and second request, then both of B's (one suffix for both, so
/// B's two classes differ only in whose prefix they carry).
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
}

/// The AUC of one range of prefix sizes.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct Bucket {
    /// Prefix sizes in tokens (estimated from the calibration).
    pub prefix_tokens: [usize; 2],
    pub b_on_a_cached_ms: Vec<f64>,
    pub b_fresh_ms: Vec<f64>,
    pub auc: Option<f64>,
    pub auc_ci95: Option<[f64; 2]>,
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
    /// The AUC by prefix size.
    pub buckets: Vec<Bucket>,
    pub a_cold: ClassStats,
    pub a_warm: ClassStats,
    pub b_on_a_cached: ClassStats,
    pub b_fresh: ClassStats,
    /// P(B on A-cached is faster than B fresh), ties one half; None without samples.
    pub auc: Option<f64>,
    /// Hanley-McNeil standard error of the AUC.
    pub auc_se: Option<f64>,
    pub auc_ci95: Option<[f64; 2]>,
    /// The one-sided 95 % upper bound: at most the threshold for a pass once powered.
    pub auc_upper95: Option<f64>,
    pub threshold: f64,
    /// Whether the samples sufficed to judge a clear channel ([`MIN_SAMPLES`] per class).
    pub judged: bool,
    /// Whether they sufficed to require the upper bound under the threshold
    /// ([`POWERED_SAMPLES`] per class).
    pub powered: bool,
    /// Median A cold over median A warm TTFT: what tenant A's own hits save.
    pub speedup: Option<f64>,
    /// B requests that reported cached tokens (each a failing `cross_tenant_cache_hit`: B never
    /// sent either prefix before).
    pub cross_tenant_hits: Vec<ProbeHit>,
    pub failed_requests: usize,
    pub duration_s: f64,
    pub notes: Vec<String>,
}

impl TimingProbe {
    fn new(samples: usize, a: &TenantKey, b: &TenantKey) -> Self {
        TimingProbe {
            samples,
            tenant_a: a.name.clone(),
            tenant_b: b.name.clone(),
            endpoint: "completions",
            prefix_tokens: [BUCKETS[0].0, BUCKETS[BUCKETS.len() - 1].1],
            buckets: BUCKETS.iter().map(|&(lo, hi)| Bucket { prefix_tokens: [lo, hi], ..Default::default() }).collect(),
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

    /// Records one exchange of class `c` (request id `id`) of a sample in `bucket`.
    fn record(&mut self, c: Class, id: usize, ex: &Exchange, bucket: usize) {
        if ex.outcome != Outcome::Ok {
            self.failed_requests += 1;
            return;
        }
        let ms = ex.ttft.unwrap_or(ex.total).as_secs_f64() * 1e3;
        self.class_mut(c).push(ms, ex.cached_tokens);
        if let Some(b) = self.buckets.get_mut(bucket) {
            match c {
                Class::BCached => b.b_on_a_cached_ms.push(ms),
                Class::BFresh => b.b_fresh_ms.push(ms),
                _ => {}
            }
        }
        if matches!(c, Class::BCached | Class::BFresh) {
            if let Some(n) = ex.cached_tokens.filter(|n| *n > 0) {
                self.cross_tenant_hits.push(ProbeHit { request: id, class: c.name(), cached_tokens: n });
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
        self.auc_upper95 = self.auc.map(|a| (a + Z95_ONE_SIDED * hanley_mcneil_se(a, n1, n2)).min(1.0));
        self.judged = n1.min(n2) >= MIN_SAMPLES;
        self.powered = n1.min(n2) >= POWERED_SAMPLES;
        for b in &mut self.buckets {
            let (m1, m2) = (b.b_on_a_cached_ms.len(), b.b_fresh_ms.len());
            b.auc = auc(&b.b_on_a_cached_ms, &b.b_fresh_ms);
            b.auc_ci95 = b.auc.map(|a| interval(a, m1, m2));
        }
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
        } else if !self.powered {
            notes.push(format!(
                "{} and {} completed samples: under {POWERED_SAMPLES} per class the probe cannot show an AUC at \
                 most {THRESHOLD}; only a channel clearly above it fails (run with --timing-probe {DEFAULT_SAMPLES})",
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
        if let (Some(a), Some([lo, hi]), Some(up)) = (self.auc, self.auc_ci95, self.auc_upper95) {
            // A clear channel (the whole interval above the target), or, once the probe has the
            // samples to show it, a channel that cannot be ruled out (the upper bound above it).
            let clear = lo > THRESHOLD;
            let unproven = self.powered && up > THRESHOLD;
            if clear || unproven {
                let fails = self.judged && (clear || unproven);
                let why = if clear {
                    format!("95% {lo:.3}-{hi:.3}, wholly over {THRESHOLD}")
                } else {
                    format!("one-sided 95% upper bound {up:.3}, over {THRESHOLD}: the server has not shown it is under")
                };
                out.push(Finding {
                    kind: if fails { kind::TIMING_SIDE_CHANNEL } else { kind::TIMING_PROBE_INCONCLUSIVE },
                    fails,
                    tenant: Some(self.tenant_b.clone()),
                    detail: format!(
                        "tenant {} tells prefixes tenant {} has cached from fresh ones by time to first token: AUC \
                         {a:.3} ({why}) from {} and {} samples; median {} ms on A-cached prefixes, {} ms on fresh \
                         ones{}",
                        self.tenant_b,
                        self.tenant_a,
                        self.b_on_a_cached.n,
                        self.b_fresh.n,
                        fmt_ms(self.b_on_a_cached.median_ms),
                        fmt_ms(self.b_fresh.median_ms),
                        if fails { "" } else { " (too few samples to fail the audit on)" },
                    ),
                    ..Default::default()
                });
            }
        }
        for b in &self.buckets {
            let (m1, m2) = (b.b_on_a_cached_ms.len(), b.b_fresh_ms.len());
            if let (Some(a), Some([lo, hi])) = (b.auc, b.auc_ci95) {
                if lo > THRESHOLD && m1.min(m2) >= MIN_SAMPLES {
                    out.push(Finding {
                        kind: kind::TIMING_SIDE_CHANNEL,
                        fails: true,
                        tenant: Some(self.tenant_b.clone()),
                        detail: format!(
                            "on prefixes of {}-{} tokens, tenant {} tells tenant {}'s cached prefixes from fresh ones \
                             by time to first token: AUC {a:.3} (95% {lo:.3}-{hi:.3}, wholly over {THRESHOLD}) from \
                             {m1} and {m2} samples",
                            b.prefix_tokens[0], b.prefix_tokens[1], self.tenant_b, self.tenant_a
                        ),
                        ..Default::default()
                    });
                }
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
        let verdict = match (self.auc_ci95, self.auc_upper95, self.judged, self.powered) {
            (Some([lo, _]), _, true, _) if lo > THRESHOLD => "**a side channel** (the interval lies above the target)",
            (_, Some(up), _, true) if up > THRESHOLD => "**not shown under the target** (the upper bound is above it)",
            (Some(_), _, true, true) => "shown under the target",
            (Some(_), _, true, false) => "no clear channel, but too few samples to show it is under the target",
            _ => "not judged (too few samples)",
        };
        let _ = writeln!(
            s,
            "\n- ROC AUC of telling {}'s requests on {}'s cached prefixes from fresh ones by TTFT: {} (95% {}, \
             one-sided upper bound {}, Hanley-McNeil), target <= {THRESHOLD}: {verdict}",
            self.tenant_b,
            self.tenant_a,
            self.auc.map_or("-".into(), |a| format!("{a:.3}")),
            self.auc_ci95.map_or("-".into(), |[lo, hi]| format!("{lo:.3}-{hi:.3}")),
            self.auc_upper95.map_or("-".into(), |u| format!("{u:.3}")),
        );
        let _ = writeln!(s, "\n| prefix tokens | n | AUC | 95% |\n|---|---:|---:|---:|");
        for b in &self.buckets {
            let _ = writeln!(
                s,
                "| {}-{} | {} + {} | {} | {} |",
                b.prefix_tokens[0],
                b.prefix_tokens[1],
                b.b_on_a_cached_ms.len(),
                b.b_fresh_ms.len(),
                b.auc.map_or("-".into(), |a| format!("{a:.3}")),
                b.auc_ci95.map_or("-".into(), |[lo, hi]| format!("{lo:.3}-{hi:.3}")),
            );
        }
        s.push('\n');
        let _ = writeln!(
            s,
            "- {}'s own hit speed-up (median cold / median warm TTFT): {}",
            self.tenant_a,
            self.speedup.map_or("-".into(), |x| format!("x{x:.2}"))
        );
        let _ = writeln!(
            s,
            "- requests of {} (on prefixes it never sent) that reported cached tokens: {}; failed probe requests: \
             {}; {:.1} s",
            self.tenant_b,
            self.cross_tenant_hits.len(),
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
    for sample in 0..setup.samples {
        let bucket = sample % BUCKETS.len();
        let tokens = rng.range(BUCKETS[bucket].0, BUCKETS[bucket].1);
        let words = ((tokens.saturating_sub(NONCE_TOKENS)) as f64 / tpw).round().max(8.0) as usize;
        let filler = crate::prose::filler(rng, words);
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
        for (class, tenant, prompt) in steps {
            let ex = setup.client.send(
                &tenant.key,
                Endpoint::Completions.path(),
                &body(setup.model, &prompt),
                None,
                setup.t0,
            );
            probe.record(class, id, &ex, bucket);
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
    RequestRow {
        stream: true,
        max_tokens: 1,
        ..RequestRow::answered(id, "probe", tenant.name.clone(), class.name(), "completions", ex)
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
    fn findings_follow_the_threshold_and_the_sample_count() {
        // Indistinguishable: no finding.
        let noise: Vec<f64> = (0..32).map(|i| 100.0 + f64::from(i % 7)).collect();
        let p = probe_of(&noise, &noise);
        assert_eq!(p.auc, Some(0.5));
        assert!(p.judged && !p.powered && p.findings().is_empty());

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

        // AUC about 0.7 from 32 + 32: above the target, but the interval reaches below it and
        // 32 samples are too few to demand more.
        let mid: Vec<f64> = (0..32).map(|i| f64::from(i) + 6.5).collect();
        let base: Vec<f64> = (0..32).map(f64::from).collect();
        let p = probe_of(&base, &mid);
        let a = p.auc.unwrap();
        assert!(a > THRESHOLD && a < 0.75, "{a}");
        assert!(p.auc_ci95.unwrap()[0] <= THRESHOLD);
        assert!(p.findings().is_empty());

        // AUC about 0.62 from 300 + 300: powered; the interval still reaches below the target,
        // but the upper bound is over it: the server has not shown it is under, and fails.
        let mid: Vec<f64> = (0..300).map(|i| f64::from(i) + 40.0).collect();
        let base: Vec<f64> = (0..300).map(f64::from).collect();
        let p = probe_of(&base, &mid);
        assert!(p.powered);
        assert!(p.auc_ci95.unwrap()[0] < THRESHOLD, "{:?}", p.auc_ci95);
        let f = p.findings();
        assert_eq!((f[0].kind, f[0].fails), (kind::TIMING_SIDE_CHANNEL, true), "{}", f[0].detail);
        assert!(f[0].detail.contains("upper bound"), "{}", f[0].detail);

        // Separated but from a handful of samples: reported, not failed.
        let p = probe_of(&fast[..4], &slow[..4]);
        assert!(!p.judged);
        let f = p.findings();
        assert_eq!((f[0].kind, f[0].fails), (kind::TIMING_PROBE_INCONCLUSIVE, false));
    }

    /// A standard normal draw (Box-Muller).
    fn normal(r: &mut Rng) -> f64 {
        let u = r.unit().max(1e-12);
        let v = r.unit();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    /// The probe's power, simulated: TTFTs of the two classes normal with a shift that makes
    /// the true AUC 0.6 (shift = sqrt 2 · Φ⁻¹(0.6)) or 0.5, at the default sample count.
    #[test]
    fn at_the_default_samples_a_06_channel_fails_95_percent_of_runs_and_none_passes_nearly_always() {
        let mut r = Rng::new(0x9e37);
        let runs = 200;
        let mut fails = [0usize; 2];
        for (k, shift) in [(0, 2f64.sqrt() * 0.253_347), (1, 0.0)] {
            for _ in 0..runs {
                let cached: Vec<f64> = (0..DEFAULT_SAMPLES).map(|_| 10.0 + normal(&mut r) - shift).collect();
                let fresh: Vec<f64> = (0..DEFAULT_SAMPLES).map(|_| 10.0 + normal(&mut r)).collect();
                let p = probe_of(&cached, &fresh);
                fails[k] += usize::from(p.findings().iter().any(|f| f.fails));
            }
        }
        // Expected: 95 % and about 0.5 % (the bound's margin at 300 + 300); binomial slack.
        assert!(fails[0] * 100 >= runs * 90, "AUC 0.6 failed {} of {runs} runs", fails[0]);
        assert!(fails[1] * 100 <= runs * 4, "AUC 0.5 failed {} of {runs} runs", fails[1]);
    }

    #[test]
    fn every_cache_hit_of_tenant_b_fails_and_each_prefix_size_has_its_auc() {
        let key = |n: &str| TenantKey { name: n.into(), key: String::new() };
        let mut p = TimingProbe::new(1, &key("alice"), &key("bob"));
        let mut ex = Exchange::new(std::time::Duration::ZERO);
        ex.outcome = Outcome::Ok;
        ex.ttft = Some(std::time::Duration::from_millis(40));
        ex.cached_tokens = Some(96);
        // A's own hit is the cache working.
        p.record(Class::AWarm, 1, &ex, 0);
        // B never sent either prefix: a hit on A's or on the fresh one is KV it never computed,
        // however long (no "own retry" excuse).
        p.record(Class::BCached, 2, &ex, 0);
        ex.cached_tokens = Some(160);
        p.record(Class::BCached, 3, &ex, 1);
        ex.cached_tokens = Some(96);
        p.record(Class::BFresh, 4, &ex, 2);
        ex.cached_tokens = Some(0);
        p.record(Class::BFresh, 5, &ex, 0);
        ex.outcome = Outcome::ServerError5xx;
        p.record(Class::ACold, 0, &ex, 0);
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
                (kind::CROSS_TENANT_CACHE_HIT, true, Some(4)),
            ]
        );
        assert!(f[0].detail.contains("96 cached prompt tokens"));
        assert!(f[2].detail.contains("no request had carried before"), "{}", f[2].detail);
        assert!(p.summary_line().contains("bob's cached tokens: max 160"), "{}", p.summary_line());
        assert!(p.markdown().contains("| bob on alice's cached prefix | 2 | 40.0 | 96, 160 |"), "{}", p.markdown());
        // Bucket 0 holds one sample of each of B's classes; the others one each of one class.
        assert_eq!(p.buckets[0].b_on_a_cached_ms.len() + p.buckets[0].b_fresh_ms.len(), 2);
        assert_eq!(p.buckets[0].auc, Some(0.5));
        assert!(p.markdown().contains("| 32-64 | 1 + 1 | 0.500 |"), "{}", p.markdown());
    }

    #[test]
    fn a_channel_in_one_prefix_size_fails_on_its_own() {
        let key = |n: &str| TenantKey { name: n.into(), key: String::new() };
        let mut p = TimingProbe::new(30, &key("alice"), &key("bob"));
        let mut ex = Exchange::new(std::time::Duration::ZERO);
        ex.outcome = Outcome::Ok;
        for i in 0..30u64 {
            let bucket = (i % 3) as usize;
            // Only the longest prefixes leak: cached ones there answer in 5 ms, all else 50 ms.
            let jitter = std::time::Duration::from_micros(i * 37 % 1000);
            ex.ttft = Some(std::time::Duration::from_millis(if bucket == 2 { 5 } else { 50 }) + jitter);
            p.record(Class::BCached, i as usize, &ex, bucket);
            ex.ttft = Some(std::time::Duration::from_millis(50) + jitter);
            p.record(Class::BFresh, i as usize, &ex, bucket);
        }
        p.finish();
        let f: Vec<(&str, bool)> = p.findings().iter().map(|f| (f.kind, f.fails)).collect();
        assert!(f.contains(&(kind::TIMING_SIDE_CHANNEL, true)), "{f:?}");
        assert!(p.findings().iter().any(|f| f.detail.starts_with("on prefixes of 176-320 tokens")));
    }
}
