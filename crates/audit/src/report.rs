//! The audit's results: findings, outcomes, latency, metrics and the fault log, as one
//! serialisable value, rendered as `report.json` (everything), `report.md` (for people) and
//! `report.svg` (the chart), plus the few lines printed to stdout.
//!
//! Findings are the only place prompt or output text appears: a leak finding quotes the
//! canary and a short window of the response around it, which is the evidence.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::prom::ViolationDelta;
use super::timing::TimingProbe;
use super::workload::Calibration;
use crate::client::Outcome;
use crate::error::AuditError;
use crate::finding::{kind, Finding, RequestRow};

/// Nearest-rank percentiles of a sample.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Percentiles {
    pub n: usize,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

/// The `p`-th percentile (0 < p <= 100) of `sorted` by nearest rank: the smallest value with at
/// least p% of the sample at or below it. Always a value that was observed.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

impl Percentiles {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        Percentiles {
            n: v.len(),
            p50: percentile(&v, 50.0),
            p90: percentile(&v, 90.0),
            p99: percentile(&v, 99.0),
            max: v.last().copied(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// Streams only: a full response has no first token to time.
    pub ttft_ms: Percentiles,
    pub total_ms: Percentiles,
    /// Completed requests only (refusals answer in a millisecond and would hide the tail).
    pub total_ok_ms: Percentiles,
}

#[derive(Debug, Clone, Serialize)]
pub struct TenantRow {
    pub name: String,
    pub requests: usize,
    pub ok: usize,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Counts {
    pub cross_tenant_canaries: usize,
    pub cross_request_canaries: usize,
    /// Fragments found inside a garbled copy of the request's own canary (not failed).
    pub fragments_in_own_canary_copies: usize,
    pub divergences: usize,
    pub leaked_pages: usize,
    pub overlong_accepted: usize,
    /// Answers whose reported `prompt_tokens` is under the audit's own count.
    pub prompt_tokens_undercounted: usize,
    pub cross_tenant_cache_hits: usize,
    pub findings: usize,
    pub failing_findings: usize,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct DivergenceChecks {
    /// Requests chosen for an isolated re-run.
    pub selected: usize,
    /// Pairs compared (whole answers, or the received prefix of a partial one).
    pub compared: usize,
    /// Selected but not compared: nothing received the first time, or the re-run failed.
    pub skipped: usize,
    pub diverged: usize,
    /// Re-runs in flight together (all of one tenant).
    pub rerun_concurrency: usize,
    /// Whether the target was taken as batch-invariant (then any difference diverges).
    pub batch_invariant: bool,
    /// The largest log-prob difference allowed (0 when batch-invariant).
    pub logprob_tolerance: f64,
    /// Per scenario: selected, compared, why not, and the minimum to pass.
    pub by_scenario: BTreeMap<&'static str, super::rerun::CategoryChecks>,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct NearContext {
    pub planned: usize,
    /// Confirmed by the server's count to be 90-99% of the window.
    pub verified: usize,
}

/// One `/metrics` endpoint before and after.
#[derive(Debug, Clone, Serialize, Default)]
pub struct MetricsReport {
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_error: Option<String>,
    pub violations: Vec<ViolationDelta>,
    /// Page gauges still non-zero when the wait ended.
    pub pages_in_use_after: BTreeMap<String, f64>,
    /// None when the endpoint could not be read.
    pub pages_returned_to_zero: Option<bool>,
    pub before: BTreeMap<String, f64>,
    pub after: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub version: u32,
    pub passed: bool,
    pub url: String,
    /// The first tenant's model, its window, calibration and counter (every model's: `models`).
    pub model: String,
    pub seed: u64,
    pub context_window: usize,
    pub calibration: Calibration,
    /// Where the audit's own prompt lengths came from.
    pub prompt_lengths: super::meter::MeterSource,
    /// Every model the requests named, and which tenants named it.
    pub models: Vec<super::target::ModelRow>,
    pub concurrency: usize,
    pub requests_planned: usize,
    pub requests_sent: usize,
    /// Requests that only measured a prompt's length (refused before any work).
    pub probes: usize,
    pub near_context: NearContext,
    pub started_unix: u64,
    pub duration_s: f64,
    /// Seconds waited after the run for the page gauges to reach zero.
    pub pages_wait_s: f64,
    pub tenants: Vec<TenantRow>,
    pub counts: Counts,
    pub divergence_checks: DivergenceChecks,
    pub outcomes: BTreeMap<&'static str, usize>,
    pub outcomes_by_scenario: BTreeMap<&'static str, BTreeMap<&'static str, usize>>,
    pub errors_by_kind: BTreeMap<String, usize>,
    pub latency: Latency,
    pub metrics: Vec<MetricsReport>,
    pub fault_log: Vec<String>,
    pub notes: Vec<String>,
    /// Checks the operator skipped by name (`--skip-check`).
    pub skipped_checks: Vec<crate::options::SkippedCheck>,
    /// The timing probe's results; None when it did not run.
    pub timing_probe: Option<TimingProbe>,
    pub findings: Vec<Finding>,
    /// Every request: the load ("main"), the isolated re-runs ("rerun") and the timing probe
    /// ("probe"); outcome and latency tables count the load only.
    pub requests: Vec<RequestRow>,
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.0}"))
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

impl Report {
    /// Main-phase rows only (re-runs are a second pass, not load).
    fn main_rows(&self) -> impl Iterator<Item = &RequestRow> {
        self.requests.iter().filter(|r| r.phase == "main")
    }

    pub fn verdict(&self) -> String {
        let v = if self.passed { "PASS" } else { "FAIL" };
        let skipped: Vec<&str> = self.skipped_checks.iter().map(|c| c.name()).collect();
        if self.skipped_checks.contains(&crate::options::SkippedCheck::TimingProbe) {
            format!("{v} (the prefix cache was NOT checked; skipped: {})", skipped.join(", "))
        } else if !skipped.is_empty() {
            format!("{v} (skipped: {})", skipped.join(", "))
        } else {
            v.to_string()
        }
    }

    /// The lines printed when the audit ends (no prompt or output text).
    pub fn summary(&self, report_dir: Option<&Path>) -> String {
        let c = &self.counts;
        let mut s = format!(
            "pagewarden audit: {} - {} requests from {} tenants in {:.1} s (seed {})\n\
             cross-tenant canaries: {}, cross-request canaries: {}, divergences: {} of {} compared, leaked pages: {}, \
             over-long prompts accepted: {}, prompt_tokens under the audit's count: {}, fragments in own-canary copies \
             (not failed): {}\n",
            self.verdict(),
            self.requests_sent,
            self.tenants.len(),
            self.duration_s,
            self.seed,
            c.cross_tenant_canaries,
            c.cross_request_canaries,
            c.divergences,
            self.divergence_checks.compared,
            c.leaked_pages,
            c.overlong_accepted,
            c.prompt_tokens_undercounted,
            c.fragments_in_own_canary_copies,
        );
        let outcomes: Vec<String> =
            self.outcomes.iter().filter(|(_, n)| **n > 0).map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(s, "outcomes: {}", outcomes.join(", "));
        let l = &self.latency;
        let _ = writeln!(
            s,
            "latency ms: ttft p50 {} p90 {} p99 {}; total p50 {} p90 {} p99 {}",
            opt_ms(l.ttft_ms.p50),
            opt_ms(l.ttft_ms.p90),
            opt_ms(l.ttft_ms.p99),
            opt_ms(l.total_ms.p50),
            opt_ms(l.total_ms.p90),
            opt_ms(l.total_ms.p99)
        );
        if let Some(p) = &self.timing_probe {
            let _ = writeln!(s, "{}", p.summary_line());
        }
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        for f in self.findings.iter().filter(|f| f.fails).take(10) {
            let _ = writeln!(
                s,
                "FINDING {}: request {} ({}){}",
                f.kind,
                f.request.map_or("-".into(), |r| r.to_string()),
                f.tenant.as_deref().unwrap_or("-"),
                f.canary_owner.as_deref().map_or(String::new(), |o| format!(", canary of {o}")),
            );
        }
        if let Some(d) = report_dir {
            let _ = writeln!(s, "report: {}", d.join("report.md").display());
        }
        s
    }

    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let c = &self.counts;
        let _ = writeln!(s, "# pagewarden audit: {}\n", self.verdict());
        let _ = writeln!(
            s,
            "| check | result |\n|---|---|\n\
             | cross-tenant canaries | {} |\n| cross-request canaries (same tenant) | {} |\n\
             | divergences from an isolated re-run | {} of {} compared ({} skipped; re-runs one tenant at a time, {} at once) |\n\
             | leaked KV pages after the run | {} |\n| over-long prompts accepted (by the audit's count) | {} |\n\
             | answers reporting fewer prompt tokens than sent | {} |\n\
             | another canary's fragment inside a misspelt copy of the request's own canary (reported, not failed) | {} |",
            c.cross_tenant_canaries,
            c.cross_request_canaries,
            c.divergences,
            self.divergence_checks.compared,
            self.divergence_checks.skipped,
            self.divergence_checks.rerun_concurrency.max(1),
            c.leaked_pages,
            c.overlong_accepted,
            c.prompt_tokens_undercounted,
            c.fragments_in_own_canary_copies,
        );
        let _ = writeln!(
            s,
            "| cross-tenant cache hits (cached tokens beyond what the tenant sent itself, any phase) | {} |",
            c.cross_tenant_cache_hits
        );
        match &self.timing_probe {
            Some(p) => {
                let _ = writeln!(
                    s,
                    "| timing probe: AUC of cached vs fresh prefixes by TTFT (target <= {}) | {} ({} + {} samples; \
                     chunks {}) |",
                    p.threshold,
                    match (p.auc, p.auc_ci95) {
                        (Some(a), Some([lo, hi])) => format!("{a:.3}, 95% {lo:.3}-{hi:.3}"),
                        _ => "-".into(),
                    },
                    p.b_on_a_cached.n,
                    p.b_fresh.n,
                    p.chunks.auc.map_or("-".into(), |a| format!("{a:.3}")),
                );
            }
            None => {
                let _ =
                    writeln!(s, "| timing probe | **not run: the prefix cache was not checked for side channels** |");
            }
        }
        s.push('\n');
        let tenants: Vec<String> = self.tenants.iter().map(|t| format!("{} {}", t.name, t.requests)).collect();
        let _ = writeln!(s, "- target: {}", self.url);
        // One line per model the requests named (one model: the line says just that).
        for m in &self.models {
            let _ = writeln!(
                s,
                "- model `{}`, context window {} tokens{}; prompt calibration {:.3} tokens per filler word{}; prompt \
                 lengths counted by the audit with {}",
                m.model,
                m.context_window,
                if self.models.len() > 1 { format!(", used by {}", m.tenants.join(", ")) } else { String::new() },
                m.calibration.tokens_per_word,
                if m.calibration.measured { " (measured)" } else { " (guessed: the server does not report lengths)" },
                m.prompt_lengths.describe(),
            );
        }
        let _ = writeln!(
            s,
            "- {} requests ({} planned) from {} tenants ({}), concurrency {}, {:.1} s; {} length probes\n\
             - near-context prompts: {} ({} confirmed within 90-99% of the window)\n\
             - seed {} (repeat with `--seed {}`)\n",
            self.requests_sent,
            self.requests_planned,
            self.tenants.len(),
            tenants.join(", "),
            self.concurrency,
            self.duration_s,
            self.probes,
            self.near_context.planned,
            self.near_context.verified,
            self.seed,
            self.seed,
        );
        for n in &self.notes {
            let _ = writeln!(s, "- note: {n}");
        }

        let d = &self.divergence_checks;
        let _ = writeln!(
            s,
            "\n## Re-runs alone\n\nEach selected request sent again alone (one tenant at a time, faults paused), \
             compared token by token{}; a partial answer is compared on the tokens it received.\n\n\
             | scenario | selected | sent again under load | compared | of them prefixes | nothing received | \
             re-run failed | diverged | needed to pass |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            if d.batch_invariant {
                " and log-prob by log-prob, exactly (the target is batch-invariant)".to_string()
            } else {
                format!(", log-probs within {} (the target does not declare batch invariance)", d.logprob_tolerance)
            }
        );
        for (k, c) in &d.by_scenario {
            let _ = writeln!(
                s,
                "| {k} | {} | {} | {} | {} | {} | {} | {} | {} |",
                c.selected,
                c.sent_again,
                c.compared,
                c.prefixes,
                c.nothing_received,
                c.rerun_failed,
                c.diverged,
                c.required
            );
        }
        let _ = writeln!(s, "\n## Findings\n");
        if self.findings.is_empty() {
            let _ = writeln!(s, "None.");
        }
        for (i, f) in self.findings.iter().enumerate() {
            let _ = write!(s, "{}. **{}**{}", i + 1, f.kind, if f.fails { " (FAIL)" } else { "" });
            if let Some(r) = f.request {
                let _ = write!(
                    s,
                    " - request {r} (tenant {}, {})",
                    f.tenant.as_deref().unwrap_or("-"),
                    f.scenario.unwrap_or("-")
                );
            }
            let _ = write!(s, ": {}", f.detail);
            if let Some(ctx) = &f.context {
                let _ = write!(s, "\n   > `{}`", ctx.replace('`', "'"));
            }
            s.push('\n');
        }

        let _ = writeln!(s, "\n## Outcomes\n\n| outcome | requests |\n|---|---:|");
        for (k, n) in &self.outcomes {
            let _ = writeln!(s, "| {k} | {n} |");
        }
        let present: Vec<&'static str> = self.outcomes.iter().filter(|(_, n)| **n > 0).map(|(k, _)| *k).collect();
        let _ = writeln!(s, "\nBy scenario:\n\n| scenario | {} |", present.join(" | "));
        let _ = writeln!(s, "|---|{}", "---:|".repeat(present.len()));
        for (sc, row) in &self.outcomes_by_scenario {
            let cells: Vec<String> = present.iter().map(|o| row.get(o).copied().unwrap_or(0).to_string()).collect();
            let _ = writeln!(s, "| {sc} | {} |", cells.join(" | "));
        }
        let _ = writeln!(s, "\n## Errors by kind\n");
        if self.errors_by_kind.is_empty() {
            let _ = writeln!(s, "None.");
        } else {
            let _ = writeln!(s, "| kind | requests |\n|---|---:|");
            for (k, n) in &self.errors_by_kind {
                let _ = writeln!(s, "| {} | {n} |", md_cell(k));
            }
        }

        let _ = writeln!(s, "\n## Latency (ms)\n\n| | n | p50 | p90 | p99 | max |\n|---|---:|---:|---:|---:|---:|");
        for (name, p) in [
            ("time to first token (streams)", &self.latency.ttft_ms),
            ("total, all requests", &self.latency.total_ms),
            ("total, completed requests", &self.latency.total_ok_ms),
        ] {
            let _ = writeln!(
                s,
                "| {name} | {} | {} | {} | {} | {} |",
                p.n,
                opt_ms(p.p50),
                opt_ms(p.p90),
                opt_ms(p.p99),
                opt_ms(p.max)
            );
        }

        if let Some(p) = &self.timing_probe {
            let _ = write!(s, "\n## Timing probe\n\n{}", p.markdown());
        }

        let _ = writeln!(s, "\n## Metrics\n");
        if self.metrics.is_empty() {
            let _ = writeln!(s, "No metrics endpoint was read.");
        }
        for m in &self.metrics {
            let _ = writeln!(s, "### {}\n", m.url);
            for (when, e) in [("before", &m.before_error), ("after", &m.after_error)] {
                if let Some(e) = e {
                    let _ = writeln!(s, "- could not read it {when} the run: {}", md_cell(e));
                }
            }
            match m.pages_returned_to_zero {
                Some(true) => {
                    let _ = writeln!(s, "- KV pages in use returned to 0 ({:.1} s after the run)", self.pages_wait_s);
                }
                Some(false) => {
                    let _ = writeln!(s, "- **KV pages still in use** after waiting {:.1} s:", self.pages_wait_s);
                    for (k, v) in &m.pages_in_use_after {
                        let _ = writeln!(s, "  - `{k}` = {v}");
                    }
                }
                None => {}
            }
            let changed: Vec<&ViolationDelta> = m.violations.iter().filter(|v| v.delta != 0.0).collect();
            let _ = writeln!(
                s,
                "- isolation violations: {} kinds exported, {} changed during the run\n",
                m.violations.len(),
                changed.len()
            );
            if !m.violations.is_empty() {
                let _ =
                    writeln!(s, "| metric | kind | labels | before | after | delta |\n|---|---|---|---:|---:|---:|");
                for v in &m.violations {
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} | {} | {} | {} |",
                        v.metric,
                        v.kind,
                        md_cell(&v.labels),
                        v.before,
                        v.after,
                        v.delta
                    );
                }
            }
            let keys: std::collections::BTreeSet<&String> = m.before.keys().chain(m.after.keys()).collect();
            if !keys.is_empty() {
                let _ = writeln!(
                    s,
                    "\n<details><summary>before and after</summary>\n\n| sample | before | after |\n|---|---:|---:|"
                );
                for k in keys {
                    let f = |v: Option<&f64>| v.map_or("-".into(), |x| x.to_string());
                    let _ = writeln!(s, "| `{}` | {} | {} |", md_cell(k), f(m.before.get(k)), f(m.after.get(k)));
                }
                let _ = writeln!(s, "\n</details>\n");
            }
        }

        let _ = writeln!(s, "\n## Fault log\n");
        if self.fault_log.is_empty() {
            let _ = writeln!(s, "No faults were injected.");
        }
        for l in &self.fault_log {
            let _ = writeln!(s, "- {}", md_cell(l));
        }
        let _ = writeln!(
            s,
            "\n## Chart\n\n![latency and outcome of every request over the run](report.svg)\n\n\
             Every request of the run is in `report.json` (`requests`), with its outcome and timings."
        );
        s
    }

    /// Writes `report.json`, `report.md` and `report.svg` into `dir` (created if missing).
    pub fn write(&self, dir: &Path) -> Result<(), AuditError> {
        let report = |action: &'static str, path: PathBuf| {
            move |source: std::io::Error| AuditError::Report { action, path, source }
        };
        std::fs::create_dir_all(dir).map_err(report("creating", dir.to_path_buf()))?;
        let json = serde_json::to_string_pretty(self).map_err(AuditError::ReportJson)?;
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).map_err(report("writing", p))
        };
        write("report.json", &json)?;
        write("report.md", &self.markdown())?;
        let title =
            format!("pagewarden audit {} - {} requests, seed {}", self.verdict(), self.requests_sent, self.seed);
        write("report.svg", &super::svg::chart(&self.requests, &title))?;
        Ok(())
    }

    /// Fills the derived tables from the rows and findings.
    pub fn tally(&mut self) {
        let mut outcomes: BTreeMap<&'static str, usize> = Outcome::ALL.iter().map(|o| (o.name(), 0)).collect();
        let mut by_scenario: BTreeMap<&'static str, BTreeMap<&'static str, usize>> = BTreeMap::new();
        let mut errors: BTreeMap<String, usize> = BTreeMap::new();
        for r in self.main_rows() {
            *outcomes.entry(r.outcome.name()).or_default() += 1;
            *by_scenario.entry(r.scenario).or_default().entry(r.outcome.name()).or_default() += 1;
            if let Some(k) = &r.error_kind {
                *errors.entry(format!("{} {k}", r.status.map_or("-".into(), |s| s.to_string()))).or_default() += 1;
            }
        }
        let main: Vec<&RequestRow> = self.main_rows().collect();
        let latency = Latency {
            ttft_ms: Percentiles::of(main.iter().filter_map(|r| r.ttft_ms)),
            total_ms: Percentiles::of(main.iter().map(|r| r.total_ms)),
            total_ok_ms: Percentiles::of(main.iter().filter(|r| r.outcome == Outcome::Ok).map(|r| r.total_ms)),
        };
        let per_tenant: Vec<(usize, usize)> = self
            .tenants
            .iter()
            .map(|t| {
                let mine = main.iter().filter(|r| r.tenant == t.name);
                (mine.clone().count(), mine.filter(|r| r.outcome == Outcome::Ok).count())
            })
            .collect();
        let sent = main.len();
        for (t, (requests, ok)) in self.tenants.iter_mut().zip(per_tenant) {
            t.requests = requests;
            t.ok = ok;
        }
        self.latency = latency;
        self.requests_sent = sent;
        self.outcomes = outcomes;
        self.outcomes_by_scenario = by_scenario;
        self.errors_by_kind = errors;
        let count = |k: &str| self.findings.iter().filter(|f| f.kind == k).count();
        self.counts = Counts {
            cross_tenant_canaries: count(kind::CROSS_TENANT_CANARY),
            cross_request_canaries: count(kind::CROSS_REQUEST_CANARY),
            fragments_in_own_canary_copies: count(kind::FRAGMENT_IN_OWN_CANARY),
            divergences: count(kind::DIVERGENCE),
            leaked_pages: count(kind::LEAKED_PAGES),
            overlong_accepted: count(kind::OVERLONG_ACCEPTED),
            prompt_tokens_undercounted: count(kind::PROMPT_UNDERCOUNTED),
            cross_tenant_cache_hits: count(kind::CROSS_TENANT_CACHE_HIT),
            findings: self.findings.len(),
            failing_findings: self.findings.iter().filter(|f| f.fails).count(),
        };
        self.divergence_checks.diverged = self.counts.divergences;
        self.passed = self.counts.failing_findings == 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 90.0), Some(90.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        // Unsorted input, NaN dropped: of() sorts.
        let p = Percentiles::of([5.0, 1.0, f64::NAN, 3.0, 2.0, 4.0]);
        assert_eq!((p.n, p.p50, p.p90, p.max), (5, Some(3.0), Some(5.0), Some(5.0)));
        let small = Percentiles::of([10.0, 20.0]);
        assert_eq!((small.p50, small.p99), (Some(10.0), Some(20.0)));
    }

    pub(crate) fn sample_report() -> Report {
        let row = |id, tenant: &str, outcome, phase| RequestRow {
            id,
            phase,
            tenant: tenant.into(),
            scenario: "short",
            endpoint: "chat",
            stream: true,
            max_tokens: 16,
            canaries: 1,
            disconnect_after: None,
            status: Some(200),
            outcome,
            error_kind: None,
            finish_reason: Some("length".into()),
            prompt_tokens: Some(40),
            completion_tokens: Some(16),
            cached_tokens: None,
            events: 17,
            start_ms: id as f64 * 100.0,
            ttft_ms: Some(20.0),
            total_ms: 200.0 + id as f64,
        };
        let mut r = Report {
            version: 1,
            passed: false,
            url: "http://x".into(),
            model: "m".into(),
            seed: 3,
            context_window: 8192,
            calibration: Calibration::guess(),
            prompt_lengths: super::super::meter::MeterSource::Estimate,
            models: Vec::new(),
            concurrency: 2,
            requests_planned: 3,
            requests_sent: 0,
            probes: 2,
            near_context: NearContext::default(),
            started_unix: 0,
            duration_s: 1.5,
            pages_wait_s: 0.2,
            tenants: vec![
                TenantRow { name: "alice".into(), requests: 0, ok: 0 },
                TenantRow { name: "bob".into(), requests: 0, ok: 0 },
            ],
            counts: Counts::default(),
            divergence_checks: DivergenceChecks::default(),
            outcomes: BTreeMap::new(),
            outcomes_by_scenario: BTreeMap::new(),
            errors_by_kind: BTreeMap::new(),
            latency: Latency {
                ttft_ms: Percentiles::of([]),
                total_ms: Percentiles::of([]),
                total_ok_ms: Percentiles::of([]),
            },
            metrics: vec![MetricsReport { url: "http://x/metrics".into(), ..Default::default() }],
            fault_log: vec!["kill -9 decode-1 at 3.2 s".into()],
            notes: vec![],
            skipped_checks: vec![],
            timing_probe: None,
            findings: vec![],
            requests: vec![
                row(0, "alice", Outcome::Ok, "main"),
                row(1, "bob", Outcome::DisconnectedByUs, "main"),
                row(2, "bob", Outcome::Ok, "main"),
                row(0, "alice", Outcome::Ok, "rerun"),
            ],
        };
        r.tally();
        r
    }

    #[test]
    fn report_json_has_the_documented_shape() {
        let mut r = sample_report();
        assert!(r.passed);
        assert_eq!(r.requests_sent, 3);
        assert_eq!(r.tenants[1].requests, 2);
        r.findings.push(Finding {
            kind: kind::CROSS_TENANT_CANARY,
            fails: true,
            request: Some(2),
            tenant: Some("bob".into()),
            scenario: Some("short"),
            detail: "canary of alice".into(),
            canary: Some("kavorimu-tezulani-4821".into()),
            canary_owner: Some("alice".into()),
            canary_request: Some(0),
            location: Some("response text".into()),
            context: Some("…is kavorimu-tezulani-4821.".into()),
            whole: Some(true),
            ..Default::default()
        });
        r.tally();
        assert!(!r.passed);
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        for k in [
            "version",
            "passed",
            "seed",
            "tenants",
            "counts",
            "outcomes",
            "errors_by_kind",
            "latency",
            "metrics",
            "fault_log",
            "findings",
            "requests",
            "divergence_checks",
        ] {
            assert!(v.get(k).is_some(), "{k} missing");
        }
        assert_eq!(v["counts"]["cross_tenant_canaries"], 1);
        assert_eq!(v["counts"]["divergences"], 0);
        assert_eq!(v["counts"]["leaked_pages"], 0);
        assert_eq!(v["outcomes"]["ok"], 2);
        assert_eq!(v["outcomes"]["disconnected_by_us"], 1);
        assert_eq!(v["outcomes"]["transport_error"], 0);
        assert_eq!(v["findings"][0]["canary_owner"], "alice");
        assert!(v["findings"][0].get("delta").is_none());
        assert_eq!(v["latency"]["total_ms"]["n"], 3);
        assert_eq!(v["requests"][3]["phase"], "rerun");
        assert_eq!(v["requests"][1]["outcome"], "disconnected_by_us");

        let md = r.markdown();
        assert!(md.starts_with("# pagewarden audit: FAIL"));
        assert!(md.contains("kavorimu-tezulani-4821"));
        assert!(md.contains("kill -9 decode-1"));
        let summary = r.summary(None);
        assert!(summary.starts_with("pagewarden audit: FAIL"));
        // The summary names the finding but quotes no response text.
        assert!(summary.contains("cross_tenant_canary") && !summary.contains("kavorimu"));
    }

    #[test]
    fn the_timing_probe_is_in_every_form_of_the_report() {
        let mut r = sample_report();
        assert!(serde_json::to_value(&r).unwrap()["timing_probe"].is_null());
        assert!(!r.markdown().contains("## Timing probe"));
        r.timing_probe = Some(super::super::timing::probe_of(&[10.0, 20.0], &[20.0, 10.0]));
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["timing_probe"]["auc"], 0.5);
        assert_eq!(v["timing_probe"]["b_fresh"]["n"], 2);
        assert!(v["timing_probe"]["auc_ci95"].is_array());
        let md = r.markdown();
        assert!(
            md.contains("## Timing probe")
                && md.contains(
                    "| cross-tenant cache hits (cached tokens beyond what the tenant sent itself, any phase) | 0 |"
                )
        );
        assert!(r.summary(None).contains("timing probe: AUC 0.500"), "{}", r.summary(None));
    }

    #[test]
    fn writes_three_files() {
        let r = sample_report();
        let dir = std::env::temp_dir().join(format!("pw-audit-report-{}", std::process::id()));
        r.write(&dir).unwrap();
        let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        assert!(md.starts_with("# pagewarden audit: PASS"));
        let svg = std::fs::read_to_string(dir.join("report.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("disconnected_by_us (1)"));
        assert_eq!(svg.matches("<circle").count(), 4 + 2 + 1);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
        assert_eq!(json["passed"], true);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
