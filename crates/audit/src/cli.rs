//! `pagewarden audit`'s arguments, and the run a command line asks for: against a deployment
//! (`--url`, `--tenants`) or one spawned on loopback with faults (`--spawn`).

use std::path::PathBuf;

use crate::error::AuditError;
use crate::options::{AuditOptions, NoHooks, SkippedCheck, TokenizerFile};
use crate::run::{run_audit, AuditOutcome};
use crate::spawn;
use crate::tenants::{self, TenantKey};
use crate::timing;

/// `pagewarden audit`.
#[derive(clap::Args, Debug, Clone)]
pub struct AuditArgs {
    /// Base URL of the deployment's OpenAI API, e.g. http://127.0.0.1:8080
    #[arg(long)]
    pub url: Option<String>,
    /// TOML file of tenants to act as: `[[tenants]]` entries with `name` and `key`.
    #[arg(long)]
    pub tenants: Option<PathBuf>,
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Concurrent clients (bursts briefly exceed it).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Seed of everything random (canaries, prompts, the mix); default: random, printed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Directory for report.md, report.json and report.svg.
    #[arg(long = "report")]
    pub report: Option<PathBuf>,
    /// The deployment's context window in tokens; default: asked from the server.
    #[arg(long)]
    pub context_window: Option<usize>,
    /// A /metrics URL to check (repeatable); default: URL/metrics.
    #[arg(long = "metrics")]
    pub metrics: Vec<String>,
    /// A file holding the bearer token for the gateway's /metrics (its `[metrics] token_file`);
    /// not needed for a `[metrics] listen` address given with --metrics.
    #[arg(long)]
    pub metrics_token_file: Option<PathBuf>,
    /// Prompts within 90-99% of the context window (each costs a whole window of prefill);
    /// default: one per hundred requests, at least one.
    #[arg(long)]
    pub long_prompts: Option<usize>,
    /// Re-runs in flight at once in the isolated pass. They are always all of one tenant (no
    /// other tenant's request is in flight), so a leak into a reference run can only be the
    /// tenant's own; more than 1 batches them, which makes long runs several times faster.
    #[arg(long, default_value_t = 1)]
    pub rerun_concurrency: usize,
    /// Samples of the timing probe, run after the re-runs with nothing else in flight: for
    /// pairs of tenants, B times prefixes A has cached (and A's text without A's head)
    /// against fresh ones (ROC AUC, target <= 0.6), A its own hits. Under 256 completed
    /// samples per class is a failing `probe_underpowered` unless `--skip-check probe-power`.
    /// Needs two tenants; skip it only with `--skip-check timing-probe`.
    #[arg(long, default_value_t = timing::DEFAULT_SAMPLES as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub timing_probe: u64,
    /// A check to skip, by name (repeatable): `timing-probe` (the cache is not checked: the
    /// report's first line says so), `probe-power` (a probe under 256 samples per class fails
    /// only on a clear channel), `page-gauges` (no KV page gauge need be readable).
    #[arg(long = "skip-check", value_enum, value_name = "CHECK")]
    pub skip_checks: Vec<SkippedCheck>,
    /// A GGUF model file whose tokenizer and chat template the audit counts prompts with (it
    /// never takes a prompt's length from the answer it judges); `MODEL=FILE` for one model of
    /// several (repeatable). Default: the target's tokenizer endpoint (vLLM's or llama-server's
    /// `/tokenize`), else the packaged model's file when the target serves one by its name;
    /// with neither, lengths are estimates.
    #[arg(long = "tokenizer", value_name = "[MODEL=]FILE")]
    pub tokenizers: Vec<TokenizerFile>,
    /// Whether the target's outputs are bit-identical alone and batched: then any token or
    /// log-prob difference from the isolated re-run is a divergence (else log-probs may differ
    /// by 1e-3). Default: what the target declares (`batch_invariant` in `/v1/models`).
    #[arg(long)]
    pub batch_invariant: Option<bool>,
    /// Draw the progress bar even when stderr is not a terminal.
    #[arg(long)]
    pub progress: bool,
    /// Start a deployment on loopback (gateway, two prefill and two decode workers, a
    /// fault-injecting proxy on each decode worker's KV port) and audit it; `--url` and
    /// `--tenants` are then not needed.
    #[arg(long)]
    pub spawn: bool,
    /// With --spawn: faults to inject, comma-separated, from kill, corrupt, drop, duplicate,
    /// reorder, delay, stall (or none); default: all.
    #[arg(long)]
    pub faults: Option<String>,
    /// With --spawn: how many tenants to create.
    #[arg(long, default_value_t = 3)]
    pub tenant_count: usize,
}

impl AuditArgs {
    pub fn options(&self, url: String, tenants: Vec<TenantKey>) -> AuditOptions {
        let mut o = AuditOptions::new(url, tenants);
        o.requests = self.requests;
        o.concurrency = self.concurrency;
        if let Some(s) = self.seed {
            o.seed = s;
        }
        o.report_dir = self.report.clone();
        o.context_window = self.context_window;
        o.metrics_urls = self.metrics.clone();
        o.progress = self.progress;
        o.long_prompts = self.long_prompts;
        o.rerun_concurrency = self.rerun_concurrency;
        o.timing_probe = self.timing_probe as usize;
        o.skip = self.skip_checks.clone();
        o.tokenizers = self.tokenizers.clone();
        o.batch_invariant = self.batch_invariant;
        o
    }
}

/// `pagewarden audit --url ... --tenants ...`: runs, prints the summary, and fails (non-zero
/// exit) when the audit does.
pub fn run(args: &AuditArgs) -> Result<(), AuditError> {
    if args.spawn {
        let outcome = spawn::run(args.seed, args.tenant_count, args.faults.as_deref(), &|url, tenants| {
            args.options(url, tenants)
        })?;
        return conclude(&outcome);
    }
    let url = args.url.clone().ok_or_else(|| AuditError::Usage("--url is required".into()))?;
    let path = args.tenants.as_deref().ok_or_else(|| AuditError::Usage("--tenants FILE is required".into()))?;
    let mut opts = args.options(url, tenants::load(path)?);
    if let Some(f) = &args.metrics_token_file {
        let text = std::fs::read_to_string(f).map_err(AuditError::file("reading --metrics-token-file", f))?;
        opts.metrics_token = Some(text.trim().to_string());
    }
    conclude(&run_audit(&opts, &NoHooks)?)
}

/// Prints the summary; an error (non-zero exit) naming the failing kinds when the audit failed.
fn conclude(outcome: &AuditOutcome) -> Result<(), AuditError> {
    print!("{}", outcome.summary);
    if !outcome.passed {
        let mut kinds: Vec<&str> = outcome.findings.iter().filter(|f| f.fails).map(|f| f.kind).collect();
        kinds.sort_unstable();
        kinds.dedup();
        return Err(AuditError::Failed { failing: outcome.counts.failing_findings, kinds });
    }
    Ok(())
}
