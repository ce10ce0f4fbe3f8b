//! The timing probe's results: can one tenant tell, from time to first token alone, which
//! prompts another tenant has in the server's cache? (invariant 8 of docs/invariants.md: no
//! cross-tenant hit, ever, and nothing another tenant can time.) [`crate::probe`] sends the
//! requests; this module judges them.
//!
//! Each sample has tenant A send a new prefix P twice (its own miss, "A cold", then its own
//! hit, "A warm") and tenant B send P ("B on A-cached") and, in random order with it, a fresh
//! prefix Q of the same size with its own filler ("B fresh"). In a third of each pair's
//! samples A also sends two more prompts once, and B sends the first with its middle third cut
//! out ("B on A's chunk") and the second's first third before fresh text ("B chunk fresh"):
//! a cache that reuses chunks past the point where two prompts part (llama.cpp's
//! `--cache-reuse`) shows there, even when it reports no cached tokens.
//!
//! B's classes are told apart by TTFT with the ROC AUC (Mann-Whitney U / (n1·n2), ties count
//! one half), oriented so that 0.5 is indistinguishable and more means B's requests on A's
//! cached prompts are faster. The burden of proof is on the server: the audit passes only when,
//! with at least [`POWERED_SAMPLES`] completed samples per class, the one-sided 95 % upper
//! bound of the AUC (Hanley-McNeil) is at most [`THRESHOLD`], so a side channel of AUC 0.6
//! fails 95 % of runs (and a server with none, AUC 0.5, passes about 99 % of them at the
//! default [`DEFAULT_SAMPLES`]). A probe that could not reach that power is a failing
//! `probe_underpowered` unless the operator waived the power by name; a probe request the
//! server did not answer (after honouring 429 and `Retry-After`) is a failing
//! `probe_unanswered`. Whatever the power, a channel whose two-sided interval lies wholly above
//! the threshold fails, overall, per prefix size ([`BUCKETS`]), per tenant pair and for chunks.
//! A reported cached count beyond the longest prefix the tenant itself sent before is a
//! failing `cross_tenant_cache_hit` ([`crate::own_prefix`]).

use serde::Serialize;

use crate::stats::{auc, hanley_mcneil_se, interval, median, Z95_ONE_SIDED};

use super::client::{Exchange, Outcome};
use super::finding::{kind, Finding};

/// The largest AUC a server may show (the target of invariant 8, docs/invariants.md).
pub const THRESHOLD: f64 = 0.6;
/// Fewer completed samples than this in a comparison: its AUC is reported, never judged.
pub const MIN_SAMPLES: usize = 8;
/// Completed samples per class from which the AUC's upper bound must be under the threshold:
/// a server without a side channel (AUC 0.5) then passes about 98.8 % of runs (the bound is
/// 0.5 + 1.645 · 0.0255), one with AUC 0.6 fails 95 % of them.
pub const POWERED_SAMPLES: usize = 256;
/// Samples per class when not told (`--timing-probe`): enough to reach [`POWERED_SAMPLES`]
/// with a tenth of the samples spent on the chunk variant's A requests and some to spare.
pub const DEFAULT_SAMPLES: usize = 300;
/// Prefix sizes in tokens, by bucket: a sample draws a bucket in turn, then a size in it. A
/// cache that leaks only long prefixes (or only short ones) shows in its bucket.
pub const BUCKETS: [(usize, usize); 3] = [(32, 64), (80, 160), (176, 320)];

/// What one probe request was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    ACold,
    AWarm,
    BCached,
    BFresh,
    /// A's prompts of the chunk variant, each sent once.
    AChunk,
    BChunk,
    BChunkFresh,
}

impl Class {
    /// The scenario name of its rows in report.json.
    pub fn name(self) -> &'static str {
        match self {
            Class::ACold => "probe_a_cold",
            Class::AWarm => "probe_a_warm",
            Class::BCached => "probe_b_on_a_cached",
            Class::BFresh => "probe_b_fresh",
            Class::AChunk => "probe_a_chunk",
            Class::BChunk => "probe_b_on_a_chunk",
            Class::BChunkFresh => "probe_b_chunk_fresh",
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

/// A request that reported more cached tokens than its tenant's own earlier prompts explain.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProbeHit {
    pub request: usize,
    pub class: &'static str,
    pub tenant: String,
    pub cached_tokens: u64,
    /// The longest prefix the tenant itself had sent before.
    pub own_prefix_tokens: usize,
}

/// A probe request the server did not answer, after the probe honoured its 429s.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Unanswered {
    pub request: usize,
    pub class: &'static str,
    pub tenant: String,
    pub status: Option<u16>,
    pub outcome: &'static str,
}

/// One comparison of B's requests on something A sent against B's fresh ones.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct Comparison {
    /// What is compared: a prefix size, a tenant pair, chunks.
    pub label: String,
    pub on_a_ms: Vec<f64>,
    pub fresh_ms: Vec<f64>,
    pub auc: Option<f64>,
    pub auc_ci95: Option<[f64; 2]>,
}

impl Comparison {
    fn new(label: String) -> Self {
        Comparison { label, ..Default::default() }
    }

    fn finish(&mut self) {
        let (m1, m2) = (self.on_a_ms.len(), self.fresh_ms.len());
        self.auc = auc(&self.on_a_ms, &self.fresh_ms);
        self.auc_ci95 = self.auc.map(|a| interval(a, m1, m2));
    }

    /// A clear channel: enough samples and the whole interval above the threshold.
    fn clear(&self) -> Option<(f64, f64, f64)> {
        let (a, [lo, hi]) = (self.auc?, self.auc_ci95?);
        (lo > THRESHOLD && self.on_a_ms.len().min(self.fresh_ms.len()) >= MIN_SAMPLES).then_some((a, lo, hi))
    }
}

/// The probe's results (`timing_probe` in report.json).
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct TimingProbe {
    /// Samples asked for.
    pub samples: usize,
    /// How the tenant pairs were drawn.
    pub pairs_drawn: String,
    pub endpoint: &'static str,
    /// Range of prefix sizes drawn, in tokens (estimated from the calibration).
    pub prefix_tokens: [usize; 2],
    /// The AUC by prefix size.
    pub buckets: Vec<Comparison>,
    /// The AUC by (A, B) tenant pair, each with the model id each used.
    pub pairs: Vec<Comparison>,
    /// B on A's prompt with its middle cut out, against A's other prompt's head before fresh text.
    pub chunks: Comparison,
    pub a_cold: ClassStats,
    pub a_warm: ClassStats,
    pub b_on_a_cached: ClassStats,
    pub b_fresh: ClassStats,
    pub b_on_a_chunk: ClassStats,
    pub b_chunk_fresh: ClassStats,
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
    /// The operator waived the power (`--skip-check probe-power`): an underpowered probe is
    /// reported, not failed.
    pub power_waived: bool,
    /// Median A cold over median A warm TTFT: what tenant A's own hits save.
    pub speedup: Option<f64>,
    /// Requests whose cached count went beyond their tenant's own earlier prompts.
    pub cross_tenant_hits: Vec<ProbeHit>,
    /// Requests the server did not answer, after 429s and `Retry-After` were honoured.
    pub unanswered: Vec<Unanswered>,
    pub failed_requests: usize,
    /// 429 and 503 answers the probe waited out and sent again.
    pub retries: usize,
    pub duration_s: f64,
    pub notes: Vec<String>,
}

impl TimingProbe {
    pub(crate) fn new(samples: usize, pairs: &[String], pairs_drawn: String) -> Self {
        TimingProbe {
            samples,
            pairs_drawn,
            endpoint: "completions",
            prefix_tokens: [BUCKETS[0].0, BUCKETS[BUCKETS.len() - 1].1],
            buckets: BUCKETS.iter().map(|&(lo, hi)| Comparison::new(format!("{lo}-{hi} tokens"))).collect(),
            pairs: pairs.iter().map(|p| Comparison::new(p.clone())).collect(),
            chunks: Comparison::new("A's prompt with its middle cut out".into()),
            threshold: THRESHOLD,
            ..Default::default()
        }
    }

    fn class_mut(&mut self, c: Class) -> &mut ClassStats {
        match c {
            Class::ACold | Class::AChunk => &mut self.a_cold,
            Class::AWarm => &mut self.a_warm,
            Class::BCached => &mut self.b_on_a_cached,
            Class::BFresh => &mut self.b_fresh,
            Class::BChunk => &mut self.b_on_a_chunk,
            Class::BChunkFresh => &mut self.b_chunk_fresh,
        }
    }

    /// Records one exchange of class `c` (request `id` of `tenant`) of a sample in `bucket`
    /// for tenant pair `pair`; `own_prefix`: the longest prefix the tenant sent before;
    /// `own_len`: the prompt's length by the audit's count.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &mut self,
        c: Class,
        id: usize,
        tenant: &str,
        ex: &Exchange,
        bucket: usize,
        pair: usize,
        own_prefix: usize,
        own_len: Option<usize>,
    ) {
        if ex.outcome != Outcome::Ok {
            self.failed_requests += 1;
            self.unanswered.push(Unanswered {
                request: id,
                class: c.name(),
                tenant: tenant.to_string(),
                status: ex.status,
                outcome: ex.outcome.name(),
            });
            return;
        }
        let ms = ex.ttft.unwrap_or(ex.total).as_secs_f64() * 1e3;
        self.class_mut(c).push(ms, ex.cached_tokens);
        let cached = matches!(c, Class::BCached);
        let fresh = matches!(c, Class::BFresh);
        if cached || fresh {
            for cmp in [self.buckets.get_mut(bucket), self.pairs.get_mut(pair)].into_iter().flatten() {
                if cached { &mut cmp.on_a_ms } else { &mut cmp.fresh_ms }.push(ms);
            }
        }
        match c {
            Class::BChunk => self.chunks.on_a_ms.push(ms),
            Class::BChunkFresh => self.chunks.fresh_ms.push(ms),
            _ => {}
        }
        let own_len = own_len.or(ex.prompt_tokens.map(|n| n as usize));
        if let Some(n) = ex.cached_tokens.filter(|n| crate::own_prefix::crosses(*n as usize, own_prefix, own_len)) {
            self.cross_tenant_hits.push(ProbeHit {
                request: id,
                class: c.name(),
                tenant: tenant.to_string(),
                cached_tokens: n,
                own_prefix_tokens: own_prefix,
            });
        }
    }

    /// Derives the medians, the AUCs and their intervals, the speed-up and the notes.
    pub fn finish(&mut self) {
        for c in [Class::ACold, Class::AWarm, Class::BCached, Class::BFresh, Class::BChunk, Class::BChunkFresh] {
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
        for b in self.buckets.iter_mut().chain(self.pairs.iter_mut()) {
            b.finish();
        }
        self.chunks.finish();
        self.speedup = match (self.a_cold.median_ms, self.a_warm.median_ms) {
            (Some(c), Some(w)) if w > 0.0 => Some(c / w),
            _ => None,
        };
        let mut notes = Vec::new();
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
        self.notes = notes;
    }

    /// The probe's findings: cross-tenant hits and unanswered requests (always failing), a
    /// probe short of power (failing unless waived), and each side channel.
    pub fn findings(&self) -> Vec<Finding> {
        let mut out = Vec::new();
        for h in &self.cross_tenant_hits {
            out.push(Finding {
                kind: kind::CROSS_TENANT_CACHE_HIT,
                fails: true,
                request: Some(h.request),
                tenant: Some(h.tenant.clone()),
                scenario: Some(h.class),
                detail: format!(
                    "the timing probe's request reported {} cached prompt tokens where tenant {}'s own earlier prompts \
                     share at most {}: it was served KV it never computed",
                    h.cached_tokens, h.tenant, h.own_prefix_tokens
                ),
                ..Default::default()
            });
        }
        if let Some(first) = self.unanswered.first() {
            let mut by: std::collections::BTreeMap<String, usize> = Default::default();
            for u in &self.unanswered {
                let status = u.status.map_or(u.outcome.to_string(), |s| s.to_string());
                *by.entry(format!("{} {status}", u.class)).or_default() += 1;
            }
            let by: Vec<String> = by.into_iter().map(|(k, n)| format!("{k} x{n}")).collect();
            out.push(Finding {
                kind: kind::PROBE_UNANSWERED,
                fails: true,
                request: Some(first.request),
                tenant: Some(first.tenant.clone()),
                detail: format!(
                    "{} of the timing probe's requests were not answered (after waiting out 429s and Retry-After): \
                     {}; the burden of proof is on the server, and an unanswered probe proves nothing",
                    self.unanswered.len(),
                    by.join(", ")
                ),
                ..Default::default()
            });
        }
        let (n1, n2) = (self.b_on_a_cached.n, self.b_fresh.n);
        if !self.powered {
            out.push(Finding {
                kind: kind::PROBE_UNDERPOWERED,
                fails: !self.power_waived,
                detail: format!(
                    "{n1} and {n2} completed samples: under {POWERED_SAMPLES} per class the probe cannot show an AUC at \
                     most {THRESHOLD}{}",
                    if self.power_waived {
                        " (waived by --skip-check probe-power: only a clear channel fails)"
                    } else {
                        "; run with --timing-probe 300 or more"
                    }
                ),
                ..Default::default()
            });
        }
        if let (Some(a), Some([lo, hi]), Some(up)) = (self.auc, self.auc_ci95, self.auc_upper95) {
            // A clear channel (the whole interval above the target), or, once the probe has the
            // samples to show it, a channel that cannot be ruled out (the upper bound above it).
            let clear = lo > THRESHOLD && self.judged;
            let unproven = self.powered && up > THRESHOLD;
            if clear || unproven {
                let why = if clear {
                    format!("95% {lo:.3}-{hi:.3}, wholly over {THRESHOLD}")
                } else {
                    format!("one-sided 95% upper bound {up:.3}, over {THRESHOLD}: the server has not shown it is under")
                };
                out.push(Finding {
                    kind: kind::TIMING_SIDE_CHANNEL,
                    fails: true,
                    detail: format!(
                        "a tenant tells prefixes another tenant has cached from fresh ones by time to first token: AUC \
                         {a:.3} ({why}) from {n1} and {n2} samples; median {} ms on cached prefixes, {} ms on fresh \
                         ones",
                        fmt_ms(self.b_on_a_cached.median_ms),
                        fmt_ms(self.b_fresh.median_ms),
                    ),
                    ..Default::default()
                });
            }
        }
        for (what, c) in self.buckets.iter().map(|b| ("on prefixes of", b)).chain(self.pairs.iter().map(|p| ("for", p)))
        {
            if let Some((a, lo, hi)) = c.clear() {
                out.push(Finding {
                    kind: kind::TIMING_SIDE_CHANNEL,
                    fails: true,
                    detail: format!(
                        "{what} {}: cached prefixes told from fresh ones by time to first token, AUC {a:.3} (95% \
                         {lo:.3}-{hi:.3}, wholly over {THRESHOLD}) from {} and {} samples",
                        c.label,
                        c.on_a_ms.len(),
                        c.fresh_ms.len()
                    ),
                    ..Default::default()
                });
            }
        }
        if let Some((a, lo, hi)) = self.chunks.clear() {
            out.push(Finding {
                kind: kind::CHUNK_REUSE_SIDE_CHANNEL,
                fails: true,
                detail: format!(
                    "a tenant tells the end of another tenant's prompt, sent past a gap, from fresh text by time to \
                     first token: AUC {a:.3} (95% {lo:.3}-{hi:.3}, wholly over {THRESHOLD}) from {} and {} samples; \
                     the cache reuses chunks that are not a prefix, across tenants",
                    self.chunks.on_a_ms.len(),
                    self.chunks.fresh_ms.len()
                ),
                ..Default::default()
            });
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
            "timing probe: {auc} telling prefixes another tenant cached from fresh ones by TTFT, {} + {} samples \
             (target <= {THRESHOLD}); median {} vs {} ms; chunks AUC {}; own hits x{} faster ({} cached tokens); \
             unanswered {}; cross-tenant hits {}",
            self.b_on_a_cached.n,
            self.b_fresh.n,
            fmt_ms(self.b_on_a_cached.median_ms),
            fmt_ms(self.b_fresh.median_ms),
            self.chunks.auc.map_or("-".into(), |a| format!("{a:.3}")),
            self.speedup.map_or("-".into(), |s| format!("{s:.2}")),
            self.a_warm.cached_median().map_or("-".into(), |n| format!("median {n}")),
            self.unanswered.len(),
            self.cross_tenant_hits.len(),
        )
    }

    /// The report.md section.
    pub fn markdown(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "Tenant pairs ({}): A sent each new prefix twice (a miss, then its own hit); B then sent the same prefix and \
             a fresh one of the same size with its own filler, in random order; in a third of each pair's samples, B also sent one of \
             two new prompts of A with its middle third cut out, against the other's first third before fresh text. \
             One request at a time, streamed, \
             `max_tokens` 1, through `/v1/{}`; prefixes of {}-{} tokens.\n",
            self.pairs_drawn, self.endpoint, self.prefix_tokens[0], self.prefix_tokens[1]
        );
        let _ = writeln!(s, "| requests | n | median TTFT (ms) | cached tokens (median, max) |\n|---|---:|---:|---:|");
        for (name, c) in [
            ("A cold (new prefix)", &self.a_cold),
            ("A warm (same prefix again)", &self.a_warm),
            ("B on A's cached prefix", &self.b_on_a_cached),
            ("B fresh prefix", &self.b_fresh),
            ("B on A's prompt with its middle cut out", &self.b_on_a_chunk),
            ("B on A's prompt head before fresh text", &self.b_chunk_fresh),
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
            _ if self.power_waived => "not shown under the target (too few samples; the power was waived)",
            _ => "**not shown under the target** (too few samples)",
        };
        let _ = writeln!(
            s,
            "\n- ROC AUC of telling B's requests on A's cached prefixes from fresh ones by TTFT: {} (95% {}, one-sided \
             upper bound {}, Hanley-McNeil), target <= {THRESHOLD}: {verdict}",
            self.auc.map_or("-".into(), |a| format!("{a:.3}")),
            self.auc_ci95.map_or("-".into(), |[lo, hi]| format!("{lo:.3}-{hi:.3}")),
            self.auc_upper95.map_or("-".into(), |u| format!("{u:.3}")),
        );
        let _ = writeln!(s, "\n| compared | n | AUC | 95% |\n|---|---:|---:|---:|");
        for c in self.buckets.iter().chain(&self.pairs).chain(std::iter::once(&self.chunks)) {
            let _ = writeln!(
                s,
                "| {} | {} + {} | {} | {} |",
                c.label,
                c.on_a_ms.len(),
                c.fresh_ms.len(),
                c.auc.map_or("-".into(), |a| format!("{a:.3}")),
                c.auc_ci95.map_or("-".into(), |[lo, hi]| format!("{lo:.3}-{hi:.3}")),
            );
        }
        s.push('\n');
        let _ = writeln!(
            s,
            "- A's own hit speed-up (median cold / median warm TTFT): {}",
            self.speedup.map_or("-".into(), |x| format!("x{x:.2}"))
        );
        let _ = writeln!(
            s,
            "- requests that reported cached tokens beyond their tenant's own earlier prompts: {}; unanswered probe \
             requests: {}; 429/503 waited out and sent again: {}; {:.1} s",
            self.cross_tenant_hits.len(),
            self.unanswered.len(),
            self.retries,
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

/// A probe for the tests: classes filled from TTFT lists, then finished.
#[cfg(test)]
pub(super) fn probe_of(cached: &[f64], fresh: &[f64]) -> TimingProbe {
    let mut p = TimingProbe::new(cached.len(), &[], "test".into());
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
    use crate::rng::Rng;

    fn failing(p: &TimingProbe) -> Vec<(&'static str, bool)> {
        p.findings().iter().map(|f| (f.kind, f.fails)).collect()
    }

    #[test]
    fn findings_follow_the_threshold_and_the_sample_count() {
        // Indistinguishable, 32 + 32: no channel, but too few samples to show it: failing
        // unless the power was waived.
        let noise: Vec<f64> = (0..32).map(|i| 100.0 + f64::from(i % 7)).collect();
        let mut p = probe_of(&noise, &noise);
        assert_eq!(p.auc, Some(0.5));
        assert!(p.judged && !p.powered);
        assert_eq!(failing(&p), [(kind::PROBE_UNDERPOWERED, true)]);
        p.power_waived = true;
        assert_eq!(failing(&p), [(kind::PROBE_UNDERPOWERED, false)]);

        // Fully separated, 32 + 32: a failing side channel, whatever the power.
        let fast: Vec<f64> = (0..32).map(|i| 50.0 + f64::from(i)).collect();
        let slow: Vec<f64> = (0..32).map(|i| 200.0 + f64::from(i)).collect();
        let mut p = probe_of(&fast, &slow);
        p.power_waived = true;
        assert_eq!(p.auc, Some(1.0));
        assert_eq!(failing(&p), [(kind::PROBE_UNDERPOWERED, false), (kind::TIMING_SIDE_CHANNEL, true)]);

        // Cached ones slower: not the side channel the target is about.
        let mut p = probe_of(&slow, &fast);
        p.power_waived = true;
        assert!(p.findings().iter().all(|f| !f.fails));

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
        // Powered and indistinguishable: nothing at all.
        let same: Vec<f64> = (0..300).map(|i| f64::from(i % 17)).collect();
        assert!(probe_of(&same, &same).findings().is_empty());

        // Separated but from a handful of samples: not judged as a channel, still underpowered.
        let mut p = probe_of(&fast[..4], &slow[..4]);
        assert!(!p.judged);
        assert_eq!(failing(&p), [(kind::PROBE_UNDERPOWERED, true)]);
        p.power_waived = true;
        assert_eq!(failing(&p), [(kind::PROBE_UNDERPOWERED, false)]);
    }

    /// A standard normal draw (Box-Muller).
    fn normal(r: &mut Rng) -> f64 {
        let u: f64 = r.unit().max(1e-12);
        let v: f64 = r.unit();
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

    fn answered(ms: u64, cached: Option<u64>) -> Exchange {
        let mut ex = Exchange::new(std::time::Duration::ZERO);
        ex.outcome = Outcome::Ok;
        ex.status = Some(200);
        ex.ttft = Some(std::time::Duration::from_millis(ms));
        ex.cached_tokens = cached;
        ex
    }

    #[test]
    fn a_hit_beyond_the_tenants_own_prefix_fails_in_any_class_and_every_unanswered_request_fails() {
        let pairs = ["alice (m) and bob (m)".to_string()];
        let mut p = TimingProbe::new(1, &pairs, "test".into());
        // A's own hit on the prefix it sent itself: the cache working.
        p.record(Class::AWarm, 1, "alice", &answered(40, Some(96)), 0, 0, 100, None);
        // B never sent the prefix: a hit on A's or on a fresh one is KV it never computed.
        p.record(Class::BCached, 2, "bob", &answered(40, Some(96)), 0, 0, 0, None);
        p.record(Class::BFresh, 3, "bob", &answered(40, Some(160)), 1, 0, 3, None);
        // Within what bob's own earlier prompts share: its own.
        p.record(Class::BFresh, 4, "bob", &answered(40, Some(3)), 2, 0, 3, None);
        let mut refused = answered(1, None);
        refused.outcome = Outcome::Unavailable503;
        refused.status = Some(503);
        p.record(Class::BCached, 5, "bob", &refused, 0, 0, 0, None);
        p.finish();
        assert_eq!(p.failed_requests, 1);
        assert_eq!(p.a_warm.median_ms, Some(40.0));
        let got: Vec<(&str, bool, Option<usize>)> = p.findings().iter().map(|f| (f.kind, f.fails, f.request)).collect();
        assert_eq!(
            got[..3],
            [
                (kind::CROSS_TENANT_CACHE_HIT, true, Some(2)),
                (kind::CROSS_TENANT_CACHE_HIT, true, Some(3)),
                (kind::PROBE_UNANSWERED, true, Some(5)),
            ]
        );
        let f = p.findings();
        assert!(f[1].detail.contains("160 cached prompt tokens") && f[1].detail.contains("share at most 3"));
        assert!(f[2].detail.contains("probe_b_on_a_cached 503 x1"), "{}", f[2].detail);
        assert!(p.markdown().contains("| B on A's cached prefix | 1 | 40.0 | 96, 96 |"), "{}", p.markdown());
        assert_eq!(p.buckets[0].on_a_ms.len(), 1);
        assert_eq!(p.pairs[0].on_a_ms.len() + p.pairs[0].fresh_ms.len(), 3);
    }

    #[test]
    fn a_channel_in_one_prefix_size_one_pair_or_in_chunks_fails_on_its_own() {
        let pairs = ["alice and bob".to_string(), "alice and carol".to_string()];
        // `leak(bucket, pair)`: whether B's requests on A's prefixes answer fast there.
        let run = |leak: &dyn Fn(usize, usize) -> bool, chunks_leak: bool| {
            let mut p = TimingProbe::new(120, &pairs, "test".into());
            p.power_waived = true;
            for i in 0..120u64 {
                let (bucket, pair) = ((i % 3) as usize, (i / 3 % 2) as usize);
                let jitter = i * 37 % 1000 / 100;
                let fast = |yes: bool| answered(if yes { 5 } else { 50 } + jitter, None);
                p.record(Class::BCached, 0, "b", &fast(leak(bucket, pair)), bucket, pair, 0, None);
                p.record(Class::BFresh, 0, "b", &fast(false), bucket, pair, 0, None);
                p.record(Class::BChunk, 0, "b", &fast(chunks_leak), bucket, pair, 0, None);
                p.record(Class::BChunkFresh, 0, "b", &fast(false), bucket, pair, 0, None);
            }
            p.finish();
            p.findings().into_iter().filter(|f| f.fails).map(|f| (f.kind, f.detail)).collect::<Vec<_>>()
        };
        let f = run(&|bucket, _| bucket == 2, false);
        assert!(f.iter().any(|(_, d)| d.starts_with("on prefixes of 176-320 tokens")), "{f:?}");
        assert!(!f.iter().any(|(k, _)| *k == kind::CHUNK_REUSE_SIDE_CHANNEL), "{f:?}");
        let f = run(&|_, pair| pair == 0, true);
        assert!(f.iter().any(|(_, d)| d.starts_with("for alice and bob")), "{f:?}");
        assert!(!f.iter().any(|(_, d)| d.starts_with("for alice and carol")), "{f:?}");
        assert!(f.iter().any(|(k, _)| *k == kind::CHUNK_REUSE_SIDE_CHANNEL), "{f:?}");
    }
}
