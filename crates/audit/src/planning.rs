//! Phase 2 of a run ([`Discovered::plan`]): the requests, each with canaries only its tenant
//! knows, every prompt counted by the audit itself (or by the target's own endpoint, counted
//! as a probe) before anything is sent, and the timing probe's size. What the plan itself
//! cannot verify (no request that must be refused, one tenant for the probe) is a finding here.

use std::io::IsTerminal;
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::Value;

use crate::canary::CanaryIndex;
use crate::discover;
use crate::finding::{kind, Finding};
use crate::options::SkippedCheck;
use crate::own_prefix::{OwnPrefixes, Units};
use crate::probe;
use crate::progress::Progress;
use crate::rng::Rng;
use crate::run::{Discovered, Run};
use crate::workload::{self, Endpoint, PlanParams, Unit};

impl<'a> Discovered<'a> {
    /// Phase 2: the requests, each with canaries only its tenant knows, every prompt counted
    /// by the audit itself before anything is sent.
    pub(crate) fn plan(mut self) -> Run<'a> {
        let opts = self.opts;
        let mut rng = Rng::new(opts.seed);
        let mut canaries = CanaryIndex::new();
        let params = PlanParams {
            requests: opts.requests,
            concurrency: opts.concurrency,
            long_prompts: opts.long_prompts,
            targets: self.targets.plan_targets(),
            request_seed: opts.seed & 0x7fff_ffff,
        };
        let mut measure_calls = 0usize;
        let (targets, client) = (&self.targets, self.client);
        let mut measure = |tenant: usize, b: &Value| {
            let meter = &targets.of(tenant).meter;
            if meter.exact() {
                return meter.count(b);
            }
            measure_calls += 1;
            let endpoint = if b.get("messages").is_some() { Endpoint::Chat } else { Endpoint::Completions };
            discover::probe(client, &opts.tenants[tenant].key, endpoint.path(), b).1
        };
        let mut plan = workload::build_plan(&params, &mut rng, &mut canaries, &mut measure);
        for spec in plan.units.iter_mut().flat_map(Unit::specs_mut) {
            let meter = &targets.of(spec.tenant).meter;
            match meter.tokens(&spec.body) {
                Some(ids) => {
                    spec.sent_tokens = Some(ids.len());
                    spec.units = Some(Units::Tokens(ids));
                }
                None => spec.sent_tokens = meter.count(&spec.body),
            }
        }
        let per_model = 2 + usize::from(opts.context_window.is_none());
        let probes = measure_calls + per_model * targets.models.len();
        let reruns_planned = plan.units.iter().flat_map(Unit::specs).filter(|s| s.rerun).count();
        if !plan.units.iter().flat_map(Unit::specs).any(|s| s.scenario.must_be_refused()) {
            self.findings.push(Finding {
                kind: kind::NOT_VERIFIED,
                fails: true,
                detail: "over-long prompts: not verified (the plan has no request that must be refused; give \
                         --requests 2 or more)"
                    .into(),
                ..Default::default()
            });
        }
        let probe_samples = if opts.skips(SkippedCheck::TimingProbe) {
            self.notes.push(
                "the prefix cache was not checked: the timing probe was skipped (--skip-check timing-probe)".into(),
            );
            0
        } else if opts.tenants.len() < 2 {
            self.findings.push(Finding {
                kind: kind::PROBE_UNDERPOWERED,
                fails: true,
                detail: "the timing probe needs two tenants and was given one: the prefix cache was not checked (give \
                         two tenants, or skip it with --skip-check timing-probe)"
                    .into(),
                ..Default::default()
            });
            0
        } else {
            opts.timing_probe
        };
        let probe_requests = probe_samples * 4 + probe_samples.div_ceil(probe::CHUNK_EVERY) * 4;
        let progress = Progress {
            on: opts.progress || std::io::stderr().is_terminal(),
            total: AtomicUsize::new(plan.total + reruns_planned + probe_requests),
            done: AtomicUsize::new(0),
            last: Mutex::new(None),
        };
        Run {
            rng,
            canaries,
            plan,
            probes,
            probe_samples,
            progress,
            t0: Instant::now(),
            rows: Mutex::new(Vec::new()),
            findings: Mutex::new(std::mem::take(&mut self.findings)),
            own: OwnPrefixes::new(opts.tenants.len()),
            d: self,
        }
    }
}
