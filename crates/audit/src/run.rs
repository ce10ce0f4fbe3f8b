//! One audit run as a value that goes through the phases of the crate's doc in order:
//! [`Run::discover`], [`Discovered::plan`], [`Run::load`], [`Run::rerun`], [`Run::probe`],
//! [`Run::settle`], [`Run::report`]. Each phase hands the next what it produced; findings and
//! request rows, which the phases' client threads all add to, live in the run.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::canary::CanaryIndex;
use crate::client::{Client, Exchange};
use crate::error::AuditError;
use crate::examine::Examiner;
use crate::finding::{kind, Finding, RequestRow};
use crate::options::{AuditHooks, AuditOptions, SkippedCheck};
use crate::own_prefix::{OwnPrefixes, Units};
use crate::probe;
use crate::progress::Progress;
use crate::report::{self, Counts, Report};
use crate::rerun;
use crate::rng::{self, Rng};
use crate::settle::{self, Scrapes};
use crate::sync::lock;
use crate::target::Targets;
use crate::timing::TimingProbe;
use crate::workload::{self, Plan, ReqSpec, Unit};

/// Time limit of one request: past the server's own request deadline (300 s by default), so
/// that the server, not the audit, ends a stalled request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(330);
/// How long the page gauges get to return to zero after the run.
const PAGES_WAIT: Duration = Duration::from_secs(30);
/// Rounds of re-sending, under load, the re-run requests whose answer carried nothing to
/// compare, while a category is short of its comparisons.
const TOP_UP_ROUNDS: usize = 6;
/// Tries of one isolated re-run that gives nothing to compare (a load refusal, a failure).
const RERUN_TRIES: usize = 3;

/// What a run found.
#[derive(Debug, Clone)]
pub struct AuditOutcome {
    pub passed: bool,
    /// A few lines for stdout (no prompt or output text).
    pub summary: String,
    pub counts: Counts,
    /// Every finding, failing or not, as in report.json.
    pub findings: Vec<Finding>,
}

/// Runs the audit against `opts.url`.
pub fn run_audit(opts: &AuditOptions, hooks: &dyn AuditHooks) -> Result<AuditOutcome, AuditError> {
    let client = Client::new(&opts.url, REQUEST_TIMEOUT);
    let mut run = Run::discover(opts, hooks, &client)?.plan();
    let load = run.load();
    hooks.on_load_done();
    let checks = run.rerun(load);
    let timing = run.probe();
    run.progress.finish();
    let duration = run.t0.elapsed();
    let settled = run.settle();
    run.report(checks, timing, duration, settled)
}

/// What the first phase learned of the target.
pub(crate) struct Discovered<'a> {
    pub(crate) opts: &'a AuditOptions,
    pub(crate) hooks: &'a dyn AuditHooks,
    pub(crate) client: &'a Client,
    pub(crate) started_unix: u64,
    /// The model each tenant's requests name, and each model's window and counter.
    pub(crate) targets: Targets<'a>,
    /// Every `/metrics` endpoint before anything was sent.
    pub(crate) before: Scrapes,
    /// What the report should say about how the run was judged.
    pub(crate) notes: Vec<String>,
    /// What discovery itself found (a tokenizer or window the target lies about).
    pub(crate) findings: Vec<Finding>,
}

/// A planned run and what its phases add up.
pub(crate) struct Run<'a> {
    pub(crate) d: Discovered<'a>,
    pub(crate) rng: Rng,
    pub(crate) canaries: CanaryIndex,
    pub(crate) plan: Plan,
    /// Requests spent on discovering lengths.
    pub(crate) probes: usize,
    /// Samples per class of the timing probe (0: none).
    pub(crate) probe_samples: usize,
    pub(crate) progress: Progress,
    pub(crate) t0: Instant,
    pub(crate) rows: Mutex<Vec<RequestRow>>,
    pub(crate) findings: Mutex<Vec<Finding>>,
    /// What each tenant sent so far: how many cached tokens its answers may report.
    pub(crate) own: OwnPrefixes,
}

/// What the load phase leaves for the re-runs.
pub(crate) struct Load {
    /// The answers under load of the requests chosen for a re-run.
    kept: HashMap<usize, Exchange>,
    /// By scenario: chosen requests sent again under load (top-up) for want of an answer.
    sent_again: BTreeMap<&'static str, usize>,
}

/// The deployment after the run.
pub(crate) struct Settled {
    after: Scrapes,
    pages_wait_s: f64,
}

impl<'a> Run<'a> {
    /// Phase 1: the model, the context window (given, listed, or read from a refusal), the
    /// audit's own prompt counter and how many tokens a word of filler costs; every `/metrics`
    /// endpoint as it was before the run.
    pub(crate) fn discover(
        opts: &'a AuditOptions,
        hooks: &'a dyn AuditHooks,
        client: &'a Client,
    ) -> Result<Discovered<'a>, AuditError> {
        if opts.tenants.is_empty() {
            return Err(AuditError::Usage("the audit needs at least one tenant".into()));
        }
        if opts.concurrency == 0 {
            return Err(AuditError::Usage("--concurrency must be at least 1".into()));
        }
        let started_unix =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let before = settle::scrape_all(client, metrics_urls(opts, hooks), opts.metrics_token.as_deref());
        if opts.timing_probe == 0 && !opts.skips(SkippedCheck::TimingProbe) {
            return Err(AuditError::Usage(
                "a timing probe of 0 samples checks nothing: skip it by name with --skip-check timing-probe".into(),
            ));
        }
        let mut notes = Vec::new();
        let mut findings = Vec::new();
        let targets = Targets::discover(opts, client, &mut notes, &mut findings)?;
        Ok(Discovered { opts, hooks, client, started_unix, targets, before, notes, findings })
    }

    fn examiner(&self) -> Examiner<'_> {
        Examiner { opts: self.d.opts, canaries: &self.canaries }
    }

    /// Sends one request, judges its answer and records it; keeps the answer of a request
    /// chosen for a re-run, until the comparison.
    fn send(&self, spec: &ReqSpec, phase: &'static str, kept: &Mutex<HashMap<usize, Exchange>>) {
        let sent = self.own.send(spec.tenant, units(spec));
        let ex = self.d.client.exchange(&self.d.opts.tenants[spec.tenant].key, spec, self.t0);
        let own_prefix = self.own.allowed(sent);
        let judge = self.examiner();
        lock(&self.findings).extend(judge.examine(spec, &ex, false));
        lock(&self.findings).extend(judge.cache_hit(spec, &ex, own_prefix, phase));
        lock(&self.rows).push(judge.row(spec, &ex, phase));
        if spec.rerun {
            lock(kept).insert(spec.id, ex);
        }
        self.progress.tick(self.d.hooks);
    }

    /// Phase 3: every planned request with `concurrency` clients (a group's members leave
    /// together: a burst, or a shared prefix in flight for every tenant at once); then the
    /// top-up: a request chosen for a re-run whose answer carried nothing to compare (refused
    /// for load, failed by a fault before its first token) is sent again, with the others in
    /// that state, still under faults, since a comparison needs an answer given under load.
    pub(crate) fn load(&self) -> Load {
        let opts = self.d.opts;
        let kept: Mutex<HashMap<usize, Exchange>> = Mutex::new(HashMap::new());
        let next = AtomicUsize::new(0);
        let one = |spec: &ReqSpec| self.send(spec, "main", &kept);
        let staggered = staggered_groups(&self.plan.units);
        std::thread::scope(|s| {
            for _ in 0..opts.concurrency {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(unit) = self.plan.units.get(i) else { break };
                    match unit {
                        Unit::One(spec) => one(spec),
                        Unit::Group(members) => {
                            // A staggered group's first member is answered before the others
                            // leave: a cache shared across tenants then serves them its prefix.
                            let members = match staggered.get(i) {
                                Some(true) => {
                                    one(&members[0]);
                                    &members[1..]
                                }
                                _ => &members[..],
                            };
                            let gate = Barrier::new(members.len());
                            std::thread::scope(|g| {
                                for m in members {
                                    let gate = &gate;
                                    g.spawn(move || {
                                        gate.wait();
                                        one(m);
                                    });
                                }
                            });
                        }
                    }
                });
            }
        });

        let mut sent_again: BTreeMap<&'static str, usize> = BTreeMap::new();
        for _ in 0..TOP_UP_ROUNDS {
            let selected: Vec<&ReqSpec> = self.plan.units.iter().flat_map(Unit::specs).filter(|s| s.rerun).collect();
            let is_empty = |s: &&ReqSpec| {
                lock(&kept)
                    .get(&s.id)
                    .is_none_or(|ex| rerun::plan(ex, s.scenario.must_be_refused()) == rerun::RerunPlan::Nothing)
            };
            // Only categories that would fall short: a few empty answers in a category that
            // has its comparisons are left as they are.
            let short: Vec<&'static str> =
                rerun::short_categories(selected.iter().map(|s| (s.scenario.name(), !is_empty(s))));
            let empty: Vec<&ReqSpec> =
                selected.iter().copied().filter(|s| short.contains(&s.scenario.name()) && is_empty(s)).collect();
            if empty.is_empty() {
                break;
            }
            self.progress.total.fetch_add(empty.len(), Ordering::SeqCst);
            for s in &empty {
                *sent_again.entry(s.scenario.name()).or_default() += 1;
            }
            let next = AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..opts.concurrency {
                    s.spawn(|| {
                        while let Some(spec) = empty.get(next.fetch_add(1, Ordering::SeqCst)) {
                            self.send(spec, "top_up", &kept);
                        }
                    });
                }
            });
        }
        Load { kept: kept.into_inner().unwrap_or_else(|e| e.into_inner()), sent_again }
    }

    /// Phase 4: the isolated second pass, one tenant at a time with nothing of any other
    /// tenant in flight (up to `rerun_concurrency` of that tenant's requests together), each
    /// chosen request compared with its answer under load: whole when both completed, on the
    /// tokens received when one was a partial stream, refused again when it was refused.
    pub(crate) fn rerun(&self, load: Load) -> report::DivergenceChecks {
        let opts = self.d.opts;
        let kept = Mutex::new(load.kept);
        let mut selected: Vec<&ReqSpec> = self.plan.units.iter().flat_map(Unit::specs).filter(|s| s.rerun).collect();
        selected.sort_by_key(|s| (s.tenant, s.id));
        // Per model: each declares its own invariance.
        let tolerance_of =
            |tenant: usize| if self.d.targets.of(tenant).batch_invariant { 0.0 } else { rerun::LOGPROB_TOLERANCE };
        let invariant = self.d.targets.models.iter().all(|m| m.batch_invariant);
        let by_scenario: Mutex<BTreeMap<&'static str, rerun::CategoryChecks>> = Mutex::new(BTreeMap::new());
        for s in &selected {
            let mut by = lock(&by_scenario);
            let c = by.entry(s.scenario.name()).or_default();
            c.selected += 1;
            c.required = rerun::required(c.selected);
            c.sent_again = load.sent_again.get(s.scenario.name()).copied().unwrap_or(0);
        }
        let rerun_nonce = rng::random_seed();
        let judge = self.examiner();
        let rerun = |spec: &ReqSpec| {
            let Some(first) = lock(&kept).remove(&spec.id) else { return };
            let count =
                |f: &dyn Fn(&mut rerun::CategoryChecks)| f(lock(&by_scenario).entry(spec.scenario.name()).or_default());
            let how = rerun::plan(&first, spec.scenario.must_be_refused());
            if how == rerun::RerunPlan::Nothing {
                count(&|c| c.nothing_received += 1);
                self.progress.tick(self.d.hooks);
                return;
            }
            // A fresh cache salt: the reference is computed from scratch, never from pages the
            // first run (or an earlier audit) left in the prefix cache.
            let key = &opts.tenants[spec.tenant].key;
            let mut alone = spec.body.clone();
            alone["cache_salt"] = json!(format!("audit-rerun-{}-{rerun_nonce:016x}-{}", opts.seed, spec.id));
            let client = self.d.client;
            let mut tries = 0;
            let again = loop {
                let sent = self.own.send(spec.tenant, units(spec));
                let again = match how {
                    rerun::RerunPlan::Prefix(n) => client.exchange_until_tokens(key, spec, &alone, n, self.t0),
                    _ => client.exchange(
                        key,
                        &ReqSpec { body: alone.clone(), disconnect_after: None, ..spec.clone() },
                        self.t0,
                    ),
                };
                lock(&self.findings).extend(judge.examine(spec, &again, true));
                lock(&self.findings).extend(judge.cache_hit(spec, &again, self.own.allowed(sent), "rerun"));
                lock(&self.rows).push(judge.row(spec, &again, "rerun"));
                tries += 1;
                if rerun::usable(how, &again) || tries >= RERUN_TRIES {
                    break again;
                }
                std::thread::sleep(Duration::from_millis(250 << tries));
            };
            self.progress.tick(self.d.hooks);
            if !rerun::usable(how, &again) {
                count(&|c| c.rerun_failed += 1);
                return;
            }
            count(&|c| {
                c.compared += 1;
                c.prefixes += usize::from(matches!(how, rerun::RerunPlan::Prefix(_)));
            });
            let prefix = match how {
                rerun::RerunPlan::Prefix(n) => Some(n),
                rerun::RerunPlan::Refusal => {
                    // Refused under load: it must be refused alone too, with the same class of
                    // status. A refusal that was only a matter of load is not one.
                    if let Some(why) = rerun::refusal_differs(&first, &again) {
                        count(&|c| c.diverged += 1);
                        lock(&self.findings).push(judge.finding(spec, kind::REFUSAL_NOT_REPEATED, true, why));
                    }
                    return;
                }
                _ => None,
            };
            if let Some((position, what, delta)) = rerun::divergence(&first, &again, prefix, tolerance_of(spec.tenant))
            {
                count(&|c| c.diverged += 1);
                let partial = if prefix.is_some() { " (on the tokens received before the stream ended)" } else { "" };
                let detail =
                    format!("the response under load differs from the same request run alone{partial}: {what}");
                lock(&self.findings).push(Finding {
                    position,
                    delta,
                    ..judge.finding(spec, kind::DIVERGENCE, true, detail)
                });
            }
        };
        for tenant_specs in selected.chunk_by(|a, b| a.tenant == b.tenant) {
            let next = AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..opts.rerun_concurrency.max(1) {
                    s.spawn(|| {
                        while let Some(spec) = tenant_specs.get(next.fetch_add(1, Ordering::SeqCst)) {
                            rerun(spec);
                        }
                    });
                }
            });
        }
        let by_scenario = by_scenario.into_inner().unwrap_or_else(|e| e.into_inner());
        for (scenario, compared, required) in rerun::short_of_minimum(&by_scenario) {
            lock(&self.findings).push(Finding {
                kind: kind::TOO_FEW_COMPARISONS,
                fails: true,
                scenario: Some(scenario),
                detail: format!(
                    "only {compared} of the `{scenario}` requests could be compared with a re-run alone (at least \
                     {required} needed): the audit cannot vouch for that category"
                ),
                ..Default::default()
            });
        }
        report::DivergenceChecks {
            selected: selected.len(),
            compared: by_scenario.values().map(|c| c.compared).sum(),
            skipped: by_scenario.values().map(|c| c.nothing_received + c.rerun_failed).sum(),
            diverged: 0,
            rerun_concurrency: opts.rerun_concurrency.max(1),
            batch_invariant: invariant,
            logprob_tolerance: if invariant { 0.0 } else { rerun::LOGPROB_TOLERANCE },
            by_scenario,
        }
    }

    /// Phase 5: the timing probe, one request at a time with nothing else in flight, over
    /// pairs of tenants each on the model id listed for it ([`probe`]).
    pub(crate) fn probe(&mut self) -> Option<TimingProbe> {
        let opts = self.d.opts;
        if self.probe_samples == 0 {
            return None;
        }
        let tenants: Vec<probe::ProbeTenant> = (0..opts.tenants.len())
            .map(|t| {
                let target = self.d.targets.of(t);
                probe::ProbeTenant {
                    index: t,
                    key: &opts.tenants[t],
                    model: &target.name,
                    tokens_per_word: target.calibration.tokens_per_word,
                    window: target.window,
                    meter: &target.meter,
                }
            })
            .collect();
        let first_id = self.plan.units.iter().flat_map(Unit::specs).map(|s| s.id + 1).max().unwrap_or(0);
        let setup = probe::Setup {
            client: self.d.client,
            tenants,
            samples: self.probe_samples,
            power_waived: opts.skips(SkippedCheck::ProbePower),
            t0: self.t0,
            first_id,
            own: &self.own,
        };
        let (progress, hooks) = (&self.progress, self.d.hooks);
        let (probe, probe_rows) = probe::run(&setup, &mut self.rng, &|| progress.tick(hooks));
        lock(&self.rows).extend(probe_rows);
        lock(&self.findings).extend(probe.findings());
        Some(probe)
    }

    /// Phase 6: every page gauge back to zero within [`PAGES_WAIT`], on every endpoint.
    pub(crate) fn settle(&self) -> Settled {
        let wait_start = Instant::now();
        loop {
            let after = settle::scrape_all(
                self.d.client,
                metrics_urls(self.d.opts, self.d.hooks),
                self.d.opts.metrics_token.as_deref(),
            );
            if !settle::busy(&after) || wait_start.elapsed() >= PAGES_WAIT {
                return Settled { after, pages_wait_s: wait_start.elapsed().as_secs_f64() };
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Phase 7: the report, written to the report directory when there is one.
    pub(crate) fn report(
        self,
        checks: report::DivergenceChecks,
        timing_probe: Option<TimingProbe>,
        duration: Duration,
        settled: Settled,
    ) -> Result<AuditOutcome, AuditError> {
        let Run { d, plan, probes, rows, findings, .. } = self;
        let opts = d.opts;
        let mut findings = findings.into_inner().unwrap_or_else(|e| e.into_inner());
        let (metrics, metric_findings) =
            settle::compare(&d.before, &settled.after, settled.pages_wait_s, opts.skips(SkippedCheck::PageGauges));
        findings.extend(metric_findings);
        findings.sort_by_key(|f| (!f.fails, f.request));
        let mut rows = rows.into_inner().unwrap_or_else(|e| e.into_inner());
        rows.sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
        let first = d.targets.of(0);
        let mut rep = Report {
            version: 1,
            passed: false,
            url: opts.url.clone(),
            model: first.name.clone(),
            seed: opts.seed,
            context_window: first.window,
            calibration: first.calibration,
            prompt_lengths: first.meter.source().clone(),
            models: d.targets.rows(opts),
            concurrency: opts.concurrency,
            requests_planned: plan.total,
            requests_sent: 0,
            probes,
            near_context: report::NearContext { planned: plan.near_total, verified: plan.near_verified },
            started_unix: d.started_unix,
            duration_s: duration.as_secs_f64(),
            pages_wait_s: settled.pages_wait_s,
            tenants: opts
                .tenants
                .iter()
                .map(|t| report::TenantRow { name: t.name.clone(), requests: 0, ok: 0 })
                .collect(),
            counts: Counts::default(),
            divergence_checks: checks,
            outcomes: BTreeMap::new(),
            outcomes_by_scenario: BTreeMap::new(),
            errors_by_kind: BTreeMap::new(),
            latency: report::Latency {
                ttft_ms: report::Percentiles::of([]),
                total_ms: report::Percentiles::of([]),
                total_ok_ms: report::Percentiles::of([]),
            },
            metrics,
            fault_log: d.hooks.fault_log(),
            notes: d.notes,
            skipped_checks: opts.skip.clone(),
            timing_probe,
            findings,
            requests: rows,
        };
        rep.tally();
        if let Some(dir) = &opts.report_dir {
            rep.write(dir)?;
        }
        Ok(AuditOutcome {
            passed: rep.passed,
            summary: rep.summary(opts.report_dir.as_deref()),
            counts: rep.counts.clone(),
            findings: rep.findings.clone(),
        })
    }
}

/// Per unit of the plan, whether it is a shared-prefix group whose first member goes alone
/// before the others (every other such group; the rest leave all at once, to put the same
/// prefix in flight for every tenant together).
fn staggered_groups(units: &[Unit]) -> Vec<bool> {
    let mut nth = 0usize;
    units
        .iter()
        .map(|u| match u {
            Unit::Group(v) if v.len() > 1 && v[0].scenario == workload::Scenario::SharedPrefix => {
                nth += 1;
                nth % 2 == 1
            }
            _ => false,
        })
        .collect()
}

/// A request's prompt as the own-prefix ledger compares it: its token ids when the audit
/// counted them, else its bytes.
fn units(spec: &ReqSpec) -> Units {
    spec.units.clone().unwrap_or_else(|| Units::bytes_of(&spec.body))
}

/// The `/metrics` URLs to read now: the spawner's (a restarted worker gets a new port), else
/// the options', else the target's own.
fn metrics_urls(opts: &AuditOptions, hooks: &dyn AuditHooks) -> Vec<String> {
    let from_hooks = hooks.metrics_urls();
    if !from_hooks.is_empty() {
        from_hooks
    } else if opts.metrics_urls.is_empty() {
        vec![format!("{}/metrics", opts.url.trim_end_matches('/'))]
    } else {
        opts.metrics_urls.clone()
    }
}
