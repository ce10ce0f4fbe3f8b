//! What a run is given ([`AuditOptions`]) and the calls it makes back to whoever started it
//! ([`AuditHooks`]).

use std::path::PathBuf;

use serde::Serialize;

use crate::rng;
use crate::tenants::TenantKey;
use crate::timing;

/// `--tokenizer [MODEL=]FILE`: the tokenizer of `MODEL`, or of every model without its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerFile {
    pub model: Option<String>,
    pub path: PathBuf,
}

impl std::str::FromStr for TokenizerFile {
    type Err = String;

    /// `MODEL=FILE` names the model only when `MODEL` is not itself a path (a file name may
    /// hold `=`, a model id has no `/`).
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('=') {
            Some((m, f)) if !m.is_empty() && !m.contains('/') && !f.is_empty() => {
                Ok(TokenizerFile { model: Some(m.to_string()), path: PathBuf::from(f) })
            }
            _ if s.is_empty() => Err("an empty --tokenizer".into()),
            _ => Ok(TokenizerFile { model: None, path: PathBuf::from(s) }),
        }
    }
}

/// A check the operator skips by name (`--skip-check`). Nothing is skipped silently: the
/// report lists every skipped check, and its first line says when the cache was not checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SkippedCheck {
    /// No timing probe: the prefix cache is not checked for side channels.
    TimingProbe,
    /// A probe with fewer than 256 completed samples per class is reported, not failed; only
    /// a clear channel fails (short runs, such as the test suite's).
    ProbePower,
    /// No KV page gauge need be readable after the run (a target without pagewarden's gauges).
    PageGauges,
}

impl SkippedCheck {
    pub fn name(self) -> &'static str {
        match self {
            SkippedCheck::TimingProbe => "timing-probe",
            SkippedCheck::ProbePower => "probe-power",
            SkippedCheck::PageGauges => "page-gauges",
        }
    }
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// Base URL of the deployment's OpenAI API.
    pub url: String,
    pub tenants: Vec<TenantKey>,
    pub requests: usize,
    pub concurrency: usize,
    pub seed: u64,
    /// Where to write report.md, report.json and report.svg.
    pub report_dir: Option<PathBuf>,
    /// None: discovered from the server.
    pub context_window: Option<usize>,
    /// `/metrics` URLs of the gateway (and workers); empty: `{url}/metrics`.
    pub metrics_urls: Vec<String>,
    /// Bearer token for scraping them (the gateway's `[metrics] token_file`).
    pub metrics_token: Option<String>,
    /// Draw a progress bar on stderr even when it is not a terminal.
    pub progress: bool,
    /// Near-context prompts; None: one per hundred requests, at least one.
    pub long_prompts: Option<usize>,
    /// Re-runs in flight at once during the isolated pass, always all of one tenant.
    pub rerun_concurrency: usize,
    /// Samples of the timing probe (it needs two tenants; skipping it takes
    /// [`SkippedCheck::TimingProbe`]).
    pub timing_probe: usize,
    /// Checks the operator skipped by name.
    pub skip: Vec<SkippedCheck>,
    /// GGUF files whose tokenizer and chat template count the prompts, each for one model or
    /// (without a name) for any; none for a model: the target's tokenizer endpoint, else the
    /// packaged model of that name when the target serves one.
    pub tokenizers: Vec<TokenizerFile>,
    /// Whether the target's outputs are bit-identical alone and in a batch; None: as the
    /// target declares (`batch_invariant` in `/v1/models`).
    pub batch_invariant: Option<bool>,
}

impl AuditOptions {
    pub fn skips(&self, check: SkippedCheck) -> bool {
        self.skip.contains(&check)
    }

    /// Options with the CLI's defaults (200 requests, 8 clients, a random seed).
    pub fn new(url: impl Into<String>, tenants: Vec<TenantKey>) -> Self {
        AuditOptions {
            url: url.into(),
            tenants,
            requests: 200,
            concurrency: 8,
            seed: rng::random_seed(),
            report_dir: None,
            context_window: None,
            metrics_urls: Vec::new(),
            metrics_token: None,
            progress: false,
            long_prompts: None,
            rerun_concurrency: 1,
            timing_probe: timing::DEFAULT_SAMPLES,
            skip: Vec::new(),
            tokenizers: Vec::new(),
            batch_invariant: None,
        }
    }
}

/// Calls from the run to whoever started it (`--spawn` injects faults on its own thread and
/// tells the report what it did).
pub trait AuditHooks: Sync {
    fn on_progress(&self, _done: usize, _total: usize) {}
    /// The load phase is over; next come the isolated re-runs, the timing probe and the wait
    /// for pages to return to zero. A spawner stops every fault here: the re-runs are the
    /// reference the load is compared with, and the probe times single requests.
    fn on_load_done(&self) {}
    /// `/metrics` URLs to read now, when they change during the run (a restarted worker gets a
    /// new port); empty: the options' URLs.
    fn metrics_urls(&self) -> Vec<String> {
        vec![]
    }
    fn fault_log(&self) -> Vec<String> {
        vec![]
    }
}

pub struct NoHooks;

impl AuditHooks for NoHooks {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tokenizer_names_its_model_only_before_an_equals_sign_that_is_not_in_a_path() {
        let t = |s: &str| s.parse::<TokenizerFile>().unwrap();
        assert_eq!(t("m.gguf"), TokenizerFile { model: None, path: "m.gguf".into() });
        assert_eq!(t("gemma=/m/g.gguf"), TokenizerFile { model: Some("gemma".into()), path: "/m/g.gguf".into() });
        assert_eq!(t("/models/a=b.gguf"), TokenizerFile { model: None, path: "/models/a=b.gguf".into() });
        assert!("".parse::<TokenizerFile>().is_err());
    }
}
